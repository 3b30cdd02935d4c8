//! Moving results between databases: `export` writes JSON lines (a header, one record per host,
//! inventory, software stack and run with its values folded in, an end record with the count), and
//! `import` reads them back all-or-nothing, idempotently (records carry UUIDs).

use std::io::Write;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sqlx::Row;

use crate::{DbError, Result, Store};

/// The export format's version; a file from a newer kiln is refused.
pub const EXPORT_VERSION: i64 = 1;

#[derive(Serialize, Deserialize)]
struct Header {
    pub(crate) kiln_export: i64,
    pub(crate) exported_at: String,
    #[serde(default)]
    pub(crate) since: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HostRec {
    #[serde(rename = "type")]
    _kind: serde::de::IgnoredAny,
    pub(crate) id: String,
    pub(crate) identity: String,
    pub(crate) hostname: Option<String>,
    pub(crate) config_fingerprint: String,
    pub(crate) config_name: String,
    pub(crate) first_seen: String,
    pub(crate) last_seen: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct InventoryRec<'a> {
    #[serde(rename = "type")]
    _kind: serde::de::IgnoredAny,
    pub(crate) id: String,
    pub(crate) host_id: String,
    pub(crate) collected_at: String,
    pub(crate) schema_version: i64,
    pub(crate) config_fingerprint: String,
    pub(crate) config_name: String,
    pub(crate) cpu_model: Option<String>,
    pub(crate) cpu_packages: Option<i64>,
    pub(crate) cpu_cores: Option<i64>,
    pub(crate) cpu_threads: Option<i64>,
    pub(crate) memory_bytes: Option<i64>,
    pub(crate) kernel_release: Option<String>,
    pub(crate) problem_count: i64,
    #[serde(borrow)]
    pub(crate) document: &'a RawValue,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SoftwareRec<'a> {
    #[serde(rename = "type")]
    _kind: serde::de::IgnoredAny,
    pub(crate) id: String,
    pub(crate) fingerprint: String,
    #[serde(borrow)]
    pub(crate) document: &'a RawValue,
}

/// A string of an export line, borrowed from the file's text unless it holds JSON escapes. A run's
/// values carry millions of them (names, units, directions); owning each one (an allocation, and
/// a free after the commit) kept a fleet import of 2.4 M metric rows at 2.66 s, against 2.14 s
/// borrowed.
#[derive(Deserialize)]
#[serde(transparent)]
pub(crate) struct Text<'a>(#[serde(borrow)] std::borrow::Cow<'a, str>);

impl Text<'_> {
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for Text<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Text<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl std::fmt::Display for Text<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunRec<'a> {
    #[serde(rename = "type")]
    _kind: serde::de::IgnoredAny,
    pub(crate) id: String,
    pub(crate) host_id: String,
    pub(crate) inventory_id: Option<String>,
    pub(crate) software_id: Option<String>,
    pub(crate) benchmark: String,
    pub(crate) config: String,
    pub(crate) started_at: String,
    pub(crate) finished_at: Option<String>,
    pub(crate) status: crate::RunStatus,
    #[serde(default)]
    pub(crate) status_reason: Option<String>,
    #[serde(default, borrow)]
    pub(crate) metrics: Vec<(Text<'a>, f64, Text<'a>, Text<'a>)>,
    #[serde(default, borrow)]
    pub(crate) samples: Vec<(Text<'a>, i64, f64)>,
    #[serde(default, borrow)]
    pub(crate) telemetry: Vec<(i64, Text<'a>, Text<'a>, f64)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct VerdictRec<'a> {
    #[serde(rename = "type")]
    _kind: serde::de::IgnoredAny,
    pub(crate) id: String,
    pub(crate) host_id: String,
    pub(crate) inventory_id: String,
    pub(crate) judged_at: String,
    pub(crate) spec_name: String,
    pub(crate) spec_hash: String,
    pub(crate) spec: String,
    pub(crate) verdict: String,
    pub(crate) failed: i64,
    #[serde(borrow)]
    pub(crate) document: &'a RawValue,
}

/// A provisioning apply with its journal: what `kiln provision apply` did to a machine (or to the
/// root it was pointed at), step by step. A resumed apply is the same record again with more steps.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ApplyRec {
    #[serde(rename = "type")]
    _kind: serde::de::IgnoredAny,
    pub(crate) id: String,
    pub(crate) image: String,
    pub(crate) image_version: String,
    pub(crate) image_hash: String,
    pub(crate) root: String,
    pub(crate) hostname: Option<String>,
    pub(crate) started_at: String,
    pub(crate) finished_at: Option<String>,
    pub(crate) resumes: i64,
    pub(crate) status: crate::ApplyStatus,
    pub(crate) steps: Vec<StepRec>,
}

/// One step of an apply's journal.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StepRec {
    pub(crate) seq: i64,
    pub(crate) step_key: String,
    pub(crate) summary: String,
    pub(crate) command: String,
    pub(crate) image_hash: String,
    pub(crate) started_at: String,
    pub(crate) finished_at: Option<String>,
    pub(crate) status: crate::StepStatus,
    pub(crate) exit_code: Option<i64>,
    pub(crate) duration_ms: Option<i64>,
    pub(crate) output_tail: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EndRec {
    #[serde(rename = "type")]
    _kind: serde::de::IgnoredAny,
    pub(crate) records: u64,
}

/// One line of an export. (Parsed by hand on its `type`: serde's tagged enums buffer their
/// content, which neither borrows raw documents nor runs fast.)
pub(crate) enum Record<'a> {
    Host(HostRec),
    Inventory(InventoryRec<'a>),
    Software(SoftwareRec<'a>),
    Run(RunRec<'a>),
    Verdict(VerdictRec<'a>),
    Apply(ApplyRec),
    End(EndRec),
}

/// Limits an imported record must keep: what kiln itself writes stays far inside them, and what
/// breaks them would break the database or a later export (SQLite's JSON functions stop at a
/// nesting depth of 1000).
const MAX_ID: usize = 128;
const MAX_NAME: usize = 1024;
const MAX_DOCUMENT: usize = 64 << 20;
const MAX_DEPTH: usize = 64;

/// The deepest nesting of arrays and objects in a JSON text (strings skipped).
fn json_depth(text: &str) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for b in text.bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Checks a parsed record against what kiln can store and export again: lengths, times, counts,
/// and the size and depth of its documents.
// Long: one arm per record type, each a list of its fields' limits through the checks above them.
fn validate(record: &Record<'_>) -> std::result::Result<(), String> {
    let id = |what: &str, v: &str| match v.len() {
        0 => Err(format!("{what} is empty")),
        n if n > MAX_ID => Err(format!("{what} is {n} characters long (at most {MAX_ID})")),
        _ => Ok(()),
    };
    let name = |what: &str, v: &str| match v.len() {
        n if n > MAX_NAME => Err(format!("{what} is {n} characters long (at most {MAX_NAME})")),
        _ => Ok(()),
    };
    let time = |what: &str, v: &str| {
        kiln_text::timefmt::parse_rfc3339(v).map(|_| ()).ok_or_else(|| format!("{what} {v:?} is not an RFC 3339 time"))
    };
    let count = |what: &str, v: Option<i64>| match v {
        Some(n) if n < 0 => Err(format!("{what} is negative ({n})")),
        _ => Ok(()),
    };
    let text = |what: &str, v: &str| match v.len() {
        n if n > MAX_DOCUMENT => Err(format!("{what} is {n} bytes (at most {MAX_DOCUMENT})")),
        _ => Ok(()),
    };
    let document = |what: &str, text: &str| {
        if text.len() > MAX_DOCUMENT {
            return Err(format!("{what} is {} bytes (at most {MAX_DOCUMENT})", text.len()));
        }
        match json_depth(text) {
            d if d > MAX_DEPTH => Err(format!("{what} nests {d} deep (at most {MAX_DEPTH})")),
            _ => Ok(()),
        }
    };
    match record {
        Record::Host(h) => {
            id("host id", &h.id)?;
            id("host identity", &h.identity)?;
            name("hostname", h.hostname.as_deref().unwrap_or(""))?;
            if h.hostname.as_deref().is_some_and(|n| n.len() > 253) {
                return Err("hostname is longer than a DNS name can be (253)".into());
            }
            name("configuration fingerprint", &h.config_fingerprint)?;
            name("configuration name", &h.config_name)?;
            time("first_seen", &h.first_seen)?;
            time("last_seen", &h.last_seen)
        }
        Record::Inventory(i) => {
            id("inventory id", &i.id)?;
            id("host id", &i.host_id)?;
            time("collected_at", &i.collected_at)?;
            count("schema_version", Some(i.schema_version))?;
            name("configuration fingerprint", &i.config_fingerprint)?;
            name("configuration name", &i.config_name)?;
            name("cpu_model", i.cpu_model.as_deref().unwrap_or(""))?;
            name("kernel_release", i.kernel_release.as_deref().unwrap_or(""))?;
            for (what, v) in [
                ("cpu_packages", i.cpu_packages),
                ("cpu_cores", i.cpu_cores),
                ("cpu_threads", i.cpu_threads),
                ("memory_bytes", i.memory_bytes),
                ("problem_count", Some(i.problem_count)),
            ] {
                count(what, v)?;
            }
            document("the inventory document", i.document.get())
        }
        Record::Software(sw) => {
            id("software id", &sw.id)?;
            id("software fingerprint", &sw.fingerprint)?;
            document("the software document", sw.document.get())
        }
        Record::Run(r) => {
            id("run id", &r.id)?;
            id("host id", &r.host_id)?;
            name("benchmark", &r.benchmark)?;
            time("started_at", &r.started_at)?;
            if let Some(f) = &r.finished_at {
                time("finished_at", f)?;
            }
            name("status_reason", r.status_reason.as_deref().unwrap_or(""))?;
            document("the run's configuration", &r.config)?;
            serde_json::from_str::<serde::de::IgnoredAny>(&r.config)
                .map_err(|e| format!("the run's configuration is not JSON ({e})"))?;
            for (n, _, unit, direction) in &r.metrics {
                name("a metric name", n)?;
                name("a metric unit", unit)?;
                if !matches!(direction.as_str(), "higher" | "lower" | "none") {
                    return Err(format!("metric {n}: direction {direction:?} is not higher, lower or none"));
                }
            }
            for (m, _, _) in &r.samples {
                name("a sample's metric name", m)?;
            }
            for (t, source, n, _) in &r.telemetry {
                name("a telemetry source", source)?;
                name("a telemetry channel", n)?;
                count("a telemetry time", Some(*t))?;
            }
            Ok(())
        }
        Record::Verdict(v) => {
            id("verdict id", &v.id)?;
            id("host id", &v.host_id)?;
            id("inventory id", &v.inventory_id)?;
            time("judged_at", &v.judged_at)?;
            name("spec name", &v.spec_name)?;
            id("spec hash", &v.spec_hash)?;
            if v.spec.len() > MAX_DOCUMENT {
                return Err(format!("the spec is {} bytes (at most {MAX_DOCUMENT})", v.spec.len()));
            }
            if !matches!(v.verdict.as_str(), "accept" | "reject" | "inconclusive") {
                return Err(format!("verdict {:?} is not accept, reject or inconclusive", v.verdict));
            }
            count("failed", Some(v.failed))?;
            document("the verdict document", v.document.get())
        }
        Record::Apply(a) => {
            id("apply id", &a.id)?;
            name("image", &a.image)?;
            name("image version", &a.image_version)?;
            id("image hash", &a.image_hash)?;
            name("root", &a.root)?;
            name("hostname", a.hostname.as_deref().unwrap_or(""))?;
            time("started_at", &a.started_at)?;
            if let Some(f) = &a.finished_at {
                time("finished_at", f)?;
            }
            count("resumes", Some(a.resumes))?;
            for st in &a.steps {
                let at = |e: String| format!("step {}: {e}", st.seq);
                count("seq", Some(st.seq)).map_err(at)?;
                name("step key", &st.step_key).map_err(at)?;
                name("summary", &st.summary).map_err(at)?;
                text("the command", &st.command).map_err(at)?;
                id("image hash", &st.image_hash).map_err(at)?;
                time("started_at", &st.started_at).map_err(at)?;
                if let Some(f) = &st.finished_at {
                    time("finished_at", f).map_err(at)?;
                }
                count("duration_ms", st.duration_ms).map_err(at)?;
                text("the output", st.output_tail.as_deref().unwrap_or("")).map_err(at)?;
            }
            Ok(())
        }
        Record::End(_) => Ok(()),
    }
}

fn parse_record(line: &str) -> std::result::Result<Record<'_>, serde_json::Error> {
    #[derive(Deserialize)]
    struct Kind {
        #[serde(rename = "type")]
        kind: String,
    }
    // The export writes `type` first; anything else is looked up the slow way.
    let fast = line.strip_prefix("{\"type\":\"").and_then(|rest| rest.split('"').next());
    let kind = match fast {
        Some(k) => k.to_string(),
        None => serde_json::from_str::<Kind>(line)?.kind,
    };
    Ok(match kind.as_str() {
        "host" => Record::Host(serde_json::from_str(line)?),
        "inventory" => Record::Inventory(serde_json::from_str(line)?),
        "software" => Record::Software(serde_json::from_str(line)?),
        "run" => Record::Run(serde_json::from_str(line)?),
        "verdict" => Record::Verdict(serde_json::from_str(line)?),
        "apply" => Record::Apply(serde_json::from_str(line)?),
        "end" => Record::End(serde_json::from_str(line)?),
        other => {
            return Err(serde::de::Error::custom(format!(
                "unknown record type {other:?} (host, inventory, software, run, verdict, apply or end)"
            )))
        }
    })
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ExportStats {
    pub hosts: u64,
    pub inventories: u64,
    pub software: u64,
    pub runs: u64,
    pub metrics: u64,
    pub samples: u64,
    pub telemetry: u64,
    pub verdicts: u64,
    /// Provisioning applies, with their steps.
    pub applies: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ImportStats {
    pub records: u64,
    pub hosts_new: u64,
    pub inventories_new: u64,
    pub software_new: u64,
    pub runs_new: u64,
    pub runs_known: u64,
    pub verdicts_new: u64,
    /// Provisioning applies new here, and those that came again with more of their story
    /// (resumed, or finished since the last upload).
    #[serde(default)]
    pub applies_new: u64,
    #[serde(default)]
    pub applies_updated: u64,
    pub metrics: u64,
    pub samples: u64,
    pub telemetry: u64,
}

/// An upload to the fleet service: its label (for messages), the export text, and who sent it.
#[derive(Debug, Clone)]
pub struct Upload {
    pub label: String,
    pub text: String,
    pub sender: Sender,
}

/// Who sent an upload: its token (recorded with every accepted upload, with the client's address)
/// and whether that token speaks for one host only (an agent's: bound to a host identity when it
/// was made, or by its first upload; records of any other host are refused).
#[derive(Debug, Clone)]
pub struct Sender {
    pub token_id: String,
    pub client: Option<String>,
    pub one_host: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("{file}:{line}: {message}; nothing was imported")]
    Malformed { file: String, line: usize, message: String },
    /// The upload speaks for a host its token may not (the fleet service answers 403).
    #[error("{file}: {message}; nothing was imported")]
    Refused { file: String, message: String },
    #[error("{file}: {message}; nothing was imported")]
    File { file: String, message: String },
    #[error(transparent)]
    Db(#[from] DbError),
}

fn json_line<T: Serialize>(out: &mut dyn Write, value: &T) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, value)?;
    out.write_all(b"\n")
}

/// One kind of exported record: the query that writes each of its lines (JSON built by SQLite),
/// the condition that picks the records of a window (`?1` its start, or '') and the one that picks
/// those an upload carries (the outbox's batch, `temp.upload_batch`), and what a row adds to the
/// statistics.
struct ExportKind {
    select: &'static str,
    window: &'static str,
    batch: &'static str,
    order: &'static str,
    count: fn(&mut ExportStats, &sqlx::sqlite::SqliteRow),
}

/// Which records an export writes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Selection<'a> {
    /// Runs started at or after this instant ('' for all), and what they name.
    Window(&'a str),
    /// The upload batch (`temp.upload_batch`: runs, inventories, verdicts) and what they name.
    Batch,
}

impl ExportKind {
    fn sql(&self, selection: Selection) -> String {
        let condition = match selection {
            Selection::Window(_) => self.window,
            Selection::Batch => self.batch,
        };
        format!("{} WHERE {condition} ORDER BY {}", self.select, self.order)
    }
}

/// The batch's ids of one kind, as SQL.
macro_rules! batch {
    ($kind:literal) => {
        concat!("(SELECT id FROM temp.upload_batch WHERE kind = '", $kind, "')")
    };
}

/// In the order an import needs them: hosts, then what names them.
const EXPORTS: [ExportKind; 6] = [
    // Hosts with a run in the window (or an inventory, when there is no window).
    ExportKind {
        select: "SELECT json_object('type', 'host', 'id', id, 'identity', identity, 'hostname', hostname, \
              'config_fingerprint', config_fingerprint, 'config_name', config_name, 'first_seen', first_seen, \
              'last_seen', last_seen) FROM hosts h",
        window: "?1 = '' OR EXISTS (SELECT 1 FROM runs r WHERE r.host_id = h.id AND r.started_at >= ?1)",
        batch: concat!(
            "h.id IN (SELECT host_id FROM runs WHERE id IN ",
            batch!("run"),
            " UNION SELECT host_id FROM inventories WHERE id IN ",
            batch!("inventory"),
            " UNION SELECT host_id FROM verdicts WHERE id IN ",
            batch!("verdict"),
            ")"
        ),
        order: "id",
        count: |s, _| s.hosts += 1,
    },
    // Inventories with a run in the window; in a batch, also those its runs and verdicts name (the
    // server may not have them yet).
    ExportKind {
        select: "SELECT json_object('type', 'inventory', 'id', id, 'host_id', host_id, 'collected_at', collected_at, \
              'schema_version', schema_version, 'config_fingerprint', config_fingerprint, 'config_name', config_name, \
              'cpu_model', cpu_model, 'cpu_packages', cpu_packages, 'cpu_cores', cpu_cores, 'cpu_threads', cpu_threads, \
              'memory_bytes', memory_bytes, 'kernel_release', kernel_release, 'problem_count', problem_count, \
              'document', json(document)) FROM inventories i",
        window: "?1 = '' OR EXISTS (SELECT 1 FROM runs r WHERE r.inventory_id = i.id AND r.started_at >= ?1)",
        batch: concat!(
            "i.id IN ",
            batch!("inventory"),
            " OR i.id IN (SELECT inventory_id FROM runs WHERE id IN ",
            batch!("run"),
            ") OR i.id IN (SELECT inventory_id FROM verdicts WHERE id IN ",
            batch!("verdict"),
            ")"
        ),
        order: "collected_at",
        count: |s, _| s.inventories += 1,
    },
    ExportKind {
        select: "SELECT json_object('type', 'software', 'id', id, 'fingerprint', fingerprint, 'document', json(document)) \
              FROM software_stacks s",
        window: "EXISTS (SELECT 1 FROM runs r WHERE r.software_id = s.id AND r.started_at >= ?1)",
        batch: concat!("s.id IN (SELECT software_id FROM runs WHERE id IN ", batch!("run"), ")"),
        order: "id",
        count: |s, _| s.software += 1,
    },
    // One row per run, its children folded in by SQLite's JSON functions: a few thousand rows
    // instead of millions. Values go through printf('%!.17g'): SQLite writes a REAL in JSON with 15
    // significant digits, which loses the last bits of a double (0.1 + 0.2 came back as 0.3).
    // Children come in a fixed order, so that the export of an import is the same file.
    ExportKind {
        select: "SELECT json_object('type', 'run', 'id', r.id, 'host_id', r.host_id, 'inventory_id', r.inventory_id, \
              'software_id', r.software_id, 'benchmark', r.benchmark, 'config', r.config, 'started_at', r.started_at, \
              'finished_at', r.finished_at, 'status', r.status, 'status_reason', r.status_reason, \
              'metrics', (SELECT json_group_array(json_array(name, json(printf('%!.17g', value)), unit, direction)) FROM (SELECT * FROM metrics WHERE run_id = r.id ORDER BY name)), \
              'samples', (SELECT json_group_array(json_array(metric, idx, json(printf('%!.17g', value)))) FROM (SELECT * FROM samples WHERE run_id = r.id ORDER BY metric, idx)), \
              'telemetry', (SELECT json_group_array(json_array(t_ms, source, name, json(printf('%!.17g', value)))) FROM (SELECT * FROM telemetry WHERE run_id = r.id ORDER BY t_ms, source, name, value))), \
              (SELECT COUNT(*) FROM metrics WHERE run_id = r.id), (SELECT COUNT(*) FROM samples WHERE run_id = r.id), \
              (SELECT COUNT(*) FROM telemetry WHERE run_id = r.id) \
              FROM runs r",
        window: "r.started_at >= ?1",
        batch: concat!("r.id IN ", batch!("run")),
        order: "r.started_at, r.id",
        count: |s, row| {
            s.runs += 1;
            s.metrics += row.get::<i64, _>(1) as u64;
            s.samples += row.get::<i64, _>(2) as u64;
            s.telemetry += row.get::<i64, _>(3) as u64;
        },
    },
    // Verdicts of the exported inventories.
    ExportKind {
        select: "SELECT json_object('type', 'verdict', 'id', v.id, 'host_id', v.host_id, 'inventory_id', v.inventory_id, \
              'judged_at', v.judged_at, 'spec_name', v.spec_name, 'spec_hash', v.spec_hash, 'spec', v.spec, \
              'verdict', v.verdict, 'failed', v.failed, 'document', json(v.document)) FROM verdicts v",
        window: "?1 = '' OR EXISTS (SELECT 1 FROM runs r WHERE r.inventory_id = v.inventory_id AND r.started_at >= ?1)",
        batch: concat!("v.id IN ", batch!("verdict")),
        order: "v.judged_at, v.id",
        count: |s, _| s.verdicts += 1,
    },
    // Provisioning applies started in the window, each with its journal folded in.
    ExportKind {
        select: "SELECT json_object('type', 'apply', 'id', a.id, 'image', a.image, 'image_version', a.image_version, \
              'image_hash', a.image_hash, 'root', a.root, 'hostname', a.hostname, 'started_at', a.started_at, \
              'finished_at', a.finished_at, 'resumes', a.resumes, 'status', a.status, \
              'steps', (SELECT json_group_array(json_object('seq', seq, 'step_key', step_key, 'summary', summary, \
              'command', command, 'image_hash', image_hash, 'started_at', started_at, 'finished_at', finished_at, \
              'status', status, 'exit_code', exit_code, 'duration_ms', duration_ms, 'output_tail', output_tail)) \
              FROM (SELECT * FROM provision_steps WHERE apply_id = a.id ORDER BY seq, id))) \
              FROM provision_applies a",
        window: "a.started_at >= ?1",
        batch: concat!("a.id IN ", batch!("apply")),
        order: "a.started_at, a.id",
        count: |s, _| s.applies += 1,
    },
];

impl Store {
    /// Writes every host, inventory, software stack and run (with metrics, samples, telemetry) —
    /// of runs started at or after `since`, when given — as JSON lines: a header, the records, and
    /// an end record with the count, so that a truncated file is recognised.
    pub async fn export(&mut self, since: Option<&str>, exported_at: &str, out: &mut dyn Write) -> Result<ExportStats> {
        let since = since.unwrap_or("");
        self.export_selected(Selection::Window(since), exported_at, out).await
    }

    /// Writes the records `selection` picks as an export: a header, the records, and an end record
    /// with the count.
    pub(crate) async fn export_selected(
        &mut self,
        selection: Selection<'_>,
        exported_at: &str,
        out: &mut dyn Write,
    ) -> Result<ExportStats> {
        let err = self.sql_err();
        let io = |e: std::io::Error| DbError::Open { path: "<output>".into(), source: e };
        let since = match selection {
            Selection::Window(since) => since,
            Selection::Batch => "",
        };
        let mut stats = ExportStats::default();
        json_line(
            out,
            &Header {
                kiln_export: EXPORT_VERSION,
                exported_at: exported_at.to_string(),
                since: (!since.is_empty()).then(|| since.to_string()),
            },
        )
        .map_err(io)?;
        for kind in EXPORTS {
            let sql = kind.sql(selection);
            let mut query = sqlx::query(&sql);
            if let Selection::Window(since) = selection {
                query = query.bind(since);
            }
            for row in query.fetch_all(&mut self.conn).await.map_err(&err)? {
                out.write_all(row.get::<String, _>(0).as_bytes()).and_then(|_| out.write_all(b"\n")).map_err(io)?;
                (kind.count)(&mut stats, &row);
            }
        }
        let records = stats.hosts + stats.inventories + stats.software + stats.runs + stats.verdicts + stats.applies;
        json_line(out, &serde_json::json!({ "type": "end", "records": records })).map_err(io)?;
        out.flush().map_err(io)?;
        Ok(stats)
    }
}

/// Checks an export without a database: every line parsed and validated, the end record's count.
/// Returns the number of records. `kiln import` does this before it writes anything; the fuzzer
/// drives it directly.
///
/// # Errors
/// The first malformed line, with its number; a truncated file.
pub fn check_export(file: &str, text: &str) -> std::result::Result<usize, ImportError> {
    parse_export(file, text).map(|r| r.len())
}

/// Parses and validates every line of an export (on every core; the file is in memory).
pub(crate) fn parse_export<'t>(
    file: &str,
    text: &'t str,
) -> std::result::Result<Vec<(usize, Record<'t>)>, ImportError> {
    let malformed = |line: usize, message: String| ImportError::Malformed { file: file.to_string(), line, message };
    let mut lines = text.split_inclusive('\n').enumerate().map(|(i, l)| (i + 1, l));
    let Some((_, first)) = lines.next() else {
        return Err(ImportError::File { file: file.into(), message: "empty file, not a kiln export".into() });
    };
    let header: Header =
        serde_json::from_str(first.trim_end()).map_err(|e| malformed(1, format!("not a kiln export header ({e})")))?;
    if header.kiln_export > EXPORT_VERSION {
        return Err(malformed(
            1,
            format!(
                "export format {} is newer than this kiln knows ({EXPORT_VERSION}); upgrade kiln",
                header.kiln_export
            ),
        ));
    }
    // Lines are parsed on every core (the file is in memory), then checked in order; a small file
    // on this thread (starting threads costs more than parsing a few records).
    let lines: Vec<(usize, &str)> = lines.collect();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
    let workers = if text.len() < 1 << 20 { 1 } else { cores };
    let parse_part = |part: &[(usize, &'t str)]| -> Vec<(usize, std::result::Result<Option<Record<'t>>, String>)> {
        part.iter()
            .map(|&(n, line)| {
                if !line.ends_with('\n') {
                    return (n, Err("the last line is cut off (no newline): the file is truncated".to_string()));
                }
                let body = line.trim_end();
                if body.is_empty() {
                    return (n, Ok(None));
                }
                let record = parse_record(body).map_err(|e| e.to_string());
                (n, record.and_then(|r| validate(&r).map(|()| Some(r))))
            })
            .collect()
    };
    let parsed: Vec<Vec<(usize, std::result::Result<Option<Record>, String>)>> = if workers == 1 {
        vec![parse_part(&lines)]
    } else {
        let chunk = lines.len().div_ceil(workers).max(1);
        std::thread::scope(|scope| {
            let handles: Vec<_> = lines.chunks(chunk).map(|part| scope.spawn(move || parse_part(part))).collect();
            handles.into_iter().map(|h| h.join().expect("parser thread")).collect()
        })
    };
    let mut records = Vec::new();
    let mut end: Option<(usize, u64)> = None;
    for (n, record) in parsed.into_iter().flatten() {
        let record = record.map_err(|e| malformed(n, e))?;
        let Some(record) = record else { continue };
        if let Some((at, _)) = end {
            return Err(malformed(n, format!("data after the end record of line {at}")));
        }
        if let Record::End(EndRec { records: count, .. }) = record {
            end = Some((n, count));
        } else {
            records.push((n, record));
        }
    }
    let Some((at, count)) = end else {
        return Err(ImportError::File { file: file.into(), message: "no end record: the file is truncated".into() });
    };
    if count != records.len() as u64 {
        return Err(malformed(at, format!("the end record counts {count} records, the file holds {}", records.len())));
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Queries;

    const HOST: &str = r#"{"type":"host","id":"h1","identity":"serial-1","hostname":"gpu-01","config_fingerprint":"cf","config_name":"8x H100","first_seen":"2026-11-01T00:00:00Z","last_seen":"2026-11-02T00:00:00Z"}"#;
    const INVENTORY: &str = r#"{"type":"inventory","id":"i1","host_id":"h1","collected_at":"2026-11-01T00:00:00Z","schema_version":1,"config_fingerprint":"cf","config_name":"8x H100","cpu_model":"x","cpu_packages":2,"cpu_cores":96,"cpu_threads":192,"memory_bytes":2199023255552,"kernel_release":"6.8.0","problem_count":0,"document":{"cpu":{"model_name":"x"}}}"#;
    const SOFTWARE: &str = r#"{"type":"software","id":"s1","fingerprint":"0123abcd","document":{"kernel":"6.8.0"}}"#;
    const RUN: &str = r#"{"type":"run","id":"00000000-0000-4000-8000-000000000001","host_id":"h1","inventory_id":"i1","software_id":"s1","benchmark":"membw","config":"{}","started_at":"2026-11-01T01:00:00Z","finished_at":"2026-11-01T01:01:00Z","status":"ok","status_reason":null,"metrics":[["membw.all.triad_gbps",30.5,"GB/s","higher"]],"samples":[["membw.all.triad_gbps",0,30.1]],"telemetry":[[0,"cpu","util",0.9]]}"#;
    const END: &str = r#"{"type":"end","records":4}"#;

    /// One test per record type: it parses into its own variant with its fields, and a record of
    /// that type with a field missing or of the wrong type is refused, naming the field.
    #[test]
    fn host_record() {
        let Record::Host(h) = parse_record(HOST).unwrap() else { panic!("not a host") };
        assert_eq!((h.id.as_str(), h.identity.as_str(), h.hostname.as_deref()), ("h1", "serial-1", Some("gpu-01")));
        let err = parse_record(&HOST.replace(r#""identity":"serial-1","#, "")).err().unwrap().to_string();
        assert!(err.contains("missing field `identity`"), "{err}");
    }

    #[test]
    fn inventory_record() {
        let Record::Inventory(i) = parse_record(INVENTORY).unwrap() else { panic!("not an inventory") };
        assert_eq!((i.id.as_str(), i.host_id.as_str(), i.cpu_cores), ("i1", "h1", Some(96)));
        assert_eq!(i.document.get(), r#"{"cpu":{"model_name":"x"}}"#, "the document is kept as it was written");
        let err = parse_record(&INVENTORY.replace(r#""cpu_cores":96"#, r#""cpu_cores":"many""#)).err().unwrap();
        assert!(err.to_string().contains("invalid type"), "{err}");
    }

    #[test]
    fn software_record() {
        let Record::Software(s) = parse_record(SOFTWARE).unwrap() else { panic!("not software") };
        assert_eq!(
            (s.id.as_str(), s.fingerprint.as_str(), s.document.get()),
            ("s1", "0123abcd", r#"{"kernel":"6.8.0"}"#)
        );
        assert!(parse_record(&SOFTWARE.replace(r#","document":{"kernel":"6.8.0"}"#, "")).is_err());
    }

    #[test]
    fn run_record() {
        let Record::Run(r) = parse_record(RUN).unwrap() else { panic!("not a run") };
        assert_eq!((r.benchmark.as_str(), r.status), ("membw", crate::RunStatus::Ok));
        assert_eq!((r.metrics.len(), r.samples.len(), r.telemetry.len()), (1, 1, 1));
        let err = parse_record(&RUN.replace(r#""status":"ok""#, r#""status":"done""#)).err().unwrap().to_string();
        assert!(err.contains("unknown RunStatus \"done\""), "{err}");
    }

    /// A run's value strings point into the line (no copy each), except one with a JSON escape,
    /// which is unescaped into a string of its own.
    #[test]
    fn run_values_borrow_the_line_unless_escaped() {
        use std::borrow::Cow;
        let Record::Run(r) = parse_record(RUN).unwrap() else { panic!("not a run") };
        let (name, _, unit, direction) = &r.metrics[0];
        assert!(matches!((&name.0, &unit.0, &direction.0), (Cow::Borrowed(_), Cow::Borrowed(_), Cow::Borrowed(_))));
        assert!(matches!((&r.samples[0].0 .0, &r.telemetry[0].1 .0), (Cow::Borrowed(_), Cow::Borrowed(_))));
        let escaped = RUN.replace(r#"["membw.all.triad_gbps",30.5"#, r#"["membw.all.\u0074riad \"x\"",30.5"#);
        let Record::Run(r) = parse_record(&escaped).unwrap() else { panic!("not a run") };
        assert!(matches!(&r.metrics[0].0 .0, Cow::Owned(_)));
        assert_eq!(r.metrics[0].0.as_str(), r#"membw.all.triad "x""#);
    }

    #[test]
    fn end_record_and_unknown_types() {
        let Record::End(e) = parse_record(END).unwrap() else { panic!("not an end record") };
        assert_eq!(e.records, 4);
        let err = parse_record(r#"{"type":"gpu","id":"x"}"#).err().unwrap().to_string();
        assert!(err.contains("unknown record type \"gpu\""), "{err}");
        // `type` need not come first.
        assert!(matches!(parse_record(r#"{"records":0,"type":"end"}"#), Ok(Record::End(_))));
    }

    /// Hostile records: each refused with what is wrong, before anything is written.
    #[test]
    fn records_are_validated() {
        let deep = format!("{}1{}", "[".repeat(100_000), "]".repeat(100_000));
        let cases: Vec<(String, &str)> = vec![
            (HOST.replace("gpu-01", &"h".repeat(100_000)), "hostname is 100000 characters long (at most 1024)"),
            (HOST.replace("gpu-01", &"h".repeat(300)), "hostname is longer than a DNS name can be (253)"),
            (HOST.replace("2026-11-02T00:00:00Z", "yesterday"), "last_seen \"yesterday\" is not an RFC 3339 time"),
            (HOST.replace(r#""id":"h1""#, r#""id":"""#), "host id is empty"),
            (
                INVENTORY.replace(r#"{"cpu":{"model_name":"x"}}"#, &deep),
                "the inventory document nests 100000 deep (at most 64)",
            ),
            (INVENTORY.replace(r#""cpu_cores":96"#, r#""cpu_cores":-96"#), "cpu_cores is negative (-96)"),
            (RUN.replace(r#""config":"{}""#, r#""config":"not json""#), "the run's configuration is not JSON"),
            (RUN.replace(r#""higher"]"#, r#""up"]"#), "direction \"up\" is not higher, lower or none"),
            (
                RUN.replace("2026-11-01T01:00:00Z", "2026-13-45T99:00:00Z"),
                "started_at \"2026-13-45T99:00:00Z\" is not an RFC 3339 time",
            ),
        ];
        for (line, want) in cases {
            let record = parse_record(&line).unwrap_or_else(|e| panic!("{want}: does not parse: {e}"));
            let err = validate(&record).expect_err(want);
            assert!(err.contains(want), "want {want:?}, got {err:?}");
        }
        for ok in [HOST, INVENTORY, SOFTWARE, RUN, END] {
            validate(&parse_record(ok).unwrap()).unwrap();
        }
        assert_eq!(json_depth(r#"{"a":[1,{"b":"[[[["}]}"#), 3);
    }

    /// A file of one record of each type goes in whole, a second time adds nothing, and it comes
    /// out again as it went in.
    #[test]
    fn each_record_type_round_trips() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let mut store = Store::open(&dir.path().join("k.db")).await.unwrap();
            let header = r#"{"kiln_export":1,"exported_at":"2026-11-03T00:00:00Z"}"#;
            let file = [header, HOST, INVENTORY, SOFTWARE, RUN, END].join("\n") + "\n";
            let stats = store.import("t.jsonl", &file).await.unwrap();
            assert_eq!((stats.hosts_new, stats.inventories_new, stats.software_new, stats.runs_new), (1, 1, 1, 1));
            assert_eq!((stats.metrics, stats.samples, stats.telemetry), (1, 1, 1));
            let again = store.import("t.jsonl", &file).await.unwrap();
            assert_eq!((again.hosts_new, again.runs_new, again.runs_known), (0, 0, 1));
            let mut out = Vec::new();
            store.export(None, "2026-11-03T00:00:00Z", &mut out).await.unwrap();
            let lines: Vec<&str> = std::str::from_utf8(&out).unwrap().lines().collect();
            assert_eq!(lines.len(), 6, "{lines:?}");
            let same = |a: &str, b: &str| {
                assert_eq!(
                    serde_json::from_str::<serde_json::Value>(a).unwrap(),
                    serde_json::from_str::<serde_json::Value>(b).unwrap()
                )
            };
            for (got, want) in lines[1..].iter().zip([HOST, INVENTORY, SOFTWARE, RUN, END]) {
                same(got, want);
            }
            store.close().await.unwrap();
        });
    }

    /// Uploads that share a transaction (the fleet service's group commit) are each whole or not
    /// at all: a malformed one and one that fails while it is written leave the others stored.
    #[test]
    fn uploads_in_one_transaction_stand_or_fall_alone() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let mut store = Store::open(&dir.path().join("k.db")).await.unwrap();
            let file = export_of;
            let second_run = RUN.replace("000000000001", "000000000002");
            // A run whose inventory no record gives and the database does not hold: refused while
            // writing, after its host was written, so the savepoint must undo that host.
            let orphan = RUN
                .replace("000000000001", "000000000003")
                .replace(r#""inventory_id":"i1""#, r#""inventory_id":"nowhere""#)
                .replace(r#""host_id":"h1""#, r#""host_id":"h2""#);
            let host2 = HOST.replace(r#""id":"h1""#, r#""id":"h2""#).replace("serial-1", "serial-2");
            let uploads = vec![
                anyone("a", file(&[HOST, INVENTORY, SOFTWARE, RUN])),
                anyone("b", "hello\n".to_string()),
                anyone("c", file(&[&host2, SOFTWARE, &orphan])),
                anyone("d", file(&[HOST, INVENTORY, SOFTWARE, &second_run])),
            ];
            let results = store.import_many(&uploads).await;
            assert_eq!(results[0].as_ref().unwrap().runs_new, 1);
            assert!(matches!(&results[1], Err(ImportError::Malformed { line: 1, .. })), "{:?}", results[1]);
            assert!(results[2].is_err(), "{:?}", results[2]);
            assert_eq!(results[3].as_ref().unwrap().runs_new, 1, "sees what the first stored");
            assert_eq!(store.runs(100).await.unwrap().len(), 2);
            assert_eq!(store.hosts().await.unwrap().len(), 1, "the failed upload's host was rolled back");
            store.close().await.unwrap();
        });
    }

    /// A batch of agents' uploads goes in as one import, and each upload still gets its own counts,
    /// its own binding and its own record; one agent's refused upload in the batch (another host's
    /// records) is refused alone, and the others are stored.
    #[test]
    fn a_batch_of_agents_is_stored_as_one_import_each_with_its_own_counts() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let mut store = Store::open(&dir.path().join("k.db")).await.unwrap();
            let file = export_of;
            // Agent k's box: its own identity and record ids, the same software stack as the others.
            let of = |k: usize, s: &str| {
                s.replace(r#""id":"h1""#, &format!(r#""id":"h{k}x""#))
                    .replace(r#""host_id":"h1""#, &format!(r#""host_id":"h{k}x""#))
                    .replace("serial-1", &format!("serial-{k}x"))
                    .replace(r#""id":"i1""#, &format!(r#""id":"i{k}x""#))
                    .replace(r#""inventory_id":"i1""#, &format!(r#""inventory_id":"i{k}x""#))
                    .replace("000000000001", &format!("{k:012}"))
            };
            let agent = |k: usize, text: String| Upload {
                label: format!("agent {k}"),
                text,
                sender: Sender { token_id: format!("t{k}"), client: Some(format!("10.0.0.{k}")), one_host: true },
            };
            let mut uploads = Vec::new();
            for k in 1..=6 {
                store
                    .create_token(
                        &format!("t{k}"),
                        &format!("node-{k}"),
                        crate::Role::Agent,
                        b"h",
                        "2026-11-03T00:00:00Z",
                        None,
                    )
                    .await
                    .unwrap();
                uploads.push(agent(k, file(&[&of(k, HOST), &of(k, INVENTORY), SOFTWARE, &of(k, RUN)])));
            }
            // Agent 6 sends agent 5's host with records of its own: refused, alone.
            uploads[5] = agent(6, file(&[&of(5, HOST).replace(r#""id":"h5x""#, r#""id":"h6y""#), SOFTWARE]));
            let results = store.import_many(&uploads).await;
            for (k, r) in results.iter().enumerate().take(5) {
                let stats = r.as_ref().unwrap_or_else(|e| panic!("agent {}: {e}", k + 1));
                assert_eq!(
                    (stats.records, stats.hosts_new, stats.inventories_new, stats.runs_new),
                    (4, 1, 1, 1),
                    "agent {}: {stats:?}",
                    k + 1
                );
                assert_eq!((stats.metrics, stats.samples, stats.telemetry), (1, 1, 1), "agent {}: {stats:?}", k + 1);
            }
            // The shared stack is counted once, by the first upload that brought it.
            let software: Vec<u64> = results[..5].iter().map(|r| r.as_ref().unwrap().software_new).collect();
            assert_eq!(software, [1, 0, 0, 0, 0]);
            assert!(matches!(&results[5], Err(ImportError::Refused { .. })), "{:?}", results[5]);
            assert_eq!(store.hosts().await.unwrap().len(), 5);
            assert_eq!(store.runs(100).await.unwrap().len(), 5);
            let rows = store.tokens().await.unwrap();
            for k in 1..=5 {
                let t = rows.iter().find(|t| t.id == format!("t{k}")).unwrap();
                assert_eq!(t.host_identity.as_deref(), Some(format!("serial-{k}x").as_str()));
                assert!(t.last_used_at.is_some(), "t{k}");
            }
            let t6 = rows.iter().find(|t| t.id == "t6").unwrap();
            assert_eq!(t6.host_identity, None, "nothing of the refused upload is kept");
            let recorded: Vec<(String, Option<String>, i64)> =
                sqlx::query_as("SELECT token_id, host_identity, records FROM uploads ORDER BY token_id")
                    .fetch_all(&mut store.conn)
                    .await
                    .unwrap();
            let want: Vec<(String, Option<String>, i64)> =
                (1..=5).map(|k| (format!("t{k}"), Some(format!("serial-{k}x")), 4)).collect();
            assert_eq!(recorded, want);
            store.close().await.unwrap();
        });
    }

    /// An export file of `lines` (records), with its header and end record.
    fn export_of(lines: &[&str]) -> String {
        let header = r#"{"kiln_export":1,"exported_at":"2026-11-03T00:00:00Z"}"#;
        let end = format!(r#"{{"type":"end","records":{}}}"#, lines.len());
        [&[header][..], lines, &[end.as_str()]].concat().join("\n") + "\n"
    }

    /// An upload sent with a token that speaks for any host (an admin's or importer's).
    fn anyone(label: &str, text: String) -> Upload {
        Upload { label: label.into(), text, sender: Sender { token_id: "t-any".into(), client: None, one_host: false } }
    }

    /// The probes of a node speaking for another: an agent token is bound to the host of its first
    /// upload, and then records of another host — a host record, or a run or verdict naming another
    /// host's inventory — are refused with nothing kept; a second token's first upload cannot
    /// claim a host another token holds; every accepted upload is recorded.
    #[test]
    fn an_agent_token_speaks_for_its_own_host_only() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let mut store = Store::open(&dir.path().join("k.db")).await.unwrap();
            for (id, name) in [("ta", "node-a"), ("tb", "node-b"), ("tc", "node-c")] {
                store.create_token(id, name, crate::Role::Agent, b"h", "2026-11-03T00:00:00Z", None).await.unwrap();
            }
            let file = export_of;
            let agent = |token: &str, label: &str, text: String| Upload {
                label: label.into(),
                text,
                sender: Sender { token_id: token.into(), client: Some("10.0.0.9".into()), one_host: true },
            };
            // B's own box: another identity, record ids of its own.
            let b = |s: &str| {
                s.replace(r#""id":"h1""#, r#""id":"hb""#)
                    .replace(r#""host_id":"h1""#, r#""host_id":"hb""#)
                    .replace("serial-1", "serial-2")
                    .replace(r#""id":"i1""#, r#""id":"ib""#)
                    .replace(r#""inventory_id":"i1""#, r#""inventory_id":"ib""#)
                    .replace("000000000001", "0000000000b1")
            };
            let one = async |store: &mut Store, u: Upload| store.import_many(&[u]).await.remove(0);
            assert!(one(&mut store, agent("ta", "a", file(&[HOST, INVENTORY, SOFTWARE, RUN]))).await.is_ok());
            assert!(one(&mut store, agent("tb", "b", file(&[&b(HOST), &b(INVENTORY), SOFTWARE, &b(RUN)])))
                .await
                .is_ok());
            let bound =
                |rows: &[crate::TokenRow], id: &str| rows.iter().find(|t| t.id == id).unwrap().host_identity.clone();
            let rows = store.tokens().await.unwrap();
            assert_eq!((bound(&rows, "ta"), bound(&rows, "tb")), (Some("serial-1".into()), Some("serial-2".into())));

            // B sends A's identity with fresh record ids.
            let forged = HOST.replace(r#""id":"h1""#, r#""id":"hx""#);
            let forged_run =
                RUN.replace(r#""host_id":"h1""#, r#""host_id":"hx""#).replace("000000000001", "0000000000f1");
            let refused = one(&mut store, agent("tb", "forged", file(&[&forged, SOFTWARE, &forged_run]))).await;
            let Err(ImportError::Refused { message, .. }) = refused else { panic!("{refused:?}") };
            assert!(message.contains("speaks for host serial-2") && message.contains("serial-1"), "{message}");
            // B's own host record, and a run on A's inventory.
            let on_a = b(RUN)
                .replace(r#""inventory_id":"ib""#, r#""inventory_id":"i1""#)
                .replace("0000000000b1", "0000000000f2");
            let refused = one(&mut store, agent("tb", "on-a", file(&[&b(HOST), SOFTWARE, &on_a]))).await;
            let Err(ImportError::Refused { message, .. }) = refused else { panic!("{refused:?}") };
            assert!(message.contains("belongs to another host"), "{message}");
            // A third token's first upload claims A's host.
            let refused = one(&mut store, agent("tc", "claim", file(&[HOST, INVENTORY, SOFTWARE, RUN]))).await;
            let Err(ImportError::Refused { message, .. }) = refused else { panic!("{refused:?}") };
            assert!(message.contains("node-a"), "{message}");
            assert_eq!(bound(&store.tokens().await.unwrap(), "tc"), None, "nothing of a refused upload is kept");

            // Nothing of the refused uploads was kept; an importer's upload of any host is taken.
            assert_eq!(store.hosts().await.unwrap().len(), 2);
            assert_eq!(store.runs(100).await.unwrap().len(), 2);
            assert!(one(&mut store, anyone("site", file(&[&forged, SOFTWARE, &forged_run]))).await.is_ok());
            assert_eq!(store.runs(100).await.unwrap().len(), 3);
            let recorded: Vec<(String, Option<String>, Option<String>)> =
                sqlx::query_as("SELECT token_id, host_identity, client FROM uploads ORDER BY rowid")
                    .fetch_all(&mut store.conn)
                    .await
                    .unwrap();
            let ip = Some("10.0.0.9".to_string());
            assert_eq!(
                recorded,
                [
                    ("ta".into(), Some("serial-1".into()), ip.clone()),
                    ("tb".into(), Some("serial-2".into()), ip),
                    ("t-any".into(), None, None)
                ]
            );
            store.close().await.unwrap();
        });
    }
}

/// Property: whatever kiln stores, export → import into an empty database → export gives the same
/// file, byte for byte — names with quotes, backslashes and non-ASCII, odd floats, many runs,
/// telemetry and verdicts included.
#[cfg(test)]
mod roundtrip {
    use proptest::prelude::*;

    use crate::{Direction, Metric, NewInventory, NewRun, NewVerdict, Queries, RunStatus, Store};

    fn text() -> impl Strategy<Value = String> {
        proptest::string::string_regex("[a-zA-Z0-9 _.:/\"\\\\é✓-]{0,24}").unwrap()
    }

    fn finite() -> impl Strategy<Value = f64> {
        prop_oneof![-1e12f64..1e12, Just(0.0), Just(1e-300), Just(0.1 + 0.2), Just(123_456_789.123_456_79)]
    }

    #[derive(Debug, Clone)]
    struct Box1 {
        identity: String,
        hostname: Option<String>,
        runs: Vec<(String, Vec<(String, f64)>, Vec<(i64, f64)>, Vec<(i64, String, f64)>)>,
        verdict: Option<(String, String)>,
    }

    fn a_box() -> impl Strategy<Value = Box1> {
        let run = (
            text(),
            proptest::collection::vec((text(), finite()), 0..4),
            proptest::collection::vec((0i64..5, finite()), 0..4),
            proptest::collection::vec((0i64..100_000, text(), finite()), 0..4),
        );
        (
            "[a-z0-9]{1,12}",
            proptest::option::of(text()),
            proptest::collection::vec(run, 0..3),
            proptest::option::of((prop_oneof![Just("accept"), Just("reject"), Just("inconclusive")], text())),
        )
            .prop_map(|(identity, hostname, runs, verdict)| Box1 {
                identity,
                hostname,
                runs,
                verdict: verdict.map(|(v, s)| (v.to_string(), s)),
            })
    }

    async fn fill(store: &mut Store, boxes: &[Box1]) {
        for (i, b) in boxes.iter().enumerate() {
            let saved = store
                .save_inventory(&NewInventory {
                    host_identity: format!("{}-{i}", b.identity),
                    hostname: b.hostname.clone(),
                    collected_at: "2026-12-01T00:00:00Z".into(),
                    schema_version: 1,
                    config_fingerprint: "cfg".into(),
                    config_name: "config ✓".into(),
                    cpu_model: b.hostname.clone(),
                    cpu_packages: 2,
                    cpu_cores: 8,
                    cpu_threads: 16,
                    memory_bytes: Some(1 << 34),
                    kernel_release: None,
                    problem_count: 0,
                    document: serde_json::json!({ "name": b.hostname, "n": i }).to_string(),
                })
                .await
                .unwrap();
            for (r, (bench, metrics, samples, telemetry)) in b.runs.iter().enumerate() {
                let mut names = std::collections::BTreeSet::new();
                store
                    .save_run(&NewRun {
                        host_id: saved.host_id.clone(),
                        inventory_id: Some(saved.inventory_id.clone()),
                        software: None,
                        benchmark: format!("b{bench}"),
                        config: serde_json::json!({ "label": bench }).to_string(),
                        started_at: format!("2026-12-01T0{r}:00:00Z"),
                        finished_at: format!("2026-12-01T0{r}:30:00Z"),
                        status: RunStatus::Ok,
                        status_reason: None,
                        metrics: metrics
                            .iter()
                            .filter(|(n, _)| names.insert(n.clone()))
                            .map(|(n, v)| Metric {
                                name: format!("m{n}"),
                                value: *v,
                                unit: "GB/s".into(),
                                direction: Direction::Higher,
                            })
                            .collect(),
                        samples: samples
                            .iter()
                            .enumerate()
                            .map(|(k, (_, v))| ("m".to_string(), k as i64, *v))
                            .collect(),
                        telemetry: telemetry
                            .iter()
                            .map(|(t, n, v)| (*t, "gpu0".to_string(), format!("c{n}"), *v))
                            .collect(),
                    })
                    .await
                    .unwrap();
            }
            if let Some((verdict, spec)) = &b.verdict {
                store
                    .save_verdict(&NewVerdict {
                        host_id: saved.host_id.clone(),
                        inventory_id: saved.inventory_id.clone(),
                        judged_at: "2026-12-01T12:00:00Z".into(),
                        spec_name: "spec".into(),
                        spec_hash: "abc".into(),
                        spec: spec.clone(),
                        verdict: verdict.clone(),
                        failed: 0,
                        document: serde_json::json!({ "verdict": verdict, "note": spec }).to_string(),
                    })
                    .await
                    .unwrap();
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
        #[test]
        fn export_import_export_is_identical(boxes in proptest::collection::vec(a_box(), 1..4)) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let dir = tempfile::tempdir().unwrap();
                let mut a = Store::open(&dir.path().join("a.db")).await.unwrap();
                fill(&mut a, &boxes).await;
                let mut first = Vec::new();
                a.export(None, "2026-12-03T00:00:00Z", &mut first).await.unwrap();
                let mut b = Store::open(&dir.path().join("b.db")).await.unwrap();
                b.import("a.jsonl", std::str::from_utf8(&first).unwrap()).await.unwrap();
                let mut second = Vec::new();
                b.export(None, "2026-12-03T00:00:00Z", &mut second).await.unwrap();
                prop_assert_eq!(String::from_utf8(first).unwrap(), String::from_utf8(second).unwrap());
                // And nothing was lost on the way: every value is the one stored, to the last bit.
                let values = |runs: Vec<crate::RunRow>| -> Vec<(String, u64)> {
                    let mut v: Vec<(String, u64)> = runs
                        .into_iter()
                        .flat_map(|r| r.metrics.into_iter().map(move |m| (format!("{}/{}", r.id, m.name), m.value.to_bits())))
                        .collect();
                    v.sort();
                    v
                };
                prop_assert_eq!(values(a.runs(1000).await.unwrap()), values(b.runs(1000).await.unwrap()));
                Ok(())
            })?;
        }
    }
}

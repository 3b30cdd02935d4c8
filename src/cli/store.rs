//! What the results database holds: `kiln runs`, `hosts`, `show`, `export` and `import`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use kiln_db::{ExportStats, ImportStats, Queries, RunDetail};
use serde::Serialize;

use super::args::{Show, Window};
use super::{window_start, Ctx, Exit, Output, View};
use kiln_app::views::{hosts_view, runs_view};
use kiln_inventory::Inventory;
use kiln_text::progress;

pub fn runs(limit: i64, ctx: &Ctx) -> Result<Output> {
    let database = ctx.location()?.shown();
    ctx.output(&ctx.with_any(async |store| runs_view(store, limit, database).await)?)
}

pub fn hosts(ctx: &Ctx) -> Result<Output> {
    let database = ctx.location()?.shown();
    ctx.output(&ctx.with_any(async |store| hosts_view(store, database).await)?)
}

/// `kiln db check`.
#[derive(Serialize)]
pub struct Checked {
    pub database: PathBuf,
    pub ok: bool,
    /// SQLite's findings (`["ok"]` when none).
    pub findings: Vec<String>,
}

impl View for Checked {
    fn render(&self) -> String {
        if self.ok {
            return format!("{}: integrity check passed", self.database.display());
        }
        let mut text =
            format!("{}: integrity check found {} problem(s)\n", self.database.display(), self.findings.len());
        for f in &self.findings {
            text.push_str(&format!("  {f}\n"));
        }
        text
    }
}

pub fn check(ctx: &Ctx) -> Result<Output> {
    let findings = ctx.with_store(async |store| store.integrity_check().await)?;
    let ok = findings.len() == 1 && findings[0] == "ok";
    Ok(ctx.output(&Checked { database: ctx.db_path()?, ok, findings })?.with_exit(Exit::check(!ok)))
}

/// `kiln show run`: the stored run whole. Its configuration and software stack are JSON objects.
#[derive(Serialize)]
#[serde(transparent)]
pub struct ShowRun(pub RunDetail);

impl View for ShowRun {
    fn render(&self) -> String {
        let (r, d) = (&self.0.run, &self.0);
        let mut text = format!(
            "run {} on {} ({}), {} {}\n{} .. {}\nconfig {}\n",
            r.id,
            r.hostname.as_deref().unwrap_or("?"),
            r.host_id,
            r.benchmark,
            r.status,
            r.started_at,
            r.finished_at.as_deref().unwrap_or("?"),
            r.config
        );
        for m in &r.metrics {
            let better = match m.direction {
                kiln_db::Direction::Higher => ", higher is better",
                kiln_db::Direction::Lower => ", lower is better",
                kiln_db::Direction::None => "",
            };
            text.push_str(&format!("  {:<32} {:>10.3} {}{better}\n", m.name, m.value, m.unit));
        }
        text.push_str(&render_samples(&d.samples));
        match d.software.as_deref().map(serde_json::from_str::<serde_json::Value>) {
            Some(Ok(doc)) => {
                text.push_str("software\n");
                let mut leaves = Vec::new();
                json_leaves(&doc, String::new(), &mut leaves);
                for (path, value) in leaves {
                    text.push_str(&format!("  {path:<32} {value}\n"));
                }
            }
            Some(Err(_)) => text.push_str("software: a document this kiln cannot read; try --json\n"),
            None => text.push_str("software: not recorded\n"),
        }
        for line in kiln_inventory::telemetry::summarize(&d.telemetry) {
            text.push_str(&format!("telemetry {line}\n"));
        }
        text
    }
}

/// One line per series of raw samples: how many, min, median, max.
fn render_samples(samples: &[(String, i64, f64)]) -> String {
    let mut series: std::collections::BTreeMap<&str, Vec<f64>> = Default::default();
    for (name, _, v) in samples {
        series.entry(name).or_default().push(*v);
    }
    let mut text = format!("samples ({} raw values)\n", samples.len());
    for (name, mut values) in series {
        values.sort_by(f64::total_cmp);
        text.push_str(&format!(
            "  {name:<32} {:>5} values  min {:.4}  median {:.4}  max {:.4}\n",
            values.len(),
            values[0],
            values[values.len() / 2],
            values[values.len() - 1]
        ));
    }
    text
}

/// The scalar leaves of a JSON document with their dotted paths; nulls are left out.
fn json_leaves(value: &serde_json::Value, path: String, out: &mut Vec<(String, String)>) {
    use serde_json::Value;
    let join = |key: &str| if path.is_empty() { key.to_string() } else { format!("{path}.{key}") };
    match value {
        Value::Null => {}
        Value::Object(map) => map.iter().for_each(|(k, v)| json_leaves(v, join(k), out)),
        Value::Array(items) => items.iter().enumerate().for_each(|(i, v)| json_leaves(v, join(&i.to_string()), out)),
        Value::String(s) => out.push((path, s.clone())),
        other => out.push((path, other.to_string())),
    }
}

pub fn show(what: Show, ctx: &Ctx) -> Result<Output> {
    match what {
        Show::Run { id } => {
            let run = ctx.with_any(async |store| store.run(&id).await)?;
            ctx.output(&ShowRun(run))
        }
        Show::Inventory { id } => {
            let row = ctx.with_any(async |store| store.inventory(&id).await)?;
            if ctx.json {
                // The document carries its own schema_version; printed exactly as stored.
                return Ok(Output::new(row.document));
            }
            let inv: Inventory = serde_json::from_str(&row.document).with_context(|| {
                format!(
                    "inventory {} in {} is not a document this kiln can read; try --json",
                    row.id,
                    ctx.location().map(|l| l.shown()).unwrap_or_default()
                )
            })?;
            let text = format!(
                "inventory {} (collected {})\n{}",
                row.id,
                row.collected_at,
                kiln_inventory::summary::summary(&inv)
            );
            Ok(Output::new(text))
        }
    }
}

/// `kiln export -o FILE --json`: what was written.
#[derive(Serialize)]
pub struct Exported {
    pub file: Option<PathBuf>,
    pub stats: ExportStats,
}

impl View for Exported {
    fn render(&self) -> String {
        String::new()
    }
}

fn export_summary(stats: &ExportStats) -> String {
    let applies = match stats.applies {
        0 => String::new(),
        n => format!(", {n} provisioning applies"),
    };
    format!(
        "exported {} hosts, {} inventories, {} runs, {} metrics, {} samples, {} telemetry points{applies}",
        stats.hosts, stats.inventories, stats.runs, stats.metrics, stats.samples, stats.telemetry
    )
}

pub fn export(window: &Window, output: Option<&Path>, ctx: &Ctx) -> Result<Output> {
    let since = window.since.as_deref().map(window_start).transpose()?.map(kiln_text::timefmt::rfc3339);
    let now = kiln_text::timefmt::now_rfc3339();
    let path = output.unwrap_or(Path::new("-"));
    let stats = super::outfile::write_output(path, |w| {
        ctx.with_store(async |store| store.export(since.as_deref(), &now, w).await)
    })?;
    progress(&export_summary(&stats));
    if path.as_os_str() == "-" {
        // The JSON lines are the output; the summary went to stderr.
        return Ok(Output::empty(Exit::Ok));
    }
    ctx.output(&Exported { file: Some(path.to_path_buf()), stats })
}

/// `kiln import`: one entry per file.
#[derive(Serialize)]
pub struct Imports {
    pub imports: Vec<Imported>,
}

#[derive(Serialize)]
pub struct Imported {
    pub file: String,
    pub stats: ImportStats,
    pub seconds: f64,
}

impl View for Imports {
    fn render(&self) -> String {
        let mut text = String::new();
        for i in &self.imports {
            let s = &i.stats;
            text.push_str(&format!(
                "{}: {} records; new: {} hosts, {} inventories, {} runs ({} metrics, {} samples, {} telemetry points); \
                 {} runs already here{}; {:.2} s\n",
                i.file,
                s.records,
                s.hosts_new,
                s.inventories_new,
                s.runs_new,
                s.metrics,
                s.samples,
                s.telemetry,
                s.runs_known,
                match (s.applies_new, s.applies_updated) {
                    (0, 0) => String::new(),
                    (new, more) => format!("; provisioning applies: {new} new, {more} with more of their story"),
                },
                i.seconds
            ));
        }
        text
    }
}

pub fn import(files: &[PathBuf], ctx: &Ctx) -> Result<Output> {
    let mut imports = Vec::new();
    for f in files {
        let name = f.display().to_string();
        let text = String::from_utf8(super::read_input(f)?).map_err(|e| {
            anyhow::anyhow!("{name}: not UTF-8 text (byte {}); nothing was imported", e.utf8_error().valid_up_to())
        })?;
        let started = std::time::Instant::now();
        let stats = match ctx.with_any(async |store| Ok(store.import(&name, &text).await))? {
            Ok(stats) => stats,
            Err(e) => {
                if imports.is_empty() {
                    // Nothing went in: a database this command created would be one made by mistake.
                    ctx.discard_created()?;
                }
                return Err(e.into());
            }
        };
        imports.push(Imported { file: name, stats, seconds: started.elapsed().as_secs_f64() });
    }
    ctx.output(&Imports { imports })
}

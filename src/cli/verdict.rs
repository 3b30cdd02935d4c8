//! Verdicts from the command line: the one `commission` reaches, `kiln verdict` re-judging stored
//! evidence, `kiln spec lint` and `kiln spec capture`.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context as _, Result};
use serde::Serialize;

use super::args::{Judge, Source};
use super::{Ctx, Exit, Output, View};
use kiln_app::judging::{judge_stored, Stored};
use kiln_db::Queries;
use kiln_inventory::Inventory;
use kiln_sku::spec::{self, LoadedSpec};
use kiln_sku::verdict::{self, Decision, Verdict};

/// The spec `judge` names, or the one that applies to `inv`.
///
/// # Errors
/// A spec that does not load (every problem with `file:line:col`), or none or several apply.
pub fn choose_spec(judge: &Judge, inv: &Inventory) -> Result<std::result::Result<LoadedSpec, String>> {
    if let Some(file) = &judge.spec {
        return Ok(Ok(spec::load(file).map_err(|e| anyhow::anyhow!("{e}"))?));
    }
    let all = spec::all_specs(&judge.specs).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(spec::select(all, inv).map_err(|e| e.to_string()))
}

/// Exit status of a decision.
pub fn exit_of(d: Decision) -> Exit {
    match d {
        Decision::Accept => Exit::Ok,
        Decision::Reject => Exit::CheckFailed,
        Decision::Inconclusive => Exit::Inconclusive,
    }
}

/// Writes the OCP output of a verdict where `--ocp` asks for it.
///
/// # Errors
/// The file cannot be written (an existing one is never replaced by mistake: `outfile`).
pub fn write_ocp(judge: &Judge, v: &Verdict, inv: &Inventory) -> Result<()> {
    if let Some(path) = &judge.ocp {
        let command_line: Vec<String> = std::env::args().collect();
        let text = verdict::ocp::lines(v, inv, &command_line.join(" "), &kiln_text::timefmt::now_rfc3339());
        super::outfile::write_output(path, |w| Ok(w.write_all(text.as_bytes())?))
            .with_context(|| format!("writing the OCP output to {}", path.display()))?;
    }
    Ok(())
}

/// `kiln verdict --json`.
#[derive(Serialize)]
pub struct Rejudged {
    pub kind: &'static str,
    #[serde(flatten)]
    pub verdict: Verdict,
    pub verdict_id: Option<String>,
    #[serde(skip)]
    pub verbose: bool,
}

impl View for Rejudged {
    fn render(&self) -> String {
        let mut text = self.verdict.render(self.verbose);
        if let Some(id) = &self.verdict_id {
            text.push_str(&format!("stored as verdict {id}\n"));
        }
        text
    }
}

/// `kiln verdict --inventory ID`: the stored evidence judged again.
pub fn rejudge(
    inventory: &str,
    no_perf: bool,
    no_save: bool,
    verbose: bool,
    judge: &Judge,
    ctx: &Ctx,
) -> Result<Output> {
    let row = ctx.with_store(async |store| store.inventory(inventory).await)?;
    let inv: Inventory = serde_json::from_str(&row.document)
        .with_context(|| format!("inventory {}: the stored document does not parse", row.id))?;
    let spec = choose_spec(judge, &inv)?.map_err(|e| anyhow::anyhow!("{e}"))?;
    let stored = Stored { inventory_id: &row.id, host_id: &row.host_id };
    let (v, id) = judge_stored(ctx, &inv, &stored, &spec, judge.allow_skip, !no_perf, !no_save)?;
    write_ocp(judge, &v, &inv)?;
    let exit = exit_of(v.verdict);
    let view = Rejudged { kind: "verdict", verdict: v, verdict_id: id, verbose };
    Ok(ctx.output(&view)?.with_exit(exit))
}

/// `kiln spec lint --json`.
#[derive(Serialize)]
pub struct Lint {
    pub kind: &'static str,
    pub files: Vec<LintedFile>,
}

#[derive(Serialize)]
pub struct LintedFile {
    pub file: String,
    pub name: Option<String>,
    pub hash: Option<String>,
    pub errors: Vec<kiln_provision::image::SpecError>,
}

impl View for Lint {
    fn render(&self) -> String {
        let mut text = String::new();
        for f in &self.files {
            if f.errors.is_empty() {
                text.push_str(&format!("{}: ok ({})\n", f.file, f.name.as_deref().unwrap_or("")));
            }
            for e in &f.errors {
                text.push_str(&format!("{e}\n"));
            }
        }
        text
    }
}

pub fn lint(files: &[std::path::PathBuf], ctx: &Ctx) -> Result<Output> {
    let mut out = Vec::new();
    let loaded: Vec<(String, std::result::Result<LoadedSpec, kiln_provision::image::SpecErrors>)> = if files.is_empty()
    {
        spec::BUILT_IN
            .iter()
            .map(|(name, text)| {
                let file = format!("(built in) specs/{name}");
                (file.clone(), spec::parse(&file, (*text).to_string()))
            })
            .collect()
    } else {
        files.iter().map(|f| (f.display().to_string(), spec::load(f))).collect()
    };
    for (file, result) in loaded {
        out.push(match result {
            Ok(s) => LintedFile { file, name: Some(s.spec.name), hash: Some(s.hash), errors: Vec::new() },
            Err(e) => LintedFile { file, name: None, hash: None, errors: e.0 },
        });
    }
    let failed = out.iter().any(|f| !f.errors.is_empty());
    Ok(ctx.output(&Lint { kind: "spec-lint", files: out })?.with_exit(Exit::check(failed)))
}

/// `kiln spec references`.
#[derive(Serialize)]
pub struct References {
    pub kind: &'static str,
    pub references: Vec<&'static spec::references::Reference>,
}

impl View for References {
    fn render(&self) -> String {
        let mut text = String::new();
        let mut sku = "";
        for r in &self.references {
            if r.sku != sku {
                sku = &r.sku;
                text.push_str(&format!("{sku}\n"));
            }
            text.push_str(&format!(
                "  {:<42} {:>14}  {:<12} {}\n      source: {}\n",
                r.metric,
                r.value,
                r.kind.as_str(),
                r.conditions,
                r.source
            ));
        }
        text
    }
}

/// `kiln spec references [SKU]`: the shipped table, or one SKU's part of it.
///
/// # Errors
/// A SKU the table has no figure for.
pub fn references(sku: Option<&str>, ctx: &Ctx) -> Result<Output> {
    let all = spec::references::all();
    let references: Vec<_> = all.iter().filter(|r| sku.is_none_or(|s| r.sku.starts_with(s))).collect();
    if references.is_empty() {
        let mut skus: Vec<&str> = all.iter().map(|r| r.sku.as_str()).collect();
        skus.dedup();
        anyhow::bail!("no reference figures for \"{}\"; the table has {}", sku.unwrap_or(""), skus.join(", "));
    }
    ctx.output(&References { kind: "spec-references", references })
}

/// `kiln spec capture`.
pub fn capture(
    source: &Source,
    inventory: Option<&str>,
    config: Option<&str>,
    fraction: f64,
    name: Option<String>,
    output: Option<&Path>,
    ctx: &Ctx,
) -> Result<Output> {
    anyhow::ensure!(fraction > 0.0 && fraction <= 1.0, "--fraction {fraction}: give a fraction in (0, 1]");
    let (inv, metrics, origin) = capture_evidence(source, inventory, config, ctx)?;
    let name = name.unwrap_or_else(|| format!("captured-{}", inv.fingerprints.config));
    let text = spec::capture::capture(&name, &inv, &metrics, fraction, &origin);
    // What is written must load: a captured spec is a starting point, never a broken file.
    spec::parse("(captured)", text.clone())
        .map_err(|e| anyhow::anyhow!("kiln wrote a spec it cannot load (a bug): {e}"))?;
    match output {
        Some(path) => {
            super::outfile::write_output(path, |w| Ok(w.write_all(text.as_bytes())?))?;
            Ok(Output::new(format!("wrote spec {name} to {}", path.display())))
        }
        None => Ok(Output::new(text)),
    }
}

fn capture_evidence(
    source: &Source,
    inventory: Option<&str>,
    config: Option<&str>,
    ctx: &Ctx,
) -> Result<(Inventory, BTreeMap<String, Vec<f64>>, String)> {
    if let Some(config) = config {
        let (doc, metrics, full) = ctx
            .with_store(async |store| {
                let hosts = store.hosts().await?;
                let host = hosts.iter().find(|h| h.config_fingerprint.starts_with(config));
                let Some(h) = host else { return Ok(None) };
                let full = h.config_fingerprint.clone();
                let inv = store.inventory(h.latest_inventory.as_deref().unwrap_or("")).await?;
                let metrics = store.accepted_metric_values(&full, "").await?;
                Ok(Some((inv.document, metrics, full)))
            })?
            .with_context(|| format!("no host of configuration {config} in the database"))?;
        let inv: Inventory = serde_json::from_str(&doc)?;
        let boxes = metrics.values().map(Vec::len).max().unwrap_or(0);
        return Ok((inv, metrics, format!("the {boxes} accepted boxes of configuration {full}")));
    }
    let (inv, origin) = match inventory {
        Some(id) => {
            let row = ctx.with_store(async |store| store.inventory(id).await)?;
            (serde_json::from_str::<Inventory>(&row.document)?, format!("inventory {}", row.id))
        }
        None => {
            let inv = super::inventory::take_inventory(source)?;
            let origin = format!("host {}", inv.os.hostname.as_deref().unwrap_or("(unnamed)"));
            (inv, origin)
        }
    };
    // The runs of that inventory (or of this box's newest stored one).
    let wanted = inventory.map(str::to_string);
    let identity = inv.fingerprints.host.clone();
    let runs = ctx.with_store(async |store| {
        let id = match wanted {
            Some(id) => Some(store.inventory(&id).await?.id),
            None => {
                let hosts = store.hosts().await?;
                hosts.into_iter().find(|h| Some(&h.identity) == identity.as_ref()).and_then(|h| h.latest_inventory)
            }
        };
        match id {
            Some(id) => store.runs_of_inventory(&id).await,
            None => Ok(Vec::new()),
        }
    });
    let mut metrics: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for r in runs.unwrap_or_default().into_iter().filter(|r| r.status.is_result()) {
        for m in r.metrics {
            metrics.insert(m.name, vec![m.value]);
        }
    }
    Ok((inv, metrics, origin))
}

//! Questions about the fleet in the database: `kiln compare`, `outliers`, `regressions`, `report`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;

use super::args::By;
use super::{window_start, Ctx, Exit, Output, View};
use kiln_app::fleet::{self, Filter};
use kiln_app::views::{compare_view, outliers_view, regressions_view};
use kiln_db::Queries;

pub fn compare(
    subjects: &[String],
    by: Option<By>,
    prices: Option<&Path>,
    filter: &Filter,
    noise: f64,
    ctx: &Ctx,
) -> Result<Output> {
    let prices = match prices {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            fleet::parse_prices(&text).with_context(|| p.display().to_string())?
        }
        None => BTreeMap::new(),
    };
    let view = ctx.with_any_sync(|rt, store| {
        rt.block_on(compare_view(store, subjects, by.map(Into::into), &prices, filter, noise))
    })?;
    ctx.output(&view)
}

pub fn outliers(filter: &Filter, threshold: f64, min_deviation: f64, ctx: &Ctx) -> Result<Output> {
    ctx.output(&ctx.with_any(async |store| outliers_view(store, filter, threshold, min_deviation).await)?)
}

pub fn regressions(since: &str, metric: Option<String>, noise: f64, ctx: &Ctx) -> Result<Output> {
    let view = ctx.with_any_sync(|rt, store| rt.block_on(regressions_view(store, since, metric, noise)))?;
    let found = !view.regressions.is_empty();
    Ok(ctx.output(&view)?.with_exit(Exit::check(found)))
}

/// `kiln report`'s arguments.
pub struct ReportArgs {
    pub host: Option<String>,
    pub config: Option<String>,
    pub run: Option<String>,
    pub cluster: Option<String>,
    pub html: Option<PathBuf>,
    pub markdown: Option<PathBuf>,
    pub since: String,
}

/// `kiln report --json`: what was written.
#[derive(Serialize)]
pub struct Written {
    pub title: String,
    pub html: Option<PathBuf>,
    pub markdown: Option<PathBuf>,
}

impl View for Written {
    fn render(&self) -> String {
        String::new()
    }
}

pub fn report(args: ReportArgs, ctx: &Ctx) -> Result<Output> {
    if args.html.is_none() && args.markdown.is_none() {
        anyhow::bail!("say where the report goes: --html FILE and/or --markdown FILE");
    }
    let start = window_start(&args.since)?;
    let report = match &args.cluster {
        Some(id) => {
            let runs = ctx.with_any_sync(|rt, store| Ok(rt.block_on(store.runs_of_cluster(id))?))?;
            kiln_app::cluster_report::build(id, &runs)
        }
        None => {
            let asked = kiln_app::report::subject(args.host, args.config, args.run)
                .context("give one of --host, --config, --run or --cluster")?;
            let evidence =
                ctx.with_any_sync(|rt, store| Ok(rt.block_on(kiln_app::report::gather(store, &asked, start))?))?;
            kiln_app::report::build(&evidence)
        }
    };
    let write = |path: &Path, text: String| {
        super::outfile::write_output(path, |w| w.write_all(text.as_bytes()).with_context(|| path.display().to_string()))
    };
    if let Some(path) = &args.html {
        write(path, kiln_app::report::html(&report))?;
    }
    if let Some(path) = &args.markdown {
        write(path, kiln_app::report::markdown(&report))?;
    }
    ctx.output(&Written { title: report.title, html: args.html, markdown: args.markdown })
}

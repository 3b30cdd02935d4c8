//! `kiln bench gpu collectives`: NCCL's all-reduce, all-gather and reduce-scatter over the box's
//! GPUs through `kiln-gpu collectives`, message sizes doubling up to `--max-bytes`, bus bandwidth
//! as nccl-tests computes it — the figure an HGX box is bought on. Every size's result is checked
//! by kiln-gpu (a GPU that receives a wrong value fails the run). A bus bandwidth above what each
//! GPU's links can carry makes the run `invalid`: where every pair is joined the same way over
//! NVLink, those links one way (NVLink SHARP's in-switch reduction lets an all-reduce reach the
//! links × its bus factor 2(n−1)/n, so that is its bound); where only PCIe joins them, each GPU's
//! own link; a mixed box gets no bound.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use kiln_bench::cluster::Collective;
use kiln_db::{Direction, Metric};
use kiln_gpu::collectives::{Report as Rows, Row};
use kiln_gpu::request::{CollectivesArgs, Request};
use serde::{Deserialize, Serialize};

use super::p2p::path;
use super::{
    close, interpret, read_document, render_verdict, run_all, Closing, GpuReport, Prepared, Shown, PEAK_MARGIN,
    TELEMETRY_INTERVAL,
};
use crate::runs::{sampler, Outcome, Report};
use kiln_inventory::telemetry;
use kiln_inventory::Inventory;
use kiln_text::timefmt::now_rfc3339;
use kiln_text::Progress;

/// What `kiln bench gpu collectives` measures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CollectivesConfig {
    pub collectives: Vec<Collective>,
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub iterations: usize,
    pub gpus: Vec<usize>,
    pub timeout_s: u64,
}

/// What one GPU's links carry one way, GB/s, and how that was found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LinkBound {
    pub gbps: f64,
    /// "NV18 (NVLink 4)", "PCIe".
    pub via: String,
}

/// The bound every GPU's traffic is under: the shared NVLink kind where every pair has the same
/// one, each GPU's PCIe link where no pair has NVLink, else none.
pub fn link_bound(inv: &Inventory, gpus: &[usize]) -> Option<LinkBound> {
    let paths: Vec<_> =
        gpus.iter().flat_map(|&a| gpus.iter().filter(move |&&b| b != a).map(move |&b| (a, b))).collect();
    let paths: Vec<_> = paths.into_iter().map(|(a, b)| path(inv, a, b)).collect();
    let first = paths.first()?;
    if paths.iter().all(|p| p.kind.starts_with("NV") && p.kind == first.kind) {
        let gbps = paths.iter().map(|p| p.ceiling_gbps).collect::<Option<Vec<f64>>>()?.into_iter().reduce(f64::min)?;
        return Some(LinkBound { gbps, via: first.kind.clone() });
    }
    if paths.iter().any(|p| p.kind.starts_with("NV") || p.kind == "?") {
        return None;
    }
    let link = |g: usize| {
        let d = inv.gpus.devices.iter().find(|d| d.index as usize == g)?;
        kiln_bench::peaks::pcie_gbps(d.pcie.max_gen?, d.pcie.max_width?)
    };
    let gbps = gpus.iter().map(|&g| link(g)).collect::<Option<Vec<f64>>>()?.into_iter().reduce(f64::min)?;
    Some(LinkBound { gbps, via: "PCIe".into() })
}

/// The most bus bandwidth a collective can show over `n` GPUs whose links carry `link` one way.
pub fn busbw_bound(c: Collective, n: usize, link: f64) -> f64 {
    match c {
        Collective::AllReduce => link * c.bus_factor(n),
        _ => link,
    }
}

/// `kiln bench gpu collectives`' document.
pub type GpuCollectivesReport = GpuReport<CollectivesConfig, CollectivesBody>;

/// What `GpuCollectivesReport` holds besides the envelope every GPU benchmark shares.
#[derive(Debug, Clone, Serialize)]
pub struct CollectivesBody {
    pub bound: Option<LinkBound>,
    pub run: Option<Rows>,
    pub error: Option<String>,
}

/// Runs `kiln-gpu collectives` over the chosen GPUs and judges the rows.
pub fn collectives(
    inv: &Inventory,
    prepared: &Prepared,
    config: CollectivesConfig,
    interrupted: &AtomicBool,
) -> Outcome {
    let started_at = now_rfc3339();
    let sampler = sampler(inv, TELEMETRY_INTERVAL);
    let progress = Progress::new();
    progress.update(&format!("gpu collectives: {} GPUs through NCCL", config.gpus.len()));
    let timeout = Duration::from_secs(config.timeout_s);
    let devices: Vec<String> = config.gpus.iter().map(usize::to_string).collect();
    let ops: Vec<&str> = config.collectives.iter().map(|c| c.name()).collect();
    let args = Request::Collectives(CollectivesArgs {
        devices: devices.join(","),
        ops: ops.join(","),
        min_bytes: config.min_bytes.to_string(),
        max_bytes: config.max_bytes.to_string(),
        iterations: config.iterations,
        ..CollectivesArgs::default()
    })
    .to_args();
    let ended = run_all(&prepared.program, &[args], timeout, interrupted).remove(0);
    progress.finish();
    let (run, error) = read_document::<Rows>(interpret(&ended, timeout), "collectives");
    let telemetry = sampler.stop();
    let bound = link_bound(inv, &config.gpus);
    judge(prepared, config, bound, run, error, telemetry, started_at)
}

fn judge(
    prepared: &Prepared,
    config: CollectivesConfig,
    bound: Option<LinkBound>,
    run: Option<Rows>,
    error: Option<String>,
    telemetry: Vec<telemetry::Sample>,
    started_at: String,
) -> Outcome {
    let mut failures: Vec<String> = error.iter().map(|e| format!("kiln-gpu collectives: {e}")).collect();
    let mut above = Vec::new();
    if let Some(r) = &run {
        let n = r.devices.len();
        for row in &r.rows {
            let at = format!("{} of {} B over {n} GPUs", row.collective.name(), row.bytes);
            if !row.correct {
                failures.push(format!("{at}: a GPU received a wrong result"));
            }
            if let Some(b) = &bound {
                let most = busbw_bound(row.collective, n, b.gbps);
                if row.busbw_gbs > most * (1.0 + PEAK_MARGIN) {
                    above.push(format!(
                        "{at}: bus bandwidth {:.1} GB/s, above the {most:.1} GB/s its GPUs' {} links allow (+{:.0} %)",
                        row.busbw_gbs,
                        b.via,
                        PEAK_MARGIN * 100.0
                    ));
                }
            }
        }
        for c in &config.collectives {
            if !r.rows.iter().any(|row| row.collective == *c) {
                failures.push(format!("{}: no size measured", c.name()));
            }
        }
    }
    // Each row is one mean over its calls (as nccl-tests prints): no spread to judge.
    let (metrics, samples) = run.as_ref().map(|r| metrics_of(&config, &r.rows)).unwrap_or_default();
    let body = CollectivesBody { bound, run, error };
    let closing = Closing { started_at, telemetry, above, failures, unstable: false, metrics, samples };
    close(prepared, config, body, closing, &SHOWN)
}

/// How `GpuCollectivesReport` shows itself.
const SHOWN: Shown<CollectivesConfig, CollectivesBody> = Shown { headline, render, report: Report::GpuCollectives };

/// Per collective `gpus.nccl.<op>.busbw_gbs_max` (the best size) and `….time_us_smallest`; every
/// size's bus bandwidth and time as samples indexed by bytes (the names `kiln cluster
/// collectives` uses, under `gpus.nccl.`).
fn metrics_of(config: &CollectivesConfig, rows: &[Row]) -> (Vec<Metric>, Vec<(String, i64, f64)>) {
    let mut metrics = Vec::new();
    let mut samples = Vec::new();
    for c in &config.collectives {
        let mine: Vec<&Row> = rows.iter().filter(|r| r.collective == *c).collect();
        let Some(first) = mine.first() else { continue };
        let name = c.name();
        for r in &mine {
            samples.push((format!("gpus.nccl.{name}.busbw_gbs"), r.bytes as i64, r.busbw_gbs));
            samples.push((format!("gpus.nccl.{name}.time_us"), r.bytes as i64, r.time_us));
        }
        metrics.push(Metric {
            name: format!("gpus.nccl.{name}.busbw_gbs_max"),
            value: mine.iter().map(|r| r.busbw_gbs).fold(0.0, f64::max),
            unit: "GB/s".into(),
            direction: Direction::Higher,
        });
        metrics.push(Metric {
            name: format!("gpus.nccl.{name}.time_us_smallest"),
            value: first.time_us,
            unit: "us".into(),
            direction: Direction::Lower,
        });
    }
    (metrics, samples)
}

fn headline(r: &GpuCollectivesReport) -> String {
    let Some(run) = &r.run else {
        return format!(
            "gpu collectives: {} GPUs, no result: {}",
            r.config.gpus.len(),
            r.error.as_deref().unwrap_or("?")
        );
    };
    let best: Vec<String> = r
        .config
        .collectives
        .iter()
        .filter_map(|c| {
            let most = run.rows.iter().filter(|x| x.collective == *c).map(|x| x.busbw_gbs).reduce(f64::max)?;
            Some(format!("{} {most:.0}", c.name()))
        })
        .collect();
    format!(
        "gpu collectives: {} GPUs through NCCL, best bus bandwidth GB/s: {}{}",
        run.devices.len(),
        best.join(", "),
        if r.failures.is_empty() { String::new() } else { format!("; {} failure(s)", r.failures.len()) }
    )
}

pub fn render(r: &GpuCollectivesReport) -> String {
    let mut out = format!("gpu collectives: GPUs {:?} through NCCL; {}\n", r.config.gpus, r.program);
    if let Some(b) = &r.bound {
        out.push_str(&format!("each GPU's {} links carry {:.1} GB/s one way\n", b.via, b.gbps));
    }
    if let Some(run) = &r.run {
        if let Some(v) = run.nccl_version {
            out.push_str(&format!("NCCL {}.{}.{}\n", v / 10_000, v / 100 % 100, v % 100));
        }
        for c in &r.config.collectives {
            out.push_str(&format!(
                "\n{}\n{:>12} {:>12} {:>6} {:>12} {:>10} {:>10}  {}\n",
                c.name(),
                "size (B)",
                "count",
                "iters",
                "time (us)",
                "algbw GB/s",
                "busbw GB/s",
                "result"
            ));
            for x in run.rows.iter().filter(|x| x.collective == *c) {
                out.push_str(&format!(
                    "{:>12} {:>12} {:>6} {:>12.1} {:>10.2} {:>10.2}  {}\n",
                    x.bytes,
                    x.count,
                    x.iterations,
                    x.time_us,
                    x.algbw_gbs,
                    x.busbw_gbs,
                    if x.correct { "right" } else { "WRONG" }
                ));
            }
        }
    }
    render_verdict(&mut out, &r.failures, r.invalid.as_deref(), r.status, &r.telemetry);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_db::RunStatus;

    fn rows(n: usize, busbw: f64, wrong_at: Option<u64>) -> Rows {
        let mut rows = Vec::new();
        for c in kiln_gpu::collectives::NCCL_COLLECTIVES {
            for bytes in [8u64 << 10, 1 << 20, 1 << 30] {
                let seconds = bytes as f64 * c.bus_factor(n) / (busbw * 1e9);
                let (algbw_gbs, busbw_gbs) = kiln_bench::cluster::bandwidths(c, n, bytes, seconds);
                rows.push(Row {
                    collective: c,
                    bytes,
                    count: bytes / 4,
                    iterations: 20,
                    time_us: seconds * 1e6,
                    algbw_gbs,
                    busbw_gbs,
                    correct: wrong_at != Some(bytes) || c != Collective::AllGather,
                });
            }
        }
        Rows { devices: (0..n).collect(), rank: None, ranks: n, names: Vec::new(), nccl_version: Some(23007), rows }
    }

    fn judged(run: Option<Rows>, bound: Option<f64>) -> Outcome {
        let prepared = Prepared { program: "/opt/kiln-gpu".into(), devices: Vec::new() };
        let config = CollectivesConfig {
            collectives: kiln_gpu::collectives::NCCL_COLLECTIVES.to_vec(),
            min_bytes: 8 << 10,
            max_bytes: 1 << 30,
            iterations: 20,
            gpus: (0..8).collect(),
            timeout_s: 60,
        };
        let error = run.is_none().then(|| "did not finish within 60 s".to_string());
        let bound = bound.map(|gbps| LinkBound { gbps, via: "NV18".into() });
        judge(&prepared, config, bound, run, error, Vec::new(), "2026-12-05T00:00:00Z".into())
    }

    #[test]
    fn rows_become_metrics_and_a_wrong_result_or_an_impossible_figure_is_named() {
        let o = judged(Some(rows(8, 360.0, None)), Some(450.0));
        assert_eq!(o.status, RunStatus::Ok, "{}", o.text);
        let value = |name: &str| o.metrics.iter().find(|m| m.name == name).map(|m| m.value);
        assert!((value("gpus.nccl.all_reduce.busbw_gbs_max").unwrap() - 360.0).abs() < 1e-6);
        assert!(value("gpus.nccl.reduce_scatter.time_us_smallest").is_some());
        assert_eq!(o.samples.iter().filter(|s| s.0 == "gpus.nccl.all_gather.busbw_gbs").count(), 3);
        assert!(o.text.contains("NCCL 2.30.7"), "{}", o.text);
        assert!(o.headline.contains("all_reduce 360"), "{}", o.headline);

        let o = judged(Some(rows(8, 360.0, Some(1 << 20))), Some(450.0));
        assert_eq!(o.status, RunStatus::Failed);
        assert!(
            o.text.contains("FAIL all_gather of 1048576 B over 8 GPUs: a GPU received a wrong result"),
            "{}",
            o.text
        );

        // 600 GB/s: possible for an all-reduce with in-switch reduction (bound 450 × 1.75), not
        // for an all-gather.
        let o = judged(Some(rows(8, 600.0, None)), Some(450.0));
        assert_eq!(o.status, RunStatus::Invalid);
        let why = o.report.invalid_reason().unwrap();
        assert!(why.contains("all_gather of 8192 B over 8 GPUs: bus bandwidth 600.0 GB/s, above the 450.0"), "{why}");
        assert!(!why.contains("all_reduce"), "{why}");
        // No bound known: nothing is impossible; no document: failed with the reason.
        assert_eq!(judged(Some(rows(8, 600.0, None)), None).status, RunStatus::Ok);
        let o = judged(None, Some(450.0));
        assert_eq!(o.status, RunStatus::Failed);
        assert!(o.text.contains("FAIL kiln-gpu collectives: did not finish within 60 s"), "{}", o.text);
    }

    #[test]
    fn the_link_bound_needs_one_kind_of_path() {
        let mut inv = serde_json::to_value(kiln_inventory::collect(std::path::Path::new("/")).unwrap()).unwrap();
        let link = serde_json::json!({ "link": 0, "active": true, "version": 4, "remote_bus_id": null, "remote_type": "nvswitch", "errors": null });
        let gpu = |index: u32, gen: u32| serde_json::json!({ "index": index, "power": {}, "pcie": { "max_gen": gen, "max_width": 16 }, "nvlinks": [link.clone()] });
        inv["gpus"]["devices"] = serde_json::json!([gpu(0, 5), gpu(1, 5), gpu(2, 4)]);
        let with = |matrix: serde_json::Value| {
            let mut inv = inv.clone();
            inv["topology"]["matrix"] = matrix;
            serde_json::from_value::<Inventory>(inv).unwrap()
        };
        let nv = with(serde_json::json!([["X", "NV18", "NV18"], ["NV18", "X", "NV18"], ["NV18", "NV18", "X"]]));
        assert_eq!(link_bound(&nv, &[0, 1, 2]), Some(LinkBound { gbps: 450.0, via: "NV18".into() }));
        let pcie = with(serde_json::json!([["X", "PIX", "SYS"], ["PIX", "X", "SYS"], ["SYS", "SYS", "X"]]));
        let b = link_bound(&pcie, &[0, 1, 2]).unwrap();
        assert_eq!(b.via, "PCIe");
        assert!((b.gbps - kiln_bench::peaks::pcie_gbps(4, 16).unwrap()).abs() < 1e-9);
        let mixed = with(serde_json::json!([["X", "NV4", "SYS"], ["NV4", "X", "SYS"], ["SYS", "SYS", "X"]]));
        assert_eq!(link_bound(&mixed, &[0, 1, 2]), None);
        assert!((busbw_bound(Collective::AllReduce, 8, 450.0) - 787.5).abs() < 1e-9);
    }
}

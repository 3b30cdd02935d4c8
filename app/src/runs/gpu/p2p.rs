//! `kiln bench gpu p2p`: the GPU × GPU copy matrix through `kiln-gpu p2p` — every ordered pair one
//! way, every pair both ways at once, and a small copy's time per pair — judged like the fabric
//! test judges its nodes: within each kind of path (`NV18`, `PIX`, `SYS`… from the inventory's
//! topology, so that a PCIe box's cross-socket pairs are not held to its switch-local ones), a GPU
//! most of whose links are slow one way is named, then the slow pairs no GPU explains
//! (`kiln_bench::cluster::judge_fabric`, unit-free: here GB/s and µs). A copy that arrives
//! changed, or a pair that NVLink joins but the driver gives no peer access (the fabric manager
//! down, a link trained off), fails the run; a figure above what the path can carry (its NVLinks ×
//! the version's per-link rate, or the narrower PCIe link) makes it `invalid`.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use kiln_bench::cluster::{judge_fabric, Direction as Way, FabricVerdict, Finding, Link, Quantity, Subject};
use kiln_db::{Direction, Metric};
use kiln_gpu::p2p::Report as Matrix;
use kiln_gpu::request::{P2pArgs, Request};
use serde::{Deserialize, Serialize};

use super::{
    close, interpret, read_document, render_verdict, run_all, Closing, GpuReport, Prepared, Shown, PEAK_MARGIN,
    TELEMETRY_INTERVAL,
};
use crate::runs::{sampler, samples_of, unsettled, Outcome, Report};
use kiln_inventory::telemetry;
use kiln_inventory::Inventory;
use kiln_text::timefmt::now_rfc3339;
use kiln_text::Progress;

/// What `kiln bench gpu p2p` measures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct P2pConfig {
    /// MiB per copy.
    pub mib: usize,
    pub reps: usize,
    pub gpus: Vec<usize>,
    pub timeout_s: u64,
}

/// How one ordered pair is joined, and what it can carry one way.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Path {
    pub from: usize,
    pub to: usize,
    /// The topology matrix's entry: `NV18`, `PIX`, `PXB`, `PHB`, `NODE`, `SYS`; `?` where unknown.
    pub kind: String,
    /// GB/s one way: NVLinks × the version's per-link rate, or the narrower PCIe link's rate.
    pub ceiling_gbps: Option<f64>,
}

/// The path between two GPUs (NVML indices), from the inventory's topology and link facts.
pub fn path(inv: &Inventory, from: usize, to: usize) -> Path {
    let position = |gpu: usize| inv.gpus.devices.iter().position(|d| d.index as usize == gpu);
    let kind = position(from)
        .zip(position(to))
        .and_then(|(a, b)| inv.topology.matrix.get(a).and_then(|row| row.get(b)).cloned())
        .filter(|k| !k.is_empty())
        .unwrap_or_else(|| "?".to_string());
    let gpu = |g: usize| position(g).map(|p| &inv.gpus.devices[p]);
    let ceiling_gbps = if let Some(links) = kind.strip_prefix("NV").and_then(|n| n.parse::<u32>().ok()) {
        let version = gpu(from)
            .into_iter()
            .chain(gpu(to))
            .flat_map(|d| d.nvlinks.iter().filter(|l| l.active).filter_map(|l| l.version))
            .min();
        version.and_then(kiln_bench::peaks::nvlink_gbps).map(|per_link| f64::from(links) * per_link)
    } else if kind == "?" {
        None
    } else {
        let link = |g: usize| {
            let p = &gpu(g)?.pcie;
            kiln_bench::peaks::pcie_gbps(p.max_gen?, p.max_width?)
        };
        link(from).zip(link(to)).map(|(a, b)| a.min(b))
    };
    Path { from, to, kind, ceiling_gbps }
}

/// The verdict on one kind of path.
#[derive(Debug, Clone, Serialize)]
pub struct PathVerdict {
    pub kind: String,
    /// Findings name GPUs by their NVML index.
    pub verdict: FabricVerdict,
}

/// `kiln bench gpu p2p`'s document.
pub type GpuP2pReport = GpuReport<P2pConfig, P2pBody>;

/// What `GpuP2pReport` holds besides the envelope every GPU benchmark shares.
#[derive(Debug, Clone, Serialize)]
pub struct P2pBody {
    pub paths: Vec<Path>,
    pub matrix: Option<Matrix>,
    pub error: Option<String>,
    pub verdicts: Vec<PathVerdict>,
}

/// Runs `kiln-gpu p2p` over the chosen GPUs and judges the matrix.
pub fn p2p(inv: &Inventory, prepared: &Prepared, config: P2pConfig, interrupted: &AtomicBool) -> Outcome {
    let started_at = now_rfc3339();
    let sampler = sampler(inv, TELEMETRY_INTERVAL);
    let progress = Progress::new();
    progress.update(&format!("gpu p2p: {} GPUs, every pair", config.gpus.len()));
    let timeout = Duration::from_secs(config.timeout_s);
    let devices: Vec<String> = config.gpus.iter().map(usize::to_string).collect();
    let args = Request::P2p(P2pArgs { devices: devices.join(","), mib: config.mib, reps: config.reps }).to_args();
    let ended = run_all(&prepared.program, &[args], timeout, interrupted).remove(0);
    progress.finish();
    let (matrix, error) = read_document::<Matrix>(interpret(&ended, timeout), "p2p");
    let telemetry = sampler.stop();
    let paths = config
        .gpus
        .iter()
        .flat_map(|&a| config.gpus.iter().filter(move |&&b| b != a).map(move |&b| (a, b)))
        .map(|(a, b)| path(inv, a, b))
        .collect();
    judge(prepared, config, paths, matrix, error, telemetry, started_at)
}

/// The directed links of one kind of path, GPUs as positions in `gpus` (what `judge_fabric` counts).
fn links_of(matrix: &Matrix, paths: &[Path], gpus: &[usize], kind: &str) -> Vec<Link> {
    let at = |g: usize| gpus.iter().position(|&x| x == g);
    matrix
        .one_way
        .iter()
        .filter(|p| paths.iter().any(|x| x.from == p.from && x.to == p.to && x.kind == kind))
        .filter_map(|p| {
            Some(Link { from: at(p.from)?, to: at(p.to)?, gbps: p.copies.gbps_median, rtt_us: p.small_copy_us })
        })
        .collect()
}

/// A finding in a sentence, GPUs by NVML index.
pub fn describe(gpus: &[usize], kind: &str, f: &Finding) -> String {
    let gpu = |i: usize| format!("GPU {}", gpus.get(i).copied().unwrap_or(i));
    let subject = match &f.subject {
        Subject::Node { node } => gpu(*node),
        Subject::Link { a, b } => format!("{} <-> {}", gpu(*a), gpu(*b)),
    };
    let way = match (&f.subject, f.direction) {
        (Subject::Node { .. }, Way::Send) => "when it sends".to_string(),
        (Subject::Node { .. }, Way::Receive) => "when it receives".to_string(),
        (_, Way::Both) => "both ways".to_string(),
        (Subject::Link { a, b }, Way::Send) => format!("{} -> {}", gpu(*a), gpu(*b)),
        (Subject::Link { a, b }, Way::Receive) => format!("{} -> {}", gpu(*b), gpu(*a)),
    };
    let (what, unit) = match f.quantity {
        Quantity::Bandwidth => (
            format!(
                "slow {way}: {:.1} GB/s against a baseline of {:.1} GB/s ({:.0} %)",
                f.measured,
                f.baseline,
                100.0 * f.measured / f.baseline
            ),
            "GB/s",
        ),
        Quantity::Latency => (
            format!(
                "slow small copies {way}: {:.1} us against a baseline of {:.1} us ({:.1}x)",
                f.measured,
                f.baseline,
                f.measured / f.baseline
            ),
            "us",
        ),
    };
    let evidence: Vec<String> = f
        .evidence
        .iter()
        .map(|l| {
            let v = if f.quantity == Quantity::Bandwidth { l.gbps } else { l.rtt_us };
            format!("{}->{} {v:.1}", gpu(l.from).trim_start_matches("GPU "), gpu(l.to).trim_start_matches("GPU "))
        })
        .collect();
    format!("{subject} over {kind} paths: {what} (evidence, {unit}: {})", evidence.join(", "))
}

fn judge(
    prepared: &Prepared,
    config: P2pConfig,
    paths: Vec<Path>,
    matrix: Option<Matrix>,
    error: Option<String>,
    telemetry: Vec<telemetry::Sample>,
    started_at: String,
) -> Outcome {
    let mut failures: Vec<String> = error.iter().map(|e| format!("kiln-gpu p2p: {e}")).collect();
    let mut above = Vec::new();
    let mut unstable = false;
    let mut verdicts = Vec::new();
    if let Some(m) = &matrix {
        let path_of = |a: usize, b: usize| paths.iter().find(|p| p.from == a && p.to == b);
        for p in &m.one_way {
            let at = format!("GPU {} -> GPU {}", p.from, p.to);
            if !p.copies.intact {
                failures.push(format!("{at}: the copy arrived changed (a GPU memory or link fault)"));
            }
            let kind = path_of(p.from, p.to).map(|x| x.kind.as_str()).unwrap_or("?");
            if kind.starts_with("NV") && !p.peer_access {
                failures.push(format!(
                    "{at}: {kind} joins them but the driver gives no peer access, so copies go through host \
                     memory (is nvidia-fabricmanager running on an NVSwitch box? `nvidia-smi topo -p2p r`)"
                ));
            }
            if let Some(most) = path_of(p.from, p.to)
                .and_then(|x| x.ceiling_gbps)
                .filter(|m| p.copies.gbps_best > m * (1.0 + PEAK_MARGIN))
            {
                above.push(format!(
                    "{at}: {:.1} GB/s, above the {most:.1} GB/s its {kind} path carries one way (+{:.0} %)",
                    p.copies.gbps_best,
                    PEAK_MARGIN * 100.0
                ));
            }
            unstable |= kiln_bench::stats::summarize(&p.copies.seconds).is_some_and(|s| unsettled(&s));
        }
        for b in &m.both_ways {
            let at = format!("GPU {} <-> GPU {}", b.a, b.b);
            if !b.copies.intact {
                failures.push(format!("{at}, both ways at once: a copy arrived changed"));
            }
            let most =
                path_of(b.a, b.b).zip(path_of(b.b, b.a)).and_then(|(x, y)| Some(x.ceiling_gbps? + y.ceiling_gbps?));
            if let Some(most) = most.filter(|m| b.copies.gbps_best > m * (1.0 + PEAK_MARGIN)) {
                above.push(format!(
                    "{at}: {:.1} GB/s both ways, above the {most:.1} GB/s its path carries (+{:.0} %)",
                    b.copies.gbps_best,
                    PEAK_MARGIN * 100.0
                ));
            }
        }
        let mut kinds: Vec<&str> = paths.iter().map(|p| p.kind.as_str()).collect();
        kinds.sort_unstable();
        kinds.dedup();
        for kind in kinds {
            let links = links_of(m, &paths, &config.gpus, kind);
            let verdict = judge_fabric(config.gpus.len(), &links, None);
            for f in &verdict.findings {
                failures.push(describe(&config.gpus, kind, f));
            }
            verdicts.push(PathVerdict { kind: kind.to_string(), verdict });
        }
    }
    let (metrics, samples) = matrix.as_ref().map(metrics_of).unwrap_or_default();
    let body = P2pBody { paths, matrix, error, verdicts };
    let closing = Closing { started_at, telemetry, above, failures, unstable, metrics, samples };
    close(prepared, config, body, closing, &SHOWN)
}

/// How `GpuP2pReport` shows itself.
const SHOWN: Shown<P2pConfig, P2pBody> = Shown { headline, render, report: Report::GpuP2p };

fn median(values: &[f64]) -> Option<f64> {
    kiln_bench::stats::summarize(values).map(|s| s.median)
}

/// `gpu{i}.p2p_to_gpu{j}_gbps` (one way, median, every copy's rate as samples) and
/// `gpu{i}.p2p_to_gpu{j}_small_us`; `gpu{a}.p2p_both_gpu{b}_gbps` (both ways at once, a < b);
/// `gpus.p2p_min_gbps`, `gpus.p2p_median_gbps`, `gpus.p2p_both_median_gbps` and
/// `gpus.p2p_small_median_us` over the matrix.
fn metrics_of(m: &Matrix) -> (Vec<Metric>, Vec<(String, i64, f64)>) {
    let metric = |name: String, value: f64, unit: &str, direction| Metric { name, value, unit: unit.into(), direction };
    let mut metrics = Vec::new();
    let mut samples = Vec::new();
    for p in &m.one_way {
        let name = format!("gpu{}.p2p_to_gpu{}_gbps", p.from, p.to);
        let rates: Vec<f64> = p.copies.seconds.iter().map(|s| p.copies.bytes_counted / s / 1e9).collect();
        samples.extend(samples_of(&name, &rates));
        metrics.push(metric(name, p.copies.gbps_median, "GB/s", Direction::Higher));
        if p.small_copy_us.is_finite() {
            let name = format!("gpu{}.p2p_to_gpu{}_small_us", p.from, p.to);
            samples.extend(samples_of(&name, &p.small_copy_samples_us));
            metrics.push(metric(name, p.small_copy_us, "us", Direction::Lower));
        }
    }
    for b in &m.both_ways {
        let name = format!("gpu{}.p2p_both_gpu{}_gbps", b.a, b.b);
        let rates: Vec<f64> = b.copies.seconds.iter().map(|s| b.copies.bytes_counted / s / 1e9).collect();
        samples.extend(samples_of(&name, &rates));
        metrics.push(metric(name, b.copies.gbps_median, "GB/s", Direction::Higher));
    }
    let one_way: Vec<f64> = m.one_way.iter().map(|p| p.copies.gbps_median).collect();
    if let Some(min) = one_way.iter().copied().reduce(f64::min) {
        metrics.push(metric("gpus.p2p_min_gbps".into(), min, "GB/s", Direction::Higher));
    }
    if let Some(v) = median(&one_way) {
        metrics.push(metric("gpus.p2p_median_gbps".into(), v, "GB/s", Direction::Higher));
    }
    if let Some(v) = median(&m.both_ways.iter().map(|b| b.copies.gbps_median).collect::<Vec<_>>()) {
        metrics.push(metric("gpus.p2p_both_median_gbps".into(), v, "GB/s", Direction::Higher));
    }
    let small: Vec<f64> = m.one_way.iter().map(|p| p.small_copy_us).filter(|v| v.is_finite()).collect();
    if let Some(v) = median(&small) {
        metrics.push(metric("gpus.p2p_small_median_us".into(), v, "us", Direction::Lower));
    }
    (metrics, samples)
}

fn headline(r: &GpuP2pReport) -> String {
    let Some(m) = &r.matrix else {
        return format!("gpu p2p: {} GPUs, no matrix: {}", r.config.gpus.len(), r.error.as_deref().unwrap_or("?"));
    };
    let one_way: Vec<f64> = m.one_way.iter().map(|p| p.copies.gbps_median).collect();
    format!(
        "gpu p2p: {} GPUs, one way {:.0} GB/s median ({:.0} slowest), both ways {:.0} GB/s{}",
        m.devices.len(),
        median(&one_way).unwrap_or(0.0),
        one_way.iter().copied().reduce(f64::min).unwrap_or(0.0),
        median(&m.both_ways.iter().map(|b| b.copies.gbps_median).collect::<Vec<_>>()).unwrap_or(0.0),
        if r.failures.is_empty() { String::new() } else { format!("; {} failure(s)", r.failures.len()) }
    )
}

pub fn render(r: &GpuP2pReport) -> String {
    let mut out = format!(
        "gpu p2p: {} GPUs, {} MiB per copy, {} copies per pair; {}\n",
        r.config.gpus.len(),
        r.config.mib,
        r.config.reps,
        r.program
    );
    let gpus = &r.config.gpus;
    let table = |out: &mut String, title: &str, cell: &dyn Fn(usize, usize) -> String| {
        out.push_str(&format!("\n{title}\n{:>6}", ""));
        for g in gpus {
            out.push_str(&format!(" {:>8}", format!("GPU{g}")));
        }
        out.push('\n');
        for &a in gpus {
            out.push_str(&format!("{:>6}", format!("GPU{a}")));
            for &b in gpus {
                out.push_str(&format!(" {:>8}", if a == b { "X".to_string() } else { cell(a, b) }));
            }
            out.push('\n');
        }
    };
    let kind = |a: usize, b: usize| {
        r.paths.iter().find(|p| p.from == a && p.to == b).map_or_else(|| "?".to_string(), |p| p.kind.clone())
    };
    table(&mut out, "paths (with what one way can carry, GB/s)", &|a, b| {
        let p = r.paths.iter().find(|p| p.from == a && p.to == b);
        match p.and_then(|p| p.ceiling_gbps) {
            Some(c) => format!("{} {c:.0}", kind(a, b)),
            None => kind(a, b),
        }
    });
    if let Some(m) = &r.matrix {
        let pair = |a: usize, b: usize| m.one_way.iter().find(|p| p.from == a && p.to == b);
        table(&mut out, "one way, GB/s (row sends to column)", &|a, b| {
            pair(a, b).map_or_else(
                || "-".to_string(),
                |p| {
                    let mark = if !p.copies.intact {
                        "!"
                    } else if !p.peer_access {
                        "h"
                    } else {
                        ""
                    };
                    format!("{:.1}{mark}", p.copies.gbps_median)
                },
            )
        });
        table(&mut out, "both ways at once, GB/s", &|a, b| {
            m.both_ways
                .iter()
                .find(|x| (x.a, x.b) == (a.min(b), a.max(b)))
                .map_or_else(|| "-".to_string(), |x| format!("{:.1}", x.copies.gbps_median))
        });
        table(&mut out, &format!("small copy ({} B), us", kiln_gpu::p2p::SMALL_COPY), &|a, b| {
            pair(a, b).map_or_else(|| "-".to_string(), |p| format!("{:.1}", p.small_copy_us))
        });
        if m.one_way.iter().any(|p| !p.peer_access || !p.copies.intact) {
            out.push_str("h: no peer access (through host memory); !: arrived changed\n");
        }
        for v in &r.verdicts {
            let b = &v.verdict.baseline;
            out.push_str(&format!(
                "{} paths: baseline {:.1} GB/s, slow below {:.1}; small copy {:.1} us, slow above {:.1} us\n",
                v.kind, b.median_gbps, b.slow_below_gbps, b.median_rtt_us, b.slow_above_us
            ));
        }
    }
    render_verdict(&mut out, &r.failures, r.invalid.as_deref(), r.status, &r.telemetry);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_db::RunStatus;
    use kiln_gpu::bandwidth::Copies;
    use kiln_gpu::p2p::{Both, Pair};

    /// A matrix of `n` GPUs at `gbps` one way, with `slow` pairs at their own rate.
    fn matrix(n: usize, gbps: f64, slow: &[(usize, usize, f64)], intact: bool, peer: bool) -> Matrix {
        let bytes = (256u64 << 20) as f64;
        let copies = |counted: f64, rate: f64| Copies::new(counted, vec![counted / rate / 1e9; 5], intact);
        let rate = |a: usize, b: usize| slow.iter().find(|s| (s.0, s.1) == (a, b)).map_or(gbps, |s| s.2);
        let devices: Vec<usize> = (0..n).collect();
        Matrix {
            names: vec!["NVIDIA H100 80GB HBM3".into(); n],
            bytes: 256 << 20,
            reps: 5,
            one_way: kiln_gpu::p2p::ordered_pairs(&devices)
                .into_iter()
                .map(|(a, b)| Pair {
                    from: a,
                    to: b,
                    peer_access: peer,
                    copies: copies(bytes, rate(a, b)),
                    small_copy_us: 8.0,
                    small_copy_samples_us: vec![8.0; 5],
                })
                .collect(),
            both_ways: (0..n)
                .flat_map(|a| (a + 1..n).map(move |b| (a, b)))
                .map(|(a, b)| Both { a, b, copies: copies(2.0 * bytes, rate(a, b) + rate(b, a)) })
                .collect(),
            devices,
        }
    }

    fn judged(n: usize, m: Option<Matrix>, kind: &str, ceiling: Option<f64>) -> Outcome {
        let prepared = Prepared { program: "/opt/kiln-gpu".into(), devices: Vec::new() };
        let gpus: Vec<usize> = (0..n).collect();
        let config = P2pConfig { mib: 256, reps: 5, gpus: gpus.clone(), timeout_s: 60 };
        let paths = kiln_gpu::p2p::ordered_pairs(&gpus)
            .into_iter()
            .map(|(from, to)| Path { from, to, kind: kind.into(), ceiling_gbps: ceiling })
            .collect();
        let error = m.is_none().then(|| "did not finish within 60 s".to_string());
        judge(&prepared, config, paths, m, error, Vec::new(), "2026-12-05T00:00:00Z".into())
    }

    #[test]
    fn an_even_matrix_passes_and_becomes_metrics() {
        let o = judged(4, Some(matrix(4, 370.0, &[], true, true)), "NV18", Some(450.0));
        assert_eq!(o.status, RunStatus::Ok, "{}", o.text);
        let value = |name: &str| o.metrics.iter().find(|m| m.name == name).map(|m| m.value);
        assert!((value("gpu0.p2p_to_gpu3_gbps").unwrap() - 370.0).abs() < 1e-6);
        assert!((value("gpu1.p2p_both_gpu2_gbps").unwrap() - 740.0).abs() < 1e-6);
        assert_eq!(value("gpu2.p2p_both_gpu1_gbps"), None, "each pair once, lower index first");
        assert!((value("gpus.p2p_min_gbps").unwrap() - 370.0).abs() < 1e-6);
        assert!((value("gpus.p2p_small_median_us").unwrap() - 8.0).abs() < 1e-9);
        assert_eq!(o.samples.iter().filter(|s| s.0 == "gpu0.p2p_to_gpu1_gbps").count(), 5);
        assert!(o.text.contains("NV18 450"), "{}", o.text);
        assert!(o.headline.contains("one way 370 GB/s"), "{}", o.headline);
    }

    #[test]
    fn a_slow_receiver_a_slow_pair_a_missing_peer_path_and_changed_data_are_named() {
        // GPU 2 receives at half rate from everyone: GPU 2 is named, not its senders.
        let slow = [(0, 2, 180.0), (1, 2, 185.0), (3, 2, 182.0)];
        let o = judged(4, Some(matrix(4, 370.0, &slow, true, true)), "NV18", Some(450.0));
        assert_eq!(o.status, RunStatus::Failed, "{}", o.text);
        let Report::GpuP2p(r) = &o.report else { panic!() };
        assert_eq!(r.failures.len(), 1, "{:?}", r.failures);
        assert!(
            r.failures[0].starts_with("GPU 2 over NV18 paths: slow when it receives: 182.0 GB/s"),
            "{:?}",
            r.failures
        );
        // One pair slow one way: that pair and direction.
        let o = judged(4, Some(matrix(4, 370.0, &[(3, 1, 90.0)], true, true)), "NV18", Some(450.0));
        let Report::GpuP2p(r) = &o.report else { panic!() };
        assert_eq!(
            r.failures,
            ["GPU 1 <-> GPU 3 over NV18 paths: slow GPU 3 -> GPU 1: 90.0 GB/s against a \
             baseline of 370.0 GB/s (24 %) (evidence, GB/s: 3->1 90.0)"]
        );
        // NVLink without peer access, and changed data.
        let o = judged(2, Some(matrix(2, 20.0, &[], false, false)), "NV18", Some(450.0));
        assert_eq!(o.status, RunStatus::Failed);
        assert!(o.text.contains("FAIL GPU 0 -> GPU 1: the copy arrived changed"), "{}", o.text);
        assert!(
            o.text.contains("FAIL GPU 1 -> GPU 0: NV18 joins them but the driver gives no peer access"),
            "{}",
            o.text
        );
        // Over PCIe, no peer access is no failure (the driver stages copies through host memory).
        let o = judged(2, Some(matrix(2, 20.0, &[], true, false)), "SYS", Some(63.0));
        assert_eq!(o.status, RunStatus::Ok, "{}", o.text);
        // A run that never printed a matrix fails, naming why.
        let o = judged(2, None, "SYS", None);
        assert_eq!(o.status, RunStatus::Failed);
        assert!(o.text.contains("FAIL kiln-gpu p2p: did not finish within 60 s"), "{}", o.text);
    }

    #[test]
    fn above_what_the_path_carries_is_invalid() {
        let o = judged(2, Some(matrix(2, 70.0, &[], true, true)), "PIX", Some(63.0));
        assert_eq!(o.status, RunStatus::Invalid);
        let why = o.report.invalid_reason().unwrap();
        assert!(why.contains("GPU 0 -> GPU 1: 70.0 GB/s, above the 63.0 GB/s its PIX path carries one way"), "{why}");
        assert!(why.contains("GPU 0 <-> GPU 1: 140.0 GB/s both ways, above the 126.0 GB/s"), "{why}");
    }

    #[test]
    fn paths_come_from_the_topology_and_the_links() {
        let mut inv = serde_json::to_value(kiln_inventory::collect(std::path::Path::new("/")).unwrap()).unwrap();
        let link = |version| serde_json::json!({ "link": 0, "active": true, "version": version, "remote_bus_id": null, "remote_type": "nvswitch", "errors": null });
        let gpu = |index: u32, gen: u32, links: Vec<serde_json::Value>| serde_json::json!({ "index": index, "power": {}, "pcie": { "max_gen": gen, "max_width": 16 }, "nvlinks": links });
        inv["gpus"]["devices"] =
            serde_json::json!([gpu(0, 5, vec![link(4), link(4)]), gpu(1, 4, vec![link(4)]), gpu(2, 5, vec![])]);
        inv["topology"]["matrix"] =
            serde_json::json!([["X", "NV18", "SYS"], ["NV18", "X", "NODE"], ["SYS", "NODE", "X"]]);
        let inv: Inventory = serde_json::from_value(inv).unwrap();
        let p = path(&inv, 0, 1);
        assert_eq!((p.kind.as_str(), p.ceiling_gbps), ("NV18", Some(450.0)));
        // PCIe: the narrower end (gen 4 x16 on GPU 1).
        let p = path(&inv, 2, 1);
        assert_eq!(p.kind, "NODE");
        assert!((p.ceiling_gbps.unwrap() - kiln_bench::peaks::pcie_gbps(4, 16).unwrap()).abs() < 1e-9);
        assert_eq!(path(&inv, 0, 7), Path { from: 0, to: 7, kind: "?".into(), ceiling_gbps: None });
    }
}

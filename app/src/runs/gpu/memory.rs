//! `kiln bench gpu memory`: each GPU's own memory (a device-to-device copy, read + write counted)
//! and its host link (page-locked host↔device copies), each copy checked by kiln-gpu. The host
//! side runs from the GPU's own NUMA node and, on a machine of several nodes, from another one —
//! a GPU whose transfers only reach full speed from the "wrong" node shows a wrong affinity — then
//! every GPU at once from its own node. Figures are judged against the datasheet's memory
//! bandwidth and the PCIe link's rate: above either (+5 %) the run is `invalid`.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use kiln_db::{Direction, Metric};
use kiln_gpu::bandwidth::{Copies, Report as Bandwidth};
use kiln_gpu::request::{BandwidthArgs, Request};
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

/// What `kiln bench gpu memory` measures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemoryConfig {
    /// MiB per copy.
    pub mib: usize,
    pub reps: usize,
    pub gpus: Vec<usize>,
    pub timeout_s: u64,
}

/// Where a run's host side ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// On the CPUs of the GPU's own NUMA node.
    Local,
    /// On the CPUs of another node.
    Remote,
    /// Where the scheduler put it: the GPU's node is unknown, or the machine has one node.
    Unpinned,
}

/// One run of `kiln-gpu bandwidth` as planned: the GPU, where its host side runs, with whom.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Planned {
    pub gpu: usize,
    pub placement: Placement,
    pub node: Option<u32>,
    pub cpus: Option<String>,
    pub together: bool,
}

/// The rounds, each run at once: every GPU alone from its own node, then from another node where
/// there is one, then every GPU at once from its own node.
pub fn plan(inv: &Inventory, gpus: &[usize]) -> Vec<Vec<Planned>> {
    let nodes: Vec<(u32, &str)> =
        inv.numa.nodes.iter().filter(|n| n.cpu_count > 0).map(|n| (n.id, n.cpus.as_str())).collect();
    let local = |gpu: usize| -> Option<(u32, &str)> {
        let node = inv.gpus.devices.iter().find(|d| d.index as usize == gpu)?.numa_node?;
        nodes.iter().find(|(id, _)| *id == node).copied()
    };
    let planned = |gpu, placement, at: Option<(u32, &str)>, together| Planned {
        gpu,
        placement,
        node: at.map(|a| a.0),
        cpus: at.map(|a| a.1.to_string()),
        together,
    };
    let mut rounds = Vec::new();
    for &gpu in gpus {
        match local(gpu) {
            Some(home) if nodes.len() > 1 => {
                rounds.push(vec![planned(gpu, Placement::Local, Some(home), false)]);
                let away = nodes.iter().find(|(id, _)| *id != home.0).copied();
                rounds.push(vec![planned(gpu, Placement::Remote, away, false)]);
            }
            _ => rounds.push(vec![planned(gpu, Placement::Unpinned, None, false)]),
        }
    }
    if gpus.len() > 1 {
        rounds.push(
            gpus.iter()
                .map(|&gpu| match local(gpu).filter(|_| nodes.len() > 1) {
                    Some(home) => planned(gpu, Placement::Local, Some(home), true),
                    None => planned(gpu, Placement::Unpinned, None, true),
                })
                .collect(),
        );
    }
    rounds
}

/// One run's figures, or why there are none.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryResult {
    #[serde(flatten)]
    pub planned: Planned,
    pub run: Option<Bandwidth>,
    pub error: Option<String>,
}

/// What a GPU's figures may not exceed.
#[derive(Debug, Clone, Serialize)]
pub struct Ceilings {
    pub gpu: usize,
    pub name: Option<String>,
    /// The datasheet's memory bandwidth, GB/s; a device copy counts read + write against it.
    pub memory_gbps: Option<f64>,
    /// "PCIe 5.0 x16", the link's most, and its rate one way, GB/s.
    pub link: Option<String>,
    pub link_gbps: Option<f64>,
    /// Who set that most: the GPU's own link (a ceiling), or a hypervisor's virtual root port
    /// (shown, never a ceiling).
    pub link_bound: Option<LinkBound>,
}

/// Where a host link's most, as NVML reads it, comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkBound {
    /// Bare metal: the GPU's own link, a ceiling no copy can pass.
    Device,
    /// In a virtual machine NVML's maximum generation is the lower of the GPU's and the
    /// hypervisor's virtual root port's, which the hardware did not set (a passed-through H100
    /// behind an emulated Gen4 port moves Gen5 rates all the same): never a reason for `invalid`.
    VirtualPort,
}

impl LinkBound {
    fn says(self) -> &'static str {
        match self {
            LinkBound::Device => "the GPU's own link",
            LinkBound::VirtualPort => "through the hypervisor's virtual root port: not a ceiling",
        }
    }
}

fn ceilings_of(inv: &Inventory, gpu: usize) -> Ceilings {
    let d = inv.gpus.devices.iter().find(|d| d.index as usize == gpu);
    let name = d.and_then(|d| d.name.clone());
    // Grace Hopper and Grace Blackwell reach the host over NVLink-C2C, not the PCIe link NVML shows.
    let c2c = name.as_deref().is_some_and(|n| n.contains("GH200") || n.contains("GB200"));
    let pcie = d.map(|d| &d.pcie).filter(|_| !c2c);
    let (generation, width) = (pcie.and_then(|p| p.max_gen), pcie.and_then(|p| p.max_width));
    Ceilings {
        gpu,
        memory_gbps: name.as_deref().and_then(kiln_bench::peaks::gpu_memory_gbps),
        link: generation.zip(width).map(|(g, w)| format!("PCIe {g}.0 x{w}")),
        link_gbps: generation.zip(width).and_then(|(g, w)| kiln_bench::peaks::pcie_gbps(g, w)),
        link_bound: generation.map(|_| match inv.os.virtualization.is_virtual {
            true => LinkBound::VirtualPort,
            false => LinkBound::Device,
        }),
        name,
    }
}

/// `kiln bench gpu memory`'s document.
pub type GpuMemoryReport = GpuReport<MemoryConfig, MemoryBody>;

/// What `GpuMemoryReport` holds besides the envelope every GPU benchmark shares.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryBody {
    pub ceilings: Vec<Ceilings>,
    pub results: Vec<MemoryResult>,
}

/// Runs the rounds of [`plan`] and judges them.
pub fn memory(inv: &Inventory, prepared: &Prepared, config: MemoryConfig, interrupted: &AtomicBool) -> Outcome {
    let started_at = now_rfc3339();
    let sampler = sampler(inv, TELEMETRY_INTERVAL);
    let progress = Progress::new();
    let timeout = Duration::from_secs(config.timeout_s);
    let mut results = Vec::new();
    for round in plan(inv, &config.gpus) {
        let what = match round.as_slice() {
            [one] => format!("GPU {} from {:?} CPUs", one.gpu, one.placement).to_lowercase(),
            all => format!("{} GPUs at once", all.len()),
        };
        progress.update(&format!("gpu memory: {what}"));
        let args: Vec<Vec<String>> = round
            .iter()
            .map(|p| {
                let (device, cpus) = (p.gpu, p.cpus.clone());
                Request::Bandwidth(BandwidthArgs { device, mib: config.mib, reps: config.reps, cpus }).to_args()
            })
            .collect();
        for (planned, ended) in round.into_iter().zip(run_all(&prepared.program, &args, timeout, interrupted)) {
            let (run, error) = read_document::<Bandwidth>(interpret(&ended, timeout), "bandwidth");
            results.push(MemoryResult { planned, run, error });
        }
    }
    progress.finish();
    let telemetry = sampler.stop();
    let ceilings = config.gpus.iter().map(|&g| ceilings_of(inv, g)).collect();
    judge(prepared, config, ceilings, results, telemetry, started_at)
}

fn label(p: &Planned) -> String {
    let from = match (p.placement, p.node) {
        (Placement::Unpinned, _) => String::new(),
        (placement, Some(node)) => format!(", host side on node {node} ({placement:?})").to_lowercase(),
        (placement, None) => format!(", {placement:?}").to_lowercase(),
    };
    format!("GPU {}{from}{}", p.gpu, if p.together { ", all GPUs at once" } else { "" })
}

/// The copies of a run (the triad where it was measured) with their names and ceilings.
fn copies<'a>(r: &'a Bandwidth, c: Option<&Ceilings>) -> Vec<(&'static str, &'a Copies, Option<f64>)> {
    let memory = c.and_then(|c| c.memory_gbps);
    let mut out = vec![("device copy", &r.device_copy, memory)];
    out.extend(r.triad.as_ref().map(|t| ("triad", t, memory)));
    // Only a bound the hardware set is a ceiling (see `LinkBound`).
    let link = c.filter(|c| c.link_bound == Some(LinkBound::Device)).and_then(|c| c.link_gbps);
    out.push(("host to device", &r.host_to_device, link));
    out.push(("device to host", &r.device_to_host, link));
    out
}

fn judge(
    prepared: &Prepared,
    config: MemoryConfig,
    ceilings: Vec<Ceilings>,
    results: Vec<MemoryResult>,
    telemetry: Vec<telemetry::Sample>,
    started_at: String,
) -> Outcome {
    let mut failures = Vec::new();
    let mut above = Vec::new();
    let mut unstable = false;
    for r in &results {
        let at = label(&r.planned);
        if let Some(e) = &r.error {
            failures.push(format!("{at}: {e}"));
        }
        let Some(run) = &r.run else { continue };
        if let Some(e) = &run.triad_error {
            failures.push(format!("{at}: the triad kernel could not run: {e}"));
        }
        let ceiling = ceilings.iter().find(|c| c.gpu == r.planned.gpu);
        for (what, c, most) in copies(run, ceiling) {
            if !c.intact {
                failures.push(format!("{at}: the {what} arrived changed (a GPU memory or link fault)"));
            }
            if let Some(most) = most.filter(|m| c.gbps_best > m * (1.0 + PEAK_MARGIN)) {
                above.push(format!(
                    "{at}: {what} {:.1} GB/s, above the {most:.1} GB/s it can move (+{:.0} %)",
                    c.gbps_best,
                    PEAK_MARGIN * 100.0
                ));
            }
            unstable |= kiln_bench::stats::summarize(&c.seconds).is_some_and(|s| unsettled(&s));
        }
    }
    let (metrics, samples) = metrics_of(&results);
    let body = MemoryBody { ceilings, results };
    let closing = Closing { started_at, telemetry, above, failures, unstable, metrics, samples };
    close(prepared, config, body, closing, &SHOWN)
}

/// How `GpuMemoryReport` shows itself.
const SHOWN: Shown<MemoryConfig, MemoryBody> = Shown { headline, render, report: Report::GpuMemory };

/// `gpu{i}.hbm_copy_gbps`, `.hbm_triad_gbps`, `.h2d_gbps`, `.d2h_gbps` (alone, from the GPU's own node or unpinned);
/// `.h2d_remote_gbps`, `.d2h_remote_gbps` (from another node); `.hbm_copy_all_gbps`,
/// `.h2d_all_gbps`, `.d2h_all_gbps` (all GPUs at once) and `gpus.h2d_gbps`, `gpus.d2h_gbps`
/// (their sums): medians, with every copy's rate as samples.
fn metrics_of(results: &[MemoryResult]) -> (Vec<Metric>, Vec<(String, i64, f64)>) {
    let mut metrics = Vec::new();
    let mut samples = Vec::new();
    let mut totals = [("h2d", 0.0, false), ("d2h", 0.0, false)];
    for r in results {
        let Some(run) = &r.run else { continue };
        let suffix = match (r.planned.together, r.planned.placement) {
            (true, _) => "_all",
            (false, Placement::Remote) => "_remote",
            (false, _) => "",
        };
        let mut kinds = vec![("hbm_copy", &run.device_copy)];
        kinds.extend(run.triad.as_ref().map(|t| ("hbm_triad", t)));
        kinds.extend([("h2d", &run.host_to_device), ("d2h", &run.device_to_host)]);
        for (kind, c) in kinds {
            if kind.starts_with("hbm_") && suffix == "_remote" {
                continue; // the device's own memory does not touch the host
            }
            let name = format!("gpu{}.{kind}{suffix}_gbps", r.planned.gpu);
            let rates: Vec<f64> = c.seconds.iter().map(|s| c.bytes_counted / s / 1e9).collect();
            samples.extend(samples_of(&name, &rates));
            metrics.push(Metric { name, value: c.gbps_median, unit: "GB/s".into(), direction: Direction::Higher });
            if r.planned.together {
                if let Some(t) = totals.iter_mut().find(|t| t.0 == kind) {
                    (t.1, t.2) = (t.1 + c.gbps_median, true);
                }
            }
        }
    }
    for (kind, total, any) in totals {
        if any {
            metrics.push(Metric {
                name: format!("gpus.{kind}_gbps"),
                value: total,
                unit: "GB/s".into(),
                direction: Direction::Higher,
            });
        }
    }
    (metrics, samples)
}

fn headline(r: &GpuMemoryReport) -> String {
    let alone: Vec<&Bandwidth> = r
        .results
        .iter()
        .filter(|x| !x.planned.together && x.planned.placement != Placement::Remote)
        .filter_map(|x| x.run.as_ref())
        .collect();
    let median = |f: &dyn Fn(&Bandwidth) -> f64| {
        kiln_bench::stats::summarize(&alone.iter().map(|b| f(b)).collect::<Vec<_>>()).map_or(0.0, |s| s.median)
    };
    format!(
        "gpu memory: {} GPU(s), device copy {:.0} GB/s, host to device {:.1} GB/s, device to host {:.1} GB/s (medians){}",
        alone.len(),
        median(&|b| b.device_copy.gbps_median),
        median(&|b| b.host_to_device.gbps_median),
        median(&|b| b.device_to_host.gbps_median),
        if r.failures.is_empty() { String::new() } else { format!("; {} failure(s)", r.failures.len()) }
    )
}

pub fn render(r: &GpuMemoryReport) -> String {
    let mut out = format!(
        "gpu memory: {} GPU(s), {} MiB per copy, {} copies each; {}\n",
        r.config.gpus.len(),
        r.config.mib,
        r.config.reps,
        r.program
    );
    for c in &r.ceilings {
        out.push_str(&format!(
            "GPU {} {}: datasheet memory {}, host link {}\n",
            c.gpu,
            c.name.as_deref().unwrap_or("?"),
            c.memory_gbps.map_or_else(|| "unknown".into(), |g| format!("{g:.0} GB/s")),
            c.link.as_ref().zip(c.link_gbps).map_or_else(
                || "unknown".into(),
                |(l, g)| format!("{l} ({g:.1} GB/s, {})", c.link_bound.map_or("bound unknown", LinkBound::says))
            )
        ));
    }
    out.push_str(&format!(
        "{:>4} {:<9} {:>5} {:<9} {:>16} {:>16} {:>10} {:>10}  {}\n",
        "gpu", "host side", "node", "when", "device copy GB/s", "triad GB/s", "H2D GB/s", "D2H GB/s", "data"
    ));
    for x in &r.results {
        let p = &x.planned;
        let node = p.node.map_or_else(|| "-".to_string(), |n| n.to_string());
        let placement = format!("{:?}", p.placement).to_lowercase();
        let when = if p.together { "together" } else { "alone" };
        match &x.run {
            Some(b) => {
                let ceiling = r.ceilings.iter().find(|c| c.gpu == p.gpu).and_then(|c| c.memory_gbps);
                let share = |c: &Copies| match ceiling {
                    Some(m) => format!("{:.0} ({:.0} %)", c.gbps_median, 100.0 * c.gbps_median / m),
                    None => format!("{:.0}", c.gbps_median),
                };
                let triad = b.triad.as_ref().map_or_else(|| "-".to_string(), share);
                let intact = copies(b, None).iter().all(|(_, c, _)| c.intact);
                out.push_str(&format!(
                    "{:>4} {:<9} {:>5} {:<9} {:>16} {:>16} {:>10.1} {:>10.1}  {}\n",
                    p.gpu,
                    placement,
                    node,
                    when,
                    share(&b.device_copy),
                    triad,
                    b.host_to_device.gbps_median,
                    b.device_to_host.gbps_median,
                    if intact { "intact" } else { "CHANGED" }
                ));
            }
            None => out.push_str(&format!("{:>4} {:<9} {:>5} {:<9} failed\n", p.gpu, placement, node, when)),
        }
    }
    render_verdict(&mut out, &r.failures, r.invalid.as_deref(), r.status, &r.telemetry);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_db::RunStatus;

    fn bandwidth(gpu: usize, hbm: f64, link: f64, intact: bool) -> Bandwidth {
        let bytes = (1u64 << 30) as f64;
        let copies = |counted: f64, gbps: f64| Copies::new(counted, vec![counted / gbps / 1e9; 5], intact);
        Bandwidth {
            device: gpu,
            name: Some("NVIDIA H200".into()),
            bytes: 1 << 30,
            cpus: None,
            device_copy: copies(2.0 * bytes, hbm),
            triad: Some(copies(3.0 * bytes, hbm * 1.02)),
            triad_error: None,
            host_to_device: copies(bytes, link),
            device_to_host: copies(bytes, link),
        }
    }

    fn judged(results: Vec<(Planned, Option<Bandwidth>)>) -> Outcome {
        judged_behind(results, LinkBound::Device)
    }

    fn judged_behind(results: Vec<(Planned, Option<Bandwidth>)>, bound: LinkBound) -> Outcome {
        let prepared = Prepared { program: "/opt/kiln-gpu".into(), devices: Vec::new() };
        let config = MemoryConfig { mib: 1024, reps: 5, gpus: vec![0, 1], timeout_s: 60 };
        let ceilings = (0..2)
            .map(|gpu| Ceilings {
                gpu,
                name: Some("NVIDIA H200".into()),
                memory_gbps: Some(4800.0),
                link: Some("PCIe 5.0 x16".into()),
                link_gbps: kiln_bench::peaks::pcie_gbps(5, 16),
                link_bound: Some(bound),
            })
            .collect();
        let results = results
            .into_iter()
            .map(|(planned, run)| {
                let error = run.is_none().then(|| "did not finish within 60 s".to_string());
                MemoryResult { planned, run, error }
            })
            .collect();
        judge(&prepared, config, ceilings, results, Vec::new(), "2026-12-05T00:00:00Z".into())
    }

    fn at(gpu: usize, placement: Placement, together: bool) -> Planned {
        let node = (placement != Placement::Unpinned).then_some(if placement == Placement::Local { 0 } else { 1 });
        Planned { gpu, placement, node, cpus: node.map(|n| format!("{n}")), together }
    }

    #[test]
    fn figures_become_metrics_and_a_ceiling_breach_or_changed_data_is_named() {
        let o = judged(vec![
            (at(0, Placement::Local, false), Some(bandwidth(0, 4300.0, 55.0, true))),
            (at(0, Placement::Remote, false), Some(bandwidth(0, 4300.0, 30.0, true))),
            (at(0, Placement::Local, true), Some(bandwidth(0, 4200.0, 50.0, true))),
            (at(1, Placement::Local, true), Some(bandwidth(1, 4200.0, 50.0, true))),
        ]);
        assert_eq!(o.status, RunStatus::Ok, "{}", o.text);
        let value = |name: &str| o.metrics.iter().find(|m| m.name == name).map(|m| m.value);
        assert!((value("gpu0.hbm_copy_gbps").unwrap() - 4300.0).abs() < 1e-6);
        assert!((value("gpu0.h2d_remote_gbps").unwrap() - 30.0).abs() < 1e-6);
        assert_eq!(value("gpu0.hbm_copy_remote_gbps"), None, "a device copy never touches the host");
        assert!((value("gpus.h2d_gbps").unwrap() - 100.0).abs() < 1e-6);
        assert!((value("gpu0.hbm_triad_gbps").unwrap() - 4386.0).abs() < 1e-6);
        assert_eq!(value("gpu0.hbm_triad_remote_gbps"), None);
        assert!(o.text.contains("4300 (90 %)"), "{}", o.text);

        // 70 GB/s over a PCIe 5.0 x16 link (63 GB/s): impossible, so invalid; changed data fails.
        let o = judged(vec![(at(0, Placement::Local, false), Some(bandwidth(0, 4300.0, 70.0, true)))]);
        assert_eq!(o.status, RunStatus::Invalid);
        assert!(o.report.invalid_reason().unwrap().contains("host to device 70.0 GB/s, above the 63.0 GB/s"));
        assert!(o.text.contains("PCIe 5.0 x16 (63.0 GB/s, the GPU's own link)"), "{}", o.text);
        // In a virtual machine the link NVML shows may be the hypervisor's port's: the same
        // figure is no breach, and the text says which bound that was.
        let o = judged_behind(
            vec![(at(0, Placement::Local, false), Some(bandwidth(0, 4300.0, 70.0, true)))],
            LinkBound::VirtualPort,
        );
        assert_eq!(o.status, RunStatus::Ok, "{}", o.text);
        assert!(o.text.contains("virtual root port: not a ceiling"), "{}", o.text);
        let o = judged(vec![
            (at(0, Placement::Unpinned, false), Some(bandwidth(0, 4300.0, 55.0, false))),
            (at(1, Placement::Unpinned, false), None),
        ]);
        assert_eq!(o.status, RunStatus::Failed);
        assert!(o.text.contains("FAIL GPU 0: the device copy arrived changed"), "{}", o.text);
        assert!(o.text.contains("FAIL GPU 1: did not finish within 60 s"), "{}", o.text);
        // A triad kernel the driver cannot load fails the run, the copies' figures kept.
        let mut old_driver = bandwidth(0, 4300.0, 55.0, true);
        (old_driver.triad, old_driver.triad_error) = (None, Some("CUDA_ERROR_UNSUPPORTED_PTX_VERSION".into()));
        let o = judged(vec![(at(0, Placement::Unpinned, false), Some(old_driver))]);
        assert_eq!(o.status, RunStatus::Failed);
        assert!(o.text.contains("FAIL GPU 0: the triad kernel could not run: CUDA_ERROR_UNSUPPORTED_PTX_VERSION"));
        assert!(o.metrics.iter().any(|m| m.name == "gpu0.hbm_copy_gbps"), "the copies are kept");
    }
}

#[cfg(test)]
mod plan_tests {
    use super::*;

    /// This machine's inventory with the NUMA nodes and GPUs replaced.
    fn inventory(nodes: &[(u32, &str, u32)], gpus: &[(u32, Option<u32>)]) -> Inventory {
        let mut inv = serde_json::to_value(kiln_inventory::collect(std::path::Path::new("/")).unwrap()).unwrap();
        inv["numa"]["nodes"] = nodes
            .iter()
            .map(|(id, cpus, count)| serde_json::json!({ "id": id, "cpus": cpus, "cpu_count": count, "hugepages": [] }))
            .collect();
        inv["gpus"]["devices"] = gpus
            .iter()
            .map(|(index, node)| {
                serde_json::json!({ "index": index, "numa_node": node, "power": {}, "pcie": {}, "nvlinks": [] })
            })
            .collect();
        serde_json::from_value(inv).unwrap()
    }

    #[test]
    fn each_gpu_is_fed_from_its_own_node_then_another_then_all_at_once() {
        // Two sockets, a memory-only node (no CPUs: never a host side), GPU 1 of unknown node.
        let inv = inventory(&[(0, "0-15", 16), (1, "16-31", 16), (2, "", 0)], &[(0, Some(1)), (1, None)]);
        let rounds = plan(&inv, &[0, 1]);
        let shape: Vec<Vec<(usize, Placement, Option<u32>, Option<&str>, bool)>> = rounds
            .iter()
            .map(|r| r.iter().map(|p| (p.gpu, p.placement, p.node, p.cpus.as_deref(), p.together)).collect())
            .collect();
        assert_eq!(
            shape,
            vec![
                vec![(0, Placement::Local, Some(1), Some("16-31"), false)],
                vec![(0, Placement::Remote, Some(0), Some("0-15"), false)],
                vec![(1, Placement::Unpinned, None, None, false)],
                vec![(0, Placement::Local, Some(1), Some("16-31"), true), (1, Placement::Unpinned, None, None, true)],
            ]
        );
        // One node: nothing to compare, nothing pinned; one GPU: no round together.
        let inv = inventory(&[(0, "0-7", 8)], &[(0, Some(0))]);
        assert_eq!(
            plan(&inv, &[0]),
            vec![vec![Planned { gpu: 0, placement: Placement::Unpinned, node: None, cpus: None, together: false }]]
        );
    }
}

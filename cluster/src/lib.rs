//! `kiln cluster`: tests across servers, run as one rank of a job that the cluster's own launcher
//! started (`srun`, `mpirun`, `torchrun`). What the ranks tell each other goes over the job's
//! control plane (`rendezvous::Control`): MPI (the `mpi` cargo feature, over the system's Open MPI)
//! or, under torchrun, kiln's own TCP rendezvous. The CPU collectives and CPU training's gradients
//! go through MPI; the pair matrix's traffic is kiln's TCP benchmark (`kiln_bench::net`) between
//! the ranks' NIC addresses, one pair per node at a time; the `--nccl` commands' is NCCL's.
//!
//! This module holds the rails (NICs) a rank tests and their addresses, the documents
//! (`FabricReport`, `CollectivesReport`, `TrainScalingReport`), their text and their metrics, the
//! job and its watchdog. `fabric.rs`, `nccl.rs` and `mpi.rs` run them; `kiln report --cluster` (the
//! stored rows of every rank, judged again) is `kiln_app::cluster_report`.

mod fabric;
pub mod heartbeat;
#[cfg(feature = "mpi")]
mod mpi;
mod nccl;
pub mod rendezvous;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::Path;

use anyhow::{Context, Result};
use kiln_bench::cluster::{Collective, FabricVerdict, Finding, Launch, Link, Quantity, Subject};
use kiln_db::{Direction as Better, Metric};
use serde::Serialize;

use kiln_inventory::cpulist::parse_list;

/// Whether this kiln was built with MPI.
pub const MPI_BUILT: bool = cfg!(feature = "mpi");

/// What to do when this kiln has no MPI.
pub const NOT_BUILT: &str = "this kiln was built without MPI, which `kiln cluster` needs under `mpirun` and `srun` \
for its rendezvous, and everywhere for the CPU collectives and CPU training: install Open MPI's development files \
and libclang (Debian/Ubuntu: `apt install libopenmpi-dev libclang-dev`) and build with `cargo build --release \
--features mpi`, then launch one rank per node (`srun --ntasks-per-node=1 kiln cluster …`, `mpirun --map-by \
ppr:1:node kiln cluster …`); without MPI, the fabric test and the --nccl commands run under torchrun, or under any \
launcher with KILN_RENDEZVOUS=HOST:PORT (rank 0's host, a free port)";

/// This process's launcher, read from the environment.
///
/// # Errors
/// A launcher variable that is not a number, or a rank outside the world.
pub fn launch_from_env() -> Result<Option<Launch>> {
    kiln_bench::cluster::detect_launch(|k| std::env::var(k).ok()).map_err(anyhow::Error::msg)
}

/// One NIC a rank tests: the pair matrix is measured per rail, NIC i of one node to NIC i of the
/// other (the rail-optimised wiring of training fabrics).
#[derive(Debug, Clone, Serialize)]
pub struct Rail {
    pub interface: String,
    pub address: IpAddr,
    /// The CPUs local to the NIC's PCI device (its NUMA node); the measuring threads run there.
    pub local_cpus: Option<Vec<u32>>,
    /// The link speed the kernel reports for a physical NIC, Mb/s; none for virtual ones.
    pub speed_mbps: Option<u64>,
}

/// The interface of the default route (`/proc/net/route`), in the calling thread's namespace.
fn default_route_interface() -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/net/route").ok()?;
    text.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        (f.len() > 2 && f[1] == "00000000").then(|| f[0].to_string())
    })
}

/// The rails to test: the named interfaces in order, else the default route's interface, else the
/// first interface that is up with an IPv4 address, else loopback (ranks on one host).
///
/// # Errors
/// A named interface that does not exist or has no IPv4 address.
pub fn rails(named: &[String]) -> Result<Vec<Rail>> {
    use nix::ifaddrs::getifaddrs;
    use nix::net::if_::InterfaceFlags;
    let mut v4: Vec<(String, IpAddr, bool, bool)> = Vec::new();
    for a in getifaddrs().context("listing the network interfaces (getifaddrs)")? {
        let Some(sin) = a.address.as_ref().and_then(|s| s.as_sockaddr_in()) else { continue };
        let up = a.flags.contains(InterfaceFlags::IFF_UP) && a.flags.contains(InterfaceFlags::IFF_RUNNING);
        let lo = a.flags.contains(InterfaceFlags::IFF_LOOPBACK);
        v4.push((a.interface_name, IpAddr::V4(sin.ip()), up, lo));
    }
    let pick = |name: &str| v4.iter().find(|(n, ..)| n == name).map(|(n, ip, ..)| rail_of(n, *ip));
    if !named.is_empty() {
        return named
            .iter()
            .map(|n| {
                pick(n).with_context(|| {
                    let known: BTreeSet<&str> = v4.iter().map(|(n, ..)| n.as_str()).collect();
                    format!(
                        "--iface {n}: no such interface with an IPv4 address here (interfaces with one: {})",
                        known.into_iter().collect::<Vec<_>>().join(", ")
                    )
                })
            })
            .collect();
    }
    let chosen = default_route_interface()
        .and_then(|n| pick(&n))
        .or_else(|| v4.iter().find(|(_, _, up, lo)| *up && !lo).map(|(n, ip, ..)| rail_of(n, *ip)))
        .or_else(|| v4.iter().find(|(_, _, _, lo)| *lo).map(|(n, ip, ..)| rail_of(n, *ip)))
        .context("no interface has an IPv4 address, not even loopback")?;
    Ok(vec![chosen])
}

fn rail_of(interface: &str, address: IpAddr) -> Rail {
    let dir = Path::new("/sys/class/net").join(interface);
    let physical = dir.join("device").exists();
    let local_cpus = physical
        .then(|| std::fs::read_to_string(dir.join("device/local_cpulist")).ok())
        .flatten()
        .and_then(|s| parse_list(s.trim()));
    let speed_mbps = physical
        .then(|| std::fs::read_to_string(dir.join("speed")).ok())
        .flatten()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .filter(|&s| s > 0)
        .map(|s| s as u64);
    Rail { interface: interface.to_string(), address, local_cpus, speed_mbps }
}

/// Moves the calling thread into a network namespace (a path like `/run/netns/NAME`): the sockets
/// it makes from then on, and the threads it starts, are that namespace's.
///
/// # Errors
/// The file cannot be opened, or the kernel refuses (`setns` needs CAP_SYS_ADMIN).
pub fn enter_netns(path: &Path) -> Result<()> {
    let file = std::fs::File::open(path).with_context(|| format!("--netns {}: cannot open it", path.display()))?;
    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
        .with_context(|| format!("--netns {}: entering the network namespace (needs root)", path.display()))
}

/// Pins the calling thread to `cpus` (threads it starts inherit them); the old set is returned to
/// restore. `None` when there is nothing to pin to or the kernel refuses (then the thread runs anywhere).
pub fn pin_thread(cpus: Option<&[u32]>) -> Option<nix::sched::CpuSet> {
    use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
    use nix::unistd::Pid;
    let cpus = cpus.filter(|c| !c.is_empty())?;
    let old = sched_getaffinity(Pid::from_raw(0)).ok()?;
    let mut set = CpuSet::new();
    for &c in cpus {
        set.set(c as usize).ok()?;
    }
    sched_setaffinity(Pid::from_raw(0), &set).ok()?;
    Some(old)
}

/// Restores what [`pin_thread`] changed.
pub fn unpin_thread(old: Option<nix::sched::CpuSet>) {
    if let Some(old) = old {
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &old);
    }
}

/// How the fabric test runs.
#[derive(Debug, Clone, Serialize)]
pub struct FabricConfig {
    pub streams: usize,
    pub seconds: f64,
    pub repetitions: usize,
    /// Interfaces to test (rails), in order; empty: the default route's.
    pub interfaces: Vec<String>,
    /// A network namespace to make the test's sockets in: `{rank}` and `{local_rank}` are replaced.
    pub netns: Option<String>,
    /// The spec's floor for one link, Gb/s.
    pub floor_gbps: Option<f64>,
}

/// Which job and which rank of it a result is: every `kiln cluster` document starts with it, and
/// every rank's stored run carries it in its configuration.
#[derive(Debug, Clone, Serialize)]
pub struct Rank {
    /// One id for every rank's part of one job (made by rank 0).
    pub cluster_id: String,
    pub rank: usize,
    pub world_size: usize,
    pub launcher: Option<Launch>,
}

/// What every `kiln cluster` document gives for storing: its job, text, metrics and raw samples.
pub trait Part {
    fn job(&self) -> &Rank;
    fn render(&self) -> String;
    fn metrics(&self) -> Vec<Metric>;
    fn samples(&self) -> Vec<(String, i64, f64)>;
}

/// One node (rank) of the job, as the fabric test names it.
#[derive(Debug, Clone, Serialize)]
pub struct Node {
    pub rank: usize,
    pub host: String,
    /// How reports name it: the host name, with the namespace or rank where hosts repeat.
    pub label: String,
}

/// One rail's matrix and verdict.
#[derive(Debug, Clone, Serialize)]
pub struct RailReport {
    /// This rank's interface (rail i of every node is matched with rail i of every other).
    pub interface: String,
    /// Every directed link, every rank's measurements.
    pub links: Vec<Link>,
    pub verdict: FabricVerdict,
    /// Why a figure cannot be right (above the slower NIC's link speed), when one is not.
    pub invalid: Option<String>,
}

/// `kiln cluster fabric`: the whole job's matrix, as every rank holds it.
#[derive(Debug, Clone, Serialize)]
pub struct FabricReport {
    #[serde(flatten)]
    pub job: Rank,
    pub nodes: Vec<Node>,
    pub rails: Vec<RailReport>,
    /// Tournament rounds run (N−1 for even N, N for odd).
    pub rounds: usize,
    pub seconds: f64,
    pub config: FabricConfig,
}

impl Part for FabricReport {
    fn job(&self) -> &Rank {
        &self.job
    }
    fn render(&self) -> String {
        FabricReport::render(self)
    }
    fn metrics(&self) -> Vec<Metric> {
        FabricReport::metrics(self)
    }
    fn samples(&self) -> Vec<(String, i64, f64)> {
        FabricReport::samples(self)
    }
}

impl FabricReport {
    /// Whether any rail names anything.
    pub fn has_findings(&self) -> bool {
        self.rails.iter().any(|r| !r.verdict.findings.is_empty())
    }

    /// One finding in a sentence (see [`describe`]).
    pub fn describe(&self, rail: &RailReport, f: &Finding) -> String {
        let labels: Vec<String> = self.nodes.iter().map(|n| n.label.clone()).collect();
        describe(&labels, &rail.interface, f)
    }

    /// The matrix and the verdict, for people.
    pub fn render(&self) -> String {
        let mut out = format!(
            "fabric of {} nodes ({} rounds, {:.1} s), cluster run {}\n",
            self.job.world_size, self.rounds, self.seconds, self.job.cluster_id
        );
        out.push_str("nodes:");
        for n in &self.nodes {
            out.push_str(&format!(" #{} {}", n.rank, n.label));
            out.push(if n.rank + 1 < self.nodes.len() { ',' } else { '\n' });
        }
        for rail in &self.rails {
            out.push_str(&format!("\nrail {}: Gb/s, row sends to column\n{:>5}", rail.interface, ""));
            for n in &self.nodes {
                out.push_str(&format!(" {:>7}", format!("#{}", n.rank)));
            }
            out.push('\n');
            for from in &self.nodes {
                out.push_str(&format!("{:>5}", format!("#{}", from.rank)));
                for to in &self.nodes {
                    match rail.links.iter().find(|l| l.from == from.rank && l.to == to.rank) {
                        Some(l) => out.push_str(&format!(" {:>7.2}", l.gbps)),
                        None => out.push_str(&format!(" {:>7}", "-")),
                    }
                }
                out.push('\n');
            }
            let b = &rail.verdict.baseline;
            out.push_str(&format!(
                "baseline {:.2} Gb/s (spread {:.2}), slow below {:.2}{}; round trip {:.1} us, slow above {:.1} us\n",
                b.median_gbps,
                b.mad_gbps,
                b.slow_below_gbps,
                b.floor_gbps.map(|f| format!(" (spec floor {f:.2})")).unwrap_or_default(),
                b.median_rtt_us,
                b.slow_above_us
            ));
            if let Some(why) = &rail.invalid {
                out.push_str(&format!("INVALID: {why}\n"));
            }
            for f in &rail.verdict.findings {
                out.push_str(&format!("SLOW {}\n", self.describe(rail, f)));
            }
        }
        if !self.has_findings() {
            out.push_str("\nno slow node, NIC or link\n");
        }
        out
    }

    /// This rank's row of each rail's matrix as raw samples (index: the peer's rank): what it sent
    /// to each peer (Gb/s) and the round trip to it (µs) — the stored evidence `kiln report
    /// --cluster` assembles the matrix from, every rank contributing its own row.
    pub fn samples(&self) -> Vec<(String, i64, f64)> {
        let several = self.rails.len() > 1;
        let mut out = Vec::new();
        for rail in &self.rails {
            let prefix = if several { format!("fabric.{}.", rail.interface) } else { "fabric.".to_string() };
            for l in rail.links.iter().filter(|l| l.from == self.job.rank) {
                out.push((format!("{prefix}tx_gbps"), l.to as i64, l.gbps));
                if l.rtt_us.is_finite() {
                    out.push((format!("{prefix}rtt_us"), l.to as i64, l.rtt_us));
                }
            }
        }
        out
    }

    /// This rank's figures, named so that they compare across nodes and nights: its links out and
    /// in (worst and median) and its round trips, per rail (`fabric.` or `fabric.<rail>.` with
    /// several rails).
    pub fn metrics(&self) -> Vec<Metric> {
        let mut metrics = Vec::new();
        let several = self.rails.len() > 1;
        for rail in &self.rails {
            let prefix = if several { format!("fabric.{}.", rail.interface) } else { "fabric.".to_string() };
            let m = |name: &str, value: f64, unit: &str, direction| Metric {
                name: format!("{prefix}{name}"),
                value,
                unit: unit.into(),
                direction,
            };
            let out: Vec<f64> = rail.links.iter().filter(|l| l.from == self.job.rank).map(|l| l.gbps).collect();
            let inn: Vec<f64> = rail.links.iter().filter(|l| l.to == self.job.rank).map(|l| l.gbps).collect();
            let rtt: Vec<f64> = rail
                .links
                .iter()
                .filter(|l| l.from == self.job.rank && l.rtt_us.is_finite())
                .map(|l| l.rtt_us)
                .collect();
            let min = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
            let max = |v: &[f64]| v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            if !out.is_empty() {
                metrics.push(m("tx_gbps_min", min(&out), "Gb/s", Better::Higher));
                metrics.push(m("tx_gbps_median", kiln_bench::stats::median(&out), "Gb/s", Better::Higher));
            }
            if !inn.is_empty() {
                metrics.push(m("rx_gbps_min", min(&inn), "Gb/s", Better::Higher));
                metrics.push(m("rx_gbps_median", kiln_bench::stats::median(&inn), "Gb/s", Better::Higher));
            }
            if !rtt.is_empty() {
                metrics.push(m("rtt_us_median", kiln_bench::stats::median(&rtt), "us", Better::Lower));
                metrics.push(m("rtt_us_max", max(&rtt), "us", Better::Lower));
            }
        }
        metrics
    }
}

/// One finding in a sentence: what, which way, measured against the baseline, with its evidence;
/// nodes named by `labels` (by rank).
pub fn describe(labels: &[String], interface: &str, f: &Finding) -> String {
    use kiln_bench::cluster::Direction;
    let label = |i: usize| labels.get(i).cloned().unwrap_or_else(|| format!("rank {i}"));
    let subject = match &f.subject {
        Subject::Node { node } => format!("node {}", label(*node)),
        Subject::Link { a, b } => format!("link {} <-> {}", label(*a), label(*b)),
    };
    let way = match (&f.subject, f.direction) {
        (Subject::Node { .. }, Direction::Send) => "when it sends".to_string(),
        (Subject::Node { .. }, Direction::Receive) => "when it receives".to_string(),
        (Subject::Node { .. }, Direction::Both) => "both ways".to_string(),
        (Subject::Link { a, b }, Direction::Send) => format!("{} -> {}", label(*a), label(*b)),
        (Subject::Link { a, b }, Direction::Receive) => format!("{} -> {}", label(*b), label(*a)),
        (Subject::Link { .. }, Direction::Both) => "both ways".to_string(),
    };
    let what = match f.quantity {
        Quantity::Bandwidth => format!(
            "slow {way}: {:.2} Gb/s against a baseline of {:.2} Gb/s ({:.0} %)",
            f.measured,
            f.baseline,
            100.0 * f.measured / f.baseline
        ),
        Quantity::Latency => format!(
            "slow round trips {way}: {:.1} us against a baseline of {:.1} us ({:.1}x)",
            f.measured,
            f.baseline,
            f.measured / f.baseline
        ),
    };
    let evidence: Vec<String> = f
        .evidence
        .iter()
        .map(|l| match f.quantity {
            Quantity::Bandwidth => format!("{}->{} {:.2}", label(l.from), label(l.to), l.gbps),
            Quantity::Latency => format!("{}->{} {:.1}", label(l.from), label(l.to), l.rtt_us),
        })
        .collect();
    format!("{subject} on rail {interface}: {what} (evidence: {})", evidence.join(", "))
}

/// Any link above the slower NIC's reported speed (with 2 % for rounding): the figure cannot be
/// right, so the rail is not a result. `speeds[rank]` in Mb/s, `None` for a virtual NIC.
pub fn above_ceiling(links: &[Link], speeds: &[Option<u64>]) -> Option<String> {
    links.iter().find_map(|l| {
        let (Some(a), Some(b)) = (speeds.get(l.from).copied().flatten(), speeds.get(l.to).copied().flatten()) else {
            return None;
        };
        let ceiling = a.min(b) as f64 / 1000.0;
        (l.gbps > ceiling * 1.02).then(|| {
            format!(
                "rank {} -> rank {}: {:.2} Gb/s is above the slower NIC's link speed of {ceiling:.2} Gb/s",
                l.from, l.to, l.gbps
            )
        })
    })
}

/// How the collectives run.
#[derive(Debug, Clone, Serialize)]
pub struct CollectivesConfig {
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub collectives: Vec<Collective>,
    /// Timed iterations at most (fewer for sizes that would take longer than `seconds_per_size`).
    pub iterations: usize,
    pub warmup: usize,
    pub seconds_per_size: f64,
    /// Through NCCL on each rank's GPU (kiln-gpu does the work) instead of MPI on its CPUs.
    #[serde(default)]
    pub nccl: bool,
}

impl CollectivesConfig {
    /// What the metrics and samples are named under: `coll.` over MPI, `coll.nccl.` over NCCL, so
    /// that a box's CPU and GPU figures never compare as one.
    pub fn prefix(&self) -> &'static str {
        if self.nccl {
            "coll.nccl."
        } else {
            "coll."
        }
    }
}

/// One collective at one size, as nccl-tests prints it.
#[derive(Debug, Clone, Serialize)]
pub struct CollectiveRow {
    pub collective: Collective,
    /// nccl-tests' size: the whole buffer (all-gather's output, reduce-scatter's input).
    pub bytes: u64,
    /// f32 elements in that buffer.
    pub count: u64,
    pub iterations: usize,
    /// Mean time of one call, the slowest rank's, microseconds.
    pub time_us: f64,
    /// GB/s (10⁹ bytes).
    pub algbw_gbs: f64,
    pub busbw_gbs: f64,
}

/// `kiln cluster collectives`.
#[derive(Debug, Clone, Serialize)]
pub struct CollectivesReport {
    #[serde(flatten)]
    pub job: Rank,
    /// The MPI library's own description.
    pub library: String,
    pub rows: Vec<CollectiveRow>,
    /// Every result was checked against the sum or the data it must hold.
    pub checked: bool,
    pub config: CollectivesConfig,
}

impl Part for CollectivesReport {
    fn job(&self) -> &Rank {
        &self.job
    }
    fn render(&self) -> String {
        CollectivesReport::render(self)
    }
    fn metrics(&self) -> Vec<Metric> {
        CollectivesReport::metrics(self)
    }
    fn samples(&self) -> Vec<(String, i64, f64)> {
        CollectivesReport::samples(self)
    }
}

impl CollectivesReport {
    pub fn render(&self) -> String {
        let mut out = format!(
            "collectives over {}, {} ranks, cluster run {} ({})\n",
            if self.config.nccl { "NCCL on each rank's GPU" } else { "MPI" },
            self.job.world_size,
            self.job.cluster_id,
            self.library.lines().next().unwrap_or("")
        );
        for c in &self.config.collectives {
            out.push_str(&format!(
                "\n{}\n{:>12} {:>12} {:>6} {:>12} {:>10} {:>10}\n",
                c.name(),
                "size (B)",
                "count",
                "iters",
                "time (us)",
                "algbw GB/s",
                "busbw GB/s"
            ));
            for r in self.rows.iter().filter(|r| r.collective == *c) {
                out.push_str(&format!(
                    "{:>12} {:>12} {:>6} {:>12.1} {:>10.3} {:>10.3}\n",
                    r.bytes, r.count, r.iterations, r.time_us, r.algbw_gbs, r.busbw_gbs
                ));
            }
        }
        out.push_str(&format!("results {}\n", if self.checked { "checked: correct" } else { "NOT checked" }));
        out
    }

    /// Every size's bus bandwidth and time as raw samples (index: bytes).
    pub fn samples(&self) -> Vec<(String, i64, f64)> {
        self.rows
            .iter()
            .flat_map(|r| {
                let (prefix, name) = (self.config.prefix(), r.collective.name());
                [
                    (format!("{prefix}{name}.busbw_gbs"), r.bytes as i64, r.busbw_gbs),
                    (format!("{prefix}{name}.time_us"), r.bytes as i64, r.time_us),
                ]
            })
            .collect()
    }

    /// Per collective: the best bus bandwidth over the sizes, and the smallest size's time.
    pub fn metrics(&self) -> Vec<Metric> {
        let mut metrics = Vec::new();
        for c in &self.config.collectives {
            let rows: Vec<&CollectiveRow> = self.rows.iter().filter(|r| r.collective == *c).collect();
            let Some(first) = rows.first() else { continue };
            let best = rows.iter().map(|r| r.busbw_gbs).fold(0.0, f64::max);
            metrics.push(Metric {
                name: format!("{}{}.busbw_gbs_max", self.config.prefix(), c.name()),
                value: best,
                unit: "GB/s".into(),
                direction: Better::Higher,
            });
            metrics.push(Metric {
                name: format!("{}{}.time_us_smallest", self.config.prefix(), c.name()),
                value: first.time_us,
                unit: "us".into(),
                direction: Better::Lower,
            });
        }
        metrics
    }
}

/// How the data-parallel scaling runs: the reference training run's configuration, per rank.
#[derive(Debug, Clone, Serialize)]
pub struct TrainConfig {
    pub train: kiln_bench::train::Config,
    /// On each rank's GPU through kiln-gpu, the gradients all-reduced by NCCL (else on the CPUs
    /// over MPI).
    #[serde(default)]
    pub nccl: bool,
    /// With `nccl`: how the products run (`bf16`, `tf32`, `f32`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
}

impl TrainConfig {
    /// What the metrics are named under: `cluster.train.` on CPUs over MPI, `cluster.train.nccl.`
    /// on GPUs (a different machine's figures, never compared with the CPUs').
    pub fn prefix(&self) -> &'static str {
        if self.nccl {
            "cluster.train.nccl."
        } else {
            "cluster.train."
        }
    }
}

/// The rank counts a weak-scaling curve is measured at: 1, 2, 4 … below `world`, then `world`.
pub fn scaling_steps(world: usize) -> Vec<usize> {
    let mut out: Vec<usize> =
        std::iter::successors(Some(1usize), |k| k.checked_mul(2)).take_while(|&k| k < world).collect();
    out.push(world.max(1));
    out
}

/// One point of the weak-scaling curve.
#[derive(Debug, Clone, Serialize)]
pub struct ScalingRow {
    pub ranks: usize,
    /// Mean over the ranks.
    pub tokens_per_s_per_rank: f64,
    pub tokens_per_s_total: f64,
    /// Tokens/s per rank over the single rank's: 1.0 is perfect weak scaling.
    pub efficiency: f64,
    /// The all-reduce's share of a step, the largest over the ranks (0 on one rank).
    pub comm_share: f64,
    /// The mean loss of the last steps (the same on every rank: the loss is averaged too).
    pub loss_end: f64,
    pub learned: bool,
    /// Model FLOP utilisation, the mean over the ranks, where the device's peak is known (GPUs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mfu: Option<f64>,
}

/// What each rank of a `k`-rank group measured, for [`ScalingRow::of`]: tokens/s, the
/// all-reduce's share of a step, the end loss, whether it learned (1 or 0), MFU (NaN: unknown).
const ROW_VALUES: usize = 5;

impl ScalingRow {
    /// The point of `k` ranks: this rank's run (if it trained in the group) gathered with every
    /// rank's; efficiency against `single`, the one-rank point's tokens/s (none: this is that point).
    ///
    /// # Errors
    /// As [`rendezvous::gather_f64s`].
    pub fn gather(
        c: &dyn rendezvous::Control,
        watchdog: &Watchdog,
        k: usize,
        report: Option<&kiln_bench::train::Report>,
        single: Option<f64>,
    ) -> Result<ScalingRow> {
        let mine = ScalingRow::mine(report);
        let all = rendezvous::gather_f64s(c, &mine, watchdog, &format!("gathering the {k}-rank point"))?;
        Ok(ScalingRow::of(k, &all.concat(), single))
    }

    /// This rank's values for the gather ([`ROW_VALUES`] of them); NaN where it did not train.
    fn mine(report: Option<&kiln_bench::train::Report>) -> [f64; ROW_VALUES] {
        match report {
            None => [f64::NAN; ROW_VALUES],
            Some(r) => [
                r.tokens_per_s,
                r.parallel.as_ref().map_or(0.0, |p| p.comm_share),
                r.loss_end,
                f64::from(u8::from(r.learned)),
                r.mfu.unwrap_or(f64::NAN),
            ],
        }
    }

    /// The point of `k` ranks from every rank's gathered values (the first `k` ranks trained);
    /// efficiency against `single`, the one-rank point's tokens/s (none: this is that point).
    fn of(k: usize, gathered: &[f64], single: Option<f64>) -> ScalingRow {
        let members: Vec<&[f64]> = gathered.chunks(ROW_VALUES).take(k).collect();
        let per_rank = members.iter().map(|m| m[0]).sum::<f64>() / k as f64;
        let mfu: Vec<f64> = members.iter().map(|m| m[4]).filter(|v| v.is_finite()).collect();
        ScalingRow {
            ranks: k,
            tokens_per_s_per_rank: per_rank,
            tokens_per_s_total: per_rank * k as f64,
            efficiency: per_rank / single.unwrap_or(per_rank),
            comm_share: members.iter().map(|m| m[1]).fold(0.0, f64::max),
            loss_end: members[0][2],
            learned: members.iter().all(|m| m[3] == 1.0),
            mfu: (mfu.len() == members.len()).then(|| mfu.iter().sum::<f64>() / mfu.len() as f64),
        }
    }
}

/// `kiln cluster train`.
#[derive(Debug, Clone, Serialize)]
pub struct TrainScalingReport {
    #[serde(flatten)]
    pub job: Rank,
    pub rows: Vec<ScalingRow>,
    /// This rank's run at the largest rank count it trained at (the full world's, unless the
    /// curve stopped early): its loss curve is the job's there.
    pub run: Option<kiln_bench::train::Report>,
    /// Why the curve stopped before the full world (a group whose run failed, every failing rank
    /// named with its reason); the points before it stand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
    /// What summed the gradients: the MPI library's description, or NCCL.
    #[serde(default)]
    pub library: String,
    /// The GPU this rank trained on (`nccl`), as kiln-gpu named it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    pub config: TrainConfig,
}

impl Part for TrainScalingReport {
    fn job(&self) -> &Rank {
        &self.job
    }
    fn render(&self) -> String {
        TrainScalingReport::render(self)
    }
    fn metrics(&self) -> Vec<Metric> {
        TrainScalingReport::metrics(self)
    }
    fn samples(&self) -> Vec<(String, i64, f64)> {
        TrainScalingReport::samples(self)
    }
}

impl TrainScalingReport {
    pub fn render(&self) -> String {
        let c = &self.config.train;
        let on = match (&self.config.dtype, &self.gpu) {
            (Some(dtype), gpu) if self.config.nccl => {
                format!(
                    "on GPUs ({}, {dtype} products{}), ",
                    self.library,
                    gpu.as_ref().map_or(String::new(), |g| format!("; rank {}: {g}", self.job.rank))
                )
            }
            _ if !self.library.is_empty() => format!("on CPUs ({}), ", self.library.lines().next().unwrap_or_default()),
            _ => String::new(),
        };
        let mfu = self.rows.iter().any(|r| r.mfu.is_some());
        let mut out = format!(
            "data-parallel training, weak scaling, {on}{} ({} layers, d_model {}), batch {} x seq {} per rank, {} steps; \
             cluster run {}\n{:>6} {:>14} {:>14} {:>10} {:>10} {:>10}{}\n",
            c.size,
            c.layers,
            c.d_model,
            c.batch,
            c.seq,
            c.steps,
            self.job.cluster_id,
            "ranks",
            "tok/s per rank",
            "tok/s total",
            "efficiency",
            "comm",
            "loss end",
            if mfu { format!(" {:>7}", "MFU") } else { String::new() }
        );
        for r in &self.rows {
            out.push_str(&format!(
                "{:>6} {:>14.0} {:>14.0} {:>9.1}% {:>9.1}% {:>10.3}{}{}\n",
                r.ranks,
                r.tokens_per_s_per_rank,
                r.tokens_per_s_total,
                100.0 * r.efficiency,
                100.0 * r.comm_share,
                r.loss_end,
                match (mfu, r.mfu) {
                    (true, Some(m)) => format!(" {:>6.1}%", 100.0 * m),
                    (true, None) => format!(" {:>7}", "-"),
                    _ => String::new(),
                },
                if r.learned { "" } else { "  DID NOT LEARN" }
            ));
        }
        if let Some(why) = &self.stopped {
            out.push_str(&format!("STOPPED before {} ranks: {why}\n", self.job.world_size));
        }
        out
    }

    /// The scaling curve (index: ranks) and the full world's loss curve (index: step) as raw samples.
    pub fn samples(&self) -> Vec<(String, i64, f64)> {
        let mut out = Vec::new();
        for r in &self.rows {
            let k = r.ranks as i64;
            out.push(("scaling.tokens_per_s_per_rank".to_string(), k, r.tokens_per_s_per_rank));
            out.push(("scaling.efficiency".to_string(), k, r.efficiency));
            out.push(("scaling.comm_share".to_string(), k, r.comm_share));
            if let Some(mfu) = r.mfu {
                out.push(("scaling.mfu".to_string(), k, mfu));
            }
        }
        if let Some(run) = &self.run {
            out.extend(run.loss_curve.iter().enumerate().map(|(i, l)| ("scaling.loss".to_string(), i as i64, *l)));
        }
        out
    }

    /// At the full world size: tokens/s per rank, efficiency, the all-reduce's share.
    pub fn metrics(&self) -> Vec<Metric> {
        let Some(last) = self.rows.last() else { return Vec::new() };
        let m = |name: &str, value: f64, unit: &str, direction| Metric {
            name: name.into(),
            value,
            unit: unit.into(),
            direction,
        };
        let p = self.config.prefix();
        let mut out = vec![
            m(&format!("{p}tokens_per_s_per_rank"), last.tokens_per_s_per_rank, "tokens/s", Better::Higher),
            m(&format!("{p}scaling_efficiency"), last.efficiency, "ratio", Better::Higher),
            m(&format!("{p}comm_share"), last.comm_share, "ratio", Better::Lower),
        ];
        if let Some(mfu) = last.mfu {
            out.push(m(&format!("{p}mfu"), mfu, "ratio", Better::Higher));
        }
        out
    }
}

pub use kiln_bench::cluster::parse_size;

/// The namespace path for this rank: `{rank}` and `{local_rank}` replaced.
pub fn netns_path(pattern: &str, rank: usize, local_rank: usize) -> String {
    pattern.replace("{rank}", &rank.to_string()).replace("{local_rank}", &local_rank.to_string())
}

#[cfg(feature = "mpi")]
pub use mpi::library_version;

/// This process's job, joined through kiln's rendezvous: the control plane, the watchdog (at
/// `limit`) with the heartbeats started, and the launcher's view.
///
/// # Errors
/// No launcher, or the rendezvous cannot form.
pub fn tcp_job(limit: std::time::Duration) -> Result<(rendezvous::Tcp, Watchdog, Launch)> {
    let launch = launch_from_env()?.context(
        "kiln's rendezvous needs a launcher's rank and world size (RANK and WORLD_SIZE, SLURM_PROCID and SLURM_NTASKS)",
    )?;
    let watchdog = Watchdog::start(launch.rank, limit);
    let tcp = rendezvous::Tcp::join(&launch, &watchdog, limit)?;
    heartbeat::start(&tcp, &watchdog)?;
    Ok((tcp, watchdog, launch))
}

pub use rendezvous::wanted as over_tcp;

/// What a job that meets through kiln's rendezvous cannot run.
pub const TORCHRUN_CPU: &str = "launched by torchrun (or with KILN_RENDEZVOUS), whose processes MPI cannot join: \
so kiln runs the fabric test, `cluster collectives --nccl` and `cluster train --nccl` (kiln's TCP benchmark or NCCL \
carries the data, kiln's own rendezvous at MASTER_ADDR the rest); the CPU collectives and CPU training need MPI's \
launcher (`mpirun`, or `srun --mpi=pmix`) and a kiln built with `--features mpi`";

/// `kiln cluster fabric`, as one rank: over MPI, or through kiln's rendezvous.
///
/// # Errors
/// No MPI in this build where one is needed, or the test's own errors.
pub fn fabric(config: &FabricConfig, stall: std::time::Duration) -> Result<(FabricReport, Job)> {
    if over_tcp(&launch_from_env()?) {
        return fabric::over_tcp(config, stall);
    }
    #[cfg(feature = "mpi")]
    return mpi::fabric(config, stall);
    #[cfg(not(feature = "mpi"))]
    anyhow::bail!(NOT_BUILT)
}

/// `kiln cluster collectives`, as one rank: over MPI, or under torchrun (with `--nccl`) through
/// kiln's rendezvous.
///
/// # Errors
/// No MPI in this build where one is needed, or the job's own errors.
pub fn collectives(config: &CollectivesConfig, stall: std::time::Duration) -> Result<(CollectivesReport, Job)> {
    if over_tcp(&launch_from_env()?) {
        anyhow::ensure!(config.nccl, TORCHRUN_CPU);
        return nccl::collectives_over_tcp(config, stall);
    }
    #[cfg(feature = "mpi")]
    return mpi::collectives(config, stall);
    #[cfg(not(feature = "mpi"))]
    anyhow::bail!(NOT_BUILT)
}

/// `kiln cluster train`, as one rank: over MPI, or under torchrun (with `--nccl`) through kiln's
/// rendezvous.
///
/// # Errors
/// No MPI in this build where one is needed, or the job's own errors.
pub fn train(config: &TrainConfig, stall: std::time::Duration) -> Result<(TrainScalingReport, Job)> {
    if over_tcp(&launch_from_env()?) {
        anyhow::ensure!(config.nccl, TORCHRUN_CPU);
        return nccl::train_over_tcp(config, stall);
    }
    #[cfg(feature = "mpi")]
    return mpi::train(config, stall);
    #[cfg(not(feature = "mpi"))]
    anyhow::bail!(NOT_BUILT)
}

/// The job, kept open after a test so that every rank stores its part before any rank leaves: a
/// launcher stops the whole job when one rank exits with an error, and rank 0 exits 1 on a finding.
pub struct Job {
    carrier: Carrier,
    watchdog: Watchdog,
}

/// What the job's ranks meet through.
enum Carrier {
    #[cfg(feature = "mpi")]
    Mpi(::mpi::environment::Universe),
    Tcp(rendezvous::Tcp),
}

impl Job {
    #[cfg(feature = "mpi")]
    fn over_mpi(universe: ::mpi::environment::Universe, watchdog: Watchdog) -> Job {
        Job { carrier: Carrier::Mpi(universe), watchdog }
    }

    fn over_tcp(tcp: rendezvous::Tcp, watchdog: Watchdog) -> Job {
        Job { carrier: Carrier::Tcp(tcp), watchdog }
    }

    /// Waits until every rank has come here (rank 0 names in its watchdog those it waits for).
    ///
    /// # Errors
    /// A rank is gone before it came.
    pub fn barrier(&self) -> Result<()> {
        match &self.carrier {
            #[cfg(feature = "mpi")]
            Carrier::Mpi(universe) => {
                mpi::roll_call(&universe.world(), &self.watchdog, "storing every rank's part", None);
                Ok(())
            }
            Carrier::Tcp(tcp) => {
                use rendezvous::Control;
                self.watchdog.at("storing every rank's part");
                tcp.all_gather(&[], &self.watchdog, "storing every rank's part").map(drop)
            }
        }
    }
}

/// A rank's guard against a job that stopped moving. A rank that dies or hangs leaves the others
/// blocked in MPI or on a socket, and not every launcher stops them (Slurm's `srun` lets the other
/// tasks run on unless `--kill-on-bad-exit`; nothing notices a rank that hangs). The test says
/// where it is with [`Watchdog::at`]; when it has not moved on for the limit, this rank says what
/// it was waiting for and exits 2, which makes any launcher end the job. Nothing of the command is
/// stored then (earlier commands' results are).
pub struct Watchdog {
    state: std::sync::Arc<WatchState>,
    /// Rank 0's: what the other ranks' heartbeats said (`heartbeat::start`), told when it stalls.
    roster: std::sync::Arc<std::sync::OnceLock<std::sync::Arc<heartbeat::Roster>>>,
}

struct WatchState {
    /// Since when, doing what, and how many limits it may take.
    at: std::sync::Mutex<(std::time::Instant, String, u32)>,
    done: std::sync::atomic::AtomicBool,
    /// Percent added to every limit: a rank that beats to rank 0 lets rank 0, which heard from
    /// everyone, speak first.
    slack: std::sync::atomic::AtomicU32,
}

impl Watchdog {
    /// A watchdog that ends this process (exit status 2) after `limit` without progress.
    pub fn start(rank: usize, limit: std::time::Duration) -> Watchdog {
        let roster: std::sync::Arc<std::sync::OnceLock<std::sync::Arc<heartbeat::Roster>>> = Default::default();
        let heard = std::sync::Arc::clone(&roster);
        let mut dog = Watchdog::with_action(limit, move |what, waited| {
            let others = heard
                .get()
                .and_then(|r| r.describe())
                .map(|d| format!("; what the other ranks last said: {d}"))
                .unwrap_or_default();
            eprintln!(
                "kiln: rank {rank}: nothing moved for {waited:.0} s while {what}{others}: a rank of the job has died \
                 or hangs (look for it in the launcher's output, or raise --stall-timeout if a step is that slow); \
                 this rank stops, and nothing of this command is stored"
            );
            std::process::exit(2);
        });
        dog.roster = roster;
        dog
    }

    /// Rank 0: what the other ranks' heartbeats say goes into the message of a stall.
    pub fn tell_with(&self, roster: std::sync::Arc<heartbeat::Roster>) {
        let _ = self.roster.set(roster);
    }

    /// Another rank: beats to rank 0 at `to` from a thread of its own, saying where this watchdog
    /// is and for how long, until the watchdog is dropped; from now on this rank allows every
    /// limit half again, so that where all wait alike rank 0, which heard from every rank, speaks
    /// first.
    pub fn beat_to(&self, to: std::net::SocketAddr, rank: usize, token: [u8; 16]) {
        use std::sync::atomic::Ordering;
        self.state.slack.store(50, Ordering::Relaxed);
        let watched = std::sync::Arc::clone(&self.state);
        std::thread::spawn(move || {
            let Ok(socket) = std::net::UdpSocket::bind((std::net::Ipv4Addr::UNSPECIFIED, 0)) else { return };
            while !watched.done.load(Ordering::Relaxed) {
                let beat = {
                    let at = watched.at.lock().unwrap_or_else(|p| p.into_inner());
                    heartbeat::encode(&token, rank, at.0.elapsed().as_secs_f64(), &at.1)
                };
                // A lost beat is one of many; a refused one (rank 0 gone) the next will say again.
                let _ = socket.send_to(&beat, to);
                std::thread::sleep(heartbeat::INTERVAL);
            }
        });
    }

    /// A watchdog that calls `stalled(what, seconds waited)` once when `limit` passes without progress.
    pub fn with_action(limit: std::time::Duration, stalled: impl FnOnce(&str, f64) + Send + 'static) -> Watchdog {
        use std::sync::atomic::Ordering;
        let state = std::sync::Arc::new(WatchState {
            at: std::sync::Mutex::new((std::time::Instant::now(), "starting".to_string(), 1)),
            done: std::sync::atomic::AtomicBool::new(false),
            slack: std::sync::atomic::AtomicU32::new(0),
        });
        let watched = std::sync::Arc::clone(&state);
        let tick = (limit / 4).clamp(std::time::Duration::from_millis(10), std::time::Duration::from_millis(500));
        std::thread::spawn(move || {
            while !watched.done.load(Ordering::Relaxed) {
                std::thread::sleep(tick);
                let at = watched.at.lock().unwrap_or_else(|p| p.into_inner());
                let slack = 1.0 + f64::from(watched.slack.load(Ordering::Relaxed)) / 100.0;
                let allowed = limit.mul_f64(f64::from(at.2) * slack);
                if at.2 > 0 && at.0.elapsed() > allowed && !watched.done.load(Ordering::Relaxed) {
                    let (what, waited) = (at.1.clone(), at.0.elapsed().as_secs_f64());
                    drop(at);
                    stalled(&what, waited);
                    return;
                }
            }
        });
        Watchdog { state, roster: Default::default() }
    }

    /// The rank has moved on: now `what` (shown if it stalls there).
    pub fn at(&self, what: impl Into<String>) {
        self.set(what.into(), 1);
    }

    /// Waiting on a rank that watches the same thing and knows more (rank 0 at a roll call knows
    /// who is missing): twice the limit, so that it speaks first.
    pub fn behind(&self, what: impl Into<String>) {
        self.set(what.into(), 2);
    }

    /// Moves on to `what`, allowed `limits` limits, unless this rank is already allowed longer (a
    /// [`Watchdog::waiting`] bound, counted from when it began), which then stands with its own
    /// words: what the job's control plane says while it carries a message, so that a rank
    /// waiting for others to train is not cut short by the gather that ends the wait.
    pub fn at_least(&self, what: impl Into<String>, limits: u32) {
        let mut at = self.state.at.lock().unwrap_or_else(|p| p.into_inner());
        if at.2 <= limits.max(1) {
            *at = (std::time::Instant::now(), what.into(), limits.max(1));
        }
    }

    /// Waiting for as long as other ranks take (`what`), where their own watchdogs bound that to
    /// `limits` times the limit: this rank stops after that many limits (where the others hung
    /// and the launcher let this rank run on), until the next [`Watchdog::at`].
    pub fn waiting(&self, what: impl Into<String>, limits: u32) {
        self.set(what.into(), limits.max(1));
    }

    fn set(&self, what: String, limits: u32) {
        *self.state.at.lock().unwrap_or_else(|p| p.into_inner()) = (std::time::Instant::now(), what, limits);
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.state.done.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Without MPI there is no library to describe.
#[cfg(not(feature = "mpi"))]
pub fn library_version() -> Option<String> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watchdog_fires_once_where_the_rank_stopped_moving_and_not_while_it_moves_or_waits_within_bound() {
        use std::sync::mpsc;
        use std::time::Duration;
        let limit = Duration::from_millis(150);
        let (tx, rx) = mpsc::channel();
        let dog = Watchdog::with_action(limit, move |what, waited| tx.send((what.to_string(), waited)).unwrap());
        // Moving on more often than the limit, then waiting on others within their bound: quiet.
        for step in 0..8 {
            dog.at(format!("step {step}"));
            std::thread::sleep(limit / 3);
        }
        dog.waiting("other ranks train", 5);
        std::thread::sleep(limit * 3);
        dog.behind("waiting for rank 0");
        std::thread::sleep(limit * 3 / 2);
        assert!(rx.try_recv().is_err(), "no stall while moving or waiting, nor behind another within 2 limits");
        // A gather while waiting keeps the waiting bound (and its words); one after a step moves on.
        dog.waiting("ranks 0-1 train without this rank", 5);
        dog.at_least("hearing whether every rank could train", 1);
        std::thread::sleep(limit * 2);
        assert!(rx.try_recv().is_err(), "the waiting bound stands through the gather");
        dog.at("gathering");
        dog.at_least("sending to rank 2", 1);
        let (what, waited) = rx.recv_timeout(Duration::from_secs(5)).expect("a stall is reported");
        assert_eq!(what, "sending to rank 2", "a gather after a step moves on");
        assert!(waited >= limit.as_secs_f64(), "{waited}");
        assert!(rx.recv_timeout(limit * 3).is_err(), "reported once");

        // Waiting past the others' bound: reported, after that many limits and not before.
        let (tx, rx) = mpsc::channel();
        let dog = Watchdog::with_action(limit, move |what, waited| tx.send((what.to_string(), waited)).unwrap());
        dog.waiting("ranks 0-1 train without this rank", 4);
        let (what, waited) = rx.recv_timeout(Duration::from_secs(5)).expect("a stall is reported");
        assert_eq!(what, "ranks 0-1 train without this rank");
        assert!(waited >= 4.0 * limit.as_secs_f64(), "{waited}");
        drop(dog);

        // A finished command's watchdog says nothing.
        let (tx, rx) = mpsc::channel();
        drop(Watchdog::with_action(limit, move |what, _| tx.send(what.to_string()).unwrap()));
        assert!(rx.recv_timeout(limit * 3).is_err());
    }

    #[test]
    fn a_figure_above_the_nic_speed_is_refused() {
        let link = |from, to, gbps| Link { from, to, gbps, rtt_us: 10.0 };
        let speeds = [Some(100_000), Some(25_000), None];
        assert!(above_ceiling(&[link(0, 1, 24.0), link(0, 2, 300.0)], &speeds).is_none());
        let why = above_ceiling(&[link(1, 0, 40.0)], &speeds).unwrap();
        assert!(why.contains("rank 1 -> rank 0") && why.contains("25.00"), "{why}");
    }

    #[test]
    fn weak_scaling_doubles_to_the_world() {
        assert_eq!(scaling_steps(1), [1]);
        assert_eq!(scaling_steps(4), [1, 2, 4]);
        assert_eq!(scaling_steps(6), [1, 2, 4, 6]);
    }

    #[test]
    fn namespaces_are_named_per_rank() {
        assert_eq!(netns_path("/run/netns/n{rank}-{local_rank}", 3, 1), "/run/netns/n3-1");
    }
}

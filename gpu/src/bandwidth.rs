//! Memory bandwidth of one GPU: a device-to-device copy in its own memory (HBM: bytes read plus
//! bytes written, as STREAM and the datasheets' comparisons count them), STREAM's triad by a
//! kernel of kiln's own (three arrays' bytes counted), and host↔device copies
//! from page-locked host memory (the PCIe or C2C link: bytes moved). Every repetition is timed
//! with CUDA events around the copy alone; every copy is **checked**: the buffers carry a pattern
//! from the host, and what arrives (on the device, back on the host) must equal it, so a GPU or
//! link that corrupts data fails however fast.
//!
//! The host buffer is allocated after `--cpus` has pinned the process, so the kernel places it on
//! those CPUs' NUMA node: kiln runs this once from the GPU's own node and once from another, which
//! shows a wrong affinity.

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// What `kiln-gpu bandwidth` measures.
#[derive(Debug, Clone)]
pub struct Options {
    pub device: usize,
    /// Bytes per copy.
    pub bytes: usize,
    pub reps: usize,
    /// The CPUs the process runs on (kernel list syntax), and so where the host buffer lives.
    pub cpus: Option<String>,
}

/// A kernel CPU list ("0-15,32-47") as CPU numbers.
pub fn parse_cpus(list: &str) -> anyhow::Result<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || format!("--cpus {list:?}: a CPU list like 0-15,32-47");
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().with_context(bad)?, b.parse().with_context(bad)?);
                anyhow::ensure!(a <= b && b < 65_536, bad());
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().with_context(bad)?),
        }
    }
    anyhow::ensure!(!cpus.is_empty(), "--cpus {list:?}: no CPU");
    Ok(cpus)
}

/// One direction's copies.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Copies {
    /// Bytes counted per copy (a device copy counts what it reads and what it writes).
    pub bytes_counted: f64,
    /// Each timed copy, by CUDA events.
    pub seconds: Vec<f64>,
    pub gbps_median: f64,
    pub gbps_best: f64,
    /// What arrived equals what was sent.
    pub intact: bool,
}

impl Copies {
    pub fn new(bytes_counted: f64, seconds: Vec<f64>, intact: bool) -> Copies {
        let mut sorted = seconds.clone();
        sorted.sort_by(f64::total_cmp);
        let rate = |s: f64| if s > 0.0 { bytes_counted / s / 1e9 } else { 0.0 };
        let (median, best) = match sorted.as_slice() {
            [] => (0.0, 0.0),
            s => (rate(s[s.len() / 2]), rate(s[0])),
        };
        Copies { bytes_counted, seconds, gbps_median: median, gbps_best: best, intact }
    }
}

/// `kiln-gpu bandwidth`'s document.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub device: usize,
    pub name: Option<String>,
    /// Bytes per copy.
    pub bytes: usize,
    /// The CPUs the process ran on, as asked (`None`: wherever the scheduler put it).
    pub cpus: Option<String>,
    /// Device to device within the GPU's memory: read + write counted.
    pub device_copy: Copies,
    /// STREAM's triad a = b + s·c by a kernel of kiln's own (`kernels/triad.cu`), `bytes` per
    /// array: two arrays read and one written counted. Absent from documents of before it.
    #[serde(default)]
    pub triad: Option<Copies>,
    /// Why the triad has no figures, where its kernel could not run.
    #[serde(default)]
    pub triad_error: Option<String>,
    pub host_to_device: Copies,
    pub device_to_host: Copies,
}

/// The byte at `i` of the pattern every buffer carries (never a run of one value, so a copy
/// that drops, repeats or shifts a page shows).
pub fn pattern(i: usize) -> u8 {
    let x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x >> 56) as u8 ^ (i >> 12) as u8
}

/// Pins this process to `cpus` (before any host buffer exists, so that it lands on their node).
pub fn pin_to(cpus: &str) -> anyhow::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    for cpu in parse_cpus(cpus)? {
        set.set(cpu).with_context(|| format!("CPU {cpu} is beyond what this kernel's CPU sets hold"))?;
    }
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
        .with_context(|| format!("running on CPUs {cpus}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_and_cpu_lists_are_checked() {
        let args = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        let o = crate::request::checked::<crate::request::BandwidthArgs>(&args(
            "--device 2 --mib 256 --reps 5 --cpus 0-3,8",
        ))
        .unwrap();
        assert_eq!((o.device, o.bytes, o.reps, o.cpus.as_deref()), (2, 256 << 20, 5, Some("0-3,8")));
        assert_eq!(parse_cpus("0-3,8").unwrap(), [0, 1, 2, 3, 8]);
        for bad in ["--mib 0", "--reps 0", "--cpus 3-1", "--cpus x", "--cpus ,", "--size 3"] {
            assert!(crate::request::checked::<crate::request::BandwidthArgs>(&args(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn rates_count_what_each_copy_moves() {
        let c = Copies::new(2e9, vec![0.002, 0.001, 0.004], true);
        assert_eq!((c.gbps_median, c.gbps_best), (1000.0, 2000.0));
        // The pattern has no long runs: neighbouring pages differ.
        assert_ne!((0..4096).map(pattern).collect::<Vec<_>>(), (4096..8192).map(pattern).collect::<Vec<_>>());
    }

    #[test]
    fn this_process_can_be_pinned() {
        let allowed = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).unwrap();
        let first = (0..nix::sched::CpuSet::count()).find(|&c| allowed.is_set(c).unwrap_or(false)).unwrap();
        // A thread of its own: the test harness's other tests keep their CPUs.
        std::thread::spawn(move || {
            pin_to(&first.to_string()).unwrap();
            let now = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).unwrap();
            assert!(now.is_set(first).unwrap());
            assert_eq!((0..nix::sched::CpuSet::count()).filter(|&c| now.is_set(c).unwrap_or(false)).count(), 1);
        })
        .join()
        .unwrap();
    }
}

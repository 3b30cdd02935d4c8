//! The hardware inventory: one versioned document describing a host, read from a root directory
//! (`/` on a live machine, a captured snapshot in tests). Readers never fail on odd data: what
//! cannot be read is `None` and a [`Problem`] says what and why. Beside it, what the hardware says
//! over time: `telemetry` (CPU and GPU sensors during a run), `linkwatch` (PCIe links under load),
//! `snapshot` (the files the readers read, as a tarball) and `summary` (the inventory for people).

pub mod counters;
pub mod cpu;
pub mod cpulist;
pub mod fingerprint;
pub mod gpu;
pub mod hwmon;
pub mod kmsg;
pub mod linkwatch;
pub mod memory;
pub mod net;
pub mod numa;
pub mod nvme;
pub mod os;
pub mod pci;
pub mod pciids;
pub mod rdma;
pub mod smbios;
pub mod snapshot;
pub mod source;
pub mod summary;
pub mod system;
pub mod telemetry;
pub mod topology;

use std::ffi::OsString;
use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};

pub use fingerprint::Fingerprints;
pub use source::{Problem, ProblemKind, Source};

/// The version of the JSON document. Bump it when a field changes meaning or is removed;
/// adding a field does not need a bump (readers ignore what they do not know).
/// 2: a PCI function's `class_name` is its subclass ("PCI bridge"; the programming interface moved
/// to `prog_if_name`), and unknown `vendor_id` / `device_id` are null instead of "".
pub const SCHEMA_VERSION: u32 = 2;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Inventory {
    pub schema_version: u32,
    pub kiln_version: String,
    pub collected_at: String,
    /// How long the collection took, for the curious and for regressions in kiln itself.
    pub collection_micros: u64,
    /// The root that was read: `/`, or a snapshot directory.
    pub root: String,
    pub cpu: cpu::Cpu,
    pub numa: numa::Numa,
    pub memory: memory::Memory,
    pub system: system::System,
    pub os: os::Os,
    /// Every PCI function, sorted by address.
    pub pci: Vec<pci::PciDevice>,
    pub gpus: gpu::Gpus,
    pub nvme: Vec<nvme::NvmeController>,
    pub nics: Vec<net::Nic>,
    pub rdma: Vec<rdma::RdmaDevice>,
    pub topology: topology::Topology,
    pub fingerprints: Fingerprints,
    /// GPU XID events from the kernel log since boot (absent in documents from before it was read).
    #[serde(default)]
    pub kernel_log: kmsg::KernelLog,
    /// The board's temperature and fan sensors (hwmon; absent in documents from before it was read).
    #[serde(default)]
    pub hwmon: Vec<hwmon::Chip>,
    pub problems: Vec<Problem>,
}

#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error("{path}: no such directory")]
    RootMissing { path: String },
    #[error("{path} holds neither proc/ nor sys/: not a system root or snapshot")]
    NotASnapshot { path: String },
}

/// What to collect beyond the defaults.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The NVML library to load. Default: `libnvidia-ml.so.1` on the live system; none for a
    /// snapshot (NVML describes the machine kiln runs on, not the snapshot).
    pub nvml_library: Option<OsString>,
    /// List virtual network interfaces (bridges, bonds, veths) too.
    pub all_nics: bool,
}

/// Takes the inventory of the system below `root`.
///
/// # Errors
/// Only when `root` is not a directory holding `proc/` or `sys/`; everything else is a problem entry.
pub fn collect(root: &Path) -> Result<Inventory, InventoryError> {
    collect_with(root, &Options::default())
}

/// [`collect`] with options.
///
/// # Errors
/// As [`collect`].
pub fn collect_with(root: &Path, options: &Options) -> Result<Inventory, InventoryError> {
    let started = Instant::now();
    let display = root.display().to_string();
    if !root.is_dir() {
        return Err(InventoryError::RootMissing { path: display });
    }
    if !root.join("proc").is_dir() && !root.join("sys").is_dir() {
        return Err(InventoryError::NotASnapshot { path: display });
    }
    // An inventory is mostly waiting on sysfs opens: the processors and NUMA nodes are read on
    // this thread while a second reads memory, the system's identity and the devices (PCI, NVMe,
    // NICs, RDMA), the two about equal on a small box; each reads through a `Source` of its own.
    // Problems are merged in the order one thread reading everything would have found them.
    let src = Source::new(root);
    let ((cpu, mut numa), (memory, system, rest)) = std::thread::scope(|s| {
        let others = s.spawn(|| {
            let src = Source::new(root);
            let memory = memory::collect(&src);
            let system = system::collect(&src);
            let before_devices = src.take_problems();
            let pci = pci::collect(&src);
            let nvme = nvme::collect(&src);
            let nics = net::collect(&src, options.all_nics);
            let rdma = rdma::collect(&src);
            let hwmon = hwmon::collect(&src);
            (memory, system, (pci, nvme, nics, rdma, hwmon, before_devices, src.take_problems()))
        });
        let cpu = cpu::collect(&src);
        let present: std::collections::BTreeSet<u32> = cpu.logical_cpus.iter().map(|c| c.id).collect();
        let numa = numa::collect(&src, &present);
        let others = others.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        ((cpu, numa), others)
    });
    let (pci, nvme, nics, rdma, hwmon, memory_problems, device_problems) = rest;
    let mut problems = src.take_problems();
    problems.extend(memory_problems);
    let os = os::collect(&src, &cpu, &system);
    problems.extend(src.take_problems());
    problems.extend(device_problems);
    let gpus = gpu::collect(&src, &pci, options.nvml_library.as_deref());
    numa::mark_gpu_memory(&mut numa, &gpus);
    let topology = topology::compute(&pci, &gpus, &nics, &rdma, &numa);
    let kernel_log = kmsg::collect(&src, &gpus.pci_gpus);
    problems.extend(src.take_problems());
    let fingerprints = fingerprint::compute(&cpu, &memory, &system, &os, &gpus, &pci, &nvme, &nics);
    Ok(Inventory {
        schema_version: SCHEMA_VERSION,
        kiln_version: env!("CARGO_PKG_VERSION").to_string(),
        collected_at: kiln_text::timefmt::now_rfc3339(),
        collection_micros: started.elapsed().as_micros() as u64,
        root: display,
        cpu,
        numa,
        memory,
        system,
        os,
        pci,
        gpus,
        nvme,
        nics,
        rdma,
        topology,
        fingerprints,
        kernel_log,
        hwmon,
        problems,
    })
}

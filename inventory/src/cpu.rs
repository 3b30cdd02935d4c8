//! Processors: identity from `/proc/cpuinfo`, topology, caches, frequencies and hybrid core kinds
//! from `/sys/devices/system/cpu`, and the CPUs this process may use from its cpuset.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::cpulist::{format_list, parse_list, parse_mask};
use super::source::{ProblemKind, Source};

const CPU_DIR: &str = "sys/devices/system/cpu";

/// Instruction-set families, named as the kernel names machines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Architecture {
    X86_64,
    X86,
    Aarch64,
    Arm,
    Ia64,
    S390x,
    Ppc64,
    Parisc,
    Riscv64,
    Unknown,
}

impl Architecture {
    fn from_uname(machine: &str) -> Self {
        match machine {
            "x86_64" => Self::X86_64,
            "x86" | "i386" | "i486" | "i586" | "i686" => Self::X86,
            "aarch64" | "arm64" => Self::Aarch64,
            m if m.starts_with("arm") => Self::Arm,
            "ia64" => Self::Ia64,
            "s390x" | "s390" => Self::S390x,
            "powerpc64" | "ppc64" | "ppc64le" => Self::Ppc64,
            "parisc" | "parisc64" => Self::Parisc,
            "riscv64" => Self::Riscv64,
            _ => Self::Unknown,
        }
    }

    /// The name as JSON spells it (`x86_64`, `aarch64`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::X86_64 => "x86_64",
            Self::X86 => "x86",
            Self::Aarch64 => "aarch64",
            Self::Arm => "arm",
            Self::Ia64 => "ia64",
            Self::S390x => "s390x",
            Self::Ppc64 => "ppc64",
            Self::Parisc => "parisc",
            Self::Riscv64 => "riscv64",
            Self::Unknown => "unknown",
        }
    }

    pub fn is_x86(self) -> bool {
        matches!(self, Self::X86_64 | Self::X86)
    }

    pub fn is_arm(self) -> bool {
        matches!(self, Self::Aarch64 | Self::Arm)
    }
}

/// What `/proc/cpuinfo` says, before it is combined with sysfs.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct CpuInfo {
    /// One key/value map per `processor` block, in file order.
    pub processors: Vec<BTreeMap<String, String>>,
    /// Keys outside processor blocks (s390 and PowerPC put machine-wide facts there).
    pub global: BTreeMap<String, String>,
}

impl CpuInfo {
    /// A key from the first processor block, else from the machine-wide ones.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.processors
            .first()
            .and_then(|p| p.get(key))
            .or_else(|| self.global.get(key))
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }
}

/// Parses `/proc/cpuinfo` of any architecture. Lines without a colon are skipped, never fatal.
pub fn parse_cpuinfo(text: &str) -> CpuInfo {
    let mut info = CpuInfo::default();
    let mut current: Option<BTreeMap<String, String>> = None;
    for line in text.lines() {
        if line.trim().is_empty() {
            if let Some(block) = current.take() {
                info.processors.push(block);
            }
            continue;
        }
        let Some((key, value)) = line.split_once(':') else { continue };
        let (key, value) = (key.trim().to_string(), value.trim().to_string());
        if key == "processor" && value.parse::<u32>().is_ok() {
            if let Some(block) = current.take() {
                info.processors.push(block);
            }
            current = Some(BTreeMap::new());
        }
        match current.as_mut() {
            Some(block) => {
                block.insert(key, value);
            }
            None => {
                info.global.entry(key).or_insert(value);
            }
        }
    }
    info.processors.extend(current);
    info
}

/// Infers the architecture of a snapshot from the shape of its cpuinfo.
pub fn infer_architecture(info: &CpuInfo) -> Architecture {
    if let Some(arch) = info.get("CPU architecture") {
        return if arch.trim() == "8" || arch.contains("AArch64") { Architecture::Aarch64 } else { Architecture::Arm };
    }
    if info.get("CPU implementer").is_some() {
        return Architecture::Aarch64;
    }
    let vendor = info.get("vendor_id").or_else(|| info.get("vendor")).unwrap_or("");
    if vendor.contains("S390") {
        return Architecture::S390x;
    }
    if info.get("arch").is_some_and(|a| a.contains("IA-64")) {
        return Architecture::Ia64;
    }
    if ["GenuineIntel", "AuthenticAMD", "HygonGenuine", "CentaurHauls", "  Shanghai  "].contains(&vendor) {
        let long_mode = info.get("flags").is_some_and(|f| f.split_whitespace().any(|x| x == "lm"));
        return if long_mode { Architecture::X86_64 } else { Architecture::X86 };
    }
    if info.get("cpu family").is_some_and(|f| f.starts_with("PA-RISC")) {
        return Architecture::Parisc;
    }
    if info.get("cpu").is_some_and(|c| c.contains("POWER") || c.contains("Cell") || c.contains("PPC")) {
        return Architecture::Ppc64;
    }
    if info.get("isa").is_some_and(|i| i.starts_with("rv64")) {
        return Architecture::Riscv64;
    }
    Architecture::Unknown
}

/// The instruction-set features that decide how fast training and inference kernels run.
const ML_FEATURES_X86: &[&str] = &[
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "amx_fp16",
];
const ML_FEATURES_ARM: &[&str] = &["asimd", "asimdhp", "asimddp", "sve", "sve2", "bf16", "i8mm", "sme", "sme2"];

/// Keeps the ML-relevant features of a flags line, in a fixed order.
pub fn ml_features(arch: Architecture, flags: &str) -> Vec<String> {
    let have: BTreeSet<&str> = flags.split_whitespace().collect();
    let wanted = if arch.is_x86() {
        ML_FEATURES_X86
    } else if arch.is_arm() {
        ML_FEATURES_ARM
    } else {
        &[]
    };
    wanted.iter().filter(|f| have.contains(*f)).map(|f| f.to_string()).collect()
}

/// Names an Arm core from its MIDR implementer and part numbers.
pub fn arm_core_name(implementer: u32, part: u32) -> Option<(&'static str, &'static str)> {
    let vendor = match implementer {
        0x41 => "ARM",
        0x42 => "Broadcom",
        0x43 => "Cavium",
        0x46 => "Fujitsu",
        0x48 => "HiSilicon",
        0x4e => "NVIDIA",
        0x50 => "APM",
        0x51 => "Qualcomm",
        0x61 => "Apple",
        0xc0 => "Ampere",
        _ => return None,
    };
    let core = match (implementer, part) {
        (0x41, 0xd03) => "Cortex-A53",
        (0x41, 0xd05) => "Cortex-A55",
        (0x41, 0xd07) => "Cortex-A57",
        (0x41, 0xd08) => "Cortex-A72",
        (0x41, 0xd0b) => "Cortex-A76",
        (0x41, 0xd0c) => "Neoverse-N1",
        (0x41, 0xd40) => "Neoverse-V1",
        (0x41, 0xd49) => "Neoverse-N2",
        (0x41, 0xd4f) => "Neoverse-V2",
        (0x41, 0xd84) => "Neoverse-V3",
        (0x41, 0xd8e) => "Neoverse-N3",
        (0x41, 0xd85) => "Cortex-X925",
        (0x41, 0xd87) => "Cortex-A725",
        (0x43, 0x0af) => "ThunderX2",
        (0x46, 0x001) => "A64FX",
        (0x48, 0xd01) => "Kunpeng-920",
        (0x4e, 0x004) => "Carmel",
        (0xc0, 0xac3) => "AmpereOne",
        _ => "",
    };
    Some((vendor, core))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheType {
    Data,
    Instruction,
    Unified,
}

/// One cache level and type, summarised over the whole machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheLevel {
    pub level: u8,
    #[serde(rename = "type")]
    pub cache_type: CacheType,
    pub size_bytes: u64,
    pub line_size_bytes: Option<u32>,
    pub ways: Option<u32>,
    /// How many separate caches of this kind exist (one per core for L1, often one per package for L3).
    pub instances: u32,
    /// How many logical CPUs share one instance (the most, where instances differ).
    pub cpus_per_instance: u32,
    /// The logical CPUs of each instance, as the kernel's `shared_cpu_map` gives them: what a
    /// reader restricted to some CPUs (a cgroup) counts instances from.
    pub instance_cpus: Vec<String>,
}

/// A kind of core on a hybrid processor (performance and efficiency cores).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoreKind {
    pub name: String,
    pub cpus: String,
    pub cpu_count: u32,
    pub max_mhz: Option<u32>,
}

/// One logical CPU as the kernel places it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogicalCpu {
    pub id: u32,
    pub online: bool,
    /// Package (socket) index; `None` where the kernel does not say (offline CPUs). Where no
    /// CPU has a package id (POWER and s390 write -1), the index of its `package_cpus` set.
    pub package: Option<i64>,
    pub die: Option<i64>,
    pub cluster: Option<i64>,
    pub core: Option<i64>,
    /// The logical CPUs that share this one's core (SMT siblings), itself included.
    pub core_cpus: Option<String>,
    /// The logical CPUs in this one's package.
    pub package_cpus: Option<String>,
    /// AMD Bulldozer-family compute units: the kernel lists both cores of a module as thread
    /// siblings while giving them different core ids. They are two cores (as hwloc counts them)
    /// sharing a compute unit (front end, FPU, L2), whose CPUs this lists; `None` elsewhere.
    #[serde(default)]
    pub compute_unit_cpus: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frequencies {
    pub base_mhz: Option<u32>,
    pub min_mhz: Option<u32>,
    pub max_mhz: Option<u32>,
    /// What cpuinfo reported for the first CPU at the time of reading.
    pub current_mhz: Option<u32>,
    pub scaling_driver: Option<String>,
    pub governor: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cpu {
    pub architecture: Architecture,
    pub vendor: Option<String>,
    pub model_name: Option<String>,
    /// x86 family, model and stepping (decimal, as cpuinfo prints them).
    pub family: Option<u32>,
    pub model: Option<u32>,
    pub stepping: Option<u32>,
    /// Arm MIDR fields, as cpuinfo prints them (hex).
    pub implementer: Option<String>,
    pub part: Option<String>,
    pub variant: Option<String>,
    pub revision: Option<String>,
    pub microcode: Option<String>,
    pub packages: u32,
    /// Cores as hwloc counts them: CPUs sharing a core id within a thread-sibling set.
    pub cores: u32,
    /// Compute units of AMD Bulldozer-family processors (two cores each); `None` elsewhere.
    #[serde(default)]
    pub compute_units: Option<u32>,
    pub cores_per_package: Option<u32>,
    pub threads_per_core: Option<u32>,
    pub online: u32,
    pub online_cpus: String,
    pub offline_cpus: String,
    pub possible_cpus: Option<String>,
    /// The CPUs this process may run on (cpuset or affinity), when narrower than the online set.
    pub allowed_cpus: Option<String>,
    pub frequency: Frequencies,
    pub caches: Vec<CacheLevel>,
    /// Empty unless the processor mixes kinds of cores.
    pub core_kinds: Vec<CoreKind>,
    pub ml_features: Vec<String>,
    /// The x86 `hypervisor` flag: the CPU says it runs under a hypervisor.
    pub hypervisor_flag: bool,
    pub logical_cpus: Vec<LogicalCpu>,
}

struct CpuTopo {
    package_key: Option<String>,
    core_key: Option<String>,
    raw: LogicalCpu,
}

/// The distinct Arm cores of a machine, by MIDR part, in order of first appearance:
/// big.LITTLE and DynamIQ chips (NVIDIA GB10: Cortex-X925 + Cortex-A725) list several.
fn arm_parts(info: &CpuInfo) -> Vec<(u32, u32, Vec<u32>)> {
    let mut parts: Vec<(u32, u32, Vec<u32>)> = Vec::new();
    for p in &info.processors {
        let (Some(i), Some(part), Some(cpu)) = (
            p.get("CPU implementer").and_then(|v| parse_hex(v)),
            p.get("CPU part").and_then(|v| parse_hex(v)),
            p.get("processor").and_then(|v| v.parse::<u32>().ok()),
        ) else {
            continue;
        };
        match parts.iter_mut().find(|(pi, pp, _)| (*pi, *pp) == (i, part)) {
            Some(entry) => entry.2.push(cpu),
            None => parts.push((i, part, vec![cpu])),
        }
    }
    parts
}

/// Reads a CPU list file, accepting the old mask form (`foo` beside `foo_list`).
pub(super) fn read_cpu_set(src: &Source, list_rel: &str, mask_rel: &str) -> Option<Vec<u32>> {
    if let Some(text) = src.attr(list_rel) {
        return parse_list(&text).or_else(|| {
            src.problem(list_rel, ProblemKind::Malformed, format!("not a CPU list: {text:?}"));
            None
        });
    }
    let text = src.attr(mask_rel)?;
    parse_mask(&text).or_else(|| {
        src.problem(mask_rel, ProblemKind::Malformed, format!("not a CPU mask: {text:?}"));
        None
    })
}

fn cpu_ids_in_sysfs(src: &Source) -> Vec<u32> {
    let mut ids: Vec<u32> = src.list_dir(CPU_DIR).iter().filter_map(|n| n.strip_prefix("cpu")?.parse().ok()).collect();
    ids.sort_unstable();
    ids
}

fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let (digits, mult) = match text.as_bytes().last()? {
        b'K' => (&text[..text.len() - 1], 1024),
        b'M' => (&text[..text.len() - 1], 1024 * 1024),
        b'G' => (&text[..text.len() - 1], 1024 * 1024 * 1024),
        _ => (text, 1),
    };
    digits.parse::<u64>().ok().map(|v| v * mult)
}

pub fn collect(src: &Source) -> Cpu {
    let info = src.read("proc/cpuinfo").map(|t| parse_cpuinfo(&t)).unwrap_or_default();
    let architecture =
        if src.is_live() { Architecture::from_uname(std::env::consts::ARCH) } else { infer_architecture(&info) };

    // Which CPUs exist and which are online.
    let sysfs_ids = cpu_ids_in_sysfs(src);
    let possible = src.attr_with(&format!("{CPU_DIR}/possible"), "a CPU list", &[], parse_list);
    let online_ids: Vec<u32> = match src.attr_with(&format!("{CPU_DIR}/online"), "a CPU list", &[], parse_list) {
        Some(ids) => ids,
        None if !sysfs_ids.is_empty() => sysfs_ids
            .iter()
            .copied()
            .filter(|id| src.attr(&format!("{CPU_DIR}/cpu{id}/online")).is_none_or(|v| v != "0"))
            .collect(),
        None => (0..info.processors.len() as u32).collect(),
    };
    let online_set: BTreeSet<u32> = online_ids.iter().copied().collect();
    let mut all_ids: BTreeSet<u32> = sysfs_ids.iter().copied().collect();
    all_ids.extend(&online_set);
    // The kernel's own offline list also names possible CPUs that are not present.
    let offline: Vec<u32> = src
        .attr(&format!("{CPU_DIR}/offline"))
        .and_then(|t| parse_list(&t))
        .unwrap_or_else(|| all_ids.iter().copied().filter(|id| !online_set.contains(id)).collect());

    let mut topo = read_topology(src, &all_ids, &online_set);
    let compute_units = split_compute_units(&mut topo);
    derive_package_ids(&mut topo);

    let online_topo: Vec<&CpuTopo> = topo.iter().filter(|t| t.raw.online).collect();
    let cpuinfo_packages: BTreeSet<_> = info.processors.iter().filter_map(|p| p.get("physical id")).collect();
    let packages = if online_topo.iter().any(|t| t.package_key.is_some()) {
        online_topo.iter().filter_map(|t| t.package_key.as_ref()).collect::<BTreeSet<_>>().len() as u32
    } else {
        // No sysfs package data (very old kernels, truncated snapshots): cpuinfo's ids, else one.
        cpuinfo_packages.len().max(1) as u32
    };
    let cores = if online_topo.iter().any(|t| t.core_key.is_some()) {
        let keys: BTreeSet<String> =
            online_topo.iter().map(|t| t.core_key.clone().unwrap_or_else(|| format!("cpu{}", t.raw.id))).collect();
        keys.len() as u32
    } else {
        let from_cpuinfo: BTreeSet<_> =
            info.processors.iter().filter_map(|p| Some((p.get("physical id")?, p.get("core id")?))).collect();
        if from_cpuinfo.is_empty() {
            online_ids.len().max(info.processors.len()) as u32
        } else {
            from_cpuinfo.len() as u32
        }
    };
    let online_count = if online_ids.is_empty() { info.processors.len() as u32 } else { online_ids.len() as u32 };
    let threads_per_core = (cores > 0 && online_count % cores == 0).then(|| online_count / cores);
    let cores_per_package = (packages > 0 && cores % packages == 0).then(|| cores / packages);

    let core_sets: BTreeMap<u32, Vec<u32>> =
        online_topo.iter().filter_map(|t| Some((t.raw.id, parse_list(t.raw.core_cpus.as_deref()?)?))).collect();
    let (caches, private_sizes) = collect_caches(src, &online_ids, &core_sets);
    let (frequency, max_khz) = collect_frequency(src, &online_ids, &info);
    let parts = arm_parts(&info);
    let core_kinds = if parts.len() > 1 {
        arm_core_kinds(&parts, &max_khz)
    } else {
        collect_core_kinds(src, architecture, &online_ids, &max_khz, &private_sizes)
    };
    let allowed = allowed_cpus(src).filter(|a| *a != online_ids);

    let flags = info.get("flags").or_else(|| info.get("Features")).or_else(|| info.get("features")).unwrap_or("");
    let implementer = info.get("CPU implementer").map(str::to_string);
    let part = info.get("CPU part").map(str::to_string);
    let (vendor, model_name) = identity(&info, architecture, &parts, &core_kinds);
    let x86 = architecture.is_x86();
    let num = |key: &str| if x86 { info.get(key).and_then(|v| v.parse().ok()) } else { None };

    Cpu {
        architecture,
        vendor,
        model_name,
        family: num("cpu family"),
        model: num("model"),
        stepping: num("stepping"),
        implementer,
        part,
        variant: info.get("CPU variant").map(str::to_string),
        revision: info.get("CPU revision").map(str::to_string),
        microcode: info.get("microcode").map(str::to_string),
        packages,
        cores,
        compute_units,
        cores_per_package,
        threads_per_core,
        online: online_count,
        online_cpus: format_list(&online_ids),
        offline_cpus: format_list(&offline),
        possible_cpus: possible.map(|p| format_list(&p)),
        allowed_cpus: allowed.map(|a| format_list(&a)),
        frequency,
        caches,
        core_kinds,
        ml_features: ml_features(architecture, flags),
        hypervisor_flag: flags.split_whitespace().any(|f| f == "hypervisor"),
        logical_cpus: topo.into_iter().map(|t| t.raw).collect(),
    }
}

/// The topology of every CPU, from its sysfs `topology/` directory (online CPUs only). The kernel's
/// CPU sets identify cores and packages more reliably than the numeric ids (old ia64 kernels repeat
/// package ids; s390 says -1).
fn read_topology(src: &Source, all_ids: &BTreeSet<u32>, online_set: &BTreeSet<u32>) -> Vec<CpuTopo> {
    let mut topo = Vec::new();
    for &id in all_ids {
        let base = format!("{CPU_DIR}/cpu{id}/topology");
        let online = online_set.contains(&id);
        let raw = if online {
            let num = |name: &str| src.attr_parse::<i64>(&format!("{base}/{name}"));
            let set = |list: &str, mask: &str| {
                read_cpu_set(src, &format!("{base}/{list}"), &format!("{base}/{mask}")).map(|s| format_list(&s))
            };
            let package_cpus =
                set("package_cpus_list", "package_cpus").or_else(|| set("core_siblings_list", "core_siblings"));
            LogicalCpu {
                id,
                online,
                package: num("physical_package_id"),
                die: num("die_id"),
                cluster: num("cluster_id"),
                core: num("core_id"),
                core_cpus: set("core_cpus_list", "core_cpus")
                    .or_else(|| set("thread_siblings_list", "thread_siblings")),
                package_cpus,
                compute_unit_cpus: None,
            }
        } else {
            LogicalCpu {
                id,
                online,
                package: None,
                die: None,
                cluster: None,
                core: None,
                core_cpus: None,
                package_cpus: None,
                compute_unit_cpus: None,
            }
        };
        let package_key = match (&raw.package_cpus, raw.package) {
            (Some(set), _) => Some(format!("set{set}")),
            (None, Some(p)) if p >= 0 => Some(format!("id{p}")),
            _ => None,
        };
        topo.push(CpuTopo { package_key, core_key: raw.core_cpus.clone(), raw });
    }
    topo
}

/// AMD Bulldozer to Excavator (Opteron 6200/6300, FX): the kernel lists the two cores of a
/// module as thread siblings but gives each its own core id. hwloc counts two cores, and so does
/// kiln: within a sibling set, CPUs with different core ids are different cores, and the set is
/// kept as their shared compute unit. Returns how many compute units there are, if any.
fn split_compute_units(topo: &mut [CpuTopo]) -> Option<u32> {
    let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, t) in topo.iter().enumerate() {
        if let (Some(key), true) = (&t.core_key, t.raw.online) {
            groups.entry(key.clone()).or_default().push(i);
        }
    }
    let mut units = 0;
    for (set, members) in groups {
        let ids: Option<BTreeSet<i64>> =
            members.iter().map(|&i| topo[i].raw.core.filter(|&c| c >= 0)).collect::<Option<_>>();
        let Some(ids) = ids.filter(|ids| ids.len() > 1) else { continue };
        units += 1;
        for core_id in ids {
            let cpus: Vec<u32> =
                members.iter().map(|&i| &topo[i].raw).filter(|c| c.core == Some(core_id)).map(|c| c.id).collect();
            let cpus = format_list(&cpus);
            for &i in &members {
                if topo[i].raw.core == Some(core_id) {
                    let t = &mut topo[i];
                    t.core_key = Some(format!("{set}/core{core_id}"));
                    t.raw.core_cpus = Some(cpus.clone());
                    t.raw.compute_unit_cpus = Some(set.clone());
                }
            }
        }
    }
    (units > 0).then_some(units)
}

/// Where no online CPU carries a package id (POWER without `physical_package_id`, s390's -1),
/// numbers the packages by their CPU sets in order of their first CPU, as hwloc does.
fn derive_package_ids(topo: &mut [CpuTopo]) {
    let online = || topo.iter().filter(|t| t.raw.online);
    if online().any(|t| t.raw.package.is_some_and(|p| p >= 0)) || online().all(|t| t.raw.package_cpus.is_none()) {
        return;
    }
    let mut order: Vec<String> = Vec::new();
    for t in topo.iter_mut().filter(|t| t.raw.online) {
        let Some(set) = &t.raw.package_cpus else { continue };
        let index = order.iter().position(|s| s == set).unwrap_or_else(|| {
            order.push(set.clone());
            order.len() - 1
        });
        t.raw.package = Some(index as i64);
    }
}

/// The vendor and model name: cpuinfo's, else the Arm core's names (for mixed chips the kinds,
/// biggest first: "ARM Cortex-X925 + Cortex-A725"), the IBM Z machine type, or the Itanium family.
fn identity(
    info: &CpuInfo,
    architecture: Architecture,
    parts: &[(u32, u32, Vec<u32>)],
    core_kinds: &[CoreKind],
) -> (Option<String>, Option<String>) {
    let arm_name = parts.first().and_then(|(i, p, _)| arm_core_name(*i, *p)).map(|(vendor, core)| {
        let cores = if parts.len() > 1 {
            core_kinds.iter().map(|k| k.name.as_str()).collect::<Vec<_>>().join(" + ")
        } else {
            core.to_string()
        };
        (vendor, cores)
    });
    let vendor = info
        .get("vendor_id")
        .or_else(|| info.get("vendor"))
        .map(str::to_string)
        .or_else(|| arm_name.as_ref().map(|(v, _)| v.to_string()));
    let model_name = info
        .get("model name")
        .or_else(|| info.get("cpu"))
        .map(str::to_string)
        .or_else(|| arm_name.as_ref().filter(|(_, c)| !c.is_empty()).map(|(v, c)| format!("{v} {c}")))
        .or_else(|| s390_machine(info).map(|m| format!("IBM Z machine type {m}")))
        .or_else(|| {
            // ia64 names the family ("Itanium 2") or gives only its number.
            let family = info.get("family").filter(|_| architecture == Architecture::Ia64)?;
            Some(if family.parse::<u32>().is_ok() { format!("Itanium family {family}") } else { family.to_string() })
        });
    (vendor, model_name)
}

/// The machine type of an s390 ("processor 0: version = 00, identification = 279F25, machine = 2817").
fn s390_machine(info: &CpuInfo) -> Option<String> {
    let line = info.global.iter().find(|(k, _)| k.starts_with("processor "))?.1;
    let value = line.split(',').find_map(|part| part.trim().strip_prefix("machine = "))?;
    Some(value.trim().to_string())
}

fn parse_hex(text: &str) -> Option<u32> {
    u32::from_str_radix(text.trim().trim_start_matches("0x"), 16).ok()
}

/// Each CPU's private cache sizes (L1 data, L2), which tell hybrid core kinds apart.
type PrivateSizes = BTreeMap<u32, (u64, u64)>;

/// The caches of the online CPUs, read as hwloc reads them: for each CPU and cache index its
/// `shared_cpu_map` only, and the cache's level, type, size and geometry once per instance (from
/// the first CPU that shares it). The map wins where it and `shared_cpu_list` disagree, as in
/// hwloc, and the contradiction (looked for once per index) is a problem entry. An empty map (ia64's L3) means the CPU's core.
fn collect_caches(
    src: &Source,
    online: &[u32],
    core_sets: &BTreeMap<u32, Vec<u32>>,
) -> (Vec<CacheLevel>, PrivateSizes) {
    struct Instance {
        level: u8,
        cache_type: CacheType,
        size: u64,
        line: Option<u32>,
        ways: Option<u32>,
        cpus: Vec<u32>,
    }
    // (index, CPU set) -> instance; None when the index's attributes were unusable.
    let mut seen: BTreeMap<(u32, Vec<u32>), Option<usize>> = BTreeMap::new();
    let mut instances: Vec<Instance> = Vec::new();
    let mut private: PrivateSizes = BTreeMap::new();
    let mut lists_checked = BTreeSet::new();
    for &cpu in online {
        // Index directories may be sparse (a hand-edited snapshot drops some): list, don't probe.
        let dir = format!("{CPU_DIR}/cpu{cpu}/cache");
        let indexes: Vec<u32> =
            src.list_dir(&dir).iter().filter_map(|n| n.strip_prefix("index")?.parse().ok()).collect();
        for index in indexes {
            let base = format!("{dir}/index{index}");
            let map_rel = format!("{base}/shared_cpu_map");
            let list_rel = format!("{base}/shared_cpu_list");
            let map = src.attr_with(&map_rel, "a CPU mask", &[], parse_mask);
            let from_list = || src.attr_with(&list_rel, "a CPU list", &[], parse_list);
            let had_map = map.is_some();
            let mut cpus = map.or_else(from_list).unwrap_or_else(|| vec![cpu]);
            if cpus.is_empty() {
                cpus = core_sets.get(&cpu).cloned().unwrap_or_else(|| vec![cpu]);
            }
            if !cpus.contains(&cpu) {
                src.problem(
                    &map_rel,
                    ProblemKind::Malformed,
                    format!("CPU {cpu}'s cache is shared by CPUs {} without it", format_list(&cpus)),
                );
                cpus.push(cpu);
                cpus.sort_unstable();
            }
            let key = (index, cpus);
            let at = match seen.get(&key) {
                Some(at) => *at,
                None => {
                    let (_, cpus) = &key;
                    // First CPU of this instance: its attributes. The list is checked against the
                    // map once per index (a file per instance would cost a 200-CPU box ~4 ms, and
                    // the map, which is followed, is right either way).
                    if had_map && lists_checked.insert(index) {
                        if let Some(list) = from_list().filter(|l| l != cpus) {
                            src.problem(
                                &list_rel,
                                ProblemKind::Malformed,
                                format!(
                                    "says CPUs {} share this cache, shared_cpu_map says {}: following the map",
                                    format_list(&list),
                                    format_list(cpus)
                                ),
                            );
                        }
                    }
                    let at = read_cache_attrs(src, &base).map(|(level, cache_type, size)| {
                        // The geometry is kept per kind of cache: read for its first instance.
                        let first =
                            instances.iter().find(|i| (i.level, i.cache_type, i.size) == (level, cache_type, size));
                        let (line, ways) = match first {
                            Some(i) => (i.line, i.ways),
                            None => (
                                src.attr_parse(&format!("{base}/coherency_line_size")),
                                src.attr_parse(&format!("{base}/ways_of_associativity")),
                            ),
                        };
                        instances.push(Instance { level, cache_type, size, line, ways, cpus: cpus.clone() });
                        instances.len() - 1
                    });
                    seen.insert(key, at);
                    at
                }
            };
            if let Some(inst) = at.map(|i| &instances[i]) {
                let sizes = private.entry(cpu).or_default();
                match (inst.level, inst.cache_type) {
                    (1, CacheType::Data) => sizes.0 = inst.size,
                    (2, CacheType::Unified) => sizes.1 = inst.size,
                    _ => {}
                }
            }
        }
    }
    overlapping_caches(src, &instances.iter().map(|i| (i.level, i.cache_type, i.cpus.as_slice())).collect::<Vec<_>>());
    // Summarised per (level, type, size).
    let mut levels: BTreeMap<(u8, CacheType, u64), CacheLevel> = BTreeMap::new();
    for inst in instances {
        let entry = levels.entry((inst.level, inst.cache_type, inst.size)).or_insert_with(|| CacheLevel {
            level: inst.level,
            cache_type: inst.cache_type,
            size_bytes: inst.size,
            line_size_bytes: inst.line,
            ways: inst.ways,
            instances: 0,
            cpus_per_instance: 0,
            instance_cpus: Vec::new(),
        });
        entry.instances += 1;
        entry.cpus_per_instance = entry.cpus_per_instance.max(inst.cpus.len() as u32);
        entry.instance_cpus.push(format_list(&inst.cpus));
    }
    (levels.into_values().collect(), private)
}

/// Two caches of one level and type that share some CPUs but not all: the kernel's sharing maps
/// contradict each other (firmware or a hand-edited snapshot). Said once per level.
fn overlapping_caches(src: &Source, instances: &[(u8, CacheType, &[u32])]) {
    let mut said = BTreeSet::new();
    for (i, (level, kind, a)) in instances.iter().enumerate() {
        for (l2, k2, b) in &instances[i + 1..] {
            if (level, kind) != (l2, k2) || a == b || !a.iter().any(|c| b.contains(c)) || !said.insert((level, kind)) {
                continue;
            }
            src.problem(
                CPU_DIR,
                ProblemKind::Malformed,
                format!(
                    "L{level} {kind:?} caches over CPUs {} and {} overlap: the kernel's shared_cpu_map files contradict each other",
                    format_list(a),
                    format_list(b)
                ),
            );
        }
    }
}

/// A cache index's level, type and size; `None` for an index without them (or of size 0).
fn read_cache_attrs(src: &Source, base: &str) -> Option<(u8, CacheType, u64)> {
    let level = src.attr_parse::<u8>(&format!("{base}/level"))?;
    let cache_type = match src.attr(&format!("{base}/type")).as_deref() {
        Some("Data") => CacheType::Data,
        Some("Instruction") => CacheType::Instruction,
        Some("Unified") => CacheType::Unified,
        _ => return None,
    };
    let size = src.attr_with(&format!("{base}/size"), "a cache size (32K)", &[], parse_size)?;
    (size > 0).then_some((level, cache_type, size))
}

fn khz_to_mhz(khz: u64) -> u32 {
    ((khz + 500) / 1000) as u32
}

/// The clock range, and each online CPU's top clock (kHz) for telling core kinds apart. Only the
/// top clock is read per CPU; the minimum once per distinct top clock, the rest once.
fn collect_frequency(src: &Source, online: &[u32], info: &CpuInfo) -> (Frequencies, BTreeMap<u32, u64>) {
    let mut freq = Frequencies {
        current_mhz: info.get("cpu MHz").and_then(|v| v.parse::<f64>().ok()).map(|v| v.round() as u32),
        ..Default::default()
    };
    let mut max_khz = BTreeMap::new();
    let mut min_read_for = BTreeSet::new();
    let mut policy_read = false;
    for (i, &cpu) in online.iter().enumerate() {
        let base = format!("{CPU_DIR}/cpu{cpu}/cpufreq");
        let max = src.attr_parse::<u64>(&format!("{base}/cpuinfo_max_freq"));
        // The driver and governor: from the first CPU, or the first with a clock range.
        if !policy_read && (i == 0 || max.is_some()) {
            freq.base_mhz = src.attr_parse::<u64>(&format!("{base}/base_frequency")).map(khz_to_mhz);
            freq.scaling_driver = src.attr(&format!("{base}/scaling_driver"));
            freq.governor = src.attr(&format!("{base}/scaling_governor"));
            policy_read = max.is_some() || freq.scaling_driver.is_some() || freq.governor.is_some();
        }
        let Some(max) = max else { continue };
        max_khz.insert(cpu, max);
        freq.max_mhz = Some(freq.max_mhz.map_or(khz_to_mhz(max), |m| m.max(khz_to_mhz(max))));
        if min_read_for.insert(max) {
            if let Some(min) = src.attr_parse::<u64>(&format!("{base}/cpuinfo_min_freq")).map(khz_to_mhz) {
                freq.min_mhz = Some(freq.min_mhz.map_or(min, |m| m.min(min)));
            }
        }
    }
    (freq, max_khz)
}

/// Arm chips that mix cores name each kind by its MIDR part; the biggest (highest clock) first.
fn arm_core_kinds(parts: &[(u32, u32, Vec<u32>)], max_khz: &BTreeMap<u32, u64>) -> Vec<CoreKind> {
    let mut kinds: Vec<CoreKind> = parts
        .iter()
        .map(|(i, p, cpus)| CoreKind {
            name: arm_core_name(*i, *p)
                .map(|(_, c)| c.to_string())
                .filter(|c| !c.is_empty())
                .unwrap_or_else(|| format!("part {p:#05x}")),
            cpus: format_list(cpus),
            cpu_count: cpus.len() as u32,
            max_mhz: cpus.iter().filter_map(|c| max_khz.get(c)).max().map(|&k| khz_to_mhz(k)),
        })
        .collect();
    kinds.sort_by_key(|k| std::cmp::Reverse(k.max_mhz));
    kinds
}

/// Hybrid processors: the kernel's per-kind PMUs (`cpu_core`, `cpu_atom`) name the kinds directly;
/// otherwise CPUs that differ in capacity (Arm, RISC-V), top frequency or private cache sizes are
/// different kinds.
fn collect_core_kinds(
    src: &Source,
    architecture: Architecture,
    online: &[u32],
    max_khz: &BTreeMap<u32, u64>,
    private: &PrivateSizes,
) -> Vec<CoreKind> {
    let max_mhz = |cpu: u32| max_khz.get(&cpu).map(|&k| khz_to_mhz(k));
    if architecture.is_x86() {
        let pmu_kinds = [("cpu_core", "performance"), ("cpu_atom", "efficiency")];
        let from_pmu: Vec<(String, Vec<u32>)> = pmu_kinds
            .iter()
            .filter_map(|(dir, name)| {
                let cpus = parse_list(&src.attr(&format!("sys/devices/{dir}/cpus"))?)?;
                Some((name.to_string(), cpus))
            })
            .collect();
        if from_pmu.len() > 1 {
            return from_pmu
                .into_iter()
                .map(|(name, cpus)| CoreKind {
                    max_mhz: cpus.iter().filter_map(|&c| max_mhz(c)).max(),
                    cpu_count: cpus.len() as u32,
                    cpus: format_list(&cpus),
                    name,
                })
                .collect();
        }
    }
    let mut by_signature: BTreeMap<(u32, u32, u64, u64), Vec<u32>> = BTreeMap::new();
    for &cpu in online {
        // The scheduler's capacity exists on Arm and RISC-V; x86 has none to read.
        let capacity = if architecture.is_x86() {
            0
        } else {
            src.attr_parse::<u32>(&format!("{CPU_DIR}/cpu{cpu}/cpu_capacity")).unwrap_or(0)
        };
        let (l1d, l2) = private.get(&cpu).copied().unwrap_or_default();
        by_signature.entry((capacity, max_mhz(cpu).unwrap_or(0), l1d, l2)).or_default().push(cpu);
    }
    if by_signature.len() < 2 {
        return Vec::new();
    }
    // The biggest cores first: highest capacity, then clock, then caches.
    let mut kinds: Vec<_> = by_signature.into_iter().collect();
    kinds.sort_by_key(|k| std::cmp::Reverse(k.0));
    let count = kinds.len();
    kinds
        .into_iter()
        .enumerate()
        .map(|(i, ((_, mhz, _, _), cpus))| CoreKind {
            name: match (count, i) {
                (2, 0) => "performance".to_string(),
                (2, 1) => "efficiency".to_string(),
                _ => format!("kind{i}"),
            },
            cpus: format_list(&cpus),
            cpu_count: cpus.len() as u32,
            max_mhz: (mhz > 0).then_some(mhz),
        })
        .collect()
}

/// The CPUs this process may use. Live: the scheduler affinity. Snapshot: the cpuset cgroup
/// named by `/proc/self/cpuset`, found through `/proc/mounts` (cgroup v1, the old cpuset fs, or v2).
pub fn allowed_cpus(src: &Source) -> Option<Vec<u32>> {
    if src.is_live() {
        return live_affinity();
    }
    cpuset_file(src, &["cpuset.cpus.effective", "cpuset.cpus", "cpus"])
}

/// The NUMA nodes this process may allocate from, by the same cpuset rules.
pub fn allowed_mems(src: &Source) -> Option<Vec<u32>> {
    if src.is_live() {
        let status = src.read_optional("proc/self/status")?;
        let line = status.lines().find_map(|l| l.strip_prefix("Mems_allowed_list:"))?;
        return parse_list(line);
    }
    cpuset_file(src, &["cpuset.mems.effective", "cpuset.mems", "mems"])
}

fn cpuset_file(src: &Source, names: &[&str]) -> Option<Vec<u32>> {
    let name = src.attr("proc/self/cpuset")?;
    let mounts = src.read_optional("proc/mounts")?;
    let mount = cpuset_mount(&mounts)?;
    let dir = format!("{}/{}", mount.trim_start_matches('/'), name.trim_start_matches('/'));
    let dir = dir.trim_end_matches('/');
    names.iter().find_map(|file| parse_list(&src.attr(&format!("{dir}/{file}"))?).filter(|l| !l.is_empty()))
}

/// Finds where the cpuset controller is mounted; v1 (or the old `cpuset` fs) wins over v2.
pub fn cpuset_mount(mounts: &str) -> Option<String> {
    let mut v2 = None;
    for line in mounts.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [_, target, fstype, options, ..] = fields[..] else { continue };
        match fstype {
            "cpuset" => return Some(target.to_string()),
            "cgroup" if options.split(',').any(|o| o == "cpuset") => return Some(target.to_string()),
            "cgroup2" if v2.is_none() => v2 = Some(target.to_string()),
            _ => {}
        }
    }
    v2
}

#[cfg(target_os = "linux")]
fn live_affinity() -> Option<Vec<u32>> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes at most its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        Some((0..libc::CPU_SETSIZE as u32).filter(|&c| libc::CPU_ISSET(c as usize, &set)).collect())
    }
}

#[cfg(not(target_os = "linux"))]
fn live_affinity() -> Option<Vec<u32>> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpuinfo_x86() {
        let info = parse_cpuinfo(
            "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n\
             model name\t: AMD EPYC 9654 96-Core Processor\nflags\t\t: fpu lm avx2 avx512f avx512_bf16\n\n\
             processor\t: 1\nvendor_id\t: AuthenticAMD\n",
        );
        assert_eq!(info.processors.len(), 2);
        assert_eq!(infer_architecture(&info), Architecture::X86_64);
        assert_eq!(ml_features(Architecture::X86_64, info.get("flags").unwrap()), ["avx2", "avx512f", "avx512_bf16"]);
    }

    #[test]
    fn cpuinfo_arm_names_the_core() {
        let info = parse_cpuinfo("processor\t: 0\nFeatures\t: fp asimd sve2 bf16 i8mm\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU part\t: 0xd4f\n");
        assert_eq!(infer_architecture(&info), Architecture::Aarch64);
        assert_eq!(arm_core_name(0x41, 0xd4f), Some(("ARM", "Neoverse-V2")));
        assert_eq!(
            ml_features(Architecture::Aarch64, info.get("Features").unwrap()),
            ["asimd", "sve2", "bf16", "i8mm"]
        );
    }

    #[test]
    fn cpuinfo_garbage_is_not_fatal() {
        let info = parse_cpuinfo("\u{0}\u{1}garbage\n:::\nprocessor : x\n\n\n");
        assert_eq!(info.processors.len(), 0);
        assert_eq!(infer_architecture(&info), Architecture::Unknown);
    }

    #[test]
    fn cpuset_mounts() {
        assert_eq!(cpuset_mount("none /dev/cpuset cpuset rw 0 0\n").as_deref(), Some("/dev/cpuset"));
        assert_eq!(
            cpuset_mount("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\ncgroup /c cgroup rw,cpuset 0 0\n").as_deref(),
            Some("/c")
        );
        assert_eq!(cpuset_mount("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n").as_deref(), Some("/sys/fs/cgroup"));
        assert_eq!(cpuset_mount("proc /proc proc rw 0 0\n"), None);
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("32K"), Some(32768));
        assert_eq!(parse_size("2M"), Some(2 << 20));
        assert_eq!(parse_size("x"), None);
    }
}

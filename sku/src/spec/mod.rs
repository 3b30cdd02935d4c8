//! SKU specs (`specs/*.toml`): what a box of one SKU must be, how healthy, and how fast, with a
//! typed unit on every quantity and a source for every section that holds numbers. A spec says
//! which boxes it applies to (`[match]`), so `kiln commission` finds the one for this box itself.
//!
//! Loading is strict: an unknown key, a number without a unit, a unit of the wrong dimension, a
//! section with thresholds but no `source`, or a performance threshold whose unit does not fit its
//! metric is an error naming `file:line:col` (the provisioning images' [`SourceText`](kiln_provision::image::SourceText)).

pub mod capture;
pub mod metrics;
pub mod references;
pub mod units;

use std::path::{Path, PathBuf};

use kiln_provision::image::{SourceText, SpecError, SpecErrors};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use toml::Spanned;

use kiln_inventory::Inventory;
use units::{Bytes, DataRate, Fraction, LinkWidth, PcieGen, Power, Temperature, TransferRate};

/// The specs built into the binary (`specs/*.toml`), so that a box with only `kiln` on it finds
/// its spec. `--spec FILE` and `--specs DIR` add to or override them.
pub const BUILT_IN: &[(&str, &str)] = &[
    ("hgx-h100-sxm5-80gb-8x.toml", include_str!("../../../specs/hgx-h100-sxm5-80gb-8x.toml")),
    ("hgx-h200-sxm-141gb-8x.toml", include_str!("../../../specs/hgx-h200-sxm-141gb-8x.toml")),
    ("hgx-b200-180gb-8x.toml", include_str!("../../../specs/hgx-b200-180gb-8x.toml")),
    ("hgx-a100-sxm4-80gb-8x.toml", include_str!("../../../specs/hgx-a100-sxm4-80gb-8x.toml")),
    ("cpu-server.toml", include_str!("../../../specs/cpu-server.toml")),
];

/// A SKU spec as written. Every section is optional: a spec checks what it states.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SkuSpec {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(rename = "match")]
    pub matches: Match,
    pub cpu: Option<CpuSpec>,
    pub memory: Option<MemorySpec>,
    pub numa: Option<NumaSpec>,
    pub gpu: Option<GpuSpec>,
    pub nvlink: Option<NvLinkSpec>,
    #[serde(default, rename = "nic")]
    pub nics: Vec<NicSpec>,
    pub nvme: Option<NvmeSpec>,
    pub platform: Option<PlatformSpec>,
    pub software: Option<SoftwareSpec>,
    pub health: Option<HealthSpec>,
    /// The InfiniBand / RoCE ports: link state, width, partitions and error counters.
    pub fabric: Option<FabricSpec>,
    /// Temperatures at rest and under load, and the board's sensors.
    pub heat: Option<HeatSpec>,
    /// What identical devices must agree on (every attribute when the section is absent).
    pub siblings: Option<SiblingsSpec>,
    /// Storage that feeds training (`kiln bench data`).
    pub storage: Option<StorageSpec>,
    #[serde(default, rename = "performance")]
    pub performance: Vec<Spanned<PerfSpec>>,
    /// Whose published references (`specs/references.toml`) the `of_reference` floors use: a
    /// built-in spec's name; default this spec's own (a spec captured for a variant of a known
    /// SKU names the SKU it is a variant of).
    pub references: Option<String>,
}

/// Which boxes a spec is for. Every stated key must match.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Match {
    /// DMI product names (`/sys/class/dmi/id/product_name`); a trailing `*` matches a prefix.
    #[serde(default)]
    pub product_names: Vec<String>,
    /// The GPU model as NVML names it; with no GPUs on the box, PCI's device name.
    pub gpu_model: Option<String>,
    pub gpu_count: Option<u32>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CpuSpec {
    pub source: String,
    /// Allowed model names (`model name` of /proc/cpuinfo), a trailing `*` for a prefix.
    #[serde(default)]
    pub models: Vec<String>,
    pub sockets: Option<u32>,
    pub min_cores: Option<u32>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MemorySpec {
    pub source: String,
    /// Memory the kernel sees (MemTotal), which is a little below what is installed.
    pub min_total: Option<Bytes>,
    pub dimms: Option<u32>,
    pub min_dimm_speed: Option<TransferRate>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NumaSpec {
    pub source: String,
    pub nodes: u32,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GpuSpec {
    pub source: String,
    pub count: u32,
    pub model: String,
    pub min_memory: Option<Bytes>,
    /// Allowed VBIOS versions; a trailing `*` for a prefix. Empty: any.
    #[serde(default)]
    pub vbios: Vec<String>,
    pub ecc: Option<bool>,
    pub persistence: Option<bool>,
    pub mig: Option<bool>,
    pub min_power_limit: Option<Power>,
    pub pcie_gen: Option<PcieGen>,
    pub pcie_width: Option<LinkWidth>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NvLinkSpec {
    pub source: String,
    /// Links every GPU has, all of which must be active.
    pub links_per_gpu: u32,
    pub version: Option<u32>,
    /// The GPU × GPU entry of the connection matrix for every pair ("NV18").
    pub matrix: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NicSpec {
    pub source: String,
    /// What this group is, in messages ("compute fabric").
    pub role: String,
    pub count: u32,
    /// A substring of the PCI device name or the RDMA HCA type ("ConnectX-7", "MT4129").
    pub model: String,
    /// Allowed firmware versions; a trailing `*` for a prefix. Empty: any.
    #[serde(default)]
    pub firmware: Vec<String>,
    /// RDMA ports: "ACTIVE".
    pub state: Option<String>,
    pub min_rate: Option<DataRate>,
    pub pcie_gen: Option<PcieGen>,
    pub pcie_width: Option<LinkWidth>,
    /// Every GPU must have a NIC of this group at one of these PCIe distances ("PIX", "PXB").
    #[serde(default)]
    pub gpu_affinity: Vec<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NvmeSpec {
    pub source: String,
    pub count: u32,
    pub min_size: Option<Bytes>,
    #[serde(default)]
    pub models: Vec<String>,
    pub pcie_gen: Option<PcieGen>,
    pub pcie_width: Option<LinkWidth>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PlatformSpec {
    pub source: String,
    /// ACS source validation / request redirect off on every PCIe switch port (GPUDirect P2P).
    pub acs_off: Option<bool>,
    /// Allowed `iommu=` / `intel_iommu=` / `amd_iommu=` settings on the kernel command line
    /// ("pt", "off"); "unset" for none given.
    #[serde(default)]
    pub iommu: Vec<String>,
    /// Allowed CPU frequency governors.
    #[serde(default)]
    pub governors: Vec<String>,
    /// Allowed transparent huge page modes ("always", "madvise", "never").
    #[serde(default)]
    pub transparent_hugepages: Vec<String>,
    /// Allowed BIOS versions; a trailing `*` for a prefix.
    #[serde(default)]
    pub bios: Vec<String>,
    /// Not a virtual machine.
    pub bare_metal: Option<bool>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SoftwareSpec {
    pub source: String,
    /// Allowed driver versions; a trailing `*` for a prefix.
    #[serde(default)]
    pub driver: Vec<String>,
    /// Allowed CUDA driver API versions ("12.4").
    #[serde(default)]
    pub cuda: Vec<String>,
}

/// Identical devices in one box (one model) agree on these attributes
/// (`crate::verdict::siblings::ATTRIBUTES`: "gpu.vbios", "nic.firmware", …); the device that
/// differs is named.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SiblingsSpec {
    pub source: String,
    pub agree: Vec<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HealthSpec {
    pub source: String,
    /// Uncorrectable ECC errors (volatile and aggregate) allowed: 0.
    pub max_ecc_uncorrectable: Option<u64>,
    /// Remapped rows pending or failed are never allowed when this is true.
    pub remapped_rows: Option<bool>,
    pub max_retired_pages: Option<u64>,
    /// XIDs from the kernel log since boot that fail the box; the rest of NVIDIA's catalogue warn.
    #[serde(default)]
    pub xid_fail: Vec<u32>,
    /// Whether the kernel log must be read (it needs root): without it, XID checks skip.
    pub xid_required: Option<bool>,
    pub max_aer_fatal: Option<u64>,
    pub max_aer_nonfatal: Option<u64>,
    pub max_aer_correctable: Option<u64>,
    pub max_nvlink_replay: Option<u64>,
    pub max_nvlink_recovery: Option<u64>,
    pub max_nvlink_crc: Option<u64>,
    /// Speed or width changes of a PCIe link allowed while a benchmark loads its device.
    pub max_link_transitions: Option<u32>,
    /// The share of a run's GPU telemetry samples that may show thermal throttling.
    pub max_thermal_throttle: Option<Fraction>,
    pub nvme_critical_warning: Option<bool>,
    pub max_nvme_media_errors: Option<u64>,
    pub max_nvme_percentage_used: Option<Fraction>,
    /// GPU PCIe replays (`nvmlDeviceGetPcieReplayCounter`) allowed per minute of the suite (a
    /// suite shorter than a minute is allowed one minute's worth). Judged across a suite run only:
    /// the count since the driver loaded has no time base.
    pub max_pcie_replays_per_minute: Option<u64>,
}

/// The RDMA ports of the box (`/sys/class/infiniband/*/ports/*`). State, width and partitions
/// apply to the ports of the `[[nic]]` groups; the error counters to every port that is up.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FabricSpec {
    pub source: String,
    /// "LinkUp".
    pub physical_state: Option<String>,
    /// The link width from the port's rate ("4X").
    pub width: Option<String>,
    /// Partition keys every port must hold ("0xffff"), compared without the membership bit;
    /// judged where the P_Key table is readable.
    #[serde(default)]
    pub pkeys: Vec<String>,
    /// Per error counter (`kiln_inventory::rdma::ERROR_COUNTERS`), how much it may grow during the
    /// suite: more fails the port. Without a suite run the counts since boot are judged, and more
    /// only warns (they include whatever happened before this run). `link_downed` growing is a
    /// link flap (`fabric.port.flaps`).
    #[serde(default)]
    pub max_errors: std::collections::BTreeMap<String, u64>,
}

/// Heat: a cooling fault shows at rest, before any load.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HeatSpec {
    pub source: String,
    /// The hottest a GPU may be at rest, as the inventory reads it before the suite.
    pub max_gpu_idle: Option<Temperature>,
    /// The hottest a GPU may get under the suite's load (its telemetry).
    pub max_gpu_load: Option<Temperature>,
    /// The hottest the air coming in may be (a hwmon sensor labelled inlet or ambient).
    pub max_inlet: Option<Temperature>,
    /// No hwmon sensor in alarm or at its critical limit, no fan stopped below its minimum.
    pub board_sensors: Option<bool>,
}

/// Storage that feeds training: what `kiln bench data` measures on the box's data directories.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StorageSpec {
    pub source: String,
    /// The data loader's flat-out delivery over every data directory: "5 GB/s".
    pub min_throughput: Option<DataRate>,
    /// The accelerators' utilisation at the rate the run was given (DLIO's pass mark: "90 %").
    pub min_au: Option<Fraction>,
}

/// A performance threshold on a stored metric.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PerfSpec {
    /// The metric's stored name ("membw.all.triad_gbps"); `{n}` stands for a number, making a
    /// group ("membw.node{n}.triad_gbps", "gpu{n}.hbm_gbps").
    pub metric: String,
    /// Where the threshold comes from; with `of_reference`, the reference's own source stands
    /// and this may stay empty.
    #[serde(default)]
    pub source: String,
    /// At least this fraction of the SKU's published reference figure for the metric
    /// (`specs/references.toml`): "90 %".
    pub of_reference: Option<Fraction>,
    /// Why `of_reference` is that fraction: the noise, conditions or software the band allows for.
    pub band: Option<String>,
    /// An absolute floor, in a unit of the metric's dimension.
    pub min: Option<Spanned<String>>,
    /// An absolute ceiling.
    pub max: Option<Spanned<String>>,
    /// At least this fraction of another metric of the same box ("cpu.fma_peak_gflops").
    pub min_fraction_of: Option<String>,
    pub fraction: Option<Fraction>,
    /// For a group: each member within this fraction of the best member.
    pub within_best: Option<Fraction>,
    /// Not below the 10th percentile of accepted boxes of this configuration (needs at least
    /// `fleet_min_boxes` of them, default 5; fewer: the check skips).
    pub fleet_p10: Option<bool>,
    pub fleet_min_boxes: Option<u32>,
}

/// A loaded spec: its document, where it came from, and the hash of its text (stored with every
/// verdict, so a re-judged fleet says which spec judged it).
#[derive(Debug, Clone)]
pub struct LoadedSpec {
    pub spec: SkuSpec,
    pub file: String,
    pub text: String,
    pub hash: String,
}

/// Known metrics and their units, to check a performance threshold's unit at load time.
pub fn metric_unit(metric: &str) -> Option<&'static str> {
    let m = metric;
    let ends = |s: &str| m.ends_with(s);
    Some(if m.starts_with("disk.") && ends(".mb_per_s") {
        "MB/s"
    } else if m.starts_with("disk.") && ends(".iops") {
        "IOPS"
    } else if ends("_us") {
        "us"
    } else if m.starts_with("membw.") && ends("_gbps")
        || m.starts_with("gpu") && ends("_gbps")
        || ends(".busbw_gbs_max")
    {
        "GB/s"
    } else if ends("tflops") {
        "TFLOP/s"
    } else if ends("gops") {
        "GOP/s"
    } else if ends("gflops") || m.starts_with("gemm.") {
        "GFLOP/s"
    } else if ends("_mhz") {
        "MHz"
    } else if ends("tokens_per_s") {
        "tokens/s"
    } else if ends("_s") {
        "s"
    } else if ends(".mfu") || m == "data.au" {
        "ratio"
    } else if m == "net.tcp_throughput_gbps" || m.starts_with("nccl.") || m.starts_with("ib.") {
        "Gb/s"
    } else {
        return None;
    })
}

/// Reads and validates a spec file.
///
/// # Errors
/// An unreadable file, or every problem in it with `file:line:col`.
pub fn load(path: &Path) -> Result<LoadedSpec, SpecErrors> {
    let display = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| {
        SpecErrors(vec![SpecError { file: display.clone(), line: 0, column: 0, message: format!("cannot read: {e}") }])
    })?;
    parse(&display, text)
}

/// Parses and validates spec text that came from `file`.
///
/// # Errors
/// Every problem, with `file:line:col`.
pub fn parse(file: &str, text: String) -> Result<LoadedSpec, SpecErrors> {
    let src = SourceText { file, text: &text };
    let spec: SkuSpec = toml::from_str(&text).map_err(|e| {
        let at = e.span().map(|s| s.start).unwrap_or(0);
        let message: Vec<&str> = e.message().lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        SpecErrors(vec![src.error_at(at, message.join(": "))])
    })?;
    let errors = validate(&spec, &src);
    if !errors.is_empty() {
        return Err(SpecErrors(errors));
    }
    let hash = format!("{:x}", Sha256::digest(text.as_bytes()));
    Ok(LoadedSpec { spec, file: file.to_string(), text, hash })
}

#[cfg(test)]
mod tests {
    /// Every metric kiln stores has the unit the spec loader assumes for it.
    #[test]
    fn metric_units_match_what_kiln_stores() {
        for (metric, unit) in [
            ("membw.all.triad_gbps", "GB/s"),
            ("membw.node1.copy_gbps", "GB/s"),
            ("cpu.fma_peak_gflops", "GFLOP/s"),
            ("gpu3.gemm.bf16.8192.tflops", "TFLOP/s"),
            ("gpus.gemm.f16.8192.tflops", "TFLOP/s"),
            ("cpu.bf16_peak_gflops", "GFLOP/s"),
            ("cpu.int8_peak_gops", "GOP/s"),
            ("gemm.onednn.int8.1024.gops", "GOP/s"),
            ("cpu.clock_mhz", "MHz"),
            ("gemm.f32.1024.gflops", "GFLOP/s"),
            ("train.tiny.tokens_per_s", "tokens/s"),
            ("train.tiny.step_p50_s", "s"),
            ("train.tiny.achieved_gflops", "GFLOP/s"),
            ("train.tiny.mfu", "ratio"),
            ("disk.randread_4k_qd32.mb_per_s", "MB/s"),
            ("disk.randread_4k_qd32.iops", "IOPS"),
            ("disk.randread_4k_qd32.p99_us", "us"),
            ("net.tcp_throughput_gbps", "Gb/s"),
            ("net.tcp_rtt_p50_us", "us"),
            ("gpus.nccl.all_reduce.busbw_gbs_max", "GB/s"),
            ("coll.nccl.all_gather.busbw_gbs_max", "GB/s"),
            ("gpu0.h2d_gbps", "GB/s"),
        ] {
            assert_eq!(super::metric_unit(metric), Some(unit), "{metric}");
            // A spec captured from stored evidence writes the unit back: it must read.
            assert!(super::units::parse_any(&format!("1 {unit}")).is_ok(), "{metric}: {unit}");
        }
        assert_eq!(super::metric_unit("train.tiny.loss_end"), None);
    }
}

fn validate(spec: &SkuSpec, src: &SourceText<'_>) -> Vec<SpecError> {
    let mut errors = Vec::new();
    let at_key = |key: &str| {
        let needle = format!("\n{key}");
        src.text.find(&needle).map_or(0, |i| i + 1)
    };
    if spec.name.is_empty() || !spec.name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
        errors.push(src.error_at(at_key("name"), "name: letters, digits, '-', '_' and '.' only"));
    }
    let sources = [
        ("[cpu]", spec.cpu.as_ref().map(|s| &s.source)),
        ("[memory]", spec.memory.as_ref().map(|s| &s.source)),
        ("[numa]", spec.numa.as_ref().map(|s| &s.source)),
        ("[gpu]", spec.gpu.as_ref().map(|s| &s.source)),
        ("[nvlink]", spec.nvlink.as_ref().map(|s| &s.source)),
        ("[nvme]", spec.nvme.as_ref().map(|s| &s.source)),
        ("[platform]", spec.platform.as_ref().map(|s| &s.source)),
        ("[software]", spec.software.as_ref().map(|s| &s.source)),
        ("[health]", spec.health.as_ref().map(|s| &s.source)),
        ("[fabric]", spec.fabric.as_ref().map(|s| &s.source)),
        ("[heat]", spec.heat.as_ref().map(|s| &s.source)),
        ("[siblings]", spec.siblings.as_ref().map(|s| &s.source)),
        ("[storage]", spec.storage.as_ref().map(|s| &s.source)),
    ];
    for (section, source) in sources {
        if source.is_some_and(|s| s.trim().is_empty()) {
            errors.push(
                src.error_at(at_key(section), format!("{section}: source is empty: say where its numbers come from")),
            );
        }
    }
    for a in spec.siblings.iter().flat_map(|s| &s.agree) {
        let known = crate::verdict::siblings::ATTRIBUTES;
        if !known.iter().any(|(id, _)| id == a) {
            let names: Vec<&str> = known.iter().map(|(id, _)| *id).collect();
            errors.push(src.error_at(at_key("agree"), format!("agree: \"{a}\" is none of {}", names.join(", "))));
        }
    }
    for counter in spec.fabric.iter().flat_map(|f| f.max_errors.keys()) {
        let known = kiln_inventory::rdma::ERROR_COUNTERS;
        if !known.contains(&counter.as_str()) {
            errors.push(src.error_at(
                at_key("max_errors"),
                format!("max_errors: \"{counter}\" is none of the kernel's port counters: {}", known.join(", ")),
            ));
        }
    }
    for key in spec.fabric.iter().flat_map(|f| &f.pkeys) {
        if pkey_base(key).is_none() {
            errors.push(src.error_at(at_key("pkeys"), format!("pkeys: \"{key}\" is not a P_Key like \"0xffff\"")));
        }
    }
    for nic in &spec.nics {
        if nic.source.trim().is_empty() {
            errors.push(src.error_at(at_key("[[nic]]"), "[[nic]]: source is empty: say where its numbers come from"));
        }
        for a in &nic.gpu_affinity {
            if !matches!(a.as_str(), "PIX" | "PXB" | "PHB" | "NODE" | "SYS") {
                errors.push(
                    src.error_at(at_key("[[nic]]"), format!("gpu_affinity: \"{a}\" is not PIX, PXB, PHB, NODE or SYS")),
                );
            }
        }
    }
    if let Some(p) = &spec.platform {
        for t in &p.transparent_hugepages {
            if !matches!(t.as_str(), "always" | "madvise" | "never") {
                errors.push(src.error_at(
                    at_key("transparent_hugepages"),
                    format!("transparent_hugepages: \"{t}\" is not always, madvise or never"),
                ));
            }
        }
    }
    for perf in &spec.performance {
        validate_perf(perf, src, &mut errors);
        validate_reference(spec, perf, src, &mut errors);
    }
    errors
}

/// An `of_reference` floor needs its band's reason and a published figure for its metric.
fn validate_reference(spec: &SkuSpec, perf: &Spanned<PerfSpec>, src: &SourceText<'_>, errors: &mut Vec<SpecError>) {
    let p = perf.get_ref();
    let Some(f) = &p.of_reference else {
        if p.band.is_some() {
            errors.push(src.error(perf, format!("metric \"{}\": band without of_reference", p.metric)));
        }
        return;
    };
    if p.band.as_deref().is_none_or(|b| b.trim().is_empty()) {
        errors.push(src.error(
            perf,
            format!("metric \"{}\": of_reference needs its band: say why the floor is {f} of the reference", p.metric),
        ));
    }
    if !(0.0..=1.5).contains(&f.value()) || f.value() == 0.0 {
        errors
            .push(src.error(perf, format!("metric \"{}\": of_reference {f} is not a fraction of a figure", p.metric)));
    }
    let sku = spec.reference_sku();
    if references::find(sku, &p.metric).is_none() {
        let known: Vec<&str> = references::all().iter().filter(|r| r.sku == sku).map(|r| r.metric.as_str()).collect();
        errors.push(src.error(
            perf,
            format!(
                "metric \"{}\": specs/references.toml has no figure for it under \"{sku}\"{}",
                p.metric,
                if known.is_empty() {
                    " (no figure at all: set `references` to a SKU it has, or write min instead)".to_string()
                } else {
                    format!(" (it has {})", known.join(", "))
                }
            ),
        ));
    }
}

/// A partition key without its membership bit ("0xffff" and "0x7fff" are both 0x7fff).
pub fn pkey_base(key: &str) -> Option<u16> {
    let hex = key.trim().strip_prefix("0x")?;
    let v = u16::from_str_radix(hex, 16).ok()?;
    (v & 0x7fff != 0).then_some(v & 0x7fff)
}

fn validate_perf(perf: &Spanned<PerfSpec>, src: &SourceText<'_>, errors: &mut Vec<SpecError>) {
    let p = perf.get_ref();
    let known = metrics::spec_metric_is_stored(&p.metric);
    let Some(unit) = metric_unit(&p.metric.replace("{n}", "0")).filter(|_| known) else {
        errors
            .push(src.error(perf, format!("metric \"{}\": not a metric kiln stores (see `kiln show run`)", p.metric)));
        return;
    };
    if p.source.trim().is_empty() && p.of_reference.is_none() {
        errors.push(
            src.error(perf, format!("metric \"{}\": source is empty: say where the number comes from", p.metric)),
        );
    }
    for bound in [&p.min, &p.max].into_iter().flatten() {
        match units::parse_any(bound.get_ref()) {
            Ok(q) if q.in_unit(unit).is_none() => errors.push(src.error(
                bound,
                format!("\"{}\" does not fit metric \"{}\", which is in {unit}", bound.get_ref(), p.metric),
            )),
            Ok(_) => {}
            Err(e) => errors.push(src.error(bound, e.to_string())),
        }
    }
    if p.min_fraction_of.is_some() != p.fraction.is_some() {
        errors.push(src.error(perf, "min_fraction_of and fraction go together"));
    }
    let group = p.metric.contains("{n}");
    if p.within_best.is_some() && !group {
        errors.push(src.error(perf, format!("within_best needs a group: write {{n}} in \"{}\"", p.metric)));
    }
    let any = p.min.is_some()
        || p.max.is_some()
        || p.of_reference.is_some()
        || p.fraction.is_some()
        || p.within_best.is_some()
        || p.fleet_p10 == Some(true);
    if !any {
        errors.push(src.error(
            perf,
            format!(
                "metric \"{}\": no threshold (min, max, of_reference, fraction, within_best or fleet_p10)",
                p.metric
            ),
        ));
    }
}

/// Whether `value` matches one of `patterns` (exact, or a prefix with a trailing `*`).
pub fn matches_any(patterns: &[String], value: &str) -> bool {
    patterns.iter().any(|p| match p.strip_suffix('*') {
        Some(prefix) => value.starts_with(prefix),
        None => p == value,
    })
}

impl SkuSpec {
    /// The SKU whose published references this spec's `of_reference` floors use.
    pub fn reference_sku(&self) -> &str {
        self.references.as_deref().unwrap_or(&self.name)
    }

    /// Whether this spec is for the box `inv` describes.
    pub fn applies_to(&self, inv: &Inventory) -> bool {
        let m = &self.matches;
        let product = inv.system.product.name.as_deref().unwrap_or("");
        if !m.product_names.is_empty() && !matches_any(&m.product_names, product) {
            return false;
        }
        let gpus = crate::verdict::gpu_count(inv);
        if m.gpu_count.is_some_and(|c| c != gpus) {
            return false;
        }
        if let Some(model) = &m.gpu_model {
            let names = crate::verdict::gpu_models(inv);
            if names.is_empty() || names.iter().any(|n| n != model) {
                return false;
            }
        }
        true
    }
}

/// Every spec: the built-in ones, then those of `dirs` (a file of the same name replaces a
/// built-in one).
///
/// # Errors
/// A spec that does not load.
pub fn all_specs(dirs: &[PathBuf]) -> Result<Vec<LoadedSpec>, SpecErrors> {
    let mut specs: Vec<LoadedSpec> = Vec::new();
    for (name, text) in BUILT_IN {
        specs.push(parse(&format!("(built in) specs/{name}"), (*text).to_string())?);
    }
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else { continue };
        let mut files: Vec<PathBuf> =
            entries.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "toml")).collect();
        files.sort();
        for f in files {
            let spec = load(&f)?;
            specs.retain(|s| s.spec.name != spec.spec.name);
            specs.push(spec);
        }
    }
    Ok(specs)
}

/// Why no single spec was picked.
#[derive(Debug, thiserror::Error)]
pub enum SelectError {
    #[error("no spec applies to this box ({what}); pass --spec FILE, or write one with `kiln spec capture`")]
    None { what: String },
    #[error("{} specs apply to this box: {}; pass --spec FILE to choose", names.len(), names.join(", "))]
    Several { names: Vec<String> },
}

/// The one spec among `specs` that applies to `inv`.
///
/// # Errors
/// None or more than one applies.
pub fn select(specs: Vec<LoadedSpec>, inv: &Inventory) -> Result<LoadedSpec, SelectError> {
    let mut hits: Vec<LoadedSpec> = specs.into_iter().filter(|s| s.spec.applies_to(inv)).collect();
    match hits.len() {
        1 => Ok(hits.remove(0)),
        0 => Err(SelectError::None {
            what: format!(
                "product \"{}\", {} GPU(s) {}",
                inv.system.product.name.as_deref().unwrap_or("unknown"),
                crate::verdict::gpu_count(inv),
                crate::verdict::gpu_models(inv).first().map_or("", String::as_str)
            ),
        }),
        _ => Err(SelectError::Several { names: hits.iter().map(|s| s.spec.name.clone()).collect() }),
    }
}

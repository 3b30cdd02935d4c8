//! NVIDIA GPUs through NVML (nvml-wrapper, which loads `libnvidia-ml.so.1` at run time), NVLink
//! per link with its remote end, and a cross-check against the GPUs on the PCI bus.
//!
//! Without the library or the driver, the GPUs are still listed from PCI and a problem says why.
//! A query the GPU or driver does not support gives `None`, never an error.

use std::ffi::OsStr;

use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, RetirementCause, TemperatureSensor};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use serde::{Deserialize, Serialize};

use super::cpulist::format_list;
use super::pci::PciDevice;
use super::source::{ProblemKind, Source};

pub const DEFAULT_LIBRARY: &str = "libnvidia-ml.so.1";

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ecc {
    pub enabled: bool,
    pub pending_enabled: bool,
    pub volatile_corrected: Option<u64>,
    pub volatile_uncorrected: Option<u64>,
    pub aggregate_corrected: Option<u64>,
    pub aggregate_uncorrected: Option<u64>,
}

/// Row remapping (Ampere and newer): spare rows that replaced failing ones.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemappedRows {
    pub correctable: u32,
    pub uncorrectable: u32,
    /// A remap waits for the next GPU reset.
    pub pending: bool,
    /// A remap failed: the GPU should be replaced.
    pub failure: bool,
}

/// Page retirement (before Ampere).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetiredPages {
    pub single_bit: usize,
    pub double_bit: usize,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PowerLimits {
    pub default_watts: Option<u32>,
    pub enforced_watts: Option<u32>,
    pub min_watts: Option<u32>,
    pub max_watts: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuPcie {
    pub current_gen: Option<u32>,
    pub max_gen: Option<u32>,
    pub current_width: Option<u32>,
    pub max_width: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RemoteType {
    Gpu,
    Nvswitch,
    /// IBM NPU (POWER9 CPU-GPU NVLink).
    Npu,
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvLinkErrors {
    pub replay: Option<u64>,
    pub recovery: Option<u64>,
    pub crc_flit: Option<u64>,
    pub crc_data: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvLink {
    pub link: u32,
    pub active: bool,
    pub version: Option<u32>,
    /// The PCI address of the far end, in sysfs form.
    pub remote_bus_id: Option<String>,
    pub remote_type: RemoteType,
    pub errors: Option<NvLinkErrors>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mig {
    pub enabled: bool,
    pub pending_enabled: bool,
}

/// A GPU's fabric registration (`nvmlDeviceGetGpuFabricInfo`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fabric {
    /// "not_supported", "not_started", "in_progress" or "completed".
    pub state: String,
    /// The registration's result, an NVML return code (0: success).
    pub status: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    pub index: u32,
    pub name: Option<String>,
    pub uuid: Option<String>,
    pub serial: Option<String>,
    pub board_part_number: Option<String>,
    pub vbios: Option<String>,
    /// The PCI address in sysfs form (`0000:18:00.0`).
    pub pci_address: Option<String>,
    pub pci_device_id: Option<String>,
    pub memory_total_bytes: Option<u64>,
    pub compute_capability: Option<String>,
    pub architecture: Option<String>,
    pub ecc: Option<Ecc>,
    pub remapped_rows: Option<RemappedRows>,
    pub retired_pages: Option<RetiredPages>,
    pub power: PowerLimits,
    pub max_sm_clock_mhz: Option<u32>,
    pub max_memory_clock_mhz: Option<u32>,
    pub pcie: GpuPcie,
    pub persistence_mode: Option<bool>,
    pub mig: Option<Mig>,
    pub temperature_celsius: Option<u32>,
    pub numa_node: Option<u32>,
    pub cpu_affinity: Option<String>,
    /// Why the GPU's clocks are held back as the inventory is taken (NVML's clock event
    /// reasons: "hw_slowdown", "hw_power_brake", "gpu_idle", …); at rest only idle and settings
    /// should show.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_event_reasons: Option<Vec<String>>,
    /// The GPU's place in the NVLink fabric (NVML's fabric info, Hopper and later): on NVSwitch
    /// systems the fabric manager must have brought every GPU to "completed", with success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<Fabric>,
    /// PCIe replays since the driver loaded (`nvmlDeviceGetPcieReplayCounter`): each is a TLP the
    /// link had to send again, the first sign of a marginal slot, riser or retimer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_replays: Option<u64>,
    /// What the driver says must happen before the GPU is trusted with work again (NVML's GPU
    /// recovery action, R550 drivers and later): "none", "gpu_reset", "node_reboot", "drain_p2p"
    /// or "drain_and_reset".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_action: Option<String>,
    /// The GPU is drained (`nvmlDeviceQueryDrainState`): the driver is taking it out of service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drained: Option<bool>,
    pub nvlinks: Vec<NvLink>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpus {
    /// The NVML library asked for, and why it could not be used.
    pub nvml_library: Option<String>,
    pub nvml_error: Option<String>,
    pub driver_version: Option<String>,
    /// "12.7", from NVML's integer form.
    pub cuda_driver_version: Option<String>,
    pub nvml_version: Option<String>,
    pub devices: Vec<Gpu>,
    /// NVIDIA GPUs (class 0300/0302) on the PCI bus.
    pub pci_gpus: Vec<String>,
    /// GPUs on PCI that NVML does not see: a fallen-off or unbound GPU.
    pub missing_from_nvml: Vec<String>,
    /// GPUs NVML reports at an address the PCI tree lacks (only checked when PCI lists GPUs).
    pub missing_from_pci: Vec<String>,
    /// NVSwitches, from PCI IDs and from NVLink remote ends.
    pub nvswitches: Vec<String>,
}

/// NVML's `00000000:18:00.0` to sysfs's `0000:18:00.0`.
pub fn normalize_bus_id(id: &str) -> Option<String> {
    let (domain, rest) = id.trim().trim_end_matches('\0').split_once(':')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    let (bus, devfn) = rest.split_once(':')?;
    let (dev, func) = devfn.split_once('.')?;
    let bus = u8::from_str_radix(bus, 16).ok()?;
    let dev = u8::from_str_radix(dev, 16).ok()?;
    let func = u8::from_str_radix(func, 16).ok()?;
    Some(format!("{domain:04x}:{bus:02x}:{dev:02x}.{func:x}"))
}

/// Turns NVML's CPU affinity bitmask words into a CPU list.
pub fn affinity_list(words: &[std::os::raw::c_ulong]) -> String {
    let bits = std::os::raw::c_ulong::BITS;
    let ids: Vec<u32> = words
        .iter()
        .enumerate()
        .flat_map(|(w, &word)| (0..bits).filter(move |b| word >> b & 1 == 1).map(move |b| w as u32 * bits + b))
        .collect();
    format_list(&ids)
}

/// Keeps a value, turns "not supported" into `None`, and records any other failure.
fn opt<T>(src: &Source, gpu: u32, what: &str, result: Result<T, NvmlError>) -> Option<T> {
    match result {
        Ok(v) => Some(v),
        Err(
            NvmlError::NotSupported
            | NvmlError::FunctionNotFound
            | NvmlError::InvalidArg
            | NvmlError::FailedToLoadSymbol(_),
        ) => None,
        Err(e) => {
            src.problem_at(format!("nvml: GPU {gpu}"), ProblemKind::Unreadable, format!("{what}: {e}"));
            None
        }
    }
}

pub fn collect(src: &Source, pci: &[PciDevice], library: Option<&OsStr>) -> Gpus {
    let pci_gpus: Vec<String> = pci.iter().filter(|d| d.is_nvidia_gpu()).map(|d| d.address.clone()).collect();
    let mut gpus = Gpus { pci_gpus: pci_gpus.clone(), ..Default::default() };
    gpus.nvswitches = pci.iter().filter(|d| d.is_nvswitch()).map(|d| d.address.clone()).collect();
    // NVML describes the machine kiln runs on: ask it for a snapshot only when told which library.
    // On the live system, a PCI bus without any NVIDIA device needs no NVML (a CPU-only box).
    let explicit = library.is_some();
    let worth_asking = src.is_live() && (pci.is_empty() || pci.iter().any(|d| d.vendor() == 0x10de));
    let Some(library) = library.map(OsStr::to_os_string).or_else(|| worth_asking.then(|| DEFAULT_LIBRARY.into()))
    else {
        return gpus;
    };
    gpus.nvml_library = Some(library.to_string_lossy().into_owned());
    let nvml = match Nvml::builder().lib_path(&library).init() {
        Ok(nvml) => nvml,
        Err(e) => {
            let reason = match &e {
                NvmlError::LibloadingError(_) => format!("cannot load {}: {e}", library.to_string_lossy()),
                NvmlError::DriverNotLoaded => "the NVIDIA driver is not loaded".to_string(),
                _ => e.to_string(),
            };
            // Without NVIDIA GPUs on the bus, a missing default library is expected, not a problem.
            if !pci_gpus.is_empty() || explicit {
                src.problem_at(
                    library.to_string_lossy(),
                    ProblemKind::Unreadable,
                    format!("NVML unavailable ({} NVIDIA GPU(s) on PCI): {reason}", pci_gpus.len()),
                );
            }
            gpus.nvml_error = Some(reason);
            gpus.missing_from_nvml = pci_gpus;
            return gpus;
        }
    };
    gpus.driver_version = opt(src, 0, "driver version", nvml.sys_driver_version());
    gpus.nvml_version = opt(src, 0, "NVML version", nvml.sys_nvml_version());
    gpus.cuda_driver_version = opt(src, 0, "CUDA driver version", nvml.sys_cuda_driver_version())
        .map(|v| format!("{}.{}", v / 1000, v % 1000 / 10));
    let count = match nvml.device_count() {
        Ok(n) => n,
        Err(e) => {
            src.problem_at("nvml", ProblemKind::Unreadable, format!("device count: {e}"));
            0
        }
    };
    for index in 0..count {
        match nvml.device_by_index(index) {
            Ok(device) => gpus.devices.push(read_gpu(src, &nvml, &device, index, pci)),
            Err(e) => src.problem_at(format!("nvml: GPU {index}"), ProblemKind::Unreadable, e.to_string()),
        }
    }
    // Cross-check: every GPU on the bus must be visible to NVML.
    let seen: Vec<&str> = gpus.devices.iter().filter_map(|g| g.pci_address.as_deref()).collect();
    gpus.missing_from_nvml = pci_gpus.iter().filter(|a| !seen.contains(&a.as_str())).cloned().collect();
    if !gpus.missing_from_nvml.is_empty() {
        src.problem_at(
            "nvml",
            ProblemKind::NotPresent,
            format!(
                "NVML sees {} of {} GPUs on PCI; missing: {}",
                pci_gpus.len() - gpus.missing_from_nvml.len(),
                pci_gpus.len(),
                gpus.missing_from_nvml.join(", ")
            ),
        );
    }
    if !pci_gpus.is_empty() {
        gpus.missing_from_pci =
            seen.iter().filter(|a| !pci_gpus.iter().any(|p| p == *a)).map(|a| a.to_string()).collect();
    }
    for gpu in &gpus.devices {
        for link in gpu.nvlinks.iter().filter(|l| l.remote_type == RemoteType::Nvswitch) {
            if let Some(addr) = &link.remote_bus_id {
                if !gpus.nvswitches.contains(addr) {
                    gpus.nvswitches.push(addr.clone());
                }
            }
        }
    }
    gpus.nvswitches.sort();
    gpus
}

/// Each NVLink of a GPU: state, version, the far end (by the driver's word, else by its PCI
/// identity) and its error counters.
fn read_nvlinks(nvml: &Nvml, device: &Device<'_>, pci: &[PciDevice]) -> Vec<NvLink> {
    let mut nvlinks = Vec::new();
    // NVML_NVLINK_MAX_LINKS: 18 on Hopper and Blackwell.
    for link in 0..18 {
        let l = device.link_wrapper_for(link);
        let active = match l.is_active() {
            Ok(a) => a,
            Err(_) => break, // past the last link, or no NVLink at all
        };
        // SAFETY: as above; the symbol writes one enum value.
        let remote_type = unsafe {
            nvml.lib().nvmlDeviceGetNvLinkRemoteDeviceType.as_ref().ok().and_then(|f| {
                let mut t = 0;
                (f(device.handle(), link, &mut t) == 0).then_some(t)
            })
        };
        let remote_bus_id =
            if active { l.remote_pci_info().ok().and_then(|p| normalize_bus_id(&p.bus_id)) } else { None };
        let remote_device = remote_bus_id.as_ref().and_then(|a| pci.iter().find(|d| &d.address == a));
        let remote_type = match remote_type {
            Some(0) => RemoteType::Gpu,
            Some(1) => RemoteType::Npu,
            Some(2) => RemoteType::Nvswitch,
            // Older drivers do not say: the far end's PCI identity does.
            _ if remote_device.is_some_and(|d| d.is_nvswitch()) => RemoteType::Nvswitch,
            _ if remote_device.is_some_and(|d| d.is_nvidia_gpu()) => RemoteType::Gpu,
            _ => RemoteType::Unknown,
        };
        let counter = |c| l.error_counter(c).ok();
        let errors = NvLinkErrors {
            replay: counter(ErrorCounter::DlReplay),
            recovery: counter(ErrorCounter::DlRecovery),
            crc_flit: counter(ErrorCounter::DlCrcFlit),
            crc_data: counter(ErrorCounter::DlCrcData),
        };
        let any_errors = errors.replay.is_some() || errors.recovery.is_some() || errors.crc_flit.is_some();
        nvlinks.push(NvLink {
            link,
            active,
            version: l.version().ok(),
            remote_bus_id,
            remote_type,
            errors: any_errors.then_some(errors),
        });
    }
    nvlinks
}

fn read_gpu(src: &Source, nvml: &Nvml, device: &Device<'_>, index: u32, pci: &[PciDevice]) -> Gpu {
    macro_rules! get {
        ($what:expr, $result:expr) => {
            opt(src, index, $what, $result)
        };
    }
    let pci_info = get!("PCI info", device.pci_info());
    let pci_address = pci_info.as_ref().and_then(|p| normalize_bus_id(&p.bus_id));
    let ecc_mode = get!("ECC mode", device.is_ecc_enabled());
    let ecc = ecc_mode.map(|m| {
        let count = |e, c| opt(src, index, "ECC errors", device.total_ecc_errors(e, c));
        Ecc {
            enabled: m.currently_enabled,
            pending_enabled: m.pending_enabled,
            volatile_corrected: count(MemoryError::Corrected, EccCounter::Volatile),
            volatile_uncorrected: count(MemoryError::Uncorrected, EccCounter::Volatile),
            aggregate_corrected: count(MemoryError::Corrected, EccCounter::Aggregate),
            aggregate_uncorrected: count(MemoryError::Uncorrected, EccCounter::Aggregate),
        }
    });
    // SAFETY: the handle belongs to this live Nvml; the symbol takes four out-pointers to c_uint.
    let remapped_rows = unsafe {
        nvml.lib().nvmlDeviceGetRemappedRows.as_ref().ok().and_then(|f| {
            let (mut corr, mut unc, mut pending, mut failure) = (0, 0, 0, 0);
            (f(device.handle(), &mut corr, &mut unc, &mut pending, &mut failure) == 0).then_some(RemappedRows {
                correctable: corr,
                uncorrectable: unc,
                pending: pending != 0,
                failure: failure != 0,
            })
        })
    };
    // SAFETY: the handle belongs to this live Nvml; the symbol fills one nvmlGpuFabricInfo_t.
    let fabric = unsafe {
        nvml.lib().nvmlDeviceGetGpuFabricInfo.as_ref().ok().and_then(|f| {
            let mut info: nvml_wrapper_sys::bindings::nvmlGpuFabricInfo_t = std::mem::zeroed();
            (f(device.handle(), &mut info) == 0).then(|| Fabric {
                state: match u32::from(info.state) {
                    0 => "not_supported".into(),
                    1 => "not_started".into(),
                    2 => "in_progress".into(),
                    3 => "completed".into(),
                    other => format!("state {other}"),
                },
                status: info.status,
            })
        })
    }
    .filter(|f| f.state != "not_supported");
    let retired = |cause| device.retired_pages(cause).ok().map(|p| p.len());
    let retired_pages =
        match (retired(RetirementCause::MultipleSingleBitEccErrors), retired(RetirementCause::DoubleBitEccError)) {
            (Some(single_bit), Some(double_bit)) => Some(RetiredPages { single_bit, double_bit }),
            _ => None,
        };
    let constraints = get!("power limit constraints", device.power_management_limit_constraints());
    let watts = |mw: u32| mw / 1000;
    let mig =
        get!("MIG mode", device.mig_mode()).map(|m| Mig { enabled: m.current == 1, pending_enabled: m.pending == 1 });
    let numa_node = device.numa_node_id().ok().or_else(|| {
        let addr = pci_address.as_deref()?;
        pci.iter().find(|d| d.address == addr)?.numa_node
    });
    let cpu_affinity =
        get!("CPU affinity", device.cpu_affinity(16)).map(|w| affinity_list(&w)).filter(|l| !l.is_empty());

    let nvlinks = read_nvlinks(nvml, device, pci);

    Gpu {
        index,
        name: get!("name", device.name()),
        uuid: get!("UUID", device.uuid()),
        serial: get!("serial", device.serial()),
        board_part_number: get!("board part number", device.board_part_number()),
        vbios: get!("VBIOS", device.vbios_version()),
        pci_device_id: pci_info.as_ref().map(|p| format!("{:04x}", p.pci_device_id >> 16)),
        pci_address,
        memory_total_bytes: get!("memory", device.memory_info()).map(|m| m.total),
        compute_capability: get!("compute capability", device.cuda_compute_capability())
            .map(|c| format!("{}.{}", c.major, c.minor)),
        architecture: get!("architecture", device.architecture()).map(|a| format!("{a:?}")),
        ecc,
        remapped_rows,
        retired_pages,
        power: PowerLimits {
            default_watts: get!("default power limit", device.power_management_limit_default()).map(watts),
            enforced_watts: get!("enforced power limit", device.enforced_power_limit()).map(watts),
            min_watts: constraints.as_ref().map(|c| watts(c.min_limit)),
            max_watts: constraints.as_ref().map(|c| watts(c.max_limit)),
        },
        max_sm_clock_mhz: get!("max SM clock", device.max_clock_info(Clock::SM)),
        max_memory_clock_mhz: get!("max memory clock", device.max_clock_info(Clock::Memory)),
        pcie: GpuPcie {
            current_gen: get!("PCIe generation", device.current_pcie_link_gen()),
            max_gen: get!("max PCIe generation", device.max_pcie_link_gen()),
            current_width: get!("PCIe width", device.current_pcie_link_width()),
            max_width: get!("max PCIe width", device.max_pcie_link_width()),
        },
        persistence_mode: get!("persistence mode", device.is_in_persistent_mode()),
        mig,
        temperature_celsius: get!("temperature", device.temperature(TemperatureSensor::Gpu)),
        fabric,
        pcie_replays: get!("PCIe replay counter", device.pcie_replay_counter()).map(u64::from),
        recovery_action: recovery_action(device),
        drained: get!("drain state", device.is_drain_enabled(pci_info.clone())),
        clock_event_reasons: get!("clock event reasons", device.current_throttle_reasons())
            .map(|r| reason_names(r.bits())),
        numa_node,
        cpu_affinity,
        nvlinks,
    }
}

/// NVML's GPU recovery actions (`nvmlDeviceGpuRecoveryAction_t`) by name.
pub const RECOVERY_ACTIONS: [&str; 5] = ["none", "gpu_reset", "node_reboot", "drain_p2p", "drain_and_reset"];

/// The GPU's recovery action (the field `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`); `None` where the
/// driver does not report it (before R550).
fn recovery_action(device: &Device<'_>) -> Option<String> {
    use nvml_wrapper::enums::device::SampleValue;
    use nvml_wrapper::struct_wrappers::device::FieldValueSample;
    let id = nvml_wrapper::structs::device::FieldId(
        nvml_wrapper_sys::bindings::field_id::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION,
    );
    let sample: FieldValueSample = device.field_values_for(&[id]).ok()?.into_iter().next()?.ok()?;
    let n = match sample.value.ok()? {
        SampleValue::U32(n) => u64::from(n),
        SampleValue::U64(n) => n,
        SampleValue::I64(n) => u64::try_from(n).ok()?,
        SampleValue::F64(f) => f as u64,
    };
    Some(RECOVERY_ACTIONS.get(n as usize).map_or_else(|| format!("action {n}"), |s| (*s).to_string()))
}

/// NVML's clock event reason bits (nvml.h, `nvmlClocksEventReason*`) by name.
pub const CLOCK_EVENT_REASONS: [(u64, &str); 9] = [
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake"),
    (0x100, "display_clocks_setting"),
];

/// The clock event reasons that are a fault when the GPU is at rest: a hardware slowdown, the
/// chassis's power brake, heat (idle, the applications clocks and the power cap are not).
pub const AT_REST_FAULTS: [&str; 4] = ["hw_slowdown", "hw_power_brake", "hw_thermal_slowdown", "sw_thermal_slowdown"];

impl Gpu {
    /// The clock event reasons read with the inventory that are faults at rest
    /// ([`AT_REST_FAULTS`]).
    pub fn held_back_at_rest(&self) -> Vec<&str> {
        self.clock_event_reasons.iter().flatten().map(String::as_str).filter(|r| AT_REST_FAULTS.contains(r)).collect()
    }
}

/// The names of the reasons set in an NVML clock event bitmask (an unknown bit by its value).
pub fn reason_names(bits: u64) -> Vec<String> {
    let mut names: Vec<String> =
        CLOCK_EVENT_REASONS.iter().filter(|(b, _)| bits & b != 0).map(|(_, n)| (*n).to_string()).collect();
    let known: u64 = CLOCK_EVENT_REASONS.iter().map(|(b, _)| b).sum();
    if bits & !known != 0 {
        names.push(format!("{:#x}", bits & !known));
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_event_reason_names() {
        assert_eq!(reason_names(0x1), ["gpu_idle"]);
        assert_eq!(reason_names(0x88), ["hw_slowdown", "hw_power_brake"]);
        assert_eq!(reason_names(0x1000), ["0x1000"]);
        assert!(reason_names(0).is_empty());
    }

    #[test]
    fn bus_ids() {
        assert_eq!(normalize_bus_id("00000000:18:00.0").as_deref(), Some("0000:18:00.0"));
        assert_eq!(normalize_bus_id("00000000:AB:00.0").as_deref(), Some("0000:ab:00.0"));
        assert_eq!(normalize_bus_id("0000:ab:00.0").as_deref(), Some("0000:ab:00.0"));
        assert_eq!(normalize_bus_id("garbage"), None);
    }

    #[test]
    fn affinity() {
        assert_eq!(affinity_list(&[0xfffff]), "0-19");
        assert_eq!(affinity_list(&[0, 1]), "64");
        assert_eq!(affinity_list(&[]), "");
    }
}

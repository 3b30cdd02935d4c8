//! What to do about a failing or warning check: a catalogue of remedies keyed by check id (the
//! longest prefix wins), each with where the advice comes from. `judge` gives every check that did
//! not pass its remedy, so the terminal, the report, `--json` and the OCP output all carry it.

use serde::{Deserialize, Serialize};

/// What to do, and the document that says so.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Remedy {
    pub action: String,
    pub source: String,
}

const XID_GUIDE: &str = "NVIDIA XID Errors catalogue (docs.nvidia.com/deploy/xid-errors), its Resolution column";
const MEMORY_GUIDE: &str =
    "NVIDIA GPU Memory Error Management guide (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt): row remapping";
const SMI: &str = "nvidia-smi(1), NVIDIA System Management Interface manual";
const FABRIC: &str = "NVIDIA Fabric Manager User Guide (docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide)";
const NVME: &str = "NVM Express Base Specification, SMART / Health Information log page (critical warning, media \
                    errors, percentage used)";
const AER: &str = "Linux PCI Express Advanced Error Reporting HOWTO (Documentation/PCI/pcieaer-howto.rst)";
const IB_COUNTERS: &str = "NVIDIA (Mellanox) InfiniBand port counters reference and the Azure HPC health checks (check_ib_link_flapping, IB port error thresholds): symbol and link-integrity errors point at the cable or transceiver";
const ASHRAE: &str = "ASHRAE TC 9.9 Thermal Guidelines for Data Processing Environments (recommended inlet 18–27 °C)";
const KILN: &str = "kiln (no outside document: what a technician does first)";

/// The catalogue: (check id or prefix, action, source). Order does not matter: the longest prefix
/// that matches wins.
const CATALOGUE: &[(&str, &str, &str)] = &[
    ("gpu.count", "a GPU is missing from NVML or from the PCI bus: reseat it and its power, check `dmesg` for the driver's reason, then RMA the GPU or the baseboard if it stays missing", XID_GUIDE),
    ("gpu.visible", "a GPU on the PCI bus is not visible to the driver: reseat it, reboot; if it stays invisible, RMA it", XID_GUIDE),
    ("gpu.model", "another GPU model is in this slot: swap in the SKU's model", KILN),
    ("gpu.memory", "the GPU reports less memory than its model has: check that MIG is off; otherwise RMA the GPU", KILN),
    ("gpu.vbios", "update the VBIOS to the version the spec allows, with the vendor's firmware bundle", KILN),
    ("gpu.ecc.mode", "enable ECC (`nvidia-smi -e 1`), then reboot or reset the GPU", SMI),
    ("gpu.ecc.uncorrectable", "drain the node and reset the GPU (`nvidia-smi -r`) or reboot so that the rows are remapped; if uncorrectable errors recur, or remapping fails, RMA the GPU", MEMORY_GUIDE),
    ("gpu.remapped_rows", "a pending remap: reset the GPU (`nvidia-smi -r`) or reboot, then re-run; a failed remap (the rows are used up): RMA the GPU", MEMORY_GUIDE),
    ("gpu.retired_pages", "pages were retired for ECC errors: reboot to apply pending retirements; past the spec's limit, RMA the GPU", MEMORY_GUIDE),
    ("gpu.persistence", "enable persistence: run the nvidia-persistenced daemon (or `nvidia-smi -pm 1`)", "NVIDIA Driver Persistence (docs.nvidia.com/deploy/driver-persistence)"),
    ("gpu.mig", "disable MIG (`nvidia-smi -mig 0`), then reset the GPU", SMI),
    ("gpu.power_limit", "restore the board's default power limit (`nvidia-smi -pl <default>`), or, for another model or board, swap in the SKU's part", SMI),
    ("gpu.pcie", "the GPU's link trained below the spec: reseat the GPU and its riser or cable, check the slot's link settings in the BIOS, then replace the riser, cable or switch port that keeps training low", AER),
    ("gpu.xid", "reset the GPU or reboot, and follow the XID's resolution: 79 (fallen off the bus) reseat it and check its power, RMA if it recurs; 48, 63, 64, 94, 95 (memory) the memory error guide; 74 (NVLink) check the fabric manager and the NVLink counters; 119, 120 (GSP) update the driver", XID_GUIDE),
    ("services.nvidia_peermem", "load the peer memory module (`modprobe nvidia-peermem`, and list it in /etc/modules-load.d so that it loads at boot); it ships with the driver", "NVIDIA GPUDirect RDMA documentation (docs.nvidia.com/cuda/gpudirect-rdma), nvidia-peermem"),
    ("gpu.fabric", "start the fabric manager (`systemctl enable --now nvidia-fabricmanager`; its version must be the driver's), read its log (/var/log/fabricmanager.log), then reset the GPUs; a GPU that still does not register is an RMA of the baseboard", FABRIC),
    ("gpu.at_rest.clocks", "clocks held back at rest: a power brake comes from the chassis (check the power supplies and the BMC's power capping), a slowdown from heat or a sensor (check fans and inlet, then the GPU's sensor); reset the GPU, and RMA it if the slowdown stays", "NVML clock event reasons (nvmlDeviceGetCurrentClocksEventReasons); nvidia-smi -q -d PERFORMANCE"),
    ("gpu.throttle", "the GPU is held back by heat: check the fans, the inlet temperature and the airflow path (blanks, cabling); re-run the burn once cooled", "NVML clock event reasons (nvmlDeviceGetCurrentClocksEventReasons)"),
    ("nvlink", "NVLinks down, slow or erroring: check that the fabric manager runs (`systemctl status nvidia-fabricmanager`), reset the GPUs, then reseat the baseboard; links that stay down are an RMA of the baseboard", FABRIC),
    ("nic.firmware", "update the NIC firmware to the spec's version (`mlxfwmanager` for ConnectX)", KILN),
    ("nic.port", "the port is down or slow: reseat or replace the cable and transceiver, check the switch port, then the NIC", KILN),
    ("nic.count", "a NIC is missing: reseat it, check that its driver loaded (`dmesg`), then replace it", KILN),
    ("nic.gpu_affinity", "the NIC is not behind the same PCIe switch as its GPU: move it to the slot the SKU's wiring gives it", KILN),
    ("nvme.critical_warning", "the drive reports a critical warning: back up what it holds and replace it", NVME),
    ("nvme.media_errors", "the drive reports media errors: back up what it holds and replace it", NVME),
    ("nvme.wear", "the drive's wear is past the spec's limit: plan its replacement", NVME),
    ("nvme", "a drive is missing, smaller or on a slower link than the SKU's: reseat it, then replace it", KILN),
    ("pcie.aer", "PCIe errors were reported: reseat the device named and its riser; fatal or recurring non-fatal errors mean replacing the device, riser or slot", AER),
    ("platform.acs", "disable ACS on the PCIe switch ports (BIOS setting, or `setpci` at boot) so that GPUDirect P2P and RDMA go through the switch", "NVIDIA GPUDirect RDMA documentation (docs.nvidia.com/cuda/gpudirect-rdma), ACS"),
    ("platform.iommu", "set the IOMMU off or to passthrough (`iommu=pt` on the kernel command line)", "NVIDIA GPUDirect RDMA documentation (docs.nvidia.com/cuda/gpudirect-rdma), IOMMU"),
    ("platform.governor", "set the CPU frequency governor to performance (`cpupower frequency-set -g performance`)", "Linux CPUFreq documentation (Documentation/admin-guide/pm/cpufreq.rst)"),
    ("platform.thp", "set transparent huge pages as the spec says (`/sys/kernel/mm/transparent_hugepage/enabled`)", "Linux transparent hugepage documentation (Documentation/admin-guide/mm/transhuge.rst)"),
    ("platform", "bring the platform setting to what the spec says (BIOS or kernel command line)", KILN),
    ("software", "install the driver or CUDA version the spec pins (`kiln provision apply` with the SKU's image)", KILN),
    ("cpu.sdc", "take the box out of service: a CPU computes wrong without crashing. Confirm with `kiln bench sdc --seconds 600`; the CPU is a replacement", "Meta, \"Silent Data Corruptions at Scale\" (2021); Google, \"Cores that don't count\" (2021); OpenDCDiag"),
    ("cpu", "the CPUs are not the SKU's: check the BIOS (cores disabled, SMT) and the parts fitted", KILN),
    ("memory", "memory is missing or slow: reseat the DIMMs named in SMBIOS, check that every channel is populated as the SKU's, and that the BIOS runs them at their rated speed", KILN),
    ("numa", "the NUMA layout is not the SKU's: check the BIOS's sub-NUMA clustering and node interleaving settings", KILN),
    ("siblings.gpu.vbios", "bring the GPU named to the VBIOS its siblings run (the vendor's firmware bundle updates every GPU to one version)", "Meta GCM health checks, check-nvidia-smi vbios_mismatch"),
    ("siblings", "bring the device named to the value its siblings have (firmware update, `nvidia-smi` setting, or reseating a link that trained low)", KILN),
    ("perf", "slower than the spec or the fleet: re-run on a quiet box, read the run's telemetry (throttling, clocks, contention), and compare with the box's siblings; a box that stays slow goes to the vendor with the run", KILN),
    ("fabric.port.errors", "clean or reseat the cable and transceiver at both ends (the HCA and the switch port), then clear the counters (`perfquery -x`) and re-run; errors that return: replace the cable, then move to another switch port", IB_COUNTERS),
    ("fabric.port.flaps", "reseat or replace the cable and transceiver; if the link still drops, check the switch port's log and move the cable to another port", IB_COUNTERS),
    ("fabric.port.physical_state", "check that the cable is seated at both ends and the switch port is enabled (`ibstat`, the switch's port status); replace the cable or transceiver if the link does not train", IB_COUNTERS),
    ("fabric.port.width", "the link trained on fewer lanes: reseat, then replace the cable or transceiver (a damaged lane), and check the switch port", IB_COUNTERS),
    ("fabric.port.pkey", "add this port's GUID to the partition in the subnet manager's partition configuration (OpenSM partitions.conf or UFM), then re-read with `kiln inventory`", "OpenSM partition configuration (opensm partitions.conf(5))"),
    ("gpu.pcie.replays", "the GPU's PCIe link resends packets: reseat the GPU and its riser or cable, check the retimers' firmware, then replace the part that keeps the count growing; DCGM's PCIe diagnostic confirms", "NVIDIA DCGM diagnostics, PCIe test (docs.nvidia.com/datacenter/dcgm): replay counter"),
    ("gpu.recovery", "do what the driver asks: gpu_reset: drain the GPU's work and reset it (`nvidia-smi -r -i <n>`); node_reboot: reboot the box; drain_p2p / drain_and_reset: stop peer-to-peer work, drain and reset; if it asks again after that, follow the XID in the kernel log and RMA the GPU", XID_GUIDE),
    ("gpu.drain", "the GPU is drained: finish the reset or repair it was drained for, then undrain it (`nvidia-smi drain -p <bus id> -m 0`) and re-run", SMI),
    ("gpu.at_rest.temperature", "a GPU hot at rest has a cooling fault: check the chassis fans and airflow baffles, that nothing blocks the inlet, and the heatsink's mounting; compare with its siblings", ASHRAE),
    ("gpu.temperature", "check the chassis fans, airflow and the room's inlet temperature; a GPU hotter than its siblings under the same load needs its heatsink checked", ASHRAE),
    ("board.sensors", "replace the stopped fan, or read the BMC's event log (`ipmitool sel list`) for the sensor in alarm, and fix its cause before the box takes load", KILN),
    ("board.inlet", "the air coming in is too hot: check the rack's blanking panels, hot-aisle containment and the room's cooling", ASHRAE),
    ("storage", "the data drives do not feed the accelerators: read the run's bottleneck — a slow drive (its SMART log, its PCIe link, its filesystem's mount options), the readers' CPU (more readers or a faster decode), or too few drives for the rate (stripe more)", "MLPerf Storage (DLIO): a system passes at ≥ 90 % accelerator utilisation"),
    ("drift.metric", "the box is slower than when it was accepted: read what changed since (driver, kernel, BIOS, a replaced GPU) and re-run on a quiet box; a change of software that explains it is rolled back or accepted anew (`kiln commission`), a drop with nothing changed goes to the vendor with both runs", KILN),
    ("drift.gpu.serial", "a GPU was replaced since acceptance: record the RMA, then commission the box again so that its new GPU has a baseline of its own", KILN),
    ("harness", "kiln's own stack failed, not the hardware: install the kiln-gpu built with CUDA for this driver (deploy/cuda), run `kiln bench gpu gemm` to see why it cannot measure, then commission again", KILN),
    ("link", "a link changed speed or width under load: reseat the device and its riser or cable, then replace the part that keeps flapping", AER),
];

/// The remedy for a check id: the catalogue entry with the longest prefix of `id` (on a dot
/// boundary), `None` for an id the catalogue does not know.
pub fn remedy_for(id: &str) -> Option<Remedy> {
    CATALOGUE
        .iter()
        .filter(|(prefix, ..)| id == *prefix || id.strip_prefix(prefix).is_some_and(|rest| rest.starts_with('.')))
        .max_by_key(|(prefix, ..)| prefix.len())
        .map(|(_, action, source)| Remedy { action: (*action).to_string(), source: (*source).to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The longest prefix wins, on dot boundaries; unknown ids have none.
    #[test]
    fn the_longest_prefix_gives_the_remedy() {
        assert!(remedy_for("gpu.remapped_rows").unwrap().action.contains("RMA"));
        assert!(remedy_for("siblings.gpu.vbios").unwrap().source.contains("vbios_mismatch"));
        assert!(remedy_for("siblings.gpu.ecc").unwrap().source.starts_with("kiln"));
        assert!(remedy_for("nvlink.errors.replay").unwrap().source.contains("Fabric Manager"));
        assert!(remedy_for("gpu.pcie.path").is_some());
        assert_eq!(remedy_for("gpus.unknown"), None);
        assert_eq!(remedy_for("nothing"), None);
    }
}

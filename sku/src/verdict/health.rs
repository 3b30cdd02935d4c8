//! Checks of how healthy the box is: GPU ECC, remapped rows, retired pages, XID events since boot,
//! PCIe AER counters, NVLink error counters and NVMe SMART.

use crate::spec::{HealthSpec, SkuSpec};
use kiln_inventory::kmsg::xid_name;
use kiln_inventory::Inventory;

use super::hardware::gpu_subject;
use super::{Checks, Measured, Severity};

pub fn check(spec: &SkuSpec, inv: &Inventory, c: &mut Checks) {
    let Some(h) = &spec.health else { return };
    gpu_memory(h, inv, c);
    xids(h, inv, c);
    aer(h, inv, c);
    nvlink_errors(h, inv, c);
    nvme(h, inv, c);
}

fn gpu_memory(h: &HealthSpec, inv: &Inventory, c: &mut Checks) {
    for g in &inv.gpus.devices {
        let subject = gpu_subject(g);
        if let Some(max) = h.max_ecc_uncorrectable {
            let m = match &g.ecc {
                Some(e) => match (e.volatile_uncorrected, e.aggregate_uncorrected) {
                    (None, None) => Measured::missing("NVML reports no ECC counters"),
                    (v, a) => Measured::of(
                        format!(
                            "volatile {}, aggregate {}",
                            v.map_or("?".into(), |x| x.to_string()),
                            a.map_or("?".into(), |x| x.to_string())
                        ),
                        v.unwrap_or(0) <= max && a.unwrap_or(0) <= max,
                    ),
                },
                None => Measured::missing("NVML reports no ECC (ECC unsupported or off)"),
            };
            c.add(
                "gpu.ecc.uncorrectable",
                &subject,
                Severity::Critical,
                format!("≤ {max}"),
                m,
                "uncorrectable memory errors: RMA the GPU",
                "NVML nvmlDeviceGetTotalEccErrors",
            );
        }
        if h.remapped_rows == Some(true) {
            let m = match &g.remapped_rows {
                Some(r) => Measured::of(
                    format!(
                        "{} correctable, {} uncorrectable{}{}",
                        r.correctable,
                        r.uncorrectable,
                        if r.pending { ", pending" } else { "" },
                        if r.failure { ", FAILED" } else { "" }
                    ),
                    !r.pending && !r.failure,
                ),
                None => Measured::missing(no_remapping(g)),
            };
            let reason = match &g.remapped_rows {
                Some(r) if r.failure => "row remapping failed: RMA the GPU",
                _ => "a remap is pending: reset the GPU, then re-run",
            };
            c.add(
                "gpu.remapped_rows",
                &subject,
                Severity::Critical,
                "none pending or failed",
                m,
                reason,
                "NVML nvmlDeviceGetRemappedRows",
            );
        }
        if let Some(max) = h.max_retired_pages {
            let m = g.retired_pages.as_ref().map_or_else(
                || Measured::missing("NVML reports no retired pages (row remapping replaces them on Ampere and later)"),
                |r| {
                    let n = (r.single_bit + r.double_bit) as u64;
                    Measured::of(format!("{n} ({} single-bit, {} double-bit)", r.single_bit, r.double_bit), n <= max)
                },
            );
            c.add(
                "gpu.retired_pages",
                &subject,
                Severity::Critical,
                format!("≤ {max}"),
                m,
                "too many retired pages: RMA the GPU",
                "NVML nvmlDeviceGetRetiredPages",
            );
        }
    }
}

/// "0000:1b:00" (the driver's form) matches "0000:1b:00.0".
fn same_gpu(xid_pci: &str, address: &str) -> bool {
    address.to_ascii_lowercase().starts_with(&xid_pci.to_ascii_lowercase())
}

fn xids(h: &HealthSpec, inv: &Inventory, c: &mut Checks) {
    if h.xid_fail.is_empty() && h.xid_required != Some(true) {
        return;
    }
    let log = &inv.kernel_log;
    let evidence = log.source.clone().unwrap_or_else(|| "kernel log".into());
    // No GPU at all: nothing writes XIDs, and the GPU count checks say what is missing.
    if inv.gpus.devices.is_empty() && inv.gpus.pci_gpus.is_empty() {
        return;
    }
    if log.source.is_none() {
        let why = log.error.clone().unwrap_or_else(|| "the kernel log was not read".into());
        c.add(
            "gpu.xid",
            "kernel log",
            Severity::Critical,
            "no XID in the fail list",
            Measured::missing(why),
            "",
            &evidence,
        );
        return;
    }
    let mut subjects: Vec<(String, Option<&str>)> =
        inv.gpus.devices.iter().map(|g| (gpu_subject(g), g.pci_address.as_deref())).collect();
    if subjects.is_empty() {
        subjects = inv.gpus.pci_gpus.iter().map(|a| (format!("PCI {a}"), Some(a.as_str()))).collect();
    }
    let fail_list = h.xid_fail.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
    for (subject, addr) in &subjects {
        let events: Vec<_> = log.xids.iter().filter(|x| addr.is_some_and(|a| same_gpu(&x.pci, a))).collect();
        let failing: Vec<_> = events.iter().filter(|x| h.xid_fail.contains(&x.xid)).collect();
        let describe = |xs: &[&&kiln_inventory::kmsg::XidEvent]| {
            let mut v: Vec<String> = xs.iter().map(|x| format!("Xid {} ({})", x.xid, xid_name(x.xid))).collect();
            v.dedup();
            v.join("; ")
        };
        let m = if !failing.is_empty() {
            Measured::of(describe(&failing), false)
        } else if !events.is_empty() {
            let all: Vec<_> = events.iter().collect();
            Measured::Warn {
                text: describe(&all),
                why: "XIDs outside the fail list (usually an application's fault)".into(),
            }
        } else {
            Measured::of("none since boot", true)
        };
        c.add(
            "gpu.xid",
            subject,
            Severity::Critical,
            format!("none of {fail_list}"),
            m,
            "the driver logged a hardware XID since boot",
            &evidence,
        );
    }
}

fn aer(h: &HealthSpec, inv: &Inventory, c: &mut Checks) {
    if h.max_aer_fatal.is_none() && h.max_aer_nonfatal.is_none() && h.max_aer_correctable.is_none() {
        return;
    }
    let mut reporting = 0;
    let mut with_errors = 0;
    for d in &inv.pci {
        let Some(a) = &d.aer else { continue };
        reporting += 1;
        let limits = [
            ("fatal", h.max_aer_fatal, a.fatal),
            ("nonfatal", h.max_aer_nonfatal, a.nonfatal),
            ("correctable", h.max_aer_correctable, a.correctable),
        ];
        for (kind, max, got) in limits {
            let (Some(max), Some(got)) = (max, got) else { continue };
            // Devices with errors are listed one by one; the clean ones in one line below.
            if got == 0 {
                continue;
            }
            with_errors += 1;
            let name = d.device_name.as_deref().unwrap_or("");
            c.add(
                &format!("pcie.aer.{kind}"),
                format!("{} {name}", d.address).trim(),
                Severity::Critical,
                format!("≤ {max}"),
                Measured::of(got.to_string(), got <= max),
                "PCIe errors on this device since boot (reseat; replace the riser or card if they grow)",
                &format!("/sys/bus/pci/devices/{}/aer_dev_{kind}", d.address),
            );
        }
    }
    if with_errors == 0 {
        let m = if reporting == 0 {
            Measured::missing("no device reports AER counters (kernel without AER, or a virtual machine)")
        } else {
            Measured::of(format!("0 errors on {reporting} devices"), true)
        };
        c.add(
            "pcie.aer",
            "all PCI devices",
            Severity::Critical,
            "no errors beyond the limits",
            m,
            "",
            "/sys/bus/pci/devices/*/aer_dev_*",
        );
    }
}

fn nvlink_errors(h: &HealthSpec, inv: &Inventory, c: &mut Checks) {
    if h.max_nvlink_replay.is_none() && h.max_nvlink_recovery.is_none() && h.max_nvlink_crc.is_none() {
        return;
    }
    for g in &inv.gpus.devices {
        let subject = gpu_subject(g);
        let kinds: [(&str, Option<u64>, fn(&kiln_inventory::gpu::NvLinkErrors) -> Option<u64>); 3] = [
            ("replay", h.max_nvlink_replay, |e| e.replay),
            ("recovery", h.max_nvlink_recovery, |e| e.recovery),
            ("crc", h.max_nvlink_crc, |e| match (e.crc_flit, e.crc_data) {
                (None, None) => None,
                (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
            }),
        ];
        for (kind, max, read) in kinds {
            let Some(max) = max else { continue };
            // One check per GPU and counter: the worst link, and every link over the limit.
            let counts: Vec<(u32, u64)> =
                g.nvlinks.iter().filter_map(|l| Some((l.link, read(l.errors.as_ref()?)?))).collect();
            let m = if counts.is_empty() {
                Measured::missing("NVML reports no NVLink error counters")
            } else {
                let over: Vec<String> =
                    counts.iter().filter(|(_, n)| *n > max).map(|(l, n)| format!("link {l}: {n}")).collect();
                let worst = counts.iter().map(|(_, n)| *n).max().unwrap_or(0);
                if over.is_empty() {
                    Measured::of(format!("at most {worst} on {} links", counts.len()), true)
                } else {
                    Measured::of(over.join(", "), false)
                }
            };
            c.add(
                &format!("nvlink.errors.{kind}"),
                &subject,
                Severity::Critical,
                format!("≤ {max} per link"),
                m,
                "NVLink errors (reseat the GPU or baseboard; RMA if they grow)",
                "NVML nvmlDeviceGetNvLinkErrorCounter",
            );
        }
    }
}

fn nvme(h: &HealthSpec, inv: &Inventory, c: &mut Checks) {
    if h.nvme_critical_warning.is_none() && h.max_nvme_media_errors.is_none() && h.max_nvme_percentage_used.is_none() {
        return;
    }
    for d in &inv.nvme {
        let subject = format!("{} {}", d.name, d.model.as_deref().unwrap_or("").trim());
        let subject = subject.trim();
        let ev = format!("/dev/{} SMART log (admin command 0x02)", d.name);
        let Some(s) = &d.smart else {
            c.add(
                "nvme.smart",
                subject,
                Severity::Critical,
                "readable",
                Measured::missing("the SMART log needs root"),
                "",
                &ev,
            );
            continue;
        };
        if h.nvme_critical_warning == Some(true) {
            c.add(
                "nvme.critical_warning",
                subject,
                Severity::Critical,
                "0",
                Measured::of(format!("0x{:02x}", s.critical_warning), s.critical_warning == 0),
                "the drive raises a critical warning (spare, temperature, reliability or read-only)",
                &ev,
            );
        }
        if let Some(max) = h.max_nvme_media_errors {
            c.add(
                "nvme.media_errors",
                subject,
                Severity::Critical,
                format!("≤ {max}"),
                Measured::of(s.media_errors.to_string(), s.media_errors <= max),
                "media errors: replace the drive",
                &ev,
            );
        }
        if let Some(max) = &h.max_nvme_percentage_used {
            let used = f64::from(s.percentage_used) / 100.0;
            c.add(
                "nvme.wear",
                subject,
                Severity::Minor,
                format!("≤ {max}"),
                Measured::of(format!("{} %", s.percentage_used), used <= max.value()),
                "the drive's rated endurance is largely used",
                &ev,
            );
        }
    }
}

/// GPUs held back by heat while a benchmark loaded them: more than the spec's share of a run's
/// telemetry samples fails (airflow, fans, a heatsink badly seated).
/// What the GPUs say at rest, read with the inventory and judged whatever the spec pins: clocks
/// held back by a hardware slowdown, a power brake (a signal from the chassis) or heat while idle,
/// and an enforced power limit below the board's default (a GH200 capped at 700 of its 900 W).
pub fn at_rest(inv: &Inventory, c: &mut Checks) {
    // GPUDirect RDMA (NCCL over InfiniBand or RoCE straight from GPU memory) needs the peer memory
    // module where GPUs and RDMA devices share the box.
    if let Some(modules) =
        inv.os.kernel_modules.as_ref().filter(|_| !inv.gpus.devices.is_empty() && !inv.rdma.is_empty())
    {
        let loaded = modules.iter().find(|m| *m == "nvidia_peermem" || *m == "nv_peer_mem");
        c.add(
            "services.nvidia_peermem",
            "GPUDirect RDMA",
            Severity::Major,
            "nvidia_peermem loaded (GPUs and RDMA devices in one box)",
            Measured::of(loaded.map_or("not loaded".to_string(), |m| format!("{m} loaded")), loaded.is_some()),
            "GPUDirect RDMA is off: NCCL falls back to copies through host memory",
            "/proc/modules",
        );
    }
    let nvswitch = !inv.gpus.nvswitches.is_empty() || inv.topology.nvswitch;
    for g in &inv.gpus.devices {
        let subject = gpu_subject(g);
        let ev = format!("NVML GPU {}", g.index);
        // On NVSwitch systems the fabric manager registers every GPU with the fabric; one it did
        // not is a box whose NVLink traffic will fail, however healthy each GPU looks.
        if let Some(f) = g.fabric.as_ref().filter(|_| nvswitch) {
            let ok = f.state == "completed" && f.status == 0;
            c.add(
                "gpu.fabric",
                &subject,
                Severity::Major,
                "completed, with success",
                Measured::of(format!("{}, status {}", f.state, f.status), ok),
                "the GPU is not registered with the NVLink fabric: the fabric manager is down, not started or failed",
                &format!("{ev} nvmlDeviceGetGpuFabricInfo"),
            );
        }
        if let Some(action) = &g.recovery_action {
            c.add(
                "gpu.recovery",
                &subject,
                Severity::Critical,
                "none",
                Measured::of(action, action == "none"),
                &format!("the driver asks for {} before the GPU takes work again", action.replace('_', " ")),
                &format!("{ev} nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)"),
            );
        }
        if let Some(drained) = g.drained {
            c.add(
                "gpu.drain",
                &subject,
                Severity::Major,
                "not drained",
                Measured::of(if drained { "drained" } else { "not drained" }, !drained),
                "the GPU is drained: it is being taken out of service (a pending reset, or an operator's drain)",
                &format!("{ev} nvmlDeviceQueryDrainState"),
            );
        }
        if let Some(reasons) = &g.clock_event_reasons {
            let held = g.held_back_at_rest();
            let measured = if reasons.is_empty() { "none".to_string() } else { reasons.join(", ") };
            c.add(
                "gpu.at_rest.clocks",
                &subject,
                Severity::Major,
                "no hardware slowdown, power brake or thermal slowdown at rest",
                Measured::of(measured, held.is_empty()),
                &format!(
                    "the clocks are held back at rest by {}: a power brake from the chassis, a cooling fault or a \
                     failing sensor, before any load",
                    held.join(", ")
                ),
                &format!("{ev} nvmlDeviceGetCurrentClocksEventReasons"),
            );
        }
        if let (Some(default), Some(enforced)) = (g.power.default_watts, g.power.enforced_watts) {
            c.add(
                "gpu.power_limit.default",
                &subject,
                Severity::Minor,
                format!("the board's default, {default} W"),
                Measured::of(format!("{enforced} W"), enforced >= default),
                &format!("the power limit is lowered from the board's default of {default} W"),
                &format!("{ev} nvmlDeviceGetEnforcedPowerLimit, nvmlDeviceGetPowerManagementDefaultLimit"),
            );
        }
    }
}

/// The silent-data-corruption screen's runs taken with this inventory (`kiln bench sdc`, a short
/// one in the suite): a CPU that computed wrong fails the box, whatever the spec says — its
/// results cannot be trusted. Each wrong CPU is named from the run's `sdc.cpu<N>.wrong` metrics.
pub fn sdc(e: &super::Evidence<'_>, c: &mut Checks) {
    for run in e.runs.iter().filter(|r| r.benchmark == "sdc") {
        let metric = |name: &str| run.metrics.iter().find(|m| m.0 == name).map(|m| m.1);
        let wrong: Vec<String> = run
            .metrics
            .iter()
            .filter_map(|(name, v, _)| {
                let cpu = name.strip_prefix("sdc.cpu")?.strip_suffix(".wrong")?;
                Some(format!("CPU {cpu} ({v:.0} wrong results)"))
            })
            .collect();
        let cpus = metric("sdc.cpus").unwrap_or(0.0);
        let failed = run.status == kiln_db::RunStatus::Failed || metric("sdc.cpus_wrong").is_some_and(|n| n > 0.0);
        let measured = if failed {
            if wrong.is_empty() {
                "a CPU computed wrong".to_string()
            } else {
                wrong.join(", ")
            }
        } else {
            format!("{cpus:.0} CPUs agree, {:.0} rounds compared", metric("sdc.rounds_compared").unwrap_or(0.0))
        };
        c.add(
            "cpu.sdc",
            "CPUs",
            Severity::Critical,
            "every CPU computes every result right",
            Measured::of(measured, !failed),
            "a CPU computes wrong without crashing (silent data corruption): take the box out of service and \
             confirm with `kiln bench sdc --seconds 600`; the CPU is a replacement (kiln show run for the kernel \
             and the first wrong word)",
            &format!("run {}", run.id),
        );
    }
}

pub fn thermal(spec: &SkuSpec, e: &super::Evidence<'_>, c: &mut Checks) {
    let Some(max) = spec.health.as_ref().and_then(|h| h.max_thermal_throttle.as_ref()) else { return };
    for g in &e.inventory.gpus.devices {
        let runs: Vec<(&str, u32, u32)> = e
            .runs
            .iter()
            .filter_map(|r| r.thermal.iter().find(|t| t.0 == g.index).map(|t| (r.id.as_str(), t.1, t.2)))
            .filter(|t| t.1 > 0)
            .collect();
        let Some(&(run, n, hot)) =
            runs.iter().max_by(|a, b| (f64::from(a.2) / f64::from(a.1)).total_cmp(&(f64::from(b.2) / f64::from(b.1))))
        else {
            continue;
        };
        let share = f64::from(hot) / f64::from(n);
        let subject = gpu_subject(g);
        c.add(
            "gpu.throttle.thermal",
            &subject,
            Severity::Major,
            format!("≤ {max} of samples under load"),
            Measured::of(format!("{:.0} % ({hot} of {n} samples)", share * 100.0), share <= max.value()),
            "held back by heat under load (airflow, fans, heatsink)",
            &format!("NVML throttle reasons during run {}", kiln_text::short(run)),
        );
    }
}

/// Why NVML gave no row-remapping figures: GPUs before Ampere (compute capability 8) retire pages
/// instead; for an Ampere or later GPU, or one whose generation NVML did not say, the query failed.
fn no_remapping(g: &kiln_inventory::gpu::Gpu) -> String {
    let major = g.compute_capability.as_deref().and_then(|cc| cc.split('.').next()?.parse::<u32>().ok());
    match major {
        Some(m) if m < 8 => format!(
            "this GPU ({}, compute capability {}) predates row remapping: it retires pages instead",
            g.architecture.as_deref().unwrap_or("before Ampere"),
            g.compute_capability.as_deref().unwrap_or("?")
        ),
        Some(_) => format!(
            "NVML gave no row-remapping figures for this {} GPU (nvmlDeviceGetRemappedRows failed)",
            g.architecture.as_deref().unwrap_or("Ampere or later")
        ),
        None => "NVML gave no row-remapping figures, nor the GPU's generation".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(cc: Option<&str>, arch: Option<&str>) -> kiln_inventory::gpu::Gpu {
        let mut g: kiln_inventory::gpu::Gpu =
            serde_json::from_value(serde_json::json!({"index": 0, "power": {}, "pcie": {}, "nvlinks": []})).unwrap();
        g.compute_capability = cc.map(str::to_string);
        g.architecture = arch.map(str::to_string);
        g
    }

    /// A Hopper without row-remapping figures is not guessed to be pre-Ampere; a Volta is.
    #[test]
    fn missing_row_remapping_is_explained_by_the_gpus_generation() {
        let hopper = no_remapping(&gpu(Some("9.0"), Some("Hopper")));
        assert!(hopper.contains("Hopper GPU") && hopper.contains("failed") && !hopper.contains("pre"), "{hopper}");
        let volta = no_remapping(&gpu(Some("7.0"), Some("Volta")));
        assert!(volta.contains("predates row remapping"), "{volta}");
        assert!(no_remapping(&gpu(None, None)).contains("nor the GPU's generation"));
    }
}

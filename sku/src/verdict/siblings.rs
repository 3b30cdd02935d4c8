//! Siblings that disagree: identical devices in one box (GPUs of one model, NICs and HCAs of one
//! model, NVMe drives of one model) must run one firmware and one configuration. The device that
//! differs from the others of its model is named, even when the spec pins no value: a box whose
//! eight GPUs run two VBIOS versions, or whose NICs run two firmwares, is a box to stop before a
//! job finds out.
//!
//! Each attribute is one check per model: `pass` when every device that reports it agrees; a
//! `fail` per device outside the majority, naming what its siblings have; a `fail` naming the
//! model when there is no majority (half on one value, half on another). A device that does not
//! report the attribute is left out of it (the inventory says why elsewhere).

use std::collections::BTreeMap;

use kiln_inventory::Inventory;

use super::hardware::{gpu_subject, on_off};
use super::{Checks, Measured, Severity};
use crate::spec::SkuSpec;

/// Every attribute siblings must agree on: its check id, and what it means to differ.
pub const ATTRIBUTES: [(&str, &str); 9] = [
    ("gpu.vbios", "a VBIOS version"),
    ("gpu.ecc", "ECC mode"),
    ("gpu.power_limit", "the enforced power limit"),
    ("gpu.clocks", "the maximum SM and memory clocks"),
    ("gpu.pcie", "the PCIe link it can train to (generation and width)"),
    ("gpu.persistence", "persistence mode"),
    ("nic.firmware", "a firmware version"),
    ("hca.firmware", "a firmware version"),
    ("nvme.firmware", "a firmware version"),
];

/// One device's value of one attribute.
struct Member {
    subject: String,
    value: String,
}

/// The sibling checks the spec asks for (every attribute when it has no `[siblings]` section).
pub fn check(spec: &SkuSpec, inv: &Inventory, c: &mut Checks) {
    let wanted = |id: &str| spec.siblings.as_ref().is_none_or(|s| s.agree.iter().any(|a| a == id));
    let mut groups: Vec<(&str, String, &str, Vec<Member>)> = Vec::new();
    let mut add = |id: &'static str, model: &str, evidence: &'static str, subject: String, value: Option<String>| {
        let Some(value) = value else { return };
        match groups.iter_mut().find(|(i, m, ..)| *i == id && m == model) {
            Some(g) => g.3.push(Member { subject, value }),
            None => groups.push((id, model.to_string(), evidence, vec![Member { subject, value }])),
        }
    };
    for g in &inv.gpus.devices {
        // A GPU whose name NVML could not read has no known siblings.
        let Some(model) = g.name.as_deref() else { continue };
        let s = gpu_subject(g);
        add("gpu.vbios", model, "nvmlDeviceGetVbiosVersion", s.clone(), g.vbios.clone());
        add("gpu.ecc", model, "nvmlDeviceGetEccMode", s.clone(), g.ecc.as_ref().map(|e| on_off(e.enabled).to_string()));
        let watts = g.power.enforced_watts.map(|w| format!("{w} W"));
        add("gpu.power_limit", model, "nvmlDeviceGetEnforcedPowerLimit", s.clone(), watts);
        let clocks = match (g.max_sm_clock_mhz, g.max_memory_clock_mhz) {
            (Some(sm), Some(mem)) => Some(format!("SM {sm} MHz, memory {mem} MHz")),
            _ => None,
        };
        add("gpu.clocks", model, "nvmlDeviceGetMaxClockInfo", s.clone(), clocks);
        let link = match (g.pcie.max_gen, g.pcie.max_width) {
            (Some(gen), Some(width)) => Some(format!("Gen{gen} x{width}")),
            _ => None,
        };
        add("gpu.pcie", model, "nvmlDeviceGetMaxPcieLinkGeneration/Width", s.clone(), link);
        add(
            "gpu.persistence",
            model,
            "nvmlDeviceGetPersistenceMode",
            s,
            g.persistence_mode.map(|p| on_off(p).to_string()),
        );
    }
    for n in inv.nics.iter().filter(|n| !n.virtual_device) {
        // A NIC's model is its PCI function's vendor:device (and name, where pci.ids has it).
        let Some(dev) = n.pci_address.as_deref().and_then(|a| inv.pci.iter().find(|d| d.address == a)) else {
            continue;
        };
        let ids = format!("{}:{}", dev.vendor_id.as_deref().unwrap_or("?"), dev.device_id.as_deref().unwrap_or("?"));
        let model = dev.device_name.as_ref().map_or(ids.clone(), |name| format!("{name} ({ids})"));
        let subject = format!("{} {}", n.name, dev.address);
        add("nic.firmware", &model, "ethtool -i (ETHTOOL_GDRVINFO)", subject, n.firmware_version.clone());
    }
    for h in &inv.rdma {
        let Some(model) = h.hca_type.as_deref().or(h.board_id.as_deref()) else { continue };
        let subject = format!("{} {}", h.name, h.pci_address.as_deref().unwrap_or("?"));
        add("hca.firmware", model, "/sys/class/infiniband/*/fw_ver", subject, h.firmware.clone());
    }
    for d in &inv.nvme {
        let Some(model) = d.model.as_deref() else { continue };
        let subject = format!("{} {}", d.name, d.pci_address.as_deref().unwrap_or("?"));
        add("nvme.firmware", model, "/sys/class/nvme/*/firmware_rev", subject, d.firmware.clone());
    }
    for (id, model, evidence, members) in groups {
        if members.len() < 2 || !wanted(id) {
            continue;
        }
        judge(c, id, &model, evidence, &members);
    }
}

/// One attribute of one model's devices: agreement passes; each device outside the majority
/// fails, named; no majority fails the model.
fn judge(c: &mut Checks, id: &str, model: &str, evidence: &str, members: &[Member]) {
    let what = ATTRIBUTES.iter().find(|(i, _)| *i == id).map_or("a setting", |(_, w)| w);
    let check_id = format!("siblings.{id}");
    let mut counts: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for m in members {
        counts.entry(m.value.as_str()).or_default().push(m.subject.as_str());
    }
    let n = members.len();
    let group = format!("{n} × {model}");
    if counts.len() == 1 {
        let value = members[0].value.as_str();
        c.add(
            &check_id,
            &group,
            Severity::Minor,
            "one value on all",
            Measured::of(format!("{value} on all {n}"), true),
            "",
            evidence,
        );
        return;
    }
    let (majority, holders) = counts.iter().max_by_key(|(_, h)| h.len()).map(|(v, h)| (*v, h.len())).unwrap_or(("", 0));
    let split = || counts.iter().map(|(v, h)| format!("{v} on {}", h.len())).collect::<Vec<_>>().join(", ");
    if holders * 2 <= n {
        let reason = format!("{model}: no value held by most of them ({}); bring them to one", what);
        c.add(&check_id, &group, Severity::Minor, "one value on all", Measured::of(split(), false), &reason, evidence);
        return;
    }
    for m in members.iter().filter(|m| m.value != majority) {
        let reason = format!("{what} unlike its {holders} siblings ({model}); bring it to theirs");
        let expected = format!("{majority} (as its {holders} siblings)");
        c.add(
            &check_id,
            &m.subject,
            Severity::Minor,
            expected,
            Measured::of(m.value.clone(), false),
            &reason,
            evidence,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::Status;

    fn member(subject: &str, value: &str) -> Member {
        Member { subject: subject.into(), value: value.into() }
    }

    /// Agreement passes once for the model; the odd one out fails, named, with its siblings'
    /// value; an even split names the model and every value.
    #[test]
    fn the_odd_one_out_is_named_and_a_split_names_the_model() {
        let mut c = Checks::default();
        judge(&mut c, "gpu.vbios", "H100", "e", &[member("GPU 0", "A"), member("GPU 1", "A"), member("GPU 2", "A")]);
        assert_eq!(c.list.len(), 1);
        assert_eq!((c.list[0].status, c.list[0].measured.as_str()), (Status::Pass, "A on all 3"));

        let mut c = Checks::default();
        let odd = [member("GPU 0", "A"), member("GPU 1", "A"), member("GPU 2", "B"), member("GPU 3", "A")];
        judge(&mut c, "gpu.vbios", "H100", "e", &odd);
        assert_eq!(c.list.len(), 1);
        let f = &c.list[0];
        assert_eq!((f.status, f.id.as_str(), f.subject.as_str()), (Status::Fail, "siblings.gpu.vbios", "GPU 2"));
        assert_eq!((f.expected.as_str(), f.measured.as_str()), ("A (as its 3 siblings)", "B"));

        let mut c = Checks::default();
        judge(&mut c, "nvme.firmware", "PM1743", "e", &[member("nvme0", "X"), member("nvme1", "Y")]);
        assert_eq!(c.list.len(), 1);
        let f = &c.list[0];
        assert_eq!((f.status, f.subject.as_str(), f.measured.as_str()), (Status::Fail, "2 × PM1743", "X on 1, Y on 1"));
    }
}

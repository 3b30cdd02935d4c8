//! Drift: this box against its own first acceptance (the first with benchmark results, else the
//! first). The same physical box is found by its serials (`same_box`: SMBIOS's system or board
//! serial, else most of its GPUs'), not its host identity, which a replaced GPU changes. Every
//! later verdict compares the figures of its runs with those of the baseline's runs and warns of a
//! drop beyond the benchmark's own noise — the bootstrap interval of the ratio of the two runs'
//! medians, not a fixed percentage — naming the ratio, the baseline's date and what changed since
//! (driver, CUDA, kernel, BIOS, VBIOS, a GPU replaced, by serial). A GPU swapped since acceptance
//! is reported on its own. Warnings: drift does not reject a box that meets its spec; it says why
//! the nightly numbers moved.

use kiln_inventory::Inventory;
use serde::{Deserialize, Serialize};

use super::{Checks, Measured, Severity};

/// One metric of the baseline's runs and of this verdict's, compared by the caller (the app,
/// which holds the samples and the bootstrap).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Compared {
    pub name: String,
    pub unit: String,
    pub lower_is_better: bool,
    /// The medians of the baseline's samples and of this verdict's.
    pub before: f64,
    pub now: f64,
    /// The bootstrap interval (95 %) of now / before.
    pub ci: (f64, f64),
}

impl Compared {
    /// Worse beyond the noise: the whole interval on the bad side of 1.
    pub fn worse(&self) -> bool {
        if self.lower_is_better {
            self.ci.0 > 1.0
        } else {
            self.ci.1 < 1.0
        }
    }
}

/// The box's first acceptance.
#[derive(Debug, Clone)]
pub struct Baseline {
    pub verdict_id: String,
    pub judged_at: String,
    pub inventory_id: String,
    pub inventory: Inventory,
    pub compared: Vec<Compared>,
    /// Metrics both sides measured without the repetitions a noise estimate needs.
    pub uncompared: usize,
}

/// Whether an accepted inventory with these serials was this physical box: the same system serial
/// (else board serial) from SMBIOS where both sides read one — the key a box keeps through a GPU
/// swap and a reinstall; without them (kiln not root), at least half of its GPUs' serials.
pub fn same_box(
    now: &Inventory,
    product_serial: Option<&str>,
    board_serial: Option<&str>,
    gpu_serials: &[String],
) -> bool {
    let real = |v: Option<&str>| v.filter(|s| !kiln_inventory::smbios::is_placeholder(s)).map(str::to_ascii_lowercase);
    for (mine, theirs) in [
        (real(now.system.product.serial.as_deref()), real(product_serial)),
        (real(now.system.board.serial.as_deref()), real(board_serial)),
    ] {
        if let (Some(a), Some(b)) = (mine, theirs) {
            return a == b;
        }
    }
    let mine: Vec<&str> = now
        .gpus
        .devices
        .iter()
        .filter_map(|g| g.serial.as_deref())
        .filter(|s| !kiln_inventory::smbios::is_placeholder(s))
        .collect();
    let shared = mine.iter().filter(|s| gpu_serials.iter().any(|t| t == *s)).count();
    !mine.is_empty() && 2 * shared >= mine.len()
}

/// What changed between the baseline's inventory and this one, in words.
pub fn changes(before: &Inventory, now: &Inventory) -> Vec<String> {
    let mut out = Vec::new();
    let mut field = |what: &str, a: Option<&str>, b: Option<&str>| {
        if let (Some(a), Some(b)) = (a, b) {
            if a != b {
                out.push(format!("{what} {a} → {b}"));
            }
        }
    };
    field("driver", before.gpus.driver_version.as_deref(), now.gpus.driver_version.as_deref());
    field("CUDA", before.gpus.cuda_driver_version.as_deref(), now.gpus.cuda_driver_version.as_deref());
    field("kernel", before.os.kernel_release.as_deref(), now.os.kernel_release.as_deref());
    field("BIOS", before.system.bios.version.as_deref(), now.system.bios.version.as_deref());
    for g in &now.gpus.devices {
        let Some(old) = was(before, g) else { continue };
        if old.serial.is_some() && g.serial.is_some() && old.serial != g.serial {
            out.push(format!(
                "GPU {} replaced (serial {} → {})",
                g.index,
                old.serial.as_deref().unwrap_or("?"),
                g.serial.as_deref().unwrap_or("?")
            ));
        } else if let (Some(a), Some(b)) = (&old.vbios, &g.vbios) {
            if a != b {
                out.push(format!("GPU {} VBIOS {a} → {b}", g.index));
            }
        }
    }
    out
}

/// The GPU in the same slot of the baseline: the same PCI address, else the same NVML index.
fn was<'a>(before: &'a Inventory, g: &kiln_inventory::gpu::Gpu) -> Option<&'a kiln_inventory::gpu::Gpu> {
    let same_slot = |o: &&kiln_inventory::gpu::Gpu| match (&o.pci_address, &g.pci_address) {
        (Some(a), Some(b)) => a == b,
        _ => o.index == g.index,
    };
    before.gpus.devices.iter().find(same_slot)
}

fn day(rfc3339: &str) -> &str {
    rfc3339.get(..10).unwrap_or(rfc3339)
}

/// The drift checks: a GPU swapped since acceptance (always), and each metric worse than at
/// acceptance beyond noise, with a summary (when performance is judged).
pub fn check(now: &Inventory, baseline: Option<&Baseline>, performance: bool, c: &mut Checks) {
    let Some(b) = baseline else { return };
    let when = day(&b.judged_at);
    let evidence =
        format!("verdict {} (inventory {})", kiln_text::short(&b.verdict_id), kiln_text::short(&b.inventory_id));
    // A GPU swapped since acceptance, by serial, in its slot.
    for g in &now.gpus.devices {
        let Some(old) = was(&b.inventory, g) else { continue };
        let (Some(before), Some(serial)) = (&old.serial, &g.serial) else { continue };
        let subject = format!("GPU {} {}", g.index, g.pci_address.as_deref().unwrap_or(""));
        let m = if before == serial {
            Measured::of(format!("serial {serial}"), true)
        } else {
            Measured::Warn {
                text: format!("serial {serial}"),
                why: format!("GPU {} was replaced since the box was accepted on {when}", g.index),
            }
        };
        c.add(
            "drift.gpu.serial",
            subject.trim_end(),
            Severity::Minor,
            format!("serial {before} (accepted {when})"),
            m,
            "",
            &evidence,
        );
    }
    if !performance {
        return;
    }
    let changed = changes(&b.inventory, now);
    let since = if changed.is_empty() { "nothing kiln reads changed".to_string() } else { changed.join(", ") };
    let mut worse = 0;
    for m in &b.compared {
        if !m.worse() {
            continue;
        }
        worse += 1;
        let ratio = m.now / m.before;
        c.add(
            "drift.metric",
            &m.name,
            Severity::Performance,
            format!("within noise of {} {} (accepted {when})", kiln_text::num(m.before), m.unit),
            Measured::Warn {
                text: format!(
                    "{} {} = {ratio:.3} × (95 % interval {:.3}–{:.3})",
                    kiln_text::num(m.now),
                    m.unit,
                    m.ci.0,
                    m.ci.1
                ),
                why: format!(
                    "{} than at acceptance on {when}, beyond the benchmark's noise; since then: {since}",
                    if m.lower_is_better { "slower (higher)" } else { "lower" }
                ),
            },
            "",
            &evidence,
        );
    }
    let summary = format!(
        "{} metric(s) compared, {worse} worse beyond noise{}",
        b.compared.len(),
        if b.uncompared > 0 {
            format!("; {} without repetitions to judge noise by", b.uncompared)
        } else {
            String::new()
        }
    );
    c.add(
        "drift.baseline",
        "this box",
        Severity::Performance,
        format!("the figures of its acceptance on {when}"),
        Measured::of(summary, true),
        "",
        &evidence,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compared(before: f64, now: f64, ci: (f64, f64), lower_is_better: bool) -> Compared {
        Compared { name: "m".into(), unit: "GB/s".into(), lower_is_better, before, now, ci }
    }

    #[test]
    fn only_an_interval_wholly_on_the_bad_side_is_worse() {
        assert!(compared(100.0, 90.0, (0.88, 0.92), false).worse());
        assert!(!compared(100.0, 97.0, (0.93, 1.01), false).worse(), "within noise");
        assert!(!compared(100.0, 110.0, (1.08, 1.12), false).worse(), "faster");
        assert!(compared(10.0, 12.0, (1.1, 1.3), true).worse(), "a latency that grew");
        assert!(!compared(10.0, 9.0, (0.85, 0.95), true).worse());
    }
}

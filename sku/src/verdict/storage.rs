//! Storage that feeds training (`[storage]`): what `kiln bench data` measured with this inventory —
//! the loader's flat-out delivery over the box's data directories, and the accelerators'
//! utilisation (AU) at the consumption rate the run was given — against the spec.

use super::perf::matching;
use super::{Checks, Evidence, Measured, Severity};
use crate::spec::SkuSpec;

pub fn check(spec: &SkuSpec, e: &Evidence<'_>, c: &mut Checks) {
    let Some(s) = &spec.storage else { return };
    let missing = || {
        Measured::missing(
            "no `kiln bench data` run with this inventory: run `kiln bench data DIR… --rate GB/s` on the data drives, then judge again",
        )
    };
    // A run whose reads memory served (a tmpfs, the page cache) measured memory, not the drives:
    // it passes nothing.
    let memory = |metrics: &[(String, f64, String)]| {
        metrics.iter().find(|m| m.0 == "data.from_storage").map(|m| m.1).filter(|f| *f < 0.5).map(|f| {
            format!(
                ", but only {:.0} % of it came from a drive (memory served the rest: not the storage's figure)",
                100.0 * f
            )
        })
    };
    if let Some(min) = &s.min_throughput {
        let m = match matching(e.runs, "data.max_gbps").last() {
            Some(&(_, gbps, run)) => {
                let memory = memory(&run.metrics);
                (
                    Measured::of(
                        format!("{} GB/s{}", kiln_text::num(gbps), memory.as_deref().unwrap_or("")),
                        gbps * 1e9 >= min.value() && memory.is_none(),
                    ),
                    format!("run {} (data)", kiln_text::short(&run.id)),
                )
            }
            None => (missing(), "runs of this inventory".to_string()),
        };
        c.add(
            "storage.throughput",
            "the data loader, every data directory",
            Severity::Performance,
            format!("≥ {min} flat out"),
            m.0,
            &format!("the drives deliver less than the spec's training input ({})", s.source),
            &m.1,
        );
    }
    if let Some(min) = &s.min_au {
        let m = match matching(e.runs, "data.au").last() {
            Some(&(_, au, run)) => {
                let needed = run.metrics.iter().find(|m| m.0 == "data.needed_gbps").map_or(0.0, |m| m.1);
                let memory = memory(&run.metrics);
                (
                    Measured::of(
                        format!(
                            "{:.1} % at {} GB/s needed{}",
                            100.0 * au,
                            kiln_text::num(needed),
                            memory.as_deref().unwrap_or("")
                        ),
                        au >= min.value() && memory.is_none(),
                    ),
                    format!("run {} (data)", kiln_text::short(&run.id)),
                )
            }
            None => (missing(), "runs of this inventory".to_string()),
        };
        c.add(
            "storage.au",
            "the emulated accelerators",
            Severity::Performance,
            format!("AU ≥ {min} at the configuration's rate"),
            m.0,
            "the accelerators wait on data: the run names the bottleneck (a drive, the readers' CPU, the storage as a whole)",
            &m.1,
        );
    }
}

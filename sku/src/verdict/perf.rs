//! Performance checks: the metrics of the benchmark runs taken with the inventory against the
//! spec's floors — absolute (with units), relative to another metric of the same box, within a
//! fraction of the best member of a group (GPUs, NUMA nodes), and against the fleet's accepted
//! boxes of the same configuration.

use crate::spec::units::parse_any;
use crate::spec::{metric_unit, PerfSpec, SkuSpec};

use super::{Checks, Evidence, Measured, RunEvidence, Severity};

/// The accepted boxes a fleet comparison needs by default.
pub const FLEET_MIN_BOXES: u32 = 5;

/// Whether a metric's name matches `pattern` (`{n}` stands for a number).
fn hits(pattern: &str, name: &str) -> bool {
    match pattern.split_once("{n}") {
        Some((prefix, suffix)) => {
            name.len() > prefix.len() + suffix.len()
                && name.starts_with(prefix)
                && name.ends_with(suffix)
                && name[prefix.len()..name.len() - suffix.len()].chars().all(|c| c.is_ascii_digit())
        }
        None => name == pattern,
    }
}

/// Every stored metric of a result run matching `pattern` (`{n}` stands for a number), with the run
/// it came from; for a name measured by several runs, the last run's value.
pub fn matching<'a>(runs: &'a [RunEvidence], pattern: &str) -> Vec<(&'a str, f64, &'a RunEvidence)> {
    let mut out: Vec<(&str, f64, &RunEvidence)> = Vec::new();
    // Only results: a failed, invalid or disturbed run's figures judge nothing.
    for run in runs.iter().filter(|r| r.status.is_result()) {
        for (name, value, _) in &run.metrics {
            if hits(pattern, name) {
                out.retain(|(n, _, _)| *n != name.as_str());
                out.push((name.as_str(), *value, run));
            }
        }
    }
    out.sort_by_key(|a| natural(a.0));
    out
}

/// Sorts "node10" after "node9".
fn natural(s: &str) -> (String, u64) {
    let digits: String = s.chars().filter(char::is_ascii_digit).collect();
    (s.chars().filter(|c| !c.is_ascii_digit()).collect(), digits.parse().unwrap_or(0))
}

fn lower_is_better(unit: &str) -> bool {
    matches!(unit, "s" | "us" | "ms")
}

fn fmt_value(v: f64, unit: &str) -> String {
    format!("{} {unit}", kiln_text::num(v))
}

fn run_ref(run: &RunEvidence) -> String {
    format!("run {} ({})", kiln_text::short(&run.id), run.benchmark)
}

/// The `q` quantile (nearest rank) of the finite `values`: 0.1 for the fleet's p10 floor, 0.9 for
/// the p90 ceiling of a lower-is-better metric.
pub fn nearest_rank(values: &[f64], q: f64) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Some(v[rank - 1])
}

pub fn check(spec: &SkuSpec, e: &Evidence<'_>, c: &mut Checks) {
    for p in &spec.performance {
        one(p.get_ref(), spec.reference_sku(), e, c);
    }
}

fn one(p: &PerfSpec, sku: &str, e: &Evidence<'_>, c: &mut Checks) {
    let unit = metric_unit(&p.metric.replace("{n}", "0")).unwrap_or("");
    let found = matching(e.runs, &p.metric);
    let id = format!("perf.{}", p.metric.replace("{n}", "n"));
    let only_spread = p.min.is_none()
        && p.max.is_none()
        && p.of_reference.is_none()
        && p.fraction.is_none()
        && p.fleet_p10 != Some(true);
    if only_spread && found.len() < 2 {
        // "Every member within X % of the best" holds for one member or none: a one-node box.
        let m = Measured::of(format!("{} member(s): nothing to compare", found.len()), true);
        c.add(&format!("{id}.spread"), &p.metric, Severity::Performance, describe(p), m, "", "runs of this inventory");
        return;
    }
    if found.is_empty() {
        // A run measured it but is not a result: say which and why, so the technician reruns it.
        let unusable =
            e.runs.iter().rev().find(|r| !r.status.is_result() && r.metrics.iter().any(|(n, _, _)| hits(&p.metric, n)));
        let why = match unusable {
            Some(r) => format!("{} is {}, not a result (kiln show run {})", run_ref(r), r.status, r.id),
            None if e.runs.is_empty() => "no benchmark was run with this inventory".to_string(),
            None => "the benchmark that measures it was not run (or failed)".to_string(),
        };
        c.add(&id, &p.metric, Severity::Performance, describe(p), Measured::missing(why), "", "runs of this inventory");
        return;
    }
    let lower = lower_is_better(unit);
    for &(name, value, run) in &found {
        let ev = run_ref(run);
        for (bound, is_min) in [(&p.min, true), (&p.max, false)] {
            let Some(b) = bound else { continue };
            let Some(limit) = parse_any(b.get_ref()).ok().and_then(|q| q.in_unit(unit)) else { continue };
            let ok = if is_min { value >= limit } else { value <= limit };
            c.add(
                &id,
                name,
                Severity::Performance,
                format!("{} {}", if is_min { "≥" } else { "≤" }, b.get_ref()),
                Measured::of(fmt_value(value, unit), ok),
                &format!("{} than the spec's floor ({})", if is_min != lower { "slower" } else { "worse" }, p.source),
                &ev,
            );
        }
        if let Some(f) = &p.of_reference {
            against_reference(p, f.value(), sku, (name, value, unit), &id, &ev, c);
        }
        if let (Some(other), Some(f)) = (&p.min_fraction_of, &p.fraction) {
            let m = match matching(e.runs, other).first() {
                Some(&(_, base, _)) => Measured::of(
                    format!(
                        "{} ({:.0} % of {})",
                        fmt_value(value, unit),
                        100.0 * value / base,
                        fmt_value(base, metric_unit(other).unwrap_or(""))
                    ),
                    value >= f.value() * base,
                ),
                None => Measured::missing(format!("{other} was not measured")),
            };
            c.add(
                &id,
                name,
                Severity::Performance,
                format!("≥ {f} of {other}"),
                m,
                "far below what this box's own peak allows",
                &ev,
            );
        }
        if p.fleet_p10 == Some(true) {
            fleet(p, name, value, unit, &id, &ev, e, c);
        }
    }
    if let Some(f) = &p.within_best {
        let best = if lower {
            found.iter().map(|x| x.1).fold(f64::INFINITY, f64::min)
        } else {
            found.iter().map(|x| x.1).fold(0.0, f64::max)
        };
        for &(name, value, run) in &found {
            let ok = if lower { value <= best * (1.0 + f.value()) } else { value >= best * (1.0 - f.value()) };
            let gap = if best > 0.0 { 100.0 * (value - best).abs() / best } else { 0.0 };
            c.add(
                &format!("{id}.spread"),
                name,
                Severity::Performance,
                format!("within {f} of the best ({})", fmt_value(best, unit)),
                Measured::of(format!("{} ({gap:.1} % off)", fmt_value(value, unit)), ok),
                "slower than its siblings in the same box",
                &run_ref(run),
            );
        }
    }
}

/// One measurement against `floor` × the SKU's published reference for the metric: expected,
/// measured and ratio in words, and the reference with its source on the check.
fn against_reference(
    p: &PerfSpec,
    floor: f64,
    sku: &str,
    (name, value, unit): (&str, f64, &str),
    id: &str,
    ev: &str,
    c: &mut Checks,
) {
    let figure = crate::spec::references::find(sku, &p.metric).and_then(|r| Some((r, r.in_unit(unit)?)));
    let Some((r, reference)) = figure.filter(|(_, v)| *v > 0.0) else {
        // A spec loads only with its reference; one given by a newer table is not judged here.
        let why = format!("no published reference for {} under {sku}", p.metric);
        c.add(id, name, Severity::Performance, "≥ a fraction of the reference", Measured::missing(why), "", ev);
        return;
    };
    let ratio = value / reference;
    let lower = lower_is_better(unit);
    let ok = if lower { value <= reference / floor } else { value >= floor * reference };
    c.add(
        id,
        name,
        Severity::Performance,
        format!(
            "≥ {floor:.2} × {} = {} (reference, {})",
            fmt_value(reference, unit),
            fmt_value(floor * reference, unit),
            r.kind.as_str()
        ),
        Measured::of(format!("{} = {ratio:.2} × reference", fmt_value(value, unit)), ok),
        &format!(
            "{ratio:.2} × the published reference, below the {floor:.2} floor ({}); reference: {}",
            p.band.as_deref().unwrap_or(""),
            r.source
        ),
        ev,
    );
    if let Some(last) = c.list.last_mut() {
        last.reference = Some(super::Referenced {
            value: reference,
            unit: unit.to_string(),
            ratio,
            floor,
            kind: r.kind.as_str().to_string(),
            conditions: r.conditions.clone(),
            source: r.source.clone(),
        });
    }
}

#[allow(clippy::too_many_arguments)]
fn fleet(p: &PerfSpec, name: &str, value: f64, unit: &str, id: &str, ev: &str, e: &Evidence<'_>, c: &mut Checks) {
    let need = p.fleet_min_boxes.unwrap_or(FLEET_MIN_BOXES) as usize;
    let values = e.fleet.get(name).map(Vec::as_slice).unwrap_or(&[]);
    let m = if values.len() < need {
        Measured::Warn {
            text: fmt_value(value, unit),
            why: format!(
                "only {} accepted boxes of this configuration hold {name}; the fleet check starts at {need}",
                values.len()
            ),
        }
    } else {
        if lower_is_better(unit) {
            let ceiling = nearest_rank(values, 0.9).unwrap_or(f64::INFINITY);
            Measured::of(
                format!("{} (fleet p90 {})", fmt_value(value, unit), fmt_value(ceiling, unit)),
                value <= ceiling,
            )
        } else {
            let floor = nearest_rank(values, 0.1).unwrap_or(0.0);
            Measured::of(format!("{} (fleet p10 {})", fmt_value(value, unit), fmt_value(floor, unit)), value >= floor)
        }
    };
    c.add(
        &format!("{id}.fleet"),
        name,
        Severity::Performance,
        format!("not below the p10 of {} accepted boxes", values.len()),
        m,
        "slower than 90 % of the accepted boxes of this configuration",
        ev,
    );
}

fn describe(p: &PerfSpec) -> String {
    let mut parts = Vec::new();
    if let Some(m) = &p.min {
        parts.push(format!("≥ {}", m.get_ref()));
    }
    if let Some(m) = &p.max {
        parts.push(format!("≤ {}", m.get_ref()));
    }
    if let Some(f) = &p.of_reference {
        parts.push(format!("≥ {f} of the reference"));
    }
    if let (Some(o), Some(f)) = (&p.min_fraction_of, &p.fraction) {
        parts.push(format!("≥ {f} of {o}"));
    }
    if let Some(f) = &p.within_best {
        parts.push(format!("within {f} of the best"));
    }
    if p.fleet_p10 == Some(true) {
        parts.push("≥ fleet p10".into());
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_db::RunStatus;

    #[test]
    fn groups_match_numbers_only_and_sort_naturally() {
        let run = RunEvidence {
            id: "r".into(),
            benchmark: "membw".into(),
            status: RunStatus::Ok,
            links: Vec::new(),
            thermal: Vec::new(),
            hottest: Vec::new(),
            reason: None,
            metrics: [
                "membw.node10.triad_gbps",
                "membw.node9.triad_gbps",
                "membw.all.triad_gbps",
                "membw.nodeX.triad_gbps",
            ]
            .iter()
            .map(|n| (n.to_string(), 1.0, "GB/s".to_string()))
            .collect(),
        };
        let runs = [run];
        let names: Vec<&str> = matching(&runs, "membw.node{n}.triad_gbps").iter().map(|x| x.0).collect();
        assert_eq!(names, ["membw.node9.triad_gbps", "membw.node10.triad_gbps"]);
        assert_eq!(matching(&runs, "membw.all.triad_gbps").len(), 1);
        // A disturbed run measured it, but its figures judge nothing.
        let disturbed = RunEvidence { status: RunStatus::Disturbed, ..runs[0].clone() };
        assert!(matching(std::slice::from_ref(&disturbed), "membw.all.triad_gbps").is_empty());
        assert!(hits("membw.all.triad_gbps", "membw.all.triad_gbps") && !hits("membw.node{n}.x", "membw.node.x"));
        assert_eq!(nearest_rank(&[5.0, 1.0, 4.0, 3.0, 2.0, 6.0, 7.0, 8.0, 9.0, 10.0], 0.1), Some(1.0));
        assert_eq!(nearest_rank(&[5.0, 1.0, 4.0, 3.0, 2.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0], 0.1), Some(2.0));
        assert_eq!(nearest_rank(&[5.0, 1.0, 4.0, 3.0, 2.0, 6.0, 7.0, 8.0, 9.0, 10.0], 0.9), Some(9.0));
    }
}

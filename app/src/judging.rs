//! Judging a stored inventory against a SKU spec: the evidence (the runs taken with the
//! inventory, their telemetry, the fleet's accepted values for the configuration) read from the
//! store, the verdict reached and stored. `kiln commission` and `kiln verdict` both judge this way.

use anyhow::Result;
use kiln_db::Queries;
use kiln_inventory::Inventory;
use kiln_sku::spec::LoadedSpec;
use kiln_sku::verdict::{self, Evidence, RunEvidence, Verdict};

use crate::stored::Stores;

/// What is stored about the box being judged.
pub struct Stored<'a> {
    pub inventory_id: &'a str,
    pub host_id: &'a str,
}

/// Judges `inv` with the runs stored for it and stores the verdict (unless `save` is false);
/// the verdict and its id. Performance is judged when runs were taken with the inventory, unless
/// `performance` is false (`kiln verdict --no-perf`); `allow_skip` lets a check be skipped.
///
/// # Errors
/// The store's.
pub fn judge_stored(
    stores: &impl Stores,
    inv: &Inventory,
    stored: &Stored<'_>,
    spec: &LoadedSpec,
    allow_skip: bool,
    performance: bool,
    save: bool,
) -> Result<(Verdict, Option<String>)> {
    let inventory_id = stored.inventory_id.to_string();
    let host_id = stored.host_id.to_string();
    let config = inv.fingerprints.config.clone();
    let (runs, fleet, telemetry, first) = stores.with_store(async |store| {
        let runs = store.runs_of_inventory(&inventory_id).await?;
        let fleet = store.accepted_metric_values(&config, &host_id).await?;
        let telemetry = store.verdict_telemetry_of_inventory(&inventory_id).await?;
        // The box's own first acceptance (by its serials: a replaced GPU makes a new host identity
        // but not a new box), with what drift compares: its inventory, runs and the repetitions
        // of both sides. Found among the accepted inventories of this configuration.
        let candidates = store.accepted_inventories_of_config(&config, &inventory_id).await?;
        let mine: Vec<_> = candidates
            .into_iter()
            .filter(|c| {
                verdict::drift::same_box(inv, c.product_serial.as_deref(), c.board_serial.as_deref(), &c.gpu_serials)
            })
            .collect();
        // The first acceptance with benchmark results (one taken with --no-bench compares no
        // figure), else the first acceptance.
        let mut first = None;
        for c in &mine {
            let before_runs = store.runs_of_inventory(&c.inventory_id).await?;
            let measured = before_runs.iter().any(|r| r.status.is_result());
            if measured || first.is_none() {
                first = Some((c.clone(), before_runs));
            }
            if measured {
                break;
            }
        }
        let first = match first {
            Some((c, before_runs)) => {
                let document = store.inventory(&c.inventory_id).await?.document;
                let before = store.result_samples_of_inventory(&c.inventory_id).await?;
                let now = store.result_samples_of_inventory(&inventory_id).await?;
                Some((c.verdict_id, c.inventory_id, c.judged_at, document, before_runs, before, now))
            }
            None => None,
        };
        Ok((runs, fleet, telemetry, first))
    })?;
    let baseline = first.and_then(|(verdict_id, inventory_id, judged_at, document, before_runs, before, now)| {
        // A baseline whose inventory this kiln cannot read judges no drift.
        let inventory: Inventory = serde_json::from_str(&document).ok()?;
        let (compared, uncompared) = compare(&before_runs, &before, &runs, &now);
        Some(verdict::drift::Baseline { verdict_id, judged_at, inventory_id, inventory, compared, uncompared })
    });
    let runs: Vec<RunEvidence> = runs
        .into_iter()
        .map(|r| {
            let samples: Vec<kiln_inventory::telemetry::Sample> = telemetry
                .iter()
                .filter(|l| l.0 == r.id)
                .map(|(_, t, source, name, v)| (*t, source.clone(), name.clone(), *v))
                .collect();
            RunEvidence {
                links: kiln_inventory::linkwatch::links_of(&r.id, &samples),
                thermal: verdict::thermal_of(&samples),
                hottest: verdict::hottest_of(&samples),
                reason: r.status_reason,
                id: r.id,
                benchmark: r.benchmark,
                status: r.status,
                metrics: r.metrics.into_iter().map(|m| (m.name, m.value, m.unit)).collect(),
            }
        })
        .collect();
    let evidence = Evidence {
        inventory: inv,
        inventory_id: Some(stored.inventory_id),
        runs: &runs,
        fleet: &fleet,
        // Performance is judged when benchmarks ran with this inventory: an inventory taken with
        // `--no-bench` is judged on hardware and health, now and when re-judged.
        performance_judged: performance && !runs.is_empty(),
        baseline: baseline.as_ref(),
    };
    let v = verdict::judge(spec, &evidence, allow_skip);
    let id = if save {
        let record = kiln_db::NewVerdict {
            host_id: stored.host_id.to_string(),
            inventory_id: stored.inventory_id.to_string(),
            judged_at: kiln_text::timefmt::now_rfc3339(),
            spec_name: spec.spec.name.clone(),
            spec_hash: spec.hash.clone(),
            spec: spec.text.clone(),
            verdict: v.verdict.as_str().to_string(),
            failed: v.counts.fail as i64,
            document: serde_json::to_string(&v)?,
        };
        Some(stores.with_store(async |store| store.save_verdict(&record).await)?)
    } else {
        None
    };
    Ok((v, id))
}

/// The repetitions a metric needs on each side before drift judges it against its noise.
const DRIFT_MIN_SAMPLES: usize = 3;

/// Per metric both sides' result runs measured (the last run of each name on each side): the
/// medians of their repetitions and the bootstrap interval (95 %) of now / before; and how many
/// metrics lacked the repetitions to judge noise by.
fn compare(
    before_runs: &[kiln_db::RunRow],
    before: &[(String, String, f64)],
    now_runs: &[kiln_db::RunRow],
    now: &[(String, String, f64)],
) -> (Vec<verdict::drift::Compared>, usize) {
    use kiln_db::Direction;
    // name → (run id, unit, direction) of the last result run measuring it.
    let last = |runs: &[kiln_db::RunRow]| {
        let mut by: std::collections::BTreeMap<String, (String, String, Direction)> = Default::default();
        for r in runs.iter().filter(|r| r.status.is_result()) {
            for m in &r.metrics {
                by.insert(m.name.clone(), (r.id.clone(), m.unit.clone(), m.direction));
            }
        }
        by
    };
    // (run, metric) → its repetitions, grouped once per side.
    type Grouped<'a> = std::collections::BTreeMap<(&'a str, &'a str), Vec<f64>>;
    fn grouped(all: &[(String, String, f64)]) -> Grouped<'_> {
        let mut by = Grouped::new();
        for (r, m, v) in all {
            by.entry((r.as_str(), m.as_str())).or_default().push(*v);
        }
        by
    }
    let (before, now) = (grouped(before), grouped(now));
    let samples = |by: &Grouped<'_>, run: &str, name: &str| by.get(&(run, name)).cloned().unwrap_or_default();
    let (then_by, now_by) = (last(before_runs), last(now_runs));
    let (mut compared, mut uncompared) = (Vec::new(), 0);
    for (name, (run, unit, direction)) in &now_by {
        let Some((then_run, ..)) = then_by.get(name) else { continue };
        if *direction == Direction::None {
            continue;
        }
        let (a, b) = (samples(&before, then_run, name), samples(&now, run, name));
        if a.len() < DRIFT_MIN_SAMPLES || b.len() < DRIFT_MIN_SAMPLES {
            uncompared += 1;
            continue;
        }
        let (before_m, now_m) = (kiln_bench::stats::median(&a), kiln_bench::stats::median(&b));
        if before_m <= 0.0 || !now_m.is_finite() {
            uncompared += 1;
            continue;
        }
        // A fixed seed: the same evidence gives the same verdict.
        let ci = kiln_bench::stats::bootstrap_ratio_ci(&a, &b, 2000, 0x6b69_6c6e, 0.95);
        compared.push(verdict::drift::Compared {
            name: name.clone(),
            unit: unit.clone(),
            lower_is_better: *direction == Direction::Lower,
            before: before_m,
            now: now_m,
            ci,
        });
    }
    (compared, uncompared)
}

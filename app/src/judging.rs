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
    let (runs, fleet, telemetry) = stores.with_store(async |store| {
        let runs = store.runs_of_inventory(&inventory_id).await?;
        let fleet = store.accepted_metric_values(&config, &host_id).await?;
        let telemetry = store.verdict_telemetry_of_inventory(&inventory_id).await?;
        Ok((runs, fleet, telemetry))
    })?;
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

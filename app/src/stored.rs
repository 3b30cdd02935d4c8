//! Keeping what a workflow measures, the moment it exists: the front end's store ([`Stores`]),
//! and an inventory and a benchmark's outcome as the records the store keeps.

use anyhow::Result;
use kiln_db::{NewInventory, SavedInventory, Store};
use kiln_inventory::Inventory;

use crate::runs::Outcome;

/// The store a workflow keeps what it measures in, as the front end holds it (the command line
/// opens it on first use and keeps it for the rest of the command).
pub trait Stores {
    /// Runs `f` on the store.
    ///
    /// # Errors
    /// The store cannot be opened, or `f` fails.
    fn with_store<T>(&self, f: impl AsyncFnOnce(&mut Store) -> kiln_db::Result<T>) -> Result<T>;
}

/// The plain record the store keeps for an inventory.
///
/// # Errors
/// The inventory does not serialise (it always does).
pub fn new_inventory(inv: &Inventory) -> Result<NewInventory> {
    let fp = &inv.fingerprints;
    Ok(NewInventory {
        // A box with no identity at all is keyed by its configuration and host name, so that it
        // does not merge with every other anonymous box.
        host_identity: fp.host.clone().unwrap_or_else(|| format!("anonymous-{}", fp.config)),
        hostname: inv.os.hostname.clone(),
        collected_at: inv.collected_at.clone(),
        schema_version: i64::from(inv.schema_version),
        config_fingerprint: fp.config.clone(),
        config_name: fp.config_name.clone(),
        cpu_model: inv.cpu.model_name.clone(),
        cpu_packages: i64::from(inv.cpu.packages),
        cpu_cores: i64::from(inv.cpu.cores),
        cpu_threads: i64::from(inv.cpu.online),
        memory_bytes: inv.memory.total_bytes.map(|b| b as i64),
        kernel_release: inv.os.kernel_release.clone(),
        problem_count: inv.problems.len() as i64,
        document: serde_json::to_string(inv)?,
    })
}

/// Stores the inventory (and its host, if new).
///
/// # Errors
/// The store's.
pub fn store_inventory(stores: &impl Stores, inv: &Inventory) -> Result<SavedInventory> {
    let record = new_inventory(inv)?;
    stores.with_store(async |store| store.save_inventory(&record).await)
}

/// Stores one outcome as a run against a stored inventory; returns the run's id.
///
/// # Errors
/// The store's.
pub fn store_outcome(
    stores: &impl Stores,
    inv: &Inventory,
    saved: &SavedInventory,
    outcome: &Outcome,
) -> Result<String> {
    let run = outcome.to_run(inv, saved.host_id.clone(), saved.inventory_id.clone());
    stores.with_store(async |store| store.save_run(&run).await)
}

//! The queries both engines run, written and compiled once over [`crate::engine`]'s connection:
//! what the fleet service and the read commands ask of a store ([`Queries`]), and the writing of
//! runs' values and series that `Store::save_run` and imports share.

use std::collections::BTreeMap;

use crate::engine::Backend;
use crate::{
    ApplyRow, Fleet, HostRow, ImportError, ImportStats, InventoryRow, Result, Role, RunContexts, RunDetail, RunRow,
    StepRow, TokenRow, Upload, VerdictRow,
};

pub(crate) mod import;
pub(crate) mod index;
pub(crate) mod reads;
pub(crate) mod tokens;
pub(crate) mod values;

/// What the fleet service and the read commands ask of a store, on either engine: an SQLite
/// [`crate::Store`], a [`crate::PgStore`], or an [`crate::AnyStore`] holding either.
// Every caller holds a concrete store, so each future's `Send` is known where it is awaited.
#[allow(async_fn_in_trait)]
pub trait Queries: Backend + Sized {
    /// Every known host with its inventory count, most recently seen first.
    async fn hosts(&mut self) -> Result<Vec<HostRow>> {
        reads::hosts(self).await
    }
    /// The most recent runs first, with their metrics.
    async fn runs(&mut self, limit: i64) -> Result<Vec<RunRow>> {
        reads::runs(self, limit).await
    }
    /// One run by id or unique prefix, with its samples and telemetry.
    async fn run(&mut self, id: &str) -> Result<RunDetail> {
        reads::run(self, id).await
    }
    /// Every rank's runs of one cluster run (`kiln cluster …`, by the `cluster_id` in their
    /// configuration, or a unique prefix of it), oldest first, each with its samples.
    async fn runs_of_cluster(&mut self, cluster_id: &str) -> Result<Vec<RunDetail>> {
        reads::runs_of_cluster(self, cluster_id).await
    }
    /// The runs taken with one inventory, oldest first, with their metrics.
    async fn runs_of_inventory(&mut self, inventory_id: &str) -> Result<Vec<RunRow>> {
        reads::runs_of_inventory(self, inventory_id).await
    }
    /// One inventory by its id or a unique prefix of it.
    async fn inventory(&mut self, id: &str) -> Result<InventoryRow> {
        reads::inventory(self, id).await
    }
    /// Each host's newest run start (RFC 3339), by host id.
    async fn last_runs(&mut self) -> Result<BTreeMap<String, String>> {
        reads::last_runs(self).await
    }
    /// Every series key and every host with its series: those of the partitions that reach
    /// `since` (seconds since the epoch; older points of a reached partition are included:
    /// callers filter by time).
    async fn fleet(&mut self, since: Option<i64>) -> Result<Fleet> {
        reads::fleet(self, since).await
    }
    /// What runs were measured on, by run id, with the documents of the stacks and inventories in
    /// which consecutive runs of `boundaries` differ (batched: a handful of statements for any
    /// number of runs).
    async fn run_contexts(&mut self, boundaries: &[(String, String)]) -> Result<RunContexts> {
        reads::run_contexts(self, boundaries).await
    }
    /// The mean of each telemetry channel of a run: (source, name, mean, samples).
    async fn telemetry_means(&mut self, run_id: &str) -> Result<Vec<(String, String, f64, i64)>> {
        reads::telemetry_means(self, run_id).await
    }
    /// A host's newest inventory (collected at, document).
    async fn latest_inventory(&mut self, host_id: &str) -> Result<Option<(String, String)>> {
        reads::latest_inventory(self, host_id).await
    }
    /// The newest verdict of every host that has one, without its document.
    async fn latest_verdicts(&mut self) -> Result<BTreeMap<String, VerdictRow>> {
        reads::latest_verdicts(self).await
    }
    /// The newest verdict of one host, with its document.
    async fn latest_verdict(&mut self, host_id: &str) -> Result<Option<VerdictRow>> {
        reads::latest_verdict(self, host_id).await
    }
    /// Provisioning applies, newest first, optionally of one image.
    async fn applies(&mut self, image: Option<&str>, limit: i64) -> Result<Vec<ApplyRow>> {
        reads::applies(self, image, limit).await
    }
    /// One apply by id or unique prefix, with its steps in order.
    async fn apply_journal(&mut self, id: &str) -> Result<(ApplyRow, Vec<StepRow>)> {
        reads::apply_journal(self, id).await
    }
    /// Stores a new token's hash, and for an agent token the host it speaks for when that is
    /// known already. A live token of the same name is refused.
    async fn create_token(
        &mut self,
        id: &str,
        name: &str,
        role: Role,
        secret_sha256: &[u8],
        created_at: &str,
        host_identity: Option<&str>,
    ) -> Result<()> {
        tokens::create_token(self, id, name, role, secret_sha256, created_at, host_identity).await
    }
    /// Every token, newest first.
    async fn tokens(&mut self) -> Result<Vec<TokenRow>> {
        tokens::tokens(self).await
    }
    /// One token by its id (the public part of the token), revoked or not.
    async fn token(&mut self, id: &str) -> Result<Option<TokenRow>> {
        tokens::token(self, id).await
    }
    /// Revokes the live token with this name or id; returns it, or `None` when there is none.
    async fn revoke_token(&mut self, name_or_id: &str, at: &str) -> Result<Option<TokenRow>> {
        tokens::revoke_token(self, name_or_id, at).await
    }
    /// Records that a token was used (at most once a minute per token, to spare the writes).
    async fn token_used(&mut self, id: &str, at: &str) -> Result<()> {
        tokens::token_used(self, id, at).await
    }
    /// Imports an export, all or nothing (see `import::import`).
    async fn import(&mut self, file: &str, text: &str) -> std::result::Result<ImportStats, ImportError> {
        import::import(self, file, text).await
    }
    /// Several uploads in one transaction, each whole or not at all (see `import::import_many`).
    async fn import_many(&mut self, uploads: &[Upload]) -> Vec<std::result::Result<ImportStats, ImportError>> {
        import::import_many(self, uploads).await
    }
}

impl<S: Backend> Queries for S {}

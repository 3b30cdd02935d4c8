//! The outbox: an agent's results waiting for the fleet service. A result and its place in the
//! outbox are written in one transaction; an upload takes a batch, sends it as an export, and
//! removes the batch only once the server has answered that it stored it. A failed attempt is
//! counted and paced (the caller's back-off), and the entries stay.

use std::io::Write;

use serde::Serialize;
use sqlx::sqlite::SqliteConnection;
use sqlx::Connection;

use crate::exchange::Selection;
use crate::{ExportStats, Result, Store};

/// An entry whose next attempt is further ahead of `?1` (now) than any back-off (at most 6 hours)
/// was paced by a clock that has since gone back: it is due now, not in days.
const CLOCK_WENT_BACK: &str = "next_attempt_at > strftime('%Y-%m-%dT%H:%M:%SZ', ?1, '+7 hours')";

/// Queues one stored record for upload (in the transaction that stores it).
pub(crate) async fn queue(conn: &mut SqliteConnection, kind: &str, id: &str) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT OR IGNORE INTO outbox (kind, id, queued_at) VALUES (?, ?, strftime('%Y-%m-%dT%H:%M:%SZ', 'now'))",
    )
    .bind(kind)
    .bind(id)
    .execute(conn)
    .await?;
    Ok(())
}

/// What waits in the outbox.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Pending {
    pub inventories: u64,
    pub runs: u64,
    pub verdicts: u64,
    /// Provisioning applies (each with its journal as it is when sent).
    pub applies: u64,
    /// Entries whose next attempt is not due yet (back-off after a failure).
    pub waiting: u64,
    /// The newest failure's message, if any entry has failed.
    pub last_error: Option<String>,
    /// The most attempts any entry has had.
    pub attempts: i64,
}

impl Pending {
    pub fn total(&self) -> u64 {
        self.inventories + self.runs + self.verdicts + self.applies
    }
}

/// One upload's worth of the outbox, written as an export.
#[derive(Debug, Clone, Serialize)]
pub struct UploadBatch {
    /// Outbox entries in the batch.
    pub entries: u64,
    pub stats: ExportStats,
}

impl Store {
    /// Queues every inventory, run, verdict and provisioning apply this store saves from now on for
    /// the fleet service.
    pub fn queue_uploads(&mut self, on: bool) {
        self.queue_uploads = on;
    }

    /// Queues every inventory, run, verdict and apply this store holds (`kiln sync --all`: results stored
    /// before a fleet service was configured, or for a new server); the server keeps each once.
    /// Returns how many entries were added.
    pub async fn queue_everything(&mut self) -> Result<u64> {
        let err = self.sql_err();
        let mut tx = self.conn.begin_with(crate::WRITE).await.map_err(&err)?;
        let mut added = 0;
        for (kind, table) in
            [("inventory", "inventories"), ("run", "runs"), ("verdict", "verdicts"), ("apply", "provision_applies")]
        {
            added += sqlx::query(&format!(
                "INSERT OR IGNORE INTO outbox (kind, id, queued_at) \
                 SELECT '{kind}', id, strftime('%Y-%m-%dT%H:%M:%SZ', 'now') FROM {table}"
            ))
            .execute(&mut *tx)
            .await
            .map_err(&err)?
            .rows_affected();
        }
        tx.commit().await.map_err(&err)?;
        Ok(added)
    }

    /// What waits in the outbox; `now` (RFC 3339) tells which entries are due.
    pub async fn pending_uploads(&mut self, now: &str) -> Result<Pending> {
        let err = self.sql_err();
        let rows: Vec<(String, i64, i64)> = sqlx::query_as(&format!(
            "SELECT kind, COUNT(*), SUM(next_attempt_at IS NOT NULL AND next_attempt_at > ?1 AND NOT ({CLOCK_WENT_BACK})) \
             FROM outbox GROUP BY kind"
        ))
        .bind(now)
        .fetch_all(&mut self.conn)
        .await
        .map_err(&err)?;
        let mut p = Pending::default();
        for (kind, n, waiting) in rows {
            match kind.as_str() {
                "inventory" => p.inventories = n as u64,
                "run" => p.runs = n as u64,
                "apply" => p.applies = n as u64,
                _ => p.verdicts = n as u64,
            }
            p.waiting += waiting as u64;
        }
        let last: Option<(Option<String>, i64)> = sqlx::query_as(
            "SELECT last_error, attempts FROM outbox WHERE attempts > 0 ORDER BY attempts DESC, queued_at DESC LIMIT 1",
        )
        .fetch_optional(&mut self.conn)
        .await
        .map_err(&err)?;
        if let Some((error, attempts)) = last {
            p.last_error = error;
            p.attempts = attempts;
        }
        Ok(p)
    }

    /// Takes up to `limit` entries of the outbox (those due at `due`, or all when `None`), oldest
    /// first, and writes them with what they name as an export. `None` when nothing is due. The
    /// batch stays in the outbox until [`Store::upload_done`] or [`Store::upload_failed`].
    pub async fn upload_batch(
        &mut self,
        due: Option<&str>,
        limit: i64,
        exported_at: &str,
        out: &mut dyn Write,
    ) -> Result<Option<UploadBatch>> {
        let err = self.sql_err();
        sqlx::query("CREATE TEMP TABLE IF NOT EXISTS upload_batch (kind TEXT NOT NULL, id TEXT NOT NULL)")
            .execute(&mut self.conn)
            .await
            .map_err(&err)?;
        sqlx::query("DELETE FROM temp.upload_batch").execute(&mut self.conn).await.map_err(&err)?;
        let taken = sqlx::query(&format!(
            "INSERT INTO temp.upload_batch (kind, id) SELECT kind, id FROM outbox \
             WHERE ?1 IS NULL OR next_attempt_at IS NULL OR next_attempt_at <= ?1 OR {CLOCK_WENT_BACK} \
             ORDER BY queued_at, rowid LIMIT ?2"
        ))
        .bind(due)
        .bind(limit)
        .execute(&mut self.conn)
        .await
        .map_err(&err)?
        .rows_affected();
        if taken == 0 {
            return Ok(None);
        }
        let stats = self.export_selected(Selection::Batch, exported_at, out).await?;
        Ok(Some(UploadBatch { entries: taken, stats }))
    }

    /// The server stored the batch: it leaves the outbox.
    pub async fn upload_done(&mut self) -> Result<()> {
        let err = self.sql_err();
        sqlx::query("DELETE FROM outbox WHERE (kind, id) IN (SELECT kind, id FROM temp.upload_batch)")
            .execute(&mut self.conn)
            .await
            .map_err(&err)?;
        sqlx::query("DELETE FROM temp.upload_batch").execute(&mut self.conn).await.map_err(&err)?;
        Ok(())
    }

    /// The batch could not be sent: its entries count the attempt, keep the error, and are due
    /// again at `next_attempt_at`.
    pub async fn upload_failed(&mut self, error: &str, next_attempt_at: &str) -> Result<()> {
        let err = self.sql_err();
        sqlx::query(
            "UPDATE outbox SET attempts = attempts + 1, last_error = ?, next_attempt_at = ? \
             WHERE (kind, id) IN (SELECT kind, id FROM temp.upload_batch)",
        )
        .bind(error)
        .bind(next_attempt_at)
        .execute(&mut self.conn)
        .await
        .map_err(&err)?;
        sqlx::query("DELETE FROM temp.upload_batch").execute(&mut self.conn).await.map_err(&err)?;
        Ok(())
    }

    /// The attempts of the oldest entry of the last batch (for the back-off), before it is updated.
    pub async fn batch_attempts(&mut self) -> Result<i64> {
        let err = self.sql_err();
        sqlx::query_scalar(
            "SELECT COALESCE(MAX(attempts), 0) FROM outbox WHERE (kind, id) IN (SELECT kind, id FROM temp.upload_batch)",
        )
        .fetch_one(&mut self.conn)
        .await
        .map_err(err)
    }
}

#[cfg(test)]
mod tests {
    use crate::Store;

    /// Saved results wait in the outbox until an upload is done; a failure keeps them, paced; a
    /// clock that went back does not strand them.
    #[tokio::test]
    async fn results_wait_until_uploaded_and_failures_are_paced() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("agent.db")).await.unwrap();
        store.save_inventory(&crate::tests::sample("before")).await.unwrap();
        assert_eq!(store.pending_uploads("2026-12-04T00:00:00Z").await.unwrap().total(), 0, "not queued when off");
        store.queue_uploads(true);
        store.save_inventory(&crate::tests::sample("a")).await.unwrap();
        store.save_inventory(&crate::tests::sample("b")).await.unwrap();
        let now = "2026-12-04T12:00:00Z";
        assert_eq!(store.pending_uploads(now).await.unwrap().inventories, 2);

        let mut out = Vec::new();
        let batch = store.upload_batch(Some(now), 100, now, &mut out).await.unwrap().expect("two due");
        assert_eq!(batch.entries, 2);
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.lines().filter(|l| l.contains("\"inventory\"")).count(), 2, "{text}");
        assert_eq!(store.batch_attempts().await.unwrap(), 0);
        store.upload_failed("connection refused", "2026-12-04T12:01:00Z").await.unwrap();
        let p = store.pending_uploads(now).await.unwrap();
        assert_eq!((p.inventories, p.waiting, p.attempts), (2, 2, 1));
        assert_eq!(p.last_error.as_deref(), Some("connection refused"));
        assert!(store.upload_batch(Some(now), 100, now, &mut Vec::new()).await.unwrap().is_none(), "paced");
        // `kiln sync` takes everything; a clock set back by a day finds them due too.
        assert!(store.upload_batch(Some("2026-12-03T12:00:00Z"), 100, now, &mut Vec::new()).await.unwrap().is_some());
        store.upload_done().await.unwrap();
        assert_eq!(store.pending_uploads(now).await.unwrap().total(), 0);
        assert!(store.upload_batch(None, 100, now, &mut Vec::new()).await.unwrap().is_none());
        // --all: everything stored, the result saved before queuing was on included.
        assert_eq!(store.queue_everything().await.unwrap(), 3);
        assert_eq!(store.pending_uploads(now).await.unwrap().inventories, 3);
        store.close().await.unwrap();
    }
}

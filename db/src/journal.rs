//! The provisioning journal (`provision_applies`, `provision_steps`): one row per apply, one per
//! step, each step written before it starts and updated when it ends, each write its own
//! transaction so that a killed kiln leaves the story up to the step it was in. Where uploads are
//! on, an apply is queued for the fleet service when it begins, resumes and ends (the upload
//! carries the journal as it is then). Reading it (`applies`, `apply_journal`) is shared with the
//! fleet service (`queries/reads.rs`).

use sqlx::Row;

use crate::queries::reads::{apply_row, step_row, APPLY_COLUMNS, STEP_COLUMNS};
use crate::{ApplyStatus, Result, StepStatus, Store};

const NOW: &str = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";

#[derive(Debug, Clone)]
pub struct NewApply {
    pub image: String,
    pub image_version: String,
    pub image_hash: String,
    pub root: String,
    pub hostname: Option<String>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ApplyRow {
    pub id: String,
    pub image: String,
    pub image_version: String,
    pub image_hash: String,
    pub root: String,
    pub hostname: Option<String>,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub resumes: i64,
    pub status: ApplyStatus,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct StepRow {
    pub seq: i64,
    pub step_key: String,
    pub summary: String,
    pub command: String,
    pub image_hash: String,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub status: StepStatus,
    pub exit_code: Option<i64>,
    pub duration_ms: Option<i64>,
    pub output_tail: Option<String>,
}

impl Store {
    pub async fn begin_apply(&mut self, new: &NewApply) -> Result<String> {
        let err = self.sql_err();
        let id = uuid::Uuid::new_v4().to_string();
        let mut tx = sqlx::Connection::begin_with(&mut self.conn, crate::WRITE).await.map_err(&err)?;
        sqlx::query(&format!(
            "INSERT INTO provision_applies (id, image, image_version, image_hash, root, hostname, started_at, status) \
             VALUES (?, ?, ?, ?, ?, ?, {NOW}, 'running')"
        ))
        .bind(&id)
        .bind(&new.image)
        .bind(&new.image_version)
        .bind(&new.image_hash)
        .bind(&new.root)
        .bind(&new.hostname)
        .execute(&mut *tx)
        .await
        .map_err(&err)?;
        if self.queue_uploads {
            crate::outbox::queue(&mut tx, "apply", &id).await.map_err(&err)?;
        }
        tx.commit().await.map_err(&err)?;
        Ok(id)
    }

    /// The newest apply of `image` to `root`, if it did not succeed: what `--resume` continues.
    pub async fn unfinished_apply(&mut self, image: &str, root: &str) -> Result<Option<ApplyRow>> {
        let row = sqlx::query(&format!(
            "SELECT {APPLY_COLUMNS} FROM provision_applies WHERE image = ? AND root = ? ORDER BY started_at DESC, rowid DESC LIMIT 1"
        ))
        .bind(image)
        .bind(root)
        .fetch_optional(&mut self.conn)
        .await
        .map_err(self.sql_err())?;
        Ok(row.map(|r| apply_row(&crate::engine::Row::Sqlite(r))).filter(|a| a.status != ApplyStatus::Succeeded))
    }

    /// Continues an apply: steps a dead kiln left 'started' become 'interrupted'; returns them and
    /// the next step number.
    pub async fn resume_apply(&mut self, id: &str, image_hash: &str) -> Result<(Vec<StepRow>, i64)> {
        let err = self.sql_err();
        let mut tx = sqlx::Connection::begin_with(&mut self.conn, crate::WRITE).await.map_err(&err)?;
        let dangling = sqlx::query(&format!(
            "UPDATE provision_steps SET status = 'interrupted', finished_at = {NOW} WHERE apply_id = ? AND status = 'started' \
             RETURNING {STEP_COLUMNS}"
        ))
        .bind(id)
        .fetch_all(&mut *tx)
        .await
        .map_err(&err)?;
        sqlx::query("UPDATE provision_applies SET status = 'running', finished_at = NULL, resumes = resumes + 1, image_hash = ? WHERE id = ?")
            .bind(image_hash)
            .bind(id)
            .execute(&mut *tx)
            .await
            .map_err(&err)?;
        let next: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) + 1 FROM provision_steps WHERE apply_id = ?")
            .bind(id)
            .fetch_one(&mut *tx)
            .await
            .map_err(&err)?;
        if self.queue_uploads {
            crate::outbox::queue(&mut tx, "apply", id).await.map_err(&err)?;
        }
        tx.commit().await.map_err(&err)?;
        Ok((dangling.into_iter().map(|r| step_row(&crate::engine::Row::Sqlite(r))).collect(), next))
    }

    pub async fn step_started(
        &mut self,
        apply_id: &str,
        seq: i64,
        key: &str,
        summary: &str,
        command: &str,
        image_hash: &str,
    ) -> Result<i64> {
        let id = sqlx::query(&format!(
            "INSERT INTO provision_steps (apply_id, seq, step_key, summary, command, image_hash, started_at, status) \
             VALUES (?, ?, ?, ?, ?, ?, {NOW}, 'started') RETURNING id"
        ))
        .bind(apply_id)
        .bind(seq)
        .bind(key)
        .bind(summary)
        .bind(command)
        .bind(image_hash)
        .fetch_one(&mut self.conn)
        .await
        .map_err(self.sql_err())?
        .get(0);
        Ok(id)
    }

    pub async fn step_finished(
        &mut self,
        step_id: i64,
        ok: bool,
        exit_code: Option<i64>,
        duration_ms: i64,
        output_tail: &str,
    ) -> Result<()> {
        sqlx::query(&format!(
            "UPDATE provision_steps SET status = ?, exit_code = ?, duration_ms = ?, output_tail = ?, finished_at = {NOW} WHERE id = ?"
        ))
        .bind(if ok { StepStatus::Succeeded } else { StepStatus::Failed }.as_str())
        .bind(exit_code)
        .bind(duration_ms)
        .bind(output_tail)
        .bind(step_id)
        .execute(&mut self.conn)
        .await
        .map_err(self.sql_err())?;
        Ok(())
    }

    pub async fn finish_apply(&mut self, id: &str, status: ApplyStatus) -> Result<()> {
        let err = self.sql_err();
        let mut tx = sqlx::Connection::begin_with(&mut self.conn, crate::WRITE).await.map_err(&err)?;
        sqlx::query(&format!("UPDATE provision_applies SET status = ?, finished_at = {NOW} WHERE id = ?"))
            .bind(status.as_str())
            .bind(id)
            .execute(&mut *tx)
            .await
            .map_err(&err)?;
        // Queued again: an upload since the apply began took the entry with the story so far.
        if self.queue_uploads {
            crate::outbox::queue(&mut tx, "apply", id).await.map_err(&err)?;
        }
        tx.commit().await.map_err(&err)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Queries;

    /// The outbox's due entries as one upload, taken out of the outbox.
    async fn upload(agent: &mut Store, now: &str) -> String {
        let mut out = Vec::new();
        let batch = agent.upload_batch(None, 100, now, &mut out).await.unwrap().expect("an apply is due");
        assert_eq!(batch.stats.applies, 1);
        agent.upload_done().await.unwrap();
        String::from_utf8(out).unwrap()
    }

    /// The apply lines of a store's export.
    async fn apply_lines(store: &mut Store, now: &str) -> Vec<String> {
        let mut out = Vec::new();
        store.export(None, now, &mut out).await.unwrap();
        String::from_utf8(out).unwrap().lines().filter(|l| l.contains("\"type\":\"apply\"")).map(String::from).collect()
    }

    /// An apply travels in an upload with its journal, goes into another store once, comes again
    /// (resumed, finished) as an update, and an older story never overwrites a newer one; the
    /// receiving store exports it exactly as the agent does.
    #[tokio::test]
    async fn an_apply_travels_with_its_journal_and_is_updated_only_by_more_of_its_story() {
        let dir = tempfile::tempdir().unwrap();
        let now = "2026-12-05T08:00:00Z";
        let mut agent = Store::open(&dir.path().join("agent.db")).await.unwrap();
        agent.queue_uploads(true);
        let new = NewApply {
            image: "base".into(),
            image_version: "1".into(),
            image_hash: "h1".into(),
            root: "/".into(),
            hostname: Some("node-1".into()),
        };
        let id = agent.begin_apply(&new).await.unwrap();
        let step = agent.step_started(&id, 1, "file:/etc/a", "write /etc/a", "printf 'a\tb\\n'", "h1").await.unwrap();
        agent.step_finished(step, true, Some(0), 12, "").await.unwrap();
        let step = agent.step_started(&id, 2, "command:x", "run x", "x --go", "h1").await.unwrap();
        agent.step_finished(step, false, Some(3), 1500, "line 1\nE: no network\n").await.unwrap();
        agent.finish_apply(&id, ApplyStatus::Failed).await.unwrap();
        assert_eq!(agent.pending_uploads(now).await.unwrap().applies, 1);
        let first = upload(&mut agent, now).await;

        let mut fleet = Store::open(&dir.path().join("fleet.db")).await.unwrap();
        let s = fleet.import("first", &first).await.unwrap();
        assert_eq!((s.applies_new, s.applies_updated), (1, 0));
        let s = fleet.import("first", &first).await.unwrap();
        assert_eq!((s.applies_new, s.applies_updated), (0, 0), "the same upload twice adds nothing");

        agent.resume_apply(&id, "h2").await.unwrap();
        let step = agent.step_started(&id, 3, "command:x", "run x", "x --go", "h2").await.unwrap();
        agent.step_finished(step, true, Some(0), 900, "done").await.unwrap();
        agent.finish_apply(&id, ApplyStatus::Succeeded).await.unwrap();
        let second = upload(&mut agent, now).await;
        let s = fleet.import("second", &second).await.unwrap();
        assert_eq!((s.applies_new, s.applies_updated), (0, 1));
        let s = fleet.import("first", &first).await.unwrap();
        assert_eq!((s.applies_new, s.applies_updated), (0, 0), "an older story does not overwrite a newer one");

        let (apply, steps) = fleet.apply_journal(&id[..8]).await.unwrap();
        assert_eq!((apply.status, apply.resumes, apply.image_hash.as_str()), (ApplyStatus::Succeeded, 1, "h2"));
        assert_eq!(steps.len(), 3);
        assert_eq!(steps[0].command, "printf 'a\tb\\n'");
        assert_eq!(steps[1].output_tail.as_deref(), Some("line 1\nE: no network\n"));
        let here = apply_lines(&mut agent, now).await;
        assert_eq!(here.len(), 1);
        assert_eq!(here, apply_lines(&mut fleet, now).await);
    }
}

//! The provisioning journal (`provision_applies`, `provision_steps`): one row per apply, one per
//! step, each step written before it starts and updated when it ends, each write its own
//! transaction so that a killed kiln leaves the story up to the step it was in.

use sqlx::Row;

use crate::{like_prefix, ApplyStatus, DbError, Result, StepStatus, Store};

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

const APPLY_COLUMNS: &str =
    "id, image, image_version, image_hash, root, hostname, started_at, finished_at, resumes, status";

fn apply_row(r: &sqlx::sqlite::SqliteRow) -> ApplyRow {
    ApplyRow {
        id: r.get(0),
        image: r.get(1),
        image_version: r.get(2),
        image_hash: r.get(3),
        root: r.get(4),
        hostname: r.get(5),
        started_at: r.get(6),
        finished_at: r.get(7),
        resumes: r.get(8),
        status: r.get(9),
    }
}

impl Store {
    pub async fn begin_apply(&mut self, new: &NewApply) -> Result<String> {
        let id = uuid::Uuid::new_v4().to_string();
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
        .execute(&mut self.conn)
        .await
        .map_err(self.sql_err())?;
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
        Ok(row.map(|r| apply_row(&r)).filter(|a| a.status != ApplyStatus::Succeeded))
    }

    /// Continues an apply: steps a dead kiln left 'started' become 'interrupted'; returns them and
    /// the next step number.
    pub async fn resume_apply(&mut self, id: &str, image_hash: &str) -> Result<(Vec<StepRow>, i64)> {
        let err = self.sql_err();
        let mut tx = sqlx::Connection::begin_with(&mut self.conn, crate::WRITE).await.map_err(&err)?;
        let dangling = sqlx::query(&format!(
            "UPDATE provision_steps SET status = 'interrupted', finished_at = {NOW} WHERE apply_id = ? AND status = 'started' \
             RETURNING seq, step_key, summary, command, image_hash, started_at, finished_at, status, exit_code, duration_ms, output_tail"
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
        tx.commit().await.map_err(&err)?;
        Ok((dangling.iter().map(step_row).collect(), next))
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
        sqlx::query(&format!("UPDATE provision_applies SET status = ?, finished_at = {NOW} WHERE id = ?"))
            .bind(status.as_str())
            .bind(id)
            .execute(&mut self.conn)
            .await
            .map_err(self.sql_err())?;
        Ok(())
    }

    /// Applies, newest first, optionally of one image.
    pub async fn applies(&mut self, image: Option<&str>, limit: i64) -> Result<Vec<ApplyRow>> {
        let rows = sqlx::query(&format!(
            "SELECT {APPLY_COLUMNS} FROM provision_applies WHERE (?1 IS NULL OR image = ?1) ORDER BY started_at DESC, rowid DESC LIMIT ?2"
        ))
        .bind(image)
        .bind(limit)
        .fetch_all(&mut self.conn)
        .await
        .map_err(self.sql_err())?;
        Ok(rows.iter().map(apply_row).collect())
    }

    /// One apply by id or unique prefix, with its steps in order.
    pub async fn apply_journal(&mut self, id: &str) -> Result<(ApplyRow, Vec<StepRow>)> {
        let err = self.sql_err();
        let rows =
            sqlx::query(&format!("SELECT {APPLY_COLUMNS} FROM provision_applies WHERE id LIKE ? ESCAPE '\\' LIMIT 2"))
                .bind(like_prefix(id))
                .fetch_all(&mut self.conn)
                .await
                .map_err(&err)?;
        let apply = match rows.as_slice() {
            [one] => apply_row(one),
            [] => return Err(DbError::NotFound { what: "apply", id: id.to_string() }),
            _ => return Err(DbError::Ambiguous { what: "apply", id: id.to_string(), count: rows.len() }),
        };
        let steps = sqlx::query(
            "SELECT seq, step_key, summary, command, image_hash, started_at, finished_at, status, exit_code, duration_ms, output_tail \
             FROM provision_steps WHERE apply_id = ? ORDER BY seq, id",
        )
        .bind(&apply.id)
        .fetch_all(&mut self.conn)
        .await
        .map_err(&err)?;
        Ok((apply, steps.iter().map(step_row).collect()))
    }
}

fn step_row(r: &sqlx::sqlite::SqliteRow) -> StepRow {
    StepRow {
        seq: r.get(0),
        step_key: r.get(1),
        summary: r.get(2),
        command: r.get(3),
        image_hash: r.get(4),
        started_at: r.get(5),
        finished_at: r.get(6),
        status: r.get(7),
        exit_code: r.get(8),
        duration_ms: r.get(9),
        output_tail: r.get(10),
    }
}

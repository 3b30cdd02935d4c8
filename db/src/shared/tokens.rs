//! Storing and reading the fleet service's tokens (the token format and roles are in
//! `crate::tokens`).

use sqlx::Row;

use super::{DbRow, Store};
use crate::{DbError, Result, Role, TokenRow};

fn row(r: &DbRow) -> TokenRow {
    TokenRow {
        id: r.get(0),
        name: r.get(1),
        role: Role::parse(r.get::<&str, _>(2)).unwrap_or(Role::Reader),
        created_at: r.get(3),
        revoked_at: r.get(4),
        last_used_at: r.get(5),
        secret_sha256: r.get(6),
    }
}

const COLUMNS: &str = "id, name, role, created_at, revoked_at, last_used_at, secret_sha256";

impl Store {
    /// Stores a new token's hash. A live token of the same name is refused.
    pub async fn create_token(
        &mut self,
        id: &str,
        name: &str,
        role: Role,
        secret_sha256: &[u8],
        created_at: &str,
    ) -> Result<()> {
        let err = self.sql_err();
        let live: Option<String> = sqlx::query_scalar("SELECT id FROM tokens WHERE name = $1 AND revoked_at IS NULL")
            .bind(name)
            .fetch_optional(&mut self.conn)
            .await
            .map_err(&err)?;
        if live.is_some() {
            return Err(DbError::Conflict {
                path: self.path.clone(),
                what: format!("a live token named {name:?} exists; revoke it first or choose another name"),
            });
        }
        sqlx::query("INSERT INTO tokens (id, name, role, secret_sha256, created_at) VALUES ($1, $2, $3, $4, $5)")
            .bind(id)
            .bind(name)
            .bind(role.as_str())
            .bind(secret_sha256)
            .bind(created_at)
            .execute(&mut self.conn)
            .await
            .map_err(&err)?;
        Ok(())
    }

    /// Every token, newest first.
    pub async fn tokens(&mut self) -> Result<Vec<TokenRow>> {
        let err = self.sql_err();
        let sql = format!("SELECT {COLUMNS} FROM tokens ORDER BY created_at DESC, rowid DESC");
        let rows = sqlx::query(&sql).fetch_all(&mut self.conn).await.map_err(err)?;
        Ok(rows.iter().map(row).collect())
    }

    /// One token by its id (the public part of the token), revoked or not.
    pub async fn token(&mut self, id: &str) -> Result<Option<TokenRow>> {
        let err = self.sql_err();
        let sql = format!("SELECT {COLUMNS} FROM tokens WHERE id = $1");
        let found = sqlx::query(&sql).bind(id).fetch_optional(&mut self.conn).await.map_err(err)?;
        Ok(found.as_ref().map(row))
    }

    /// Revokes the live token with this name or id; returns it, or `None` when there is none.
    pub async fn revoke_token(&mut self, name_or_id: &str, at: &str) -> Result<Option<TokenRow>> {
        let err = self.sql_err();
        let sql = format!(
            "UPDATE tokens SET revoked_at = $1 WHERE revoked_at IS NULL AND (name = $2 OR id = $2) RETURNING {COLUMNS}"
        );
        let found = sqlx::query(&sql).bind(at).bind(name_or_id).fetch_optional(&mut self.conn).await.map_err(err)?;
        Ok(found.as_ref().map(row))
    }

    /// Records that a token was used (at most once a minute per token, to spare the writes).
    pub async fn token_used(&mut self, id: &str, at: &str) -> Result<()> {
        let err = self.sql_err();
        sqlx::query(
            "UPDATE tokens SET last_used_at = $1 WHERE id = $2 AND (last_used_at IS NULL OR last_used_at < substr($1, 1, 16))",
        )
        .bind(at)
        .bind(id)
        .execute(&mut self.conn)
        .await
        .map_err(err)?;
        Ok(())
    }
}

//! The fleet service's bearer tokens. A token is `kiln_<id>_<secret>`: the id finds the row, the
//! secret is compared with the stored SHA-256 by the caller, in constant time. Only the hash is
//! stored; the token itself is printed once when it is made.

use serde::Serialize;
use sqlx::Row;

use crate::{DbError, Result, Store};

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Uploads results.
    Agent,
    /// Reads the fleet.
    Reader,
    /// Both.
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Agent => "agent",
            Role::Reader => "reader",
            Role::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "agent" => Some(Role::Agent),
            "reader" => Some(Role::Reader),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }

    /// Whether a token of this role may upload.
    pub fn writes(self) -> bool {
        matches!(self, Role::Agent | Role::Admin)
    }

    /// Whether a token of this role may read the fleet.
    pub fn reads(self) -> bool {
        matches!(self, Role::Reader | Role::Admin)
    }
}

/// A token as listed: never its secret.
#[derive(Debug, Clone, Serialize)]
pub struct TokenRow {
    pub id: String,
    pub name: String,
    pub role: Role,
    pub created_at: String,
    pub revoked_at: Option<String>,
    pub last_used_at: Option<String>,
    /// SHA-256 of the secret part.
    #[serde(skip)]
    pub secret_sha256: Vec<u8>,
}

fn row(r: &sqlx::sqlite::SqliteRow) -> TokenRow {
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
        let live: Option<String> = sqlx::query_scalar("SELECT id FROM tokens WHERE name = ? AND revoked_at IS NULL")
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
        sqlx::query("INSERT INTO tokens (id, name, role, secret_sha256, created_at) VALUES (?, ?, ?, ?, ?)")
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
        let sql = format!("SELECT {COLUMNS} FROM tokens WHERE id = ?");
        let found = sqlx::query(&sql).bind(id).fetch_optional(&mut self.conn).await.map_err(err)?;
        Ok(found.as_ref().map(row))
    }

    /// Revokes the live token with this name or id; returns it, or `None` when there is none.
    pub async fn revoke_token(&mut self, name_or_id: &str, at: &str) -> Result<Option<TokenRow>> {
        let err = self.sql_err();
        let sql = format!(
            "UPDATE tokens SET revoked_at = ?1 WHERE revoked_at IS NULL AND (name = ?2 OR id = ?2) RETURNING {COLUMNS}"
        );
        let found = sqlx::query(&sql).bind(at).bind(name_or_id).fetch_optional(&mut self.conn).await.map_err(err)?;
        Ok(found.as_ref().map(row))
    }

    /// Records that a token was used (at most once a minute per token, to spare the writes).
    pub async fn token_used(&mut self, id: &str, at: &str) -> Result<()> {
        let err = self.sql_err();
        sqlx::query(
            "UPDATE tokens SET last_used_at = ?1 WHERE id = ?2 AND (last_used_at IS NULL OR last_used_at < substr(?1, 1, 16))",
        )
        .bind(at)
        .bind(id)
        .execute(&mut self.conn)
        .await
        .map_err(err)?;
        Ok(())
    }
}

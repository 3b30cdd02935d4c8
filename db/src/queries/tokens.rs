//! Storing and reading the fleet service's tokens (the token format and roles are in
//! `crate::tokens`).

use crate::engine::{query, sql_err, Backend, Row};
use crate::{DbError, Result, Role, TokenRow};

fn row(r: &Row) -> TokenRow {
    TokenRow {
        id: r.get(0),
        name: r.get(1),
        role: Role::parse(r.get::<&str>(2)).unwrap_or(Role::Reader),
        created_at: r.get(3),
        revoked_at: r.get(4),
        last_used_at: r.get(5),
        secret_sha256: r.get(6),
        host_identity: r.get(7),
    }
}

const COLUMNS: &str = "id, name, role, created_at, revoked_at, last_used_at, secret_sha256, host_identity";

/// Stores a new token's hash. A live token of the same name is refused.
pub(crate) async fn create_token(
    s: &mut impl Backend,
    id: &str,
    name: &str,
    role: Role,
    secret_sha256: &[u8],
    created_at: &str,
    host_identity: Option<&str>,
) -> Result<()> {
    let err = sql_err(s);
    let live: Option<String> = query("SELECT id FROM tokens WHERE name = $1 AND revoked_at IS NULL")
        .bind(name)
        .scalar_optional(&mut s.conn())
        .await
        .map_err(&err)?;
    if live.is_some() {
        return Err(DbError::Conflict {
            path: s.path().to_path_buf(),
            what: format!("a live token named {name:?} exists; revoke it first or choose another name"),
        });
    }
    query(
        "INSERT INTO tokens (id, name, role, secret_sha256, created_at, host_identity) VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(id)
    .bind(name)
    .bind(role.as_str())
    .bind(secret_sha256)
    .bind(created_at)
    .bind(host_identity)
    .execute(&mut s.conn())
    .await
    .map_err(&err)?;
    Ok(())
}

/// Every token, newest first.
pub(crate) async fn tokens(s: &mut impl Backend) -> Result<Vec<TokenRow>> {
    let err = sql_err(s);
    let sql = format!("SELECT {COLUMNS} FROM tokens ORDER BY created_at DESC, rowid DESC");
    let rows = query(&sql).fetch_all(&mut s.conn()).await.map_err(err)?;
    Ok(rows.iter().map(row).collect())
}

/// One token by its id (the public part of the token), revoked or not.
pub(crate) async fn token(s: &mut impl Backend, id: &str) -> Result<Option<TokenRow>> {
    let err = sql_err(s);
    let sql = format!("SELECT {COLUMNS} FROM tokens WHERE id = $1");
    let found = query(&sql).bind(id).fetch_optional(&mut s.conn()).await.map_err(err)?;
    Ok(found.as_ref().map(row))
}

/// Revokes the live token with this name or id; returns it, or `None` when there is none.
pub(crate) async fn revoke_token(s: &mut impl Backend, name_or_id: &str, at: &str) -> Result<Option<TokenRow>> {
    let err = sql_err(s);
    let sql = format!(
        "UPDATE tokens SET revoked_at = $1 WHERE revoked_at IS NULL AND (name = $2 OR id = $2) RETURNING {COLUMNS}"
    );
    let found = query(&sql).bind(at).bind(name_or_id).fetch_optional(&mut s.conn()).await.map_err(err)?;
    Ok(found.as_ref().map(row))
}

/// Records that a token was used (at most once a minute per token, to spare the writes).
pub(crate) async fn token_used(s: &mut impl Backend, id: &str, at: &str) -> Result<()> {
    let err = sql_err(s);
    query(
            "UPDATE tokens SET last_used_at = $1 WHERE id = $2 AND (last_used_at IS NULL OR last_used_at < substr($1, 1, 16))",
        )
        .bind(at)
        .bind(id)
        .execute(&mut s.conn())
        .await
        .map_err(err)?;
    Ok(())
}

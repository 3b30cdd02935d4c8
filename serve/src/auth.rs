//! Bearer tokens: `kiln_<id>_<secret>`. The id (public, 12 hex digits) finds the stored row; the
//! secret's SHA-256 is compared with the stored hash in constant time. Browsers may send the token
//! as the password of HTTP Basic authentication (the dashboard asks for it that way).

use base64::Engine;
use kiln_db::{Role, TokenRow};
use sha2::{Digest, Sha256};

/// A new token: the text to hand out once, its id, and the hash to store.
pub struct NewToken {
    pub token: String,
    pub id: String,
    pub secret_sha256: Vec<u8>,
}

/// Makes a token with 244 random bits of secret (two v4 UUIDs' randomness).
pub fn new_token() -> NewToken {
    let id_bytes = uuid::Uuid::new_v4();
    let id: String = hex(&id_bytes.as_bytes()[..6]);
    let mut secret = Vec::with_capacity(32);
    secret.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    secret.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    let secret = hex(&secret);
    let token = format!("kiln_{id}_{secret}");
    NewToken { token, secret_sha256: Sha256::digest(secret.as_bytes()).to_vec(), id }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The id and secret of a token's text; `None` when it is not a kiln token.
pub fn split(token: &str) -> Option<(&str, &str)> {
    let rest = token.strip_prefix("kiln_")?;
    let (id, secret) = rest.split_once('_')?;
    let hexish = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hexish(id) && hexish(secret)).then_some((id, secret))
}

/// Compares two byte strings in time that depends on their length only.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// Whether `secret` is the secret of the stored token `row`.
pub fn secret_matches(row: &TokenRow, secret: &str) -> bool {
    constant_time_eq(&Sha256::digest(secret.as_bytes()), &row.secret_sha256)
}

/// The token of an `Authorization` header: `Bearer TOKEN`, or `Basic` with the token as password.
pub fn from_header(value: &str) -> Option<String> {
    let (scheme, rest) = value.trim().split_once(' ')?;
    if scheme.eq_ignore_ascii_case("bearer") {
        return Some(rest.trim().to_string());
    }
    if scheme.eq_ignore_ascii_case("basic") {
        let decoded = base64::engine::general_purpose::STANDARD.decode(rest.trim()).ok()?;
        let text = String::from_utf8(decoded).ok()?;
        let (_, password) = text.split_once(':')?;
        return Some(password.to_string());
    }
    None
}

/// What a request needs of its token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    Read,
    Write,
}

impl Need {
    pub fn allowed(self, role: Role) -> bool {
        match self {
            Need::Read => role.reads(),
            Need::Write => role.writes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_splits_into_its_id_and_secret_and_matches_only_its_hash() {
        let t = new_token();
        let (id, secret) = split(&t.token).expect("a kiln token");
        assert_eq!(id, t.id);
        assert_eq!(secret.len(), 64);
        let row = TokenRow {
            id: t.id.clone(),
            name: "n".into(),
            role: Role::Agent,
            created_at: String::new(),
            revoked_at: None,
            last_used_at: None,
            host_identity: None,
            secret_sha256: t.secret_sha256.clone(),
        };
        assert!(secret_matches(&row, secret));
        let mut wrong = secret.to_string();
        wrong.replace_range(0..1, if wrong.starts_with('0') { "1" } else { "0" });
        assert!(!secret_matches(&row, &wrong));
        assert!(split("kiln_zz_00").is_none() && split("Bearer x").is_none() && split("kiln_ab").is_none());
        assert_ne!(new_token().token, t.token);
    }

    #[test]
    fn bearer_and_basic_headers_carry_the_token() {
        assert_eq!(from_header("Bearer kiln_a_b").as_deref(), Some("kiln_a_b"));
        let basic = base64::engine::general_purpose::STANDARD.encode("anyone:kiln_a_b");
        assert_eq!(from_header(&format!("Basic {basic}")).as_deref(), Some("kiln_a_b"));
        assert_eq!(from_header("Digest x"), None);
        assert!(
            constant_time_eq(b"abc", b"abc") && !constant_time_eq(b"abc", b"abd") && !constant_time_eq(b"a", b"ab")
        );
    }
}

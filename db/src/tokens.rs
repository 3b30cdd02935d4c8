//! The fleet service's bearer tokens. A token is `kiln_<id>_<secret>`: the id finds the row, the
//! secret is compared with the stored SHA-256 by the caller, in constant time. Only the hash is
//! stored; the token itself is printed once when it is made.

use serde::Serialize;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Uploads the results of one host: the one named when the token was made, or else the one its
    /// first upload carries. Records of any other host are refused.
    Agent,
    /// Reads the fleet.
    Reader,
    /// Reads the fleet and uploads for any host.
    Admin,
    /// Loads exports of any hosts (another site's, a backup): uploads without reading.
    Importer,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Agent => "agent",
            Role::Reader => "reader",
            Role::Admin => "admin",
            Role::Importer => "importer",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "agent" => Some(Role::Agent),
            "reader" => Some(Role::Reader),
            "admin" => Some(Role::Admin),
            "importer" => Some(Role::Importer),
            _ => None,
        }
    }

    /// Whether a token of this role may upload.
    pub fn writes(self) -> bool {
        matches!(self, Role::Agent | Role::Admin | Role::Importer)
    }

    /// Whether a token of this role speaks for one host only.
    pub fn one_host(self) -> bool {
        self == Role::Agent
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
    /// The identity of the host an agent token speaks for, once bound.
    pub host_identity: Option<String>,
    /// SHA-256 of the secret part.
    #[serde(skip)]
    pub secret_sha256: Vec<u8>,
}

//! The queries both engines run, written once. This module is compiled twice: as `crate::shared`
//! over SQLite (`Conn` = `SqliteConnection`, `Store` = [`crate::Store`]) and as
//! `crate::pg::shared` over PostgreSQL (`PgConnection`, [`crate::PgStore`]); each parent names
//! its types, how a write transaction begins and what an import prepares. So the SQL here is what
//! both engines take: `$N` placeholders, `ON CONFLICT`, standard functions only; `rowid` (an
//! insertion order SQLite keeps by itself) is an identity column in the PostgreSQL schema.

use super::{bulk_insert, copy_in, one_writer, prepare_import, Conn, Db, DbRow, Store, BEGIN_WRITE, COPY_IN};

pub(crate) mod import;
pub(crate) mod index;
pub(crate) mod reads;
pub(crate) mod tokens;
pub(crate) mod values;

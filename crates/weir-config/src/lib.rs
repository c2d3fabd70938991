//! Reads PgBouncer's configuration formats the way PgBouncer does:
//! `pgbouncer.ini` (with `%include`) via [`load`], and the `auth_file`
//! (userlist.txt) via [`load_auth_file`].
//!
//! Where PgBouncer is lenient in ways that hide mistakes (`atoi` on
//! per-database numbers, unknown values), this crate reports an error
//! instead; everything PgBouncer accepts as valid is accepted here.

mod auth_file;
mod connstr;
mod database;
mod enums;
mod error;
mod general;
pub mod hba;
mod implemented;
mod ini;
pub mod ldap;
mod loader;
mod peer;
mod user;
mod value;

use std::collections::HashMap;
use std::path::Path;

pub use auth_file::{
    load_auth_file, load_auth_file_with_notices, parse_auth_file, AuthFile, LoadedAuthFile,
};
pub use database::{Database, DEFAULT_PORT};
pub use enums::{
    AuthType, LoadBalanceHosts, LogFormat, PoolMode, SigtermShutdown, SslMode, TargetSessionAttrs,
};
pub use error::ConfigError;
pub use general::General;
pub use implemented::{
    option_is_implemented, unimplemented_markdown, IMPLEMENTED, IMPLEMENTED_DATABASE_PARAMS,
    IMPLEMENTED_USER_PARAMS, UNIMPLEMENTED_DATABASE_PARAMS, UNIMPLEMENTED_USER_PARAMS,
};
pub use peer::{Peer, DEFAULT_PEER_PORT};
pub use user::User;

/// A loaded pgbouncer.ini.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The `[pgbouncer]` section.
    pub general: General,
    /// `[databases]` in file order, without `*`. A name given twice keeps
    /// its first position and its last definition, as in PgBouncer.
    pub databases: Vec<(String, Database)>,
    /// The `*` entry: its settings apply to any database not listed, with
    /// `dbname` defaulting to the name the client asked for.
    pub fallback_database: Option<Database>,
    /// `[users]`.
    pub users: HashMap<String, User>,
    /// `[peers]` by peer id, in file order.
    pub peers: Vec<(u32, Peer)>,
    /// Settings that are accepted but not acted on yet, one line each, as
    /// `file:line: ...`, in file order; the application adds the auth_file's
    /// skipped lines, so that all are logged together, once per load.
    pub notices: Vec<String>,
}

impl Config {
    /// The `[databases]` entry with exactly this name (never the `*` fallback).
    pub fn database(&self, name: &str) -> Option<&Database> {
        self.databases
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, db)| db)
    }
}

/// Loads a pgbouncer.ini, following `%include` directives (relative paths
/// are relative to the current directory, as in PgBouncer).
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    loader::load(path)
}

/// Parses the text of a pgbouncer.ini (`path` only names it in errors). `%include` is an
/// error here: no file is opened, so any text is safe to give it (the fuzz targets do).
pub fn load_str(text: &str, path: &Path) -> Result<Config, ConfigError> {
    loader::load_str(text, path)
}

/// A connection string's `key=value` pairs, as a `[databases]` entry is read (fuzzing).
#[doc(hidden)]
pub fn split_connstr(s: &str) -> Result<Vec<(String, String)>, String> {
    connstr::split_pairs(s)
}

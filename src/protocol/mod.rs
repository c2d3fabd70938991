//! The PostgreSQL v3 wire protocol, as much of it as a pooler needs: framing, the startup
//! packets, and builders for the messages Weir itself originates.

pub mod error;
pub mod framer;
pub mod messages;
pub mod reader;
pub mod startup;

pub use error::{error_code, PgError};

/// Message header: one type byte and a 4-byte big-endian length that counts itself.
pub const HEADER_LEN: usize = 5;

/// The largest startup or password packet a client may send, its length word included:
/// 65,531 bytes of content, PgBouncer 1.25's limit for both, for the long generated
/// passwords of cloud services (IAM tokens). PostgreSQL takes a password packet as large
/// (PG_MAX_AUTH_TOKEN_LENGTH) but caps a startup packet at 10,000 bytes.
pub const MAX_STARTUP_PACKET: usize = 65_535;

/// A backend's cancel key (BackendKeyData): the process id and secret a CancelRequest
/// names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendKey {
    pub pid: u32,
    pub secret: u32,
}

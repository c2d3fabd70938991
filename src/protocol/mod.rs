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

/// PostgreSQL refuses startup packets larger than this (MAX_STARTUP_PACKET_LENGTH).
pub const MAX_STARTUP_PACKET: usize = 10_000;

/// A backend's cancel key (BackendKeyData): the process id and secret a CancelRequest
/// names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendKey {
    pub pid: u32,
    pub secret: u32,
}

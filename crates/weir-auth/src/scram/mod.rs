//! SCRAM-SHA-256 (RFC 5802, RFC 7677) as PostgreSQL speaks it, with
//! SCRAM-SHA-256-PLUS (tls-server-end-point channel binding) over TLS; the user
//! name inside the SCRAM messages is ignored in favour of the one from the
//! startup packet.

mod client;
pub(crate) mod keys;
mod messages;
mod server;

use std::fmt;

pub use client::{Binding, ClientSession};
pub use server::{mock_secret, ServerFinal, ServerSession};

pub const MECHANISM: &str = "SCRAM-SHA-256";
/// With channel binding (tls-server-end-point), offered over TLS.
pub const MECHANISM_PLUS: &str = "SCRAM-SHA-256-PLUS";

/// Iterations PostgreSQL uses for new verifiers (`scram_iterations` default).
pub const DEFAULT_ITERATIONS: u32 = 4096;

/// Highest iteration count accepted from a server. libpq only demands >= 1,
/// but a pooler thread stuck in PBKDF2 stalls every client on it; at
/// 10 million a login already takes seconds.
pub const MAX_ITERATIONS: u32 = 10_000_000;

/// What Weir proves to PostgreSQL with.
#[derive(Clone)]
pub enum Credential {
    Password(String),
    /// Keys recovered from a client's own SCRAM proof ([`ServerFinal`]), as
    /// PgBouncer does, so no plaintext password is needed. They only work
    /// when the server holds the same verifier the keys came from.
    Keys {
        client_key: [u8; 32],
        server_key: [u8; 32],
    },
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credential::Password(_) => f.write_str("Credential::Password(<redacted>)"),
            Credential::Keys { .. } => f.write_str("Credential::Keys(<redacted>)"),
        }
    }
}

#[cfg(test)]
mod tests;

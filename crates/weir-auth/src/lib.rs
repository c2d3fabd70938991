//! Sans-IO password authentication for both sides of the pooler.
//!
//! Weir verifies clients as a PostgreSQL server would (md5, cleartext,
//! SCRAM-SHA-256) and logs in to PostgreSQL as libpq would. Nothing here
//! touches a socket: callers feed in message payloads and send back what they
//! get. Everything that parses peer input returns [`AuthError`] rather than
//! panicking.

mod b64;
pub mod ct;
mod error;
mod md5;
mod saslprep;
pub mod scram;
mod secret;

pub use error::AuthError;
pub use md5::{md5_response, md5_secret, md5_verify};
pub use secret::{plain_verify, scram_secret, ScramSecret, Secret};

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

/// The longest cancel key protocol 3.2 allows (BackendKeyData, CancelRequest).
pub const MAX_CANCEL_KEY: usize = 256;

/// A backend's cancel key (BackendKeyData): the process id and secret a CancelRequest
/// names. Protocol 3.0's secret is 4 bytes; 3.2's is 4 to 256 (PostgreSQL 18 sends 32).
/// The first 4 are `secret`, the rest `tail`: peers stamp their id and a time to live on
/// those first 4 bytes (crate::cancel), whatever the length, and a 3.0 key, the common
/// case, stays two words and an empty pointer, with no allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendKey {
    pub pid: u32,
    pub secret: u32,
    /// Bytes beyond the first 4 (protocol 3.2), shared: a lend copies the server's key
    /// into its client's cancel target. A thin pointer (an Arc of a Vec, not of a slice):
    /// every client's registry entry holds a key, and 8 bytes more would take it past a
    /// 256-byte allocation size class.
    pub tail: Option<std::sync::Arc<Vec<u8>>>,
}

impl BackendKey {
    /// A protocol 3.0 key.
    pub fn short(pid: u32, secret: u32) -> BackendKey {
        BackendKey {
            pid,
            secret,
            tail: None,
        }
    }

    /// A key from a message's bytes after the pid (the whole secret), None when it is
    /// not 4 to 256 bytes long.
    pub fn from_wire(pid: u32, secret: &[u8]) -> Option<BackendKey> {
        if !(4..=MAX_CANCEL_KEY).contains(&secret.len()) {
            return None;
        }
        let (head, tail) = secret.split_at(4);
        Some(BackendKey {
            pid,
            secret: u32::from_be_bytes([head[0], head[1], head[2], head[3]]),
            tail: (!tail.is_empty()).then(|| std::sync::Arc::new(tail.to_vec())),
        })
    }

    pub fn tail(&self) -> &[u8] {
        self.tail.as_deref().map_or(&[], Vec::as_slice)
    }

    /// The secret's length in bytes, as the wire carries it.
    pub fn secret_len(&self) -> usize {
        4 + self.tail().len()
    }

    /// The same pid and secret, compared without telling through timing how much of the
    /// secret matched (a key of another length does not match).
    pub fn matches(&self, other: &BackendKey) -> bool {
        let head = weir_auth::ct::eq(&self.secret.to_be_bytes(), &other.secret.to_be_bytes());
        let tail = weir_auth::ct::eq(self.tail(), other.tail());
        self.pid == other.pid && head & tail
    }

    /// The same key with another first 4 bytes of secret (a peer's stamp, its time to
    /// live).
    pub fn with_secret(&self, secret: u32) -> BackendKey {
        BackendKey {
            pid: self.pid,
            secret,
            tail: self.tail.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_3_0_and_3_2() {
        let short = BackendKey::from_wire(7, &9u32.to_be_bytes()).unwrap();
        assert_eq!(short, BackendKey::short(7, 9));
        assert_eq!(short.secret_len(), 4);
        let mut long = 9u32.to_be_bytes().to_vec();
        long.extend_from_slice(&[1; 28]);
        let long = BackendKey::from_wire(7, &long).unwrap();
        assert_eq!((long.secret, long.secret_len()), (9, 32));
        assert!(long.matches(&long.clone()));
        assert!(!long.matches(&short) && !short.matches(&long));
        let mut forged = long.clone();
        forged.tail = Some(std::sync::Arc::new([vec![1; 27], vec![2]].concat()));
        assert!(!long.matches(&forged));
        assert!(BackendKey::from_wire(7, &[0; 3]).is_none());
        assert!(BackendKey::from_wire(7, &[0; 257]).is_none());
        assert!(BackendKey::from_wire(7, &[0; 256]).is_some());
    }
}

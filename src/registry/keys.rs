//! The cancel keys Weir gives its clients. With peers (`peer_id`, `[peers]`) each key
//! carries this process's id in its secret's high 16 bits and a time to live in its low 2
//! bits, which cancel forwarding reads (crate::cancel); kept here, beside the clients the
//! keys are given to, as a process-wide setting made once at startup.
//!
//! A client on protocol 3.2 gets a longer key: those 4 bytes (which peers and cancel
//! forwarding read, as for any client) and 28 random bytes more, 32 in all as PostgreSQL
//! 18 gives. They are kept with the client (its registry entry, and across an online
//! restart the state it moves with), not derived from a process secret, so that a key
//! stays the client's whichever process holds it; a cancel request must name them all.

use std::sync::atomic::{AtomicU32, Ordering};

/// This process's `peer_id`, 0 without peers (set once at startup: not reloadable).
static PEER_ID: AtomicU32 = AtomicU32::new(0);
/// The time to live a key starts with, in its secret's low 2 bits.
pub const TTL: u32 = 3;

pub fn set_peer_id(id: u32) {
    PEER_ID.store(id & 0xffff, Ordering::Relaxed);
}

/// A new client's cancel secret: random, with this process's peer id and a full time to
/// live when it has one.
pub fn new_secret() -> u32 {
    let random: u32 = rand::random();
    match PEER_ID.load(Ordering::Relaxed) {
        0 => random,
        id => (id << 16) | (random & 0xfffc) | TTL,
    }
}

/// What a protocol 3.2 client's key has beyond the first 4 bytes. PostgreSQL 18 sends
/// 32 bytes; the protocol allows up to 256, and asks middleware that lengthens keys to
/// leave room, which 32 does.
pub const LONG_KEY_TAIL: usize = 28;

/// The rest of a new protocol 3.2 client's key: random (ThreadRng is a CSPRNG).
pub fn new_tail() -> std::sync::Arc<Vec<u8>> {
    std::sync::Arc::new(rand::random::<[u8; LONG_KEY_TAIL]>().to_vec())
}

/// This process's peer id, 0 without peers.
pub fn peer_id() -> u32 {
    PEER_ID.load(Ordering::Relaxed)
}

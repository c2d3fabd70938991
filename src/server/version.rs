//! The protocol version Weir asks its servers for. Protocol 3.2 (PostgreSQL 18) differs
//! from 3.0 only in its longer cancel keys, so it is asked for everywhere: PostgreSQL 18
//! speaks it, and earlier servers (since 9.3.21, 10.2 and 11) answer NegotiateProtocolVersion
//! naming 3.0 before authentication, and carry on in 3.0. A server that refuses the
//! request instead (some proxies, poolers in front of PostgreSQL) is asked for 3.0 from
//! then on, remembered by its address for the life of the process.

use std::collections::HashSet;
use std::sync::{LazyLock, Mutex};

use super::login::ConnectError;
use crate::protocol::messages::{PROTOCOL_3_0, PROTOCOL_3_2};
use crate::stream::ServerAddr;

/// The addresses that refused protocol 3.2; bounded, since hosts come from the
/// configuration and its reloads (past it, such a server is asked for 3.2 each time,
/// and each login costs one refused attempt more).
static ONLY_3_0: LazyLock<Mutex<HashSet<ServerAddr>>> = LazyLock::new(Mutex::default);
const REMEMBERED_MAX: usize = 1024;

fn only_3_0() -> std::sync::MutexGuard<'static, HashSet<ServerAddr>> {
    ONLY_3_0.lock().unwrap_or_else(|p| p.into_inner())
}

/// What to ask `addr` for.
pub fn for_server(addr: &ServerAddr) -> u32 {
    if only_3_0().contains(addr) {
        PROTOCOL_3_0
    } else {
        PROTOCOL_3_2
    }
}

/// Whether a login that asked for 3.2 failed as a server that does not know it fails:
/// an error before anything else was heard (PostgreSQL's own refusal of a version is
/// 0A000, a protocol error 08P01), or the connection closed at once. Then `addr` is
/// asked for 3.0 from now on, and true tells the caller to try again.
pub fn refused_3_2(addr: &ServerAddr, asked: u32, first_word: bool, e: &ConnectError) -> bool {
    let refused = match e {
        ConnectError::Server(pg) => pg.code == "0A000" || pg.code == "08P01",
        ConnectError::Closed => true,
        _ => false,
    };
    if asked != PROTOCOL_3_2 || !first_word || !refused {
        return false;
    }
    tracing::warn!(server = %addr, "server refused protocol 3.2 ({e}): asking it for 3.0 from now on");
    let mut set = only_3_0();
    if set.len() < REMEMBERED_MAX {
        set.insert(addr.clone());
    }
    true
}

/// The version a NegotiateProtocolVersion message names, when it is one Weir speaks and
/// no newer than it asked for. PostgreSQL sends the whole number (3.0: 196608); a bare
/// minor is read as 3.minor.
pub fn negotiated(body: &[u8], asked: u32) -> Option<u32> {
    let v = u32::from_be_bytes(body.get(..4)?.try_into().ok()?);
    let v = if v >> 16 == 0 { (3 << 16) | v } else { v };
    (PROTOCOL_3_0..=asked).contains(&v).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::PgError;

    #[test]
    fn a_refusal_of_3_2_is_remembered() {
        let addr = ServerAddr::Tcp {
            host: "version-test".into(),
            port: 1,
        };
        assert_eq!(for_server(&addr), PROTOCOL_3_2);
        let wrong_password = ConnectError::Server(PgError::fatal("28P01", "no"));
        assert!(!refused_3_2(&addr, PROTOCOL_3_2, true, &wrong_password));
        let refusal = ConnectError::Server(PgError::fatal("08P01", "bad packet header"));
        assert!(!refused_3_2(&addr, PROTOCOL_3_2, false, &refusal));
        assert!(!refused_3_2(&addr, PROTOCOL_3_0, true, &refusal));
        assert_eq!(for_server(&addr), PROTOCOL_3_2);
        assert!(refused_3_2(&addr, PROTOCOL_3_2, true, &refusal));
        assert_eq!(for_server(&addr), PROTOCOL_3_0);
    }

    #[test]
    fn reads_negotiate_protocol_version() {
        let body = |v: u32| [v.to_be_bytes(), 0u32.to_be_bytes()].concat();
        assert_eq!(
            negotiated(&body(PROTOCOL_3_0), PROTOCOL_3_2),
            Some(PROTOCOL_3_0)
        );
        assert_eq!(negotiated(&body(0), PROTOCOL_3_2), Some(PROTOCOL_3_0));
        assert_eq!(negotiated(&body(PROTOCOL_3_2), PROTOCOL_3_0), None);
        assert_eq!(negotiated(&body(2 << 16), PROTOCOL_3_2), None);
        assert_eq!(negotiated(&[0, 3], PROTOCOL_3_2), None);
    }
}

//! One `[peers]` entry: `<peer_id> = host=... [port=...] [pool_size=...]`,
//! as PgBouncer's `parse_peer` reads it.

use crate::connstr::{count, split_pairs};
use crate::database::parse_port;

/// A peer PgBouncer (or Weir) process that cancel requests can be forwarded to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Host name, address, or Unix socket directory (`/...`, `@...`).
    pub host: String,
    pub port: u16,
    /// `None` means `default_pool_size`.
    pub pool_size: Option<u32>,
}

/// The default port of a peer: PgBouncer's own port.
pub const DEFAULT_PEER_PORT: u16 = 6432;

impl Peer {
    /// Parses the peer id (the key), which PgBouncer requires to be 1..=65535.
    pub(crate) fn parse_id(key: &str) -> Result<u32, String> {
        match key.parse::<u32>() {
            Ok(id @ 1..=65535) => Ok(id),
            _ => Err(format!(
                "invalid peer id \"{key}\": must be a number from 1 to 65535"
            )),
        }
    }

    pub(crate) fn parse(connstr: &str) -> Result<Self, String> {
        let mut host = None;
        let mut port = DEFAULT_PEER_PORT;
        let mut pool_size = None;
        for (key, value) in split_pairs(connstr)? {
            let set = match key.as_str() {
                "host" => {
                    host = Some(value);
                    Ok(())
                }
                "port" => parse_port(&value).map(|p| port = p),
                "pool_size" => count(&value).map(|c| pool_size = c),
                _ => Err("unrecognized connection parameter".to_owned()),
            };
            set.map_err(|e| format!("parameter \"{key}\": {e}"))?;
        }
        let host = host.ok_or("host was not provided for the peer")?;
        Ok(Peer {
            host,
            port,
            pool_size,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers() {
        assert_eq!(
            Peer::parse("host=/tmp/pgbouncer-2  port=5555"),
            Ok(Peer {
                host: "/tmp/pgbouncer-2".to_owned(),
                port: 5555,
                pool_size: None
            })
        );
        assert_eq!(
            Peer::parse("host=h pool_size=3"),
            Ok(Peer {
                host: "h".to_owned(),
                port: 6432,
                pool_size: Some(3)
            })
        );
        assert!(Peer::parse("port=1").is_err());
        assert!(Peer::parse("host=h dbname=x").is_err());
    }

    #[test]
    fn ids() {
        assert_eq!(Peer::parse_id("1"), Ok(1));
        assert_eq!(Peer::parse_id("65535"), Ok(65535));
        assert!(Peer::parse_id("0").is_err());
        assert!(Peer::parse_id("65536").is_err());
        assert!(Peer::parse_id("one").is_err());
    }
}

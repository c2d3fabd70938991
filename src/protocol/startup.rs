//! The first packet a client sends: a StartupMessage, or one of the special requests that
//! share its framing (SSL, GSS encryption, cancel).

use super::messages::{CANCEL_REQUEST_CODE, GSSENC_REQUEST_CODE, SSL_REQUEST_CODE};
use super::BackendKey;

#[derive(Debug, PartialEq, Eq)]
pub enum StartupPacket {
    SslRequest,
    GssEncRequest,
    /// Its key is 4 bytes long (protocol 3.0) or up to 256 (3.2).
    Cancel(BackendKey),
    /// Its parameters are read with `params`, borrowed from the packet.
    Startup {
        major: u16,
        minor: u16,
    },
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum StartupError {
    #[error("bad startup packet")]
    Malformed,
    #[error("unsupported frontend protocol {0}.{1}: server supports 3.0 to 3.2")]
    UnsupportedVersion(u16, u16),
}

/// Parses the payload after the length word.
pub fn parse(payload: &[u8]) -> Result<StartupPacket, StartupError> {
    let code = payload
        .get(0..4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or(StartupError::Malformed)?;
    match code {
        SSL_REQUEST_CODE => Ok(StartupPacket::SslRequest),
        GSSENC_REQUEST_CODE => Ok(StartupPacket::GssEncRequest),
        CANCEL_REQUEST_CODE => {
            let pid = payload.get(4..8).ok_or(StartupError::Malformed)?;
            let pid = u32::from_be_bytes([pid[0], pid[1], pid[2], pid[3]]);
            BackendKey::from_wire(pid, &payload[8..])
                .map(StartupPacket::Cancel)
                .ok_or(StartupError::Malformed)
        }
        _ => {
            let major = (code >> 16) as u16;
            let minor = (code & 0xffff) as u16;
            if major != 3 {
                return Err(StartupError::UnsupportedVersion(major, minor));
            }
            // Checked here, so that `params` can trust the packet.
            for p in Params(&payload[4..]) {
                p?;
            }
            Ok(StartupPacket::Startup { major, minor })
        }
    }
}

/// The name/value pairs of a StartupMessage that `parse` accepted (malformed ones are
/// skipped), borrowed: a client logging in should not pay for a dozen small strings.
pub fn params(payload: &[u8]) -> impl Iterator<Item = (&str, &str)> {
    Params(payload.get(4..).unwrap_or_default()).map_while(Result::ok)
}

struct Params<'a>(&'a [u8]);

impl<'a> Iterator for Params<'a> {
    type Item = Result<(&'a str, &'a str), StartupError>;

    fn next(&mut self) -> Option<Self::Item> {
        let pair = (|| {
            let name = take_cstr(&mut self.0)?;
            if name.is_empty() {
                return Ok(None);
            }
            Ok(Some((name, take_cstr(&mut self.0)?)))
        })();
        match pair {
            Ok(Some(p)) => Some(Ok(p)),
            Ok(None) => None,
            Err(e) => {
                self.0 = &[];
                Some(Err(e))
            }
        }
    }
}

fn take_cstr<'a>(data: &mut &'a [u8]) -> Result<&'a str, StartupError> {
    let end = data
        .iter()
        .position(|b| *b == 0)
        .ok_or(StartupError::Malformed)?;
    let s = std::str::from_utf8(&data[..end]).map_err(|_| StartupError::Malformed)?;
    *data = &data[end + 1..];
    Ok(s)
}

/// What a `replication` startup parameter asks for (PgBouncer's column values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum Replication {
    #[default]
    None = 0,
    /// `replication=database`: a walsender bound to a database, that also runs SQL.
    Logical = 1,
    /// `replication=true`: a walsender for the whole cluster, SQL refused.
    Physical = 2,
}

impl Replication {
    /// PostgreSQL's reading of the value: `database`, or a boolean as `parse_bool` takes
    /// it (any case, unambiguous prefixes). None when it is neither.
    pub fn parse(value: &str) -> Option<Replication> {
        let v = value.to_ascii_lowercase();
        if v == "database" {
            return Some(Replication::Logical);
        }
        let prefix_of = |word: &str, min: usize| v.len() >= min && word.starts_with(v.as_str());
        if v == "1" || prefix_of("true", 1) || prefix_of("yes", 1) || prefix_of("on", 2) {
            Some(Replication::Physical)
        } else if v == "0" || prefix_of("false", 1) || prefix_of("no", 1) || prefix_of("off", 2) {
            Some(Replication::None)
        } else {
            None
        }
    }

    pub fn from_u8(v: u8) -> Replication {
        match v {
            1 => Replication::Logical,
            2 => Replication::Physical,
            _ => Replication::None,
        }
    }

    /// As SHOW CLIENTS and SHOW SERVERS give it.
    pub fn as_str(self) -> &'static str {
        match self {
            Replication::None => "none",
            Replication::Logical => "logical",
            Replication::Physical => "physical",
        }
    }

    /// The value a server connection is opened with.
    pub fn startup_value(self) -> Option<&'static str> {
        match self {
            Replication::None => None,
            Replication::Logical => Some("database"),
            Replication::Physical => Some("true"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_startup_params() {
        let mut p = 196_608u32.to_be_bytes().to_vec();
        p.extend_from_slice(b"user\0bob\0database\0db\0\0");
        assert_eq!(parse(&p), Ok(StartupPacket::Startup { major: 3, minor: 0 }));
        assert_eq!(
            params(&p).collect::<Vec<_>>(),
            vec![("user", "bob"), ("database", "db")]
        );
    }

    #[test]
    fn rejects_old_protocol_and_garbage() {
        assert_eq!(
            parse(&0x0002_0000u32.to_be_bytes()),
            Err(StartupError::UnsupportedVersion(2, 0))
        );
        let mut p = 196_608u32.to_be_bytes().to_vec();
        p.extend_from_slice(b"user\0bob");
        assert_eq!(parse(&p), Err(StartupError::Malformed));
        assert_eq!(parse(b"\0\0"), Err(StartupError::Malformed));
    }

    #[test]
    fn parses_cancel() {
        let mut p = CANCEL_REQUEST_CODE.to_be_bytes().to_vec();
        p.extend_from_slice(&7u32.to_be_bytes());
        p.extend_from_slice(&9u32.to_be_bytes());
        assert_eq!(
            parse(&p),
            Ok(StartupPacket::Cancel(BackendKey::short(7, 9)))
        );
        // Protocol 3.2: the rest of a longer key; past 256 bytes, or under 4, malformed.
        p.extend_from_slice(&[3; 28]);
        let Ok(StartupPacket::Cancel(long)) = parse(&p) else {
            panic!("a 32-byte key")
        };
        assert_eq!((long.secret, long.tail()), (9, &[3; 28][..]));
        p.extend_from_slice(&[3; 225]);
        assert_eq!(parse(&p), Err(StartupError::Malformed));
        assert_eq!(parse(&p[..4 + 4 + 3]), Err(StartupError::Malformed));
    }
    #[test]
    fn reads_replication_as_postgresql_does() {
        for v in ["database", "DATABASE"] {
            assert_eq!(Replication::parse(v), Some(Replication::Logical));
        }
        for v in ["true", "t", "TRUE", "yes", "y", "on", "1"] {
            assert_eq!(Replication::parse(v), Some(Replication::Physical), "{v}");
        }
        for v in ["false", "f", "no", "off", "of", "0"] {
            assert_eq!(Replication::parse(v), Some(Replication::None), "{v}");
        }
        for v in ["", "o", "2", "data", "truee", "physical"] {
            assert_eq!(Replication::parse(v), None, "{v}");
        }
    }
}

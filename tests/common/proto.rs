//! A raw PostgreSQL wire-protocol client, to send arbitrary (also invalid)
//! bytes and to look at exactly what comes back.

use super::TIMEOUT;
use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The fields of an ErrorResponse that tests look at.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ErrorFields {
    pub severity: String,
    pub code: String,
    pub message: String,
}

/// One backend message: type byte and body (without the length word).
#[derive(Debug, Clone)]
pub struct Msg {
    pub tag: u8,
    pub body: Vec<u8>,
}

impl Msg {
    pub fn tag_char(&self) -> char {
        self.tag as char
    }
}

/// Parses the body of an ErrorResponse / NoticeResponse.
pub fn parse_error(body: &[u8]) -> ErrorFields {
    let mut f = ErrorFields::default();
    let mut rest = body;
    while let Some((&kind, tail)) = rest.split_first() {
        if kind == 0 {
            break;
        }
        let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
        let value = String::from_utf8_lossy(&tail[..end]).into_owned();
        match kind {
            b'S' => f.severity = value,
            b'V' if f.severity.is_empty() => f.severity = value,
            b'C' => f.code = value,
            b'M' => f.message = value,
            _ => {}
        }
        rest = tail.get(end + 1..).unwrap_or(&[]);
    }
    f
}

// ---------------------------------------------------------------------------
// Frontend message builders

fn cstr(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(s.as_bytes());
    buf.push(0);
}

/// A StartupMessage with an explicit protocol version.
pub fn startup_message_version(major: u16, minor: u16, params: &[(&str, &str)]) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&major.to_be_bytes());
    body.extend_from_slice(&minor.to_be_bytes());
    for (k, v) in params {
        cstr(&mut body, k);
        cstr(&mut body, v);
    }
    body.push(0);
    let mut m = ((body.len() + 4) as u32).to_be_bytes().to_vec();
    m.extend_from_slice(&body);
    m
}

/// A protocol 3.0 StartupMessage.
pub fn startup_message(params: &[(&str, &str)]) -> Vec<u8> {
    startup_message_version(3, 0, params)
}

/// An untyped packet: length word + 4-byte code (SSLRequest, CancelRequest...).
fn special(code: u32, extra: &[u8]) -> Vec<u8> {
    let mut m = ((8 + extra.len()) as u32).to_be_bytes().to_vec();
    m.extend_from_slice(&code.to_be_bytes());
    m.extend_from_slice(extra);
    m
}

pub fn ssl_request() -> Vec<u8> {
    special(80877103, &[])
}

pub fn gssenc_request() -> Vec<u8> {
    special(80877104, &[])
}

pub fn cancel_request(pid: i32, key: i32) -> Vec<u8> {
    let mut extra = pid.to_be_bytes().to_vec();
    extra.extend_from_slice(&key.to_be_bytes());
    special(80877102, &extra)
}

/// A CancelRequest with a key of any length (protocol 3.2: 4 to 256 bytes).
pub fn cancel_request_key(pid: i32, secret: &[u8]) -> Vec<u8> {
    let mut extra = pid.to_be_bytes().to_vec();
    extra.extend_from_slice(secret);
    special(80877102, &extra)
}

/// A regular (typed) frontend message.
pub fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![tag];
    m.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    m.extend_from_slice(body);
    m
}

pub fn query(sql: &str) -> Vec<u8> {
    let mut b = Vec::new();
    cstr(&mut b, sql);
    msg(b'Q', &b)
}

/// Parse with no parameter types given.
pub fn parse(name: &str, sql: &str) -> Vec<u8> {
    let mut b = Vec::new();
    cstr(&mut b, name);
    cstr(&mut b, sql);
    b.extend_from_slice(&0u16.to_be_bytes());
    msg(b'P', &b)
}

/// Bind with text parameters and text results.
pub fn bind(portal: &str, stmt: &str, params: &[Option<&str>]) -> Vec<u8> {
    let mut b = Vec::new();
    cstr(&mut b, portal);
    cstr(&mut b, stmt);
    b.extend_from_slice(&0u16.to_be_bytes()); // all params text
    b.extend_from_slice(&(params.len() as u16).to_be_bytes());
    for p in params {
        match p {
            Some(v) => {
                b.extend_from_slice(&(v.len() as i32).to_be_bytes());
                b.extend_from_slice(v.as_bytes());
            }
            None => b.extend_from_slice(&(-1i32).to_be_bytes()),
        }
    }
    b.extend_from_slice(&0u16.to_be_bytes()); // all results text
    msg(b'B', &b)
}

/// Describe a portal ('P') or statement ('S').
pub fn describe(kind: u8, name: &str) -> Vec<u8> {
    let mut b = vec![kind];
    cstr(&mut b, name);
    msg(b'D', &b)
}

pub fn execute(portal: &str, max_rows: i32) -> Vec<u8> {
    let mut b = Vec::new();
    cstr(&mut b, portal);
    b.extend_from_slice(&max_rows.to_be_bytes());
    msg(b'E', &b)
}

pub fn sync() -> Vec<u8> {
    msg(b'S', &[])
}

/// libpq's batch to run a prepared statement (pgbench -M prepared): Bind, Describe of the
/// portal, Execute, Sync.
pub fn run_prepared(stmt: &str) -> Vec<u8> {
    [
        bind("", stmt, &[]),
        describe(b'P', ""),
        execute("", 0),
        sync(),
    ]
    .concat()
}

pub fn flush() -> Vec<u8> {
    msg(b'H', &[])
}

pub fn terminate() -> Vec<u8> {
    msg(b'X', &[])
}

pub fn password_message(password: &str) -> Vec<u8> {
    let mut b = Vec::new();
    cstr(&mut b, password);
    msg(b'p', &b)
}

// ---------------------------------------------------------------------------
// Backend message helpers

/// The text columns of a DataRow.
pub fn data_row(body: &[u8]) -> Vec<Option<String>> {
    let n = u16::from_be_bytes([body[0], body[1]]) as usize;
    let mut pos = 2;
    let mut cols = Vec::with_capacity(n);
    for _ in 0..n {
        let len = i32::from_be_bytes(body[pos..pos + 4].try_into().unwrap());
        pos += 4;
        if len < 0 {
            cols.push(None);
        } else {
            let len = len as usize;
            cols.push(Some(
                String::from_utf8_lossy(&body[pos..pos + len]).into_owned(),
            ));
            pos += len;
        }
    }
    cols
}

/// The result of a simple query over a raw connection.
pub type Rows = Vec<Vec<Option<String>>>;

/// A raw protocol connection over TCP.
pub struct RawConn {
    pub stream: TcpStream,
    buf: Vec<u8>,
    /// ParameterStatus values received so far.
    pub params: HashMap<String, String>,
    /// BackendKeyData (pid, key), once received.
    pub key: Option<(i32, i32)>,
    /// The whole secret of that key (4 bytes, or up to 256 in protocol 3.2).
    pub secret: Vec<u8>,
}

impl RawConn {
    /// Opens a TCP connection to 127.0.0.1:port (nothing sent yet).
    pub fn connect(port: u16) -> RawConn {
        Self::connect_addr(&format!("127.0.0.1:{port}"))
    }

    pub fn connect_addr(addr: &str) -> RawConn {
        let stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        stream.set_read_timeout(Some(TIMEOUT)).unwrap();
        stream.set_write_timeout(Some(TIMEOUT)).unwrap();
        stream.set_nodelay(true).unwrap();
        RawConn {
            stream,
            buf: Vec::new(),
            params: HashMap::new(),
            key: None,
            secret: Vec::new(),
        }
    }

    /// Connects, sends a 3.0 StartupMessage with `user`, `database` and
    /// `extra` parameters, and reads up to the first ReadyForQuery. Supports
    /// trust and cleartext-password authentication (when `password` is given).
    pub fn startup(
        port: u16,
        user: &str,
        db: &str,
        extra: &[(&str, &str)],
    ) -> Result<RawConn, ErrorFields> {
        Self::startup_pw(port, user, db, extra, None)
    }

    pub fn startup_pw(
        port: u16,
        user: &str,
        db: &str,
        extra: &[(&str, &str)],
        password: Option<&str>,
    ) -> Result<RawConn, ErrorFields> {
        let mut c = RawConn::connect(port);
        let mut params = vec![("user", user), ("database", db)];
        params.extend_from_slice(extra);
        c.send(&startup_message(&params));
        c.answer_login(password)?;
        Ok(c)
    }

    /// Logs in as postgres to database postgres asking for protocol 3.`minor` (trust).
    pub fn startup_minor(port: u16, minor: u16) -> RawConn {
        let mut c = RawConn::connect(port);
        let params = [("user", "postgres"), ("database", "postgres")];
        c.send(&startup_message_version(3, minor, &params));
        c.finish_login();
        c
    }

    /// Reads the server's side of a login after the startup message was sent, up to
    /// ReadyForQuery; trust auth only.
    pub fn finish_login(&mut self) {
        if let Err(e) = self.answer_login(None) {
            panic!("login failed: {e:?}");
        }
    }

    fn answer_login(&mut self, password: Option<&str>) -> Result<(), ErrorFields> {
        let c = self;
        loop {
            let m = c.read_message_or_panic("startup");
            match m.tag {
                b'R' => {
                    let code = u32::from_be_bytes(m.body[0..4].try_into().unwrap());
                    match (code, password) {
                        (0, _) => {}
                        (3, Some(pw)) => c.send(&password_message(pw)),
                        _ => panic!("raw client cannot do authentication request {code}"),
                    }
                }
                b'S' => {
                    let parts: Vec<&[u8]> = m.body.split(|&b| b == 0).collect();
                    c.params.insert(
                        String::from_utf8_lossy(parts[0]).into_owned(),
                        String::from_utf8_lossy(parts.get(1).copied().unwrap_or_default())
                            .into_owned(),
                    );
                }
                b'K' => {
                    let pid = i32::from_be_bytes(m.body[0..4].try_into().unwrap());
                    let key = i32::from_be_bytes(m.body[4..8].try_into().unwrap());
                    c.key = Some((pid, key));
                    c.secret = m.body[4..].to_vec();
                }
                b'E' => return Err(parse_error(&m.body)),
                b'Z' => return Ok(()),
                _ => {}
            }
        }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream
            .write_all(bytes)
            .unwrap_or_else(|e| panic!("write to server failed: {e}"));
    }

    /// Like `send`, but reports failure (the peer may have closed already).
    pub fn try_send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)
    }

    pub fn set_read_timeout(&self, t: Duration) {
        self.stream.set_read_timeout(Some(t)).unwrap();
    }

    fn fill(&mut self, need: usize) -> std::io::Result<bool> {
        let mut chunk = [0u8; 65536];
        while self.buf.len() < need {
            match self.stream.read(&mut chunk) {
                Ok(0) => return Ok(false),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Reads one byte (the answer to SSLRequest / GSSENCRequest).
    pub fn read_byte(&mut self) -> std::io::Result<Option<u8>> {
        if !self.fill(1)? {
            return Ok(None);
        }
        Ok(Some(self.buf.remove(0)))
    }

    /// Reads one backend message. `Ok(None)` on EOF (or reset); `Err` on
    /// timeout.
    pub fn read_message(&mut self) -> std::io::Result<Option<Msg>> {
        if !self.fill(5)? {
            return Ok(None);
        }
        let len = u32::from_be_bytes(self.buf[1..5].try_into().unwrap()) as usize;
        assert!(len >= 4, "backend sent a message with length {len}");
        if !self.fill(1 + len)? {
            return Ok(None);
        }
        let tag = self.buf[0];
        let body = self.buf[5..1 + len].to_vec();
        self.buf.drain(..1 + len);
        Ok(Some(Msg { tag, body }))
    }

    /// Reads one message; panics on EOF or timeout, naming `what`.
    pub fn read_message_or_panic(&mut self, what: &str) -> Msg {
        match self.read_message() {
            Ok(Some(m)) => m,
            Ok(None) => panic!("connection closed while waiting for {what}"),
            Err(e) => panic!("no answer while waiting for {what}: {e}"),
        }
    }

    /// Reads messages until an ErrorResponse; panics if the connection closes
    /// or times out first.
    pub fn expect_error(&mut self) -> ErrorFields {
        let mut seen = Vec::new();
        loop {
            match self.read_message() {
                Ok(Some(m)) if m.tag == b'E' => return parse_error(&m.body),
                Ok(Some(m)) => seen.push(m.tag_char()),
                Ok(None) => {
                    panic!("connection closed without an ErrorResponse (saw messages {seen:?})")
                }
                Err(e) => {
                    panic!("no ErrorResponse within the timeout ({e}; saw messages {seen:?})")
                }
            }
        }
    }

    /// Reads messages until an ErrorResponse or EOF; `None` on EOF. Panics on
    /// timeout.
    pub fn error_or_eof(&mut self) -> Option<ErrorFields> {
        loop {
            match self.read_message() {
                Ok(Some(m)) if m.tag == b'E' => return Some(parse_error(&m.body)),
                Ok(Some(_)) => {}
                Ok(None) => return None,
                Err(e) => panic!("neither an ErrorResponse nor a close within the timeout: {e}"),
            }
        }
    }

    /// True when the peer closes the connection (after possibly sending some
    /// messages) within the read timeout.
    pub fn closes(&mut self) -> bool {
        loop {
            match self.read_message() {
                Ok(Some(_)) => {}
                Ok(None) => return true,
                Err(_) => return false,
            }
        }
    }

    /// Reads messages up to and including ReadyForQuery, returning them all.
    pub fn read_until_ready(&mut self) -> Vec<Msg> {
        let mut out = Vec::new();
        loop {
            let m = self.read_message_or_panic("ReadyForQuery");
            let done = m.tag == b'Z';
            out.push(m);
            if done {
                return out;
            }
        }
    }

    /// Sends a simple Query and collects its rows (text), or its first error.
    /// Reads through ReadyForQuery either way.
    pub fn simple_query(&mut self, sql: &str) -> Result<Rows, ErrorFields> {
        self.send(&query(sql));
        let mut rows = Vec::new();
        let mut err = None;
        for m in self.read_until_ready() {
            match m.tag {
                b'D' => rows.push(data_row(&m.body)),
                b'E' if err.is_none() => err = Some(parse_error(&m.body)),
                b'S' => {
                    let parts: Vec<&[u8]> = m.body.split(|&b| b == 0).collect();
                    self.params.insert(
                        String::from_utf8_lossy(parts[0]).into_owned(),
                        String::from_utf8_lossy(parts.get(1).copied().unwrap_or_default())
                            .into_owned(),
                    );
                }
                _ => {}
            }
        }
        match err {
            Some(e) => Err(e),
            None => Ok(rows),
        }
    }

    /// A query expected to return one value.
    pub fn query_one(&mut self, sql: &str) -> String {
        let rows = self
            .simple_query(sql)
            .unwrap_or_else(|e| panic!("query {sql} failed: {e:?}"));
        assert_eq!(rows.len(), 1, "expected one row from {sql}: {rows:?}");
        rows[0][0].clone().unwrap_or_default()
    }
}

/// What a client sees of a batch's replies: tags, errors by SQLSTATE, rows by values, and
/// the number of fields a RowDescription announces.
pub fn replies(c: &mut RawConn) -> Vec<String> {
    c.read_until_ready()
        .iter()
        .filter_map(|m| match m.tag {
            b'E' => Some(format!("E {}", parse_error(&m.body).code)),
            b'D' => Some(format!("D {:?}", data_row(&m.body))),
            b'T' => Some(format!("T {}", u16::from_be_bytes([m.body[0], m.body[1]]))),
            b'N' | b'S' => None,
            _ => Some(m.tag_char().to_string()),
        })
        .collect()
}

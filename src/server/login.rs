//! Opening a server connection: connect, authenticate, collect the session parameters.

use std::io;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, UnixStream};

use weir_auth::scram::{Binding, ClientSession, Credential, MECHANISM, MECHANISM_PLUS};
use weir_auth::Secret;

use super::{BackendKey, ServerAddr, ServerConn};
use crate::params::ParamSet;
use crate::protocol::messages::{
    self, AUTH_CLEARTEXT, AUTH_MD5, AUTH_OK, AUTH_SASL, AUTH_SASL_CONTINUE, AUTH_SASL_FINAL,
};
use crate::protocol::reader::read_message;
use crate::protocol::PgError;
use crate::registry::servers::ServerHandle;
use crate::stream::Stream;
use crate::tls::connect::{ServerTls, TlsError};

/// Everything needed to open one server connection for a pool.
#[derive(Debug, Clone)]
pub struct ServerTarget {
    /// The address of the attempt under way: the entry's first host until `connect`
    /// picks one of `hosts`.
    pub addr: ServerAddr,
    /// All the entry's hosts and how to choose among them.
    pub hosts: std::sync::Arc<super::hosts::HostSet>,
    /// What a host must be for this pool's connections: the entry's target_session_attrs,
    /// or for a split entry a writable host (its pool of reads: prefer-standby).
    pub attrs: weir_config::TargetSessionAttrs,
    pub user: String,
    pub database: String,
    /// The password or stored secret to answer the server's challenge with.
    pub secret: Option<Secret>,
    /// Startup parameters beyond user and database (client_encoding, DateStyle, ...).
    pub startup_params: Vec<(String, String)>,
    pub connect_query: Option<String>,
    pub connect_timeout: Duration,
    pub tcp: crate::tcp_options::TcpOptions,
    /// server_tls_sslmode and the rustls configuration for it.
    pub tls: std::sync::Arc<ServerTls>,
    pub generation: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("server closed the connection")]
    Closed,
    #[error("server connection timed out")]
    Timeout,
    /// Shown as PgBouncer logs it, severity and message: the SQLSTATE is no part of it.
    #[error("{} {}", .0.severity, .0.message)]
    Server(PgError),
    #[error("{0}")]
    Auth(String),
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    #[error("{0}")]
    Tls(#[from] TlsError),
}

impl ConnectError {
    /// The error a client waiting on this connection is told.
    pub fn to_client_error(&self) -> PgError {
        match self {
            ConnectError::Server(e) => {
                let mut e = e.clone();
                e.severity = "FATAL".into();
                e
            }
            ConnectError::Timeout => PgError::fatal("08006", "server connection timed out"),
            other => PgError::fatal("08006", format!("server login failed: {other}")),
        }
    }
}

/// PgBouncer's `server login failed: wrong password type`: the stored secret is of a kind
/// the method PostgreSQL asks for cannot use (SCRAM for md5, md5 for SCRAM).
fn wrong_password_type() -> ConnectError {
    ConnectError::Auth("wrong password type".into())
}

/// The server's side of a login, sans I/O: each message it sends is a `step`, and the
/// answers to send back are written to `out`. Apart so that what a server says is
/// parsed (and fuzzed, see crate::fuzzing) without a socket.
pub struct Login<'a> {
    user: &'a str,
    secret: Option<&'a Secret>,
    scram_keys: Option<Credential>,
    /// What SCRAM-SHA-256-PLUS would bind to: the server certificate's hash over TLS.
    binding: Binding,
    scram: Option<ClientSession>,
    pub params: ParamSet,
    pub key: Option<BackendKey>,
    /// The protocol version asked for, then the one the server agreed to.
    pub protocol: u32,
}

impl<'a> Login<'a> {
    pub fn new(
        user: &'a str,
        secret: Option<&'a Secret>,
        scram_keys: Option<Credential>,
        binding: Binding,
    ) -> Login<'a> {
        Login {
            user,
            secret,
            scram_keys,
            binding,
            scram: None,
            params: ParamSet::default(),
            key: None,
            protocol: messages::PROTOCOL_3_2,
        }
    }

    /// Takes one server message; true once it is ReadyForQuery (logged in).
    pub fn step(
        &mut self,
        tag: u8,
        mut body: bytes::Bytes,
        out: &mut BytesMut,
    ) -> Result<bool, ConnectError> {
        match tag {
            b'R' => {
                if body.len() < 4 {
                    return Err(ConnectError::Protocol("short authentication request"));
                }
                let code = body.get_u32();
                match code {
                    AUTH_OK => {}
                    AUTH_CLEARTEXT => match self.secret {
                        Some(Secret::Plain(p)) => {
                            let mut data = p.as_bytes().to_vec();
                            data.push(0);
                            messages::password_message(out, &data);
                        }
                        _ => {
                            return Err(ConnectError::Auth(
                                "server asks for a cleartext password, and none is configured"
                                    .into(),
                            ))
                        }
                    },
                    AUTH_MD5 => {
                        if body.len() < 4 {
                            return Err(ConnectError::Protocol("short md5 salt"));
                        }
                        let salt = [body[0], body[1], body[2], body[3]];
                        let response = match self.secret {
                            // PgBouncer's words: a SCRAM secret cannot answer md5.
                            Some(Secret::Scram(_)) => return Err(wrong_password_type()),
                            s => s.and_then(|s| weir_auth::md5_response(self.user, s, salt))
                                .ok_or_else(|| ConnectError::Auth("server asks for md5, and no password or md5 secret is configured".into()))?,
                        };
                        let mut data = response.into_bytes();
                        data.push(0);
                        messages::password_message(out, &data);
                    }
                    AUTH_SASL => {
                        let offered =
                            |name: &str| body.split(|b| *b == 0).any(|m| m == name.as_bytes());
                        let offers_scram = offered(MECHANISM);
                        let plus =
                            offered(MECHANISM_PLUS) && matches!(self.binding, Binding::EndPoint(_));
                        if !offers_scram && !plus {
                            return Err(ConnectError::Auth(
                                "server offers no SASL mechanism Weir supports".into(),
                            ));
                        }
                        let credential = match (self.secret, self.scram_keys.clone()) {
                            (Some(Secret::Plain(p)), _) => Credential::Password(p.clone()),
                            (_, Some(keys)) => keys,
                            (Some(Secret::Md5(_)), None) => return Err(wrong_password_type()),
                            _ => return Err(ConnectError::Auth("server asks for SCRAM, and neither a password nor the client's SCRAM keys are available".into())),
                        };
                        let binding = match &self.binding {
                            Binding::EndPoint(_) if !plus => Binding::Unused,
                            b => b.clone(),
                        };
                        let mut session = ClientSession::new(credential).with_binding(binding);
                        let first = session.client_first();
                        tracing::debug!("SCRAM login as {}", session.mechanism());
                        messages::sasl_initial_response(out, session.mechanism(), &first);
                        self.scram = Some(session);
                    }
                    AUTH_SASL_CONTINUE => {
                        let session = self
                            .scram
                            .as_mut()
                            .ok_or(ConnectError::Protocol("SASL continue without SASL"))?;
                        let reply = session
                            .server_first(&body)
                            .map_err(|e| ConnectError::Auth(e.to_string()))?;
                        messages::password_message(out, &reply);
                    }
                    AUTH_SASL_FINAL => {
                        let session = self
                            .scram
                            .as_mut()
                            .ok_or(ConnectError::Protocol("SASL final without SASL"))?;
                        session
                            .server_final(&body)
                            .map_err(|e| ConnectError::Auth(e.to_string()))?;
                    }
                    _ => {
                        return Err(ConnectError::Auth(format!(
                            "unsupported authentication method {code}"
                        )))
                    }
                }
            }
            b'E' => return Err(ConnectError::Server(PgError::parse(&body))),
            b'S' => {
                self.params.apply_status(&body);
            }
            b'K' => {
                if body.len() < 8 {
                    return Err(ConnectError::Protocol("short BackendKeyData"));
                }
                let pid = body.get_u32();
                // Whatever its length (protocol 3.2: up to 256 bytes), the key is kept
                // whole: a cancel request must give it back so.
                let key = BackendKey::from_wire(pid, &body)
                    .ok_or(ConnectError::Protocol("BackendKeyData of a bad length"))?;
                self.key = Some(key);
            }
            b'Z' => return Ok(true),
            b'N' => {}
            // A server older than the protocol asked for (PostgreSQL before 18 asked for
            // 3.2) names the newest it speaks, and the login goes on in that.
            b'v' => {
                self.protocol = super::version::negotiated(&body, self.protocol).ok_or(
                    ConnectError::Protocol("server offers a protocol version Weir does not speak"),
                )?;
            }
            _ => return Err(ConnectError::Protocol("unexpected message during login")),
        }
        Ok(false)
    }
}

/// Connects and logs in to one of the target's hosts (see `hosts`), each attempt within
/// the connect timeout.
pub async fn connect(
    target: &ServerTarget,
    scram_keys: Option<Credential>,
) -> Result<ServerConn, ConnectError> {
    super::hosts::connect(
        &target.hosts,
        target.attrs,
        target.connect_timeout,
        |addr| {
            let mut one = target.clone();
            one.addr = addr.clone();
            let keys = scram_keys.clone();
            async move {
                match crate::timers::timeout(one.connect_timeout, connect_inner(&one, keys)).await {
                    Ok(r) => r,
                    Err(_) => Err(ConnectError::Timeout),
                }
            }
        },
    )
    .await
}

tokio::task_local! {
    /// Set while connect_one logs in: a connection of Weir's own (a host check, an LSN
    /// query), not one of a pool's.
    static OWN_PROBE: bool;
}

/// Connects and logs in to one given address, within the connect timeout (host checks).
pub async fn connect_one(
    target: &ServerTarget,
    addr: &ServerAddr,
    timeout: Duration,
    scram_keys: Option<Credential>,
) -> Result<ServerConn, ConnectError> {
    let mut one = target.clone();
    one.addr = addr.clone();
    let login = OWN_PROBE.scope(true, connect_inner(&one, scram_keys));
    match crate::timers::timeout(timeout, login).await {
        Ok(r) => r,
        Err(_) => Err(ConnectError::Timeout),
    }
}

async fn open(addr: &ServerAddr, tcp: &crate::tcp_options::TcpOptions) -> io::Result<Stream> {
    Ok(match addr {
        ServerAddr::Tcp { host, port } => {
            let s = TcpStream::connect((host.as_str(), *port)).await?;
            tcp.apply(socket2::SockRef::from(&s))?;
            Stream::Tcp(s)
        }
        ServerAddr::Unix { path } => Stream::Unix(UnixStream::connect(path).await?),
    })
}

/// TLS is asked for over TCP only: PostgreSQL has none on its Unix sockets (and libpq
/// and PgBouncer ignore sslmode there).
async fn connect_inner(
    target: &ServerTarget,
    scram_keys: Option<Credential>,
) -> Result<ServerConn, ConnectError> {
    let ServerAddr::Tcp { host, .. } = &target.addr else {
        return attempt(target, scram_keys, None).await;
    };
    match target.tls.mode {
        weir_config::SslMode::Disable => attempt(target, scram_keys, None).await,
        // allow: in the clear first; TLS only when the server refused that login.
        weir_config::SslMode::Allow => match attempt(target, scram_keys.clone(), None).await {
            Err(ConnectError::Server(e)) => {
                tracing::debug!(addr = %target.addr, "plain login refused ({e}); trying TLS (server_tls_sslmode allow)");
                match attempt(target, scram_keys, Some((host, true))).await {
                    // No TLS there either: the refusal of the plain login is the news.
                    Err(ConnectError::Tls(TlsError::Refused(_))) => Err(ConnectError::Server(e)),
                    r => r,
                }
            }
            r => r,
        },
        _ => attempt(target, scram_keys, Some((host, target.tls.required()))).await,
    }
}

/// One login; `tls` is the host name to check the certificate against, and whether the
/// server must agree to TLS, when TLS is to be asked for. Protocol 3.2 is asked for, and
/// 3.0 again at once from a server that refuses it (server::version).
async fn attempt(
    target: &ServerTarget,
    scram_keys: Option<Credential>,
    tls: Option<(&str, bool)>,
) -> Result<ServerConn, ConnectError> {
    let asked = super::version::for_server(&target.addr);
    let mut first_word = true;
    match attempt_as(target, scram_keys.clone(), tls, asked, &mut first_word).await {
        Err(e) if super::version::refused_3_2(&target.addr, asked, first_word, &e) => {
            let v3_0 = messages::PROTOCOL_3_0;
            attempt_as(target, scram_keys, tls, v3_0, &mut first_word).await
        }
        r => r,
    }
}

/// One login asking for protocol `asked`; `first_word` stays true until the server has
/// said anything but an error.
async fn attempt_as(
    target: &ServerTarget,
    scram_keys: Option<Credential>,
    tls: Option<(&str, bool)>,
    asked: u32,
    first_word: &mut bool,
) -> Result<ServerConn, ConnectError> {
    let id = ServerConn::next_id();
    let names = (target.database.as_str(), &*target.hosts.name);
    let info = ServerHandle::register(id, &target.user, names, &target.addr);
    let mut stream = open(&target.addr, &target.tcp).await?;
    info.0.set_local(stream.local());
    // Weir's own probes are no connections of PgBouncer's, whose lines log parsers count.
    if !OWN_PROBE.try_with(|p| *p).unwrap_or(false) {
        crate::conn_log::server_opened(&info.0);
    }
    if let Some((host, required)) = tls {
        stream = crate::tls::connect::upgrade(stream, &target.tls, host, required).await?;
    }
    // What SCRAM binds to in TLS: the hash of the server's certificate.
    let binding = match crate::tls::connect::session(&stream) {
        Some(conn) => {
            info.0.set_tls(crate::tls::connect::describe(conn));
            conn.peer_certificates()
                .and_then(|c| c.first())
                .and_then(|c| crate::tls::end_point(c))
                .map_or(Binding::Unused, Binding::EndPoint)
        }
        None => Binding::None,
    };
    let mut params: Vec<(&str, &str)> =
        vec![("user", &target.user), ("database", &target.database)];
    params.extend(
        target
            .startup_params
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str())),
    );
    stream
        .write_all(&messages::startup_message(asked, &params))
        .await?;

    let mut buf = BytesMut::with_capacity(1024);
    let mut out = BytesMut::new();
    let mut login = Login::new(&target.user, target.secret.as_ref(), scram_keys, binding);
    login.protocol = asked;
    loop {
        let msg = read_message(&mut stream, &mut buf, 1 << 20).await?;
        out.clear();
        let done = login.step(msg.tag, msg.body, &mut out)?;
        *first_word = false;
        if !out.is_empty() {
            stream.write_all(&out).await?;
        }
        if done {
            break;
        }
    }
    let Login {
        params: server_params,
        key,
        protocol,
        ..
    } = login;
    let now = Instant::now();
    let key = key.unwrap_or(BackendKey::short(0, 0));
    tracing::debug!(
        server = %target.addr,
        "logged in with protocol 3.{}, a cancel key of {} bytes",
        protocol & 0xffff,
        key.secret_len()
    );
    info.0.set_logged_in(key.pid);
    let mut conn = ServerConn {
        id,
        info,
        stream,
        params: server_params,
        synced_to: None,
        key,
        addr: std::sync::Arc::new(target.addr.clone()),
        created: now,
        idle_since: now,
        generation: target.generation,
        home: crate::workers::current(),
        sent_ahead: 0,
        owed_internal: 0,
        prefix_rest: bytes::Bytes::new(),
        statements: Default::default(),
        gucs: None,
        passengers: Default::default(),
        carry: Default::default(),
    };
    if let Some(q) = &target.connect_query {
        conn.run_internal(q, target.connect_timeout).await?;
    }
    Ok(conn)
}

//! A session moved between processes by an online restart (crate::takeover): what an idle
//! client's session is made of, written out by the old process and rebuilt by the new one
//! around the same socket. Only a client that holds nothing but its own state moves: no
//! server, no bytes half-read, no reply owed, nothing pinning it to a server, and no TLS
//! session (rustls' state cannot be carried across).

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use serde::{Deserialize, Serialize};
use weir_auth::scram::Credential;

use super::{ClientCount, Extras, Session, Timeouts, LISTENING, LOST, PINNED};
use crate::app::App;
use crate::params::ParamSet;
use crate::pool::{Lease, PoolMode};
use crate::registry::clients::ClientHandle;
use crate::registry::handover;
use crate::registry::servers::ServerHandle;
use crate::server::{BackendKey, ServerAddr, ServerConn};
use crate::stream::{Endpoint, StdSocket, Stream};

/// The state of one client, as the takeover channel carries it (JSON: it is read by
/// another build of Weir, which must tell a missing field from a wrong one).
#[derive(Serialize, Deserialize)]
pub struct Moved {
    unix: bool,
    pid: u32,
    secret: u32,
    /// A protocol 3.2 client's key beyond its first 4 bytes.
    #[serde(default)]
    secret_tail: Option<Vec<u8>>,
    user: String,
    database: String,
    /// The pool's user: the forced user of the database entry, else `user`.
    pool_user: String,
    application_name: String,
    connect_time: u64,
    /// What the client believes its reported parameters are.
    wanted: Vec<(String, String)>,
    /// Its parameters as of login, which RESET ALL goes back to.
    startup: Option<Vec<(String, String)>>,
    #[serde(default)]
    gucs: Option<Vec<(String, String)>>,
    #[serde(default)]
    startup_gucs: Option<Vec<(String, String)>>,
    #[serde(default)]
    unnamed_params: Vec<u16>,
    /// Named statements: name, prepared by SQL PREPARE, and the body as Weir keeps it.
    #[serde(default)]
    statements: Vec<(Vec<u8>, bool, Vec<u8>)>,
    /// SCRAM keys from the client's own proof, for logging servers in without a password.
    #[serde(default)]
    scram_keys: Option<([u8; 32], [u8; 32])>,
    #[serde(default)]
    scram_password: Option<String>,
    /// The secret the pool logs servers in with, when auth_query learnt it at a login on
    /// the old process: the new process's pool has none until a client logs in there.
    #[serde(default)]
    pool_secret: Option<String>,
    /// read_write_split: the client wrote, and its reads wait for the standbys to replay
    /// the write (the old process's record of it means nothing to the new one, which waits
    /// for a position taken after the move instead, later than the write).
    #[serde(default)]
    wrote: bool,
    /// How long it has been idle (client_idle_timeout keeps counting).
    idle_ms: u64,
    /// Session mode: the server that moves with it.
    #[serde(default)]
    server: Option<MovedServer>,
}

/// A server connection lent to a session-mode client, between its transactions.
#[derive(Serialize, Deserialize)]
struct MovedServer {
    host: Option<String>,
    port: u16,
    path: Option<std::path::PathBuf>,
    pid: u32,
    secret: u32,
    /// A protocol 3.2 server's key beyond its first 4 bytes.
    #[serde(default)]
    secret_tail: Option<Vec<u8>>,
    /// What the server has reported with ParameterStatus.
    params: Vec<(String, String)>,
    age_ms: u64,
}

impl Session {
    /// Idle, with nothing half-done and nothing a new process could not take over.
    fn idle_and_plain(&self) -> bool {
        self.inbuf.is_empty()
            && self.outbuf.is_empty()
            && !self.held_back
            && !self.shutting_down
            && self.touched == 0
            && self.ties & (PINNED | LISTENING | LOST) == 0
            && !self.stream.is_tls()
            && self.extras.as_ref().is_none_or(|x| {
                x.requested.is_none()
                    && x.touched_names.is_empty()
                    && x.prepared
                        .as_ref()
                        .is_none_or(|p| p.replies.is_empty() && p.ahead.is_empty())
            })
    }

    /// Whether the session can move now: without a server in the pooled modes, with the
    /// one it holds in session mode.
    pub(crate) fn movable(&self) -> bool {
        if !self.idle_and_plain() {
            return false;
        }
        match self.extras.as_ref().and_then(|x| x.handoff.as_ref()) {
            Some(server) => server_movable(server),
            None => self.mode != PoolMode::Session,
        }
    }

    /// In session mode during an online restart, a transaction's end is where the client
    /// and its server move (unless the server is to be given up anyway).
    pub(super) fn moves_with_server(&self, held: &Lease) -> bool {
        self.mode == PoolMode::Session
            && crate::registry::handover::moving()
            && !self.shutting_down
            && !(self.fast_close && held.generation != self.pool.settings().target.generation)
    }

    pub(super) fn movable_with(&self, held: &Lease) -> bool {
        self.idle_and_plain() && self.server_is_clean() && server_movable(held)
    }
}

/// A server moves with its client unless TLS holds it, or it holds statements under
/// Weir's names (their numbering is the old process's own).
fn server_movable(server: &Lease) -> bool {
    !server.stream.is_tls() && server.sent_ahead == 0 && server.statements.len() == 0
}

/// Sends an idle session to the new process of an online restart (the session ends
/// here; its client does not notice). Err gives back a session that cannot move, or all
/// of them once the new process is gone.
pub fn hand(session: Box<Session>) -> Result<(), Box<Session>> {
    if !session.movable() {
        return Err(session);
    }
    let Some(tx) = handover::outbox_sender() else {
        return Err(session);
    };
    // Counted before the session (and its place in the client count) goes.
    let in_flight = handover::InFlight::new();
    // A movable session that cannot be written out would be asked again at once: the
    // move stops instead, and the clients left finish here.
    let (text, fds) = pack(session).inspect_err(|_| {
        tracing::error!("online restart: a client could not be moved; the rest stay here");
        handover::stop_moving();
    })?;
    if tx
        .send(handover::Parcel::new(text, fds, in_flight))
        .is_err()
    {
        tracing::error!("online restart: a client was lost on its way to the new process");
        handover::stop_moving();
    }
    Ok(())
}

/// Writes out an idle session and takes its socket (and its server's, in session mode);
/// the session then ends here without closing anything the client sees. Err gives back a
/// session that cannot move.
pub fn pack(mut session: Box<Session>) -> Result<(Vec<u8>, Vec<OwnedFd>), Box<Session>> {
    if !session.movable() {
        return Err(session);
    }
    session.flush_stats();
    let info = session.client.0.clone();
    let pairs = |p: &ParamSet| {
        p.iter()
            .map(|(n, v)| (n.to_owned(), v.to_owned()))
            .collect()
    };
    let gucs = |g: &Option<Arc<crate::gucs::Gucs>>| {
        g.as_ref().map(|g| {
            g.iter()
                .map(|(n, v)| (n.to_owned(), v.to_owned()))
                .collect::<Vec<_>>()
        })
    };
    let extras = session.extras.as_deref();
    let (scram_keys, scram_password) = match extras.and_then(|x| x.scram_keys.as_ref()) {
        Some(Credential::Keys {
            client_key,
            server_key,
        }) => (Some((*client_key, *server_key)), None),
        Some(Credential::Password(p)) => (None, Some(p.clone())),
        None => (None, None),
    };
    let moved = Moved {
        unix: matches!(
            session.stream,
            Stream::Unix(_) | Stream::Parked(StdSocket::Unix(_))
        ),
        pid: info.key.pid,
        secret: info.key.secret,
        secret_tail: info.key.tail.as_ref().map(|t| t.to_vec()),
        user: info.user.to_string(),
        database: info.database.to_string(),
        pool_user: session.pool.user.clone(),
        application_name: info.application_name.to_string(),
        connect_time: info.connect_time,
        wanted: pairs(&session.wanted),
        startup: info.startup().map(|s| pairs(&s)),
        gucs: extras.and_then(|x| gucs(&x.gucs)),
        startup_gucs: extras.and_then(|x| gucs(&x.startup_gucs)),
        unnamed_params: extras.map(|x| x.unnamed_params.clone()).unwrap_or_default(),
        statements: extras
            .and_then(|x| x.prepared.as_ref())
            .map(|p| {
                p.names
                    .iter()
                    .map(|(name, def)| (name.to_vec(), def.sql, def.body.to_vec()))
                    .collect()
            })
            .unwrap_or_default(),
        scram_keys,
        scram_password,
        pool_secret: session
            .pool
            .settings()
            .target
            .secret
            .as_ref()
            .map(|s| match s {
                weir_auth::Secret::Plain(p) | weir_auth::Secret::Md5(p) => p.clone(),
                weir_auth::Secret::Scram(v) => v.to_string(),
            }),
        wrote: extras.is_some_and(|x| x.pending_write.is_some()),
        idle_ms: session.idle_since.elapsed().as_millis() as u64,
        server: extras
            .and_then(|x| x.handoff.as_ref())
            .map(|server| MovedServer {
                host: match &*server.addr {
                    ServerAddr::Tcp { host, .. } => Some(host.clone()),
                    ServerAddr::Unix { .. } => None,
                },
                port: match &*server.addr {
                    ServerAddr::Tcp { port, .. } => *port,
                    ServerAddr::Unix { .. } => 0,
                },
                path: match &*server.addr {
                    ServerAddr::Unix { path } => Some(path.clone()),
                    ServerAddr::Tcp { .. } => None,
                },
                pid: server.key.pid,
                secret: server.key.secret,
                secret_tail: server.key.tail.as_ref().map(|t| t.to_vec()),
                params: pairs(&server.params),
                age_ms: server.created.elapsed().as_millis() as u64,
            }),
    };
    let Ok(text) = serde_json::to_vec(&moved) else {
        return Err(session);
    };
    // The server's socket first: should it fail, the session goes on as it was.
    let mut fds = Vec::with_capacity(2);
    if let Some(server) = session.extras.as_mut().and_then(|x| x.handoff.as_mut()) {
        if server.stream.park().is_err() {
            let _ = server.stream.unpark();
            return Err(session);
        }
    }
    if session.stream.park().is_err() {
        if let Some(server) = session.extras.as_mut().and_then(|x| x.handoff.as_mut()) {
            let _ = server.stream.unpark();
        }
        let _ = session.stream.unpark();
        return Err(session);
    }
    fds.push(take_fd(&mut session.stream));
    if let Some(server) = session
        .extras
        .as_mut()
        .and_then(|x| x.handoff.take())
        .and_then(|l| l.hand_off())
    {
        let mut server = server;
        fds.push(take_fd(&mut server.stream));
    }
    if fds.iter().any(Option::is_none) {
        return Err(session);
    }
    Ok((text, fds.into_iter().flatten().collect()))
}

/// The socket of a parked stream, which is left closed.
fn take_fd(stream: &mut Stream) -> Option<OwnedFd> {
    match std::mem::replace(stream, Stream::Parked(StdSocket::None)) {
        Stream::Parked(StdSocket::Tcp(s)) => Some(s.into()),
        Stream::Parked(StdSocket::Unix(s)) => Some(s.into()),
        _ => None,
    }
}

/// Rebuilds a session moved from the previous process around its socket, and gives it a
/// task. The client notices nothing: its next request runs here.
pub fn adopt(app: &Arc<App>, text: &[u8], fds: Vec<OwnedFd>) -> Result<(), String> {
    let moved: Moved =
        serde_json::from_slice(text).map_err(|e| format!("unreadable client state: {e}"))?;
    let mut fds = fds.into_iter();
    let fd = fds.next().ok_or("a client came without its socket")?;
    let server_fd = match (&moved.server, fds.next()) {
        (Some(_), Some(fd)) => Some(fd),
        (None, None) => None,
        _ => return Err("a client came without its server's socket".into()),
    };
    let (socket, peer, local) = if moved.unix {
        let s = std::os::unix::net::UnixStream::from(fd);
        (StdSocket::Unix(s), Endpoint::Unix, Endpoint::Unix)
    } else {
        let s = std::net::TcpStream::from(fd);
        let peer = s.peer_addr().map_or(Endpoint::Unknown, Endpoint::tcp);
        let local = s.local_addr().map_or(Endpoint::Unknown, Endpoint::tcp);
        (StdSocket::Tcp(s), peer, local)
    };
    let snap = app.snapshot.load_full();
    let count = ClientCount::new(app);
    let Some(pool) = app.pool_as(&snap, &moved.database, &moved.pool_user) else {
        // The new configuration has no such database: the client is told, as a client of
        // a database removed by a reload would be.
        let mut stream = Stream::Parked(socket);
        crate::workers::spawn_on(
            moved.pid as usize % crate::workers::count().max(1),
            async move {
                if stream.unpark().is_ok() {
                    let e = crate::protocol::PgError::fatal("08P01", "database removed");
                    super::refuse(&mut stream, &e).await;
                }
                drop(count);
            },
        );
        return Err(format!(
            "database {} is gone from the configuration",
            moved.database
        ));
    };
    // Counted as it was in the old process, whatever the limits say now: it is not a new
    // client.
    let limits = crate::registry::client_limits::Limits {
        database: 0,
        user: 0,
        exempt: true,
    };
    if let Ok(admission) =
        crate::registry::client_limits::admit(&moved.database, &moved.user, &limits)
    {
        admission.keep();
    }
    let key = moved_key(moved.pid, moved.secret, &moved.secret_tail)?;
    let handle = ClientHandle::adopt(
        key,
        moved.connect_time,
        &moved.user,
        &moved.database,
        peer,
        local,
        &moved.application_name,
    );
    let info = handle.0.clone();
    if info.key.pid != moved.pid {
        tracing::warn!(
            client = %info.peer,
            "a moved client's cancel key was taken here: it gets a new one, so its cancel requests will not reach it"
        );
    }
    if let Some(s) = &moved.startup {
        info.set_startup(Arc::new(param_set(s)));
    }
    let scram_keys = match (moved.scram_keys, moved.scram_password) {
        (Some((client_key, server_key)), _) => Some(Credential::Keys {
            client_key,
            server_key,
        }),
        (None, Some(p)) => Some(Credential::Password(p)),
        (None, None) => None,
    };
    if let Some(keys) = &scram_keys {
        pool.remember_scram(keys);
    }
    if let Some(secret) = &moved.pool_secret {
        if pool.settings().target.secret.is_none() {
            pool.learn_secret(&weir_auth::Secret::parse(secret));
        }
    }
    let gucs = |g: Option<Vec<(String, String)>>| {
        g.map(|g| {
            let mut out = crate::gucs::Gucs::default();
            for (n, v) in g {
                out.put(&n, Some(&v));
            }
            Arc::new(out)
        })
    };
    let prepared = (!moved.statements.is_empty()).then(|| {
        let mut p = Box::<crate::prepared::ClientStatements>::default();
        for (name, sql, body) in moved.statements {
            let def = if sql {
                crate::prepared::defs::intern_sql(&body)
            } else {
                crate::prepared::defs::intern(&body)
            };
            p.names.insert(name.into_boxed_slice(), def);
        }
        p
    });
    if let Some(p) = &prepared {
        info.set_prepared(p.names.len());
    }
    pool.clients.fetch_add(1, Ordering::Relaxed);
    let no_entry = weir_config::Database::default();
    // A client that comes with its server stays in session mode whatever the new
    // configuration says (as a reload leaves a logged-in client's mode): its server holds
    // its session, which must not go back to a pool.
    let mode = if moved.server.is_some() {
        PoolMode::Session
    } else {
        snap.pool_mode(
            snap.resolve_database(&moved.database)
                .map_or(&no_entry, |d| d.0),
            &pool.user,
        )
    };
    let general = &snap.config.general;
    let pending_write = if moved.wrote {
        pool.settings().split.as_ref().map(|e| e.lsn.wrote())
    } else {
        None
    };
    let extras = Extras {
        scram_keys,
        prepared,
        gucs: gucs(moved.gucs),
        startup_gucs: gucs(moved.startup_gucs),
        unnamed_params: moved.unnamed_params,
        pending_write,
        ..Extras::default()
    };
    let timeouts = Timeouts::from_config(general, snap.config.users.get(&moved.user));
    let mut session = Box::new(Session::new(
        Stream::Parked(socket),
        BytesMut::new(),
        mode,
        general,
        timeouts,
        handle,
        pool,
        count,
        extras,
    ));
    session.wanted = Arc::new(param_set(&moved.wanted));
    session.idle_since = Instant::now()
        .checked_sub(Duration::from_millis(moved.idle_ms))
        .unwrap_or_else(Instant::now);
    if let (Some(server), Some(fd)) = (moved.server, server_fd) {
        let lease = adopt_server(&session.pool, server, fd);
        session.extras.get_or_insert_with(Box::default).handoff = Some(lease);
    }
    session.trim_extras();
    let worker = info.key.pid as usize % crate::workers::count().max(1);
    crate::workers::spawn_on(worker, async move {
        let server = session
            .extras
            .as_mut()
            .and_then(|x| x.handoff.as_mut())
            .map_or(Ok(()), |server| {
                server.home = crate::workers::current();
                server.stream.unpark()
            });
        match server.and_then(|()| session.stream.unpark()) {
            Ok(()) => super::run_session(session, true).await,
            Err(e) => tracing::warn!(client = %info.peer, "could not take over a client: {e}"),
        }
    });
    Ok(())
}

/// The server of a session-mode client, counted in its pool as lent to it.
fn adopt_server(pool: &Arc<crate::pool::Pool>, moved: MovedServer, fd: OwnedFd) -> Lease {
    let (addr, socket) = match moved.path {
        Some(path) => (
            ServerAddr::Unix { path },
            StdSocket::Unix(std::os::unix::net::UnixStream::from(fd)),
        ),
        None => (
            ServerAddr::Tcp {
                host: moved.host.unwrap_or_default(),
                port: moved.port,
            },
            StdSocket::Tcp(std::net::TcpStream::from(fd)),
        ),
    };
    let settings = pool.settings();
    let id = ServerConn::next_id();
    let t = &settings.target;
    let info = ServerHandle::register(id, &t.user, (&t.database, &t.hosts.name), &addr);
    if let StdSocket::Tcp(s) = &socket {
        if let Ok(a) = s.local_addr() {
            info.0.set_local(Endpoint::tcp(a));
        }
    }
    info.0.set_logged_in(moved.pid);
    let now = Instant::now();
    let conn = ServerConn {
        id,
        info,
        stream: Stream::Parked(socket),
        params: param_set(&moved.params),
        synced_to: None,
        key: moved_key(moved.pid, moved.secret, &moved.secret_tail).unwrap_or_else(|e| {
            tracing::warn!("online restart: a moved server's {e}: its queries cannot be cancelled");
            BackendKey::short(moved.pid, moved.secret)
        }),
        addr: Arc::new(addr),
        created: now
            .checked_sub(Duration::from_millis(moved.age_ms))
            .unwrap_or(now),
        idle_since: now,
        home: crate::workers::current(),
        generation: settings.target.generation,
        sent_ahead: 0,
        owed_internal: 0,
        prefix_rest: bytes::Bytes::new(),
        statements: Default::default(),
        gucs: None,
        passengers: Default::default(),
        carry: Default::default(),
    };
    drop(settings);
    pool.adopt_lent(conn)
}

/// A key as the previous process had it, its tail (protocol 3.2) included.
fn moved_key(pid: u32, secret: u32, tail: &Option<Vec<u8>>) -> Result<BackendKey, String> {
    let mut whole = secret.to_be_bytes().to_vec();
    whole.extend_from_slice(tail.as_deref().unwrap_or_default());
    BackendKey::from_wire(pid, &whole).ok_or_else(|| format!("cancel key of {} bytes", whole.len()))
}

fn param_set(pairs: &[(String, String)]) -> ParamSet {
    let mut p = ParamSet::default();
    for (n, v) in pairs {
        p.set(n, v);
    }
    p
}

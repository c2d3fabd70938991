//! Online restart (`weir -R`, PgBouncer's option): a new Weir, started with the running
//! one's configuration, takes over its listening sockets and its idle clients, so that an
//! upgrade or a restart drops no connection and fails no transaction.
//!
//! The running process offers a socket beside its Unix socket,
//! `<unix_socket_dir>/.s.PGSQL.<port>.takeover` (mode 0600, and only a process of the same
//! user or root is answered). The new process connects, is given duplicates of every
//! listening socket (SCM_RIGHTS) and starts accepting on them; once it says it is ready,
//! the old one stops accepting and hands over each client the moment it is idle: parked
//! clients at once, the others when their transaction ends. A client goes with its
//! socket, its cancel key, the parameters it believes it has, the settings it made, its
//! named prepared statements and its SCRAM keys (see client::moved). Bytes it sent meanwhile
//! wait in the socket for the new process to read. Cancel requests that reach the new
//! process for a client still on the old one are passed back over the same channel.
//!
//! What does not move, and finishes on the old process (which exits when the last such
//! client has gone, or at `shutdown_drain_timeout` when that is set, as a safe shutdown
//! does): clients over TLS (rustls' session state cannot be carried), session-mode
//! clients whose server is over TLS (a session-mode client otherwise moves with its
//! server, between two transactions), clients pinned to their server in the pooled modes,
//! clients that LISTEN, and admin console sessions. Once taken over, the old process
//! closes its servers as they go idle; the new one opens its own. If the new process dies
//! after taking over, the old one accepts again on the sockets it had offered (`resume`).

mod wire;

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, LazyLock, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use weir_config::General;

use crate::app::App;
use crate::listener::StdListener;
use crate::server::BackendKey;

use crate::registry::handover;
pub use crate::registry::handover::{handed_over, in_flight, predecessor_running};

const HELLO: u8 = b'H';
const LISTENER: u8 = b'L';
const LISTENERS_END: u8 = b'E';
const READY: u8 = b'R';
const CLIENT: u8 = b'C';
const CANCEL: u8 = b'K';
/// Both processes must speak the same version of the channel (and of client::moved).
const VERSION: u32 = 1;

/// The new process went away after taking over: this one accepts again (`resume`).
static SUCCESSOR_LOST: AtomicBool = AtomicBool::new(false);
/// The old process's main loop, winding down, waits on this to carry on instead.
static RESUMED: LazyLock<tokio::sync::Notify> = LazyLock::new(tokio::sync::Notify::new);

/// Resolves when a new process that had taken over is gone and this one serves again.
pub async fn resumed() {
    RESUMED.notified().await;
}

/// The old process's main loop waits on this to start winding down.
static TAKEN_OVER: LazyLock<tokio::sync::Notify> = LazyLock::new(tokio::sync::Notify::new);

#[derive(Serialize, Deserialize)]
struct Hello {
    version: u32,
    pid: u32,
}

#[derive(Serialize, Deserialize)]
enum Kind {
    Tcp,
    Unix,
    Http,
}

#[derive(Serialize, Deserialize)]
struct SocketDesc {
    kind: Kind,
    worker: usize,
    /// The Unix socket's file, on the one handle that removes it at exit.
    path: Option<PathBuf>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Resolves once a new process has taken over.
pub async fn taken_over() {
    TAKEN_OVER.notified().await;
}

/// Where the running process waits for its successor; None without a Unix socket dir.
pub fn control_path(g: &General) -> Option<PathBuf> {
    let dir = g.unix_socket_dir.as_deref().filter(|d| !d.is_empty())?;
    Some(PathBuf::from(dir).join(format!(".s.PGSQL.{}.takeover", g.listen_port)))
}

fn uid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// What a successor will be given: duplicates of the listening sockets, taken before the
/// workers own them.
pub struct Offer {
    sockets: Vec<(SocketDesc, OwnedFd)>,
    /// Serves `http_listen` again on its socket should the successor die (given by the
    /// caller: the HTTP endpoint sits above this layer).
    resume_http: fn(std::net::TcpListener),
    /// The admin console, for clients accepted again (see client::Console).
    console: crate::client::Console,
}

impl Offer {
    pub fn new(
        per_worker: &[Vec<StdListener>],
        http: Option<&std::net::TcpListener>,
        resume_http: fn(std::net::TcpListener),
        console: crate::client::Console,
    ) -> Offer {
        let mut sockets = Vec::new();
        let dup = |fd: std::os::fd::BorrowedFd<'_>| fd.try_clone_to_owned();
        for (worker, list) in per_worker.iter().enumerate() {
            for l in list {
                let (kind, fd, path) = match l {
                    StdListener::Tcp(t) => (Kind::Tcp, dup(t.as_fd()), None),
                    StdListener::Unix(u, path) => (Kind::Unix, dup(u.as_fd()), path.clone()),
                };
                match fd {
                    Ok(fd) => sockets.push((SocketDesc { kind, worker, path }, fd)),
                    Err(e) => tracing::warn!("online restart: cannot keep a listening socket: {e}"),
                }
            }
        }
        if let Some(h) = http {
            match dup(h.as_fd()) {
                Ok(fd) => sockets.push((
                    SocketDesc {
                        kind: Kind::Http,
                        worker: 0,
                        path: None,
                    },
                    fd,
                )),
                Err(e) => tracing::warn!("online restart: cannot keep the http socket: {e}"),
            }
        }
        Offer {
            sockets,
            resume_http,
            console,
        }
    }
}

/// The sockets kept for a successor: their duplicates would keep the listening sockets
/// open (and the kernel completing connections no one accepts) once a shutdown has
/// closed the listeners, so a shutdown withdraws them.
static OFFERED: Mutex<Option<Offer>> = Mutex::new(None);

/// A shutdown began: no successor will take over.
pub fn withdraw() {
    lock(&OFFERED).take();
}

/// Waits, on a thread of its own, for a new process to take over (see the module's
/// comment). Without a Unix socket directory there is nowhere to wait: `-R` then starts
/// normally and finds the ports taken.
pub fn offer(app: Arc<App>, offer: Offer) {
    let Some(path) = control_path(&app.snapshot.load().config.general) else {
        return;
    };
    // A file left there is a dead process's, or the previous process's that this one
    // took over from: this process is the one to reach now.
    let _ = std::fs::remove_file(&path);
    let listener = match UnixListener::bind(&path) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(
                "online restart unavailable: cannot listen on {}: {e}",
                path.display()
            );
            return;
        }
    };
    let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600));
    *lock(&CONTROL_FILE) = Some(path);
    *lock(&OFFERED) = Some(offer);
    let spawned = std::thread::Builder::new()
        .name("weir-takeover".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let Some(offer) = lock(&OFFERED).take() else {
                    tracing::warn!("online restart refused: this process is shutting down");
                    continue;
                };
                match hand_over(&app, &offer, conn) {
                    Ok(true) => return,
                    Ok(false) => {
                        handover::set_sockets_shared(false);
                        resume(&app, &offer);
                        // Reachable again for the next attempt (the control file may
                        // be the dead process's).
                        self::offer(app.clone(), offer);
                        return;
                    }
                    Err(e) => {
                        handover::set_sockets_shared(false);
                        tracing::warn!("online restart refused: {e}");
                        let mut offered = lock(&OFFERED);
                        if offered.is_none() && !app.shutdown.is_cancelled() {
                            *offered = Some(offer);
                        }
                    }
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("online restart unavailable: {e}");
    }
}

/// The control socket's file, removed at exit unless a successor has its own there.
static CONTROL_FILE: Mutex<Option<PathBuf>> = Mutex::new(None);

/// At exit: removes the control socket's file when it is still this process's.
pub fn remove_control_file() {
    if handed_over() {
        return;
    }
    if let Some(p) = lock(&CONTROL_FILE).take() {
        let _ = std::fs::remove_file(p);
    }
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

/// The old process's side: gives the sockets, waits for the successor to accept on them,
/// then sends it every client as it becomes idle. Err while nothing has changed here;
/// Ok(false) when the successor went away after taking over.
fn hand_over(app: &Arc<App>, offer: &Offer, conn: UnixStream) -> io::Result<bool> {
    let peer = wire::peer_uid(&conn)?;
    if peer != uid() && peer != 0 {
        return Err(invalid(&format!("a process of uid {peer} asked")));
    }
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let hello = match wire::recv(&conn)? {
        Some(m) if m.kind == HELLO => serde_json::from_slice::<Hello>(&m.payload)
            .map_err(|e| invalid(&format!("bad hello: {e}")))?,
        _ => return Err(invalid("no hello")),
    };
    if hello.version != VERSION {
        return Err(invalid(&format!(
            "process {} speaks takeover version {}, this one {VERSION}",
            hello.pid, hello.version
        )));
    }
    tracing::info!("online restart: process {} is taking over", hello.pid);
    handover::set_sockets_shared(true);
    for (desc, fd) in &offer.sockets {
        let text = serde_json::to_vec(desc).map_err(|e| invalid(&e.to_string()))?;
        wire::send(&conn, LISTENER, &text, &[fd.as_fd()])?;
    }
    wire::send(&conn, LISTENERS_END, b"", &[])?;
    // Until the successor accepts on the sockets, this process carries on as before.
    conn.set_read_timeout(Some(Duration::from_secs(60)))?;
    match wire::recv(&conn)? {
        Some(m) if m.kind == READY => {}
        _ => return Err(invalid("the new process did not get ready")),
    }
    conn.set_read_timeout(None)?;
    let reader = conn.try_clone()?;
    SUCCESSOR_LOST.store(false, Ordering::SeqCst);
    handover::set_handed_over(true);
    let rx = handover::start_moving();
    crate::listener::stop_accepting();
    TAKEN_OVER.notify_one();
    tracing::info!(
        "online restart: process {} accepts now; idle clients move to it",
        hello.pid
    );
    let app2 = app.clone();
    let _ = std::thread::Builder::new()
        .name("weir-takeover-cancels".into())
        .spawn(move || cancels_from_successor(&app2, &reader));
    sweep();
    crate::registry::clients::CLIENTS.for_each(|c| c.raise(crate::registry::clients::PARK));
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(p) => {
                let fds: Vec<_> = p.fds.iter().map(AsFd::as_fd).collect();
                if let Err(e) = wire::send(&conn, CLIENT, &p.text, &fds) {
                    tracing::error!("online restart: the new process stopped taking clients: {e}");
                    handover::stop_moving();
                    return Ok(false);
                }
            }
            // A client that was parking as the move began may have landed in the lot
            // after the first sweep.
            Err(mpsc::RecvTimeoutError::Timeout) if SUCCESSOR_LOST.load(Ordering::SeqCst) => {
                return Ok(false)
            }
            Err(mpsc::RecvTimeoutError::Timeout) => sweep(),
            Err(mpsc::RecvTimeoutError::Disconnected) if SUCCESSOR_LOST.load(Ordering::SeqCst) => {
                return Ok(false)
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(true),
        }
    }
}

/// The new process died after taking over: this one accepts again on the sockets it
/// had offered, and its main loop carries on as before the restart.
fn resume(app: &Arc<App>, offer: &Offer) {
    handover::stop_moving();
    crate::listener::resume_accepting();
    handover::set_handed_over(false);
    let workers = crate::workers::count().max(1);
    for (desc, fd) in &offer.sockets {
        let fd = match fd.try_clone() {
            Ok(fd) => fd,
            Err(e) => {
                tracing::error!("online restart: cannot accept again on a socket: {e}");
                continue;
            }
        };
        let listener = match desc.kind {
            Kind::Tcp => StdListener::Tcp(std::net::TcpListener::from(fd)),
            Kind::Unix => StdListener::Unix(
                std::os::unix::net::UnixListener::from(fd),
                desc.path.clone(),
            ),
            Kind::Http => {
                (offer.resume_http)(std::net::TcpListener::from(fd));
                continue;
            }
        };
        let (app, console) = (app.clone(), offer.console);
        crate::workers::spawn_on(desc.worker % workers, async move {
            match listener.into_tokio() {
                Ok(l) => crate::listener::run(app, console, l).await,
                Err(e) => tracing::error!("online restart: cannot accept again: {e}"),
            }
        });
    }
    if let Some(p) = &app.snapshot.load().config.general.pidfile {
        if let Err(e) = crate::cli::write_pidfile(p) {
            tracing::error!("{e}");
        }
    }
    crate::systemd::notify(&format!("MAINPID={}\nREADY=1", std::process::id()));
    tracing::warn!("online restart: this process accepts again");
    RESUMED.notify_one();
}

/// Hands over every parked client.
fn sweep() {
    for session in crate::client::park::take_all() {
        if let Err(s) = crate::client::moved::hand(session) {
            if crate::client::park::park(s).is_err() {
                tracing::warn!("online restart: a parked client could not be kept");
            }
        }
    }
}

fn cancels_from_successor(app: &Arc<App>, conn: &UnixStream) {
    loop {
        match wire::recv(conn) {
            // The cancel request packet as a client sends it, length word included.
            Ok(Some(m)) if m.kind == CANCEL => {
                let parsed = m.payload.get(4..).map(crate::protocol::startup::parse);
                let Some(Ok(crate::protocol::startup::StartupPacket::Cancel(key))) = parsed else {
                    tracing::warn!("online restart: a malformed cancel from the new process");
                    continue;
                };
                let app = app.clone();
                crate::workers::spawn_background(async move {
                    crate::cancel::forward(&app, key).await;
                });
            }
            Ok(Some(_)) => {
                tracing::warn!("online restart: unexpected message from the new process")
            }
            // The new process is gone: a client sent now would be lost with the channel;
            // those left stay here.
            Ok(None) | Err(_) => {
                if handed_over() {
                    tracing::error!(
                        "online restart: the new process is gone; the clients left stay here"
                    );
                    // Before the channel closes: the sending loop tells the two apart.
                    SUCCESSOR_LOST.store(true, Ordering::SeqCst);
                    handover::stop_moving();
                }
                return;
            }
        }
    }
}

/// The new process's end of the channel, between getting the sockets and being ready.
pub struct Predecessor {
    conn: UnixStream,
}

/// What a new process started with `-R` inherits from the running one.
pub struct Inherited {
    pub predecessor: Predecessor,
    pub listeners: Vec<Vec<StdListener>>,
    pub http: Option<std::net::TcpListener>,
}

/// Asks the running process for its sockets, spread over this process's `workers`.
/// Ok(None) when there is no process to take over: as PgBouncer's -R, this one then
/// starts as usual (and finds the ports free, or says they are not).
pub fn request(g: &General, workers: usize) -> Result<Option<Inherited>, String> {
    // Logging is not set up yet: it starts once this process knows it will serve.
    let say = |msg: &str| {
        let json = g.log_format == weir_config::LogFormat::Json;
        crate::logging::before_init(json, "LOG", msg)
    };
    let Some(path) = control_path(g) else {
        say("-R: no running process can be reached without unix_socket_dir; starting normally");
        return Ok(None);
    };
    let conn = match UnixStream::connect(&path) {
        Ok(c) => c,
        Err(e) => {
            say(&format!(
                "-R: no running process at {} ({e}); starting normally",
                path.display()
            ));
            return Ok(None);
        }
    };
    let fail = |e: io::Error| format!("online restart failed: {e}");
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(fail)?;
    let hello = serde_json::to_vec(&Hello {
        version: VERSION,
        pid: std::process::id(),
    })
    .map_err(|e| e.to_string())?;
    wire::send(&conn, HELLO, &hello, &[]).map_err(fail)?;
    let workers = workers.max(1);
    let mut listeners: Vec<Vec<StdListener>> = (0..workers).map(|_| Vec::new()).collect();
    let mut http = None;
    loop {
        let m = match wire::recv(&conn).map_err(fail)? {
            Some(m) => m,
            None => {
                return Err("the running process refused the online restart (see its log)".into())
            }
        };
        match m.kind {
            LISTENERS_END => break,
            LISTENER => {
                let desc: SocketDesc = serde_json::from_slice(&m.payload)
                    .map_err(|e| format!("online restart failed: {e}"))?;
                let fd = m
                    .fds
                    .into_iter()
                    .next()
                    .ok_or("online restart failed: a socket came without its descriptor")?;
                let slot = &mut listeners[desc.worker % workers];
                match desc.kind {
                    Kind::Tcp => slot.push(StdListener::Tcp(std::net::TcpListener::from(fd))),
                    Kind::Unix => slot.push(StdListener::Unix(
                        std::os::unix::net::UnixListener::from(fd),
                        desc.path,
                    )),
                    Kind::Http => http = Some(std::net::TcpListener::from(fd)),
                }
            }
            _ => return Err("online restart failed: unexpected message".into()),
        }
    }
    if listeners.iter().all(Vec::is_empty) {
        return Err("online restart failed: the running process has no listening socket".into());
    }
    Ok(Some(Inherited {
        predecessor: Predecessor { conn },
        listeners,
        http,
    }))
}

/// The new process, accepting: tells the old one, and takes the clients it sends.
pub fn take_over(app: &Arc<App>, p: Predecessor) {
    let conn = p.conn;
    if let Err(e) = wire::send(&conn, READY, b"", &[]).and_then(|()| conn.set_read_timeout(None)) {
        tracing::error!("online restart: the running process is gone: {e}");
        return;
    }
    let (tx, rx) = mpsc::channel::<BackendKey>();
    handover::set_predecessor(Some(tx));
    if let Ok(writer) = conn.try_clone() {
        let _ = std::thread::Builder::new()
            .name("weir-takeover-cancels".into())
            .spawn(move || {
                for key in rx {
                    let packet = crate::protocol::messages::cancel_request(&key);
                    if wire::send(&writer, CANCEL, &packet, &[]).is_err() {
                        return;
                    }
                }
            });
    }
    let app = app.clone();
    let _ = std::thread::Builder::new()
        .name("weir-takeover".into())
        .spawn(move || {
            let mut moved = 0u64;
            loop {
                match wire::recv(&conn) {
                    Ok(Some(m)) if m.kind == CLIENT => {
                        match crate::client::moved::adopt(&app, &m.payload, m.fds) {
                            Ok(()) => moved += 1,
                            Err(e) => tracing::warn!("online restart: a client could not be taken over: {e}"),
                        }
                    }
                    Ok(Some(_)) => tracing::warn!("online restart: unexpected message"),
                    Ok(None) | Err(_) => break,
                }
            }
            handover::set_predecessor(None);
            tracing::info!("online restart complete: the previous process has exited ({moved} clients taken over)");
        });
}

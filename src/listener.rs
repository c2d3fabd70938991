//! Accepting clients on TCP (every listen_addr) and on the Unix socket.

use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpListener, UnixListener};
use weir_config::General;

use crate::app::App;
use crate::stream::{Endpoint, Stream};

/// A bound socket, made before the runtime exists (so a port in use is reported before
/// daemonizing). The Unix socket's owner (the one that removes the file) carries its path.
pub enum StdListener {
    Tcp(std::net::TcpListener),
    Unix(std::os::unix::net::UnixListener, Option<PathBuf>),
}

impl StdListener {
    pub fn into_tokio(self) -> std::io::Result<Listener> {
        Ok(match self {
            StdListener::Tcp(l) => {
                let l = TcpListener::from_std(l)?;
                if !SYSTEMD_SOCKETS.load(std::sync::atomic::Ordering::Relaxed) {
                    use std::os::fd::AsRawFd;
                    open_tcp().push(l.as_raw_fd());
                }
                Listener::Tcp(l)
            }
            StdListener::Unix(l, path) => {
                if let Some(p) = &path {
                    *SOCKET_FILE.lock().unwrap_or_else(|e| e.into_inner()) = Some(p.clone());
                }
                Listener::Unix(UnixListener::from_std(l)?, path)
            }
        })
    }
}

pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, Option<PathBuf>),
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Tcp(l) = self {
            // Before the descriptor is closed, so `close_tcp` never reaches a reused one.
            use std::os::fd::AsRawFd;
            let fd = l.as_raw_fd();
            open_tcp().retain(|&f| f != fd);
        }
        if let Listener::Unix(_, Some(path)) = self {
            // After an online restart the socket (and its file) is the new process's.
            if !crate::registry::handover::keeps_socket_files() {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

/// Cancelled when the listeners are to stop accepting without a shutdown: an online
/// restart, where the new process accepts on the same sockets. Replaced by a fresh one
/// when this process accepts again (the new process died).
static STOP_ACCEPTING: std::sync::Mutex<Option<tokio_util::sync::CancellationToken>> =
    std::sync::Mutex::new(None);

fn stop_slot() -> std::sync::MutexGuard<'static, Option<tokio_util::sync::CancellationToken>> {
    STOP_ACCEPTING.lock().unwrap_or_else(|p| p.into_inner())
}

/// What an accept loop watches to stop (taken when it starts).
pub fn stop_token() -> tokio_util::sync::CancellationToken {
    stop_slot().get_or_insert_with(Default::default).clone()
}

pub fn stop_accepting() {
    stop_token().cancel();
}

/// Accept loops started from now on run until the next `stop_accepting`.
pub fn resume_accepting() {
    *stop_slot() = Some(Default::default());
}

/// Cancelled when a graceful shutdown begins: the TCP accept loops end, and with them
/// their sockets (see admin::control::begin_shutdown). Never reset: a shutdown is not
/// taken back.
static CLOSE_TCP: std::sync::LazyLock<tokio_util::sync::CancellationToken> =
    std::sync::LazyLock::new(Default::default);

/// Stops every TCP listener now, not when its accept loop next runs: a connection coming
/// in the meantime would be accepted and then refused, where a `so_reuseport` peer
/// could have served it. shutdown(2) on a listening socket takes it out of the port at
/// once (Linux), whichever thread is polling it.
pub fn close_tcp() {
    CLOSE_TCP.cancel();
    // Another process of an online restart (the new one, or the previous one, which
    // accepts again should this one die) has the same sockets: only this process's
    // copies may go, with its accept loops.
    use crate::registry::handover;
    if handover::sockets_shared() || handover::predecessor_running() {
        return;
    }
    for &fd in open_tcp().iter() {
        // SAFETY: a listening socket of ours, still open: it leaves this list before it
        // is closed (Listener's drop), under the same lock.
        unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
    }
}

/// The TCP listeners being accepted on. Not systemd's sockets: shutdown(2) would end
/// them for systemd too, which keeps them for the service's next start.
static OPEN_TCP: std::sync::Mutex<Vec<std::os::fd::RawFd>> = std::sync::Mutex::new(Vec::new());

fn open_tcp() -> std::sync::MutexGuard<'static, Vec<std::os::fd::RawFd>> {
    OPEN_TCP.lock().unwrap_or_else(|p| p.into_inner())
}

/// Set when the sockets came from systemd (see `from_systemd`).
static SYSTEMD_SOCKETS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The Unix socket file this process made (None when systemd passed the socket), removed
/// at exit: the accept loops are still running then, and their drop never comes.
static SOCKET_FILE: std::sync::Mutex<Option<PathBuf>> = std::sync::Mutex::new(None);

pub fn remove_socket_file() {
    let path = SOCKET_FILE.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(path) = path {
        if !crate::registry::handover::keeps_socket_files() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// A socket bound but not yet listening.
struct Bound {
    worker: usize,
    socket: Socket,
    /// Unix socket: the path, and whether this handle owns (removes) the file.
    unix: Option<(PathBuf, bool)>,
}

fn tcp_socket(addr: SocketAddr, g: &General, reuse_port: bool) -> std::io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if g.so_reuseport || reuse_port {
        socket.set_reuse_port(true)?;
    }
    if addr.is_ipv6() {
        // "*" binds :: and 0.0.0.0 separately, as PgBouncer does.
        socket.set_only_v6(true)?;
    }
    socket.set_nonblocking(true)?;
    if g.tcp_defer_accept {
        set_defer_accept(&socket)?;
    }
    socket.bind(&addr.into())?;
    Ok(socket)
}

/// TCP_DEFER_ACCEPT: a connection is handed to accept() only once its first bytes (the
/// startup packet) have arrived, so logging a client in starts with one wake-up, not
/// two. 45 seconds, the value PgBouncer hardcodes.
fn set_defer_accept(socket: &Socket) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let secs: libc::c_int = 45;
    // SAFETY: a valid socket descriptor, and a c_int option value of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            std::ptr::addr_of!(secs).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn backlog(g: &General) -> i32 {
    g.listen_backlog.min(i32::MAX as u32) as i32
}

/// Binds everything the configuration asks for, once per worker thread: each worker has
/// its own TCP sockets (SO_REUSEPORT, so the kernel spreads new connections over the
/// workers without waking them all) and a handle on the one Unix socket. Any failure is
/// fatal at startup.
///
/// Every socket is bound first and only then set listening, the first address last: a
/// supervisor (or a test) that sees the first address accept can rely on all the others
/// accepting too.
pub fn bind_all_std(g: &General, workers: usize) -> Result<Vec<Vec<StdListener>>, String> {
    let workers = workers.max(1);
    let mut bound: Vec<Bound> = Vec::new();
    let port = g.listen_port;
    for addr in &g.listen_addr {
        let addr = addr.trim();
        if addr.is_empty() {
            continue;
        }
        let ips: Vec<IpAddr> = if addr == "*" {
            vec![
                "0.0.0.0".parse().expect("literal"),
                "::".parse().expect("literal"),
            ]
        } else if let Ok(ip) = addr.parse::<IpAddr>() {
            vec![ip]
        } else {
            use std::net::ToSocketAddrs;
            (addr, port)
                .to_socket_addrs()
                .map_err(|e| format!("cannot resolve listen_addr {addr}: {e}"))?
                .map(|a| a.ip())
                .collect()
        };
        'ips: for ip in ips {
            let sa = SocketAddr::new(ip, port);
            if workers > 1 && !g.so_reuseport {
                // SO_REUSEPORT would also let another process bind this port beside us and
                // take half the connections: make sure nobody has it first. The probe is
                // set listening too: a process bound with SO_REUSEPORT but not listening
                // yet would not conflict with a mere bind.
                let probe = tcp_socket(sa, g, false).and_then(|s| s.listen(1));
                if let Err(e) = probe {
                    if addr == "*" && ip.is_ipv6() {
                        tracing::warn!("cannot listen on {sa}: {e}");
                        continue 'ips;
                    }
                    return Err(format!("cannot listen on {sa}: {e}"));
                }
            }
            for worker in 0..workers {
                match tcp_socket(sa, g, workers > 1) {
                    Ok(socket) => bound.push(Bound {
                        worker,
                        socket,
                        unix: None,
                    }),
                    // "*" on a host without IPv6 still serves IPv4.
                    Err(e) if worker == 0 && addr == "*" && ip.is_ipv6() => {
                        tracing::warn!("cannot listen on {sa}: {e}");
                        continue 'ips;
                    }
                    Err(e) => return Err(format!("cannot listen on {sa}: {e}")),
                }
            }
        }
    }
    if let Some(dir) = g.unix_socket_dir.as_deref().filter(|d| !d.is_empty()) {
        let path = PathBuf::from(dir).join(format!(".s.PGSQL.{port}"));
        let fail = |e: std::io::Error| format!("cannot listen on {}: {e}", path.display());
        if path.exists() {
            if std::os::unix::net::UnixStream::connect(&path).is_ok() {
                return Err(format!(
                    "unix socket {} is in use by another process",
                    path.display()
                ));
            }
            let _ = std::fs::remove_file(&path);
        }
        let socket = Socket::new(Domain::UNIX, Type::STREAM, None).map_err(fail)?;
        socket
            .bind(&socket2::SockAddr::unix(&path).map_err(fail)?)
            .map_err(fail)?;
        socket.set_nonblocking(true).map_err(fail)?;
        let _ =
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(g.unix_socket_mode));
        if let Some(group) = g.unix_socket_group.as_deref().filter(|s| !s.is_empty()) {
            set_group(&path, group)?;
        }
        for worker in 1..workers {
            let clone = socket.try_clone().map_err(fail)?;
            bound.push(Bound {
                worker,
                socket: clone,
                unix: Some((path.clone(), false)),
            });
        }
        bound.push(Bound {
            worker: 0,
            socket,
            unix: Some((path, true)),
        });
    }
    if bound.is_empty() {
        return Err("nothing to listen on: set listen_addr or unix_socket_dir".into());
    }
    let mut per_worker: Vec<Vec<StdListener>> = (0..workers).map(|_| Vec::new()).collect();
    for b in bound.into_iter().rev() {
        let what = match &b.unix {
            Some((path, _)) => path.display().to_string(),
            None => format!(
                "{:?}",
                b.socket.local_addr().ok().and_then(|a| a.as_socket())
            ),
        };
        b.socket
            .listen(backlog(g))
            .map_err(|e| format!("cannot listen on {what}: {e}"))?;
        per_worker[b.worker].push(match b.unix {
            Some((path, owner)) => StdListener::Unix(b.socket.into(), owner.then_some(path)),
            None => StdListener::Tcp(b.socket.into()),
        });
    }
    Ok(per_worker)
}

/// Sockets passed by systemd's socket activation (`LISTEN_FDS`, for this process by
/// `LISTEN_PID`, from descriptor 3 on), each shared by every worker; None when there are
/// none. They replace listen_addr and unix_socket_dir's socket: the unit's `.socket`
/// file says where to listen, and systemd keeps the socket (and its file) across
/// restarts of the service.
pub fn from_systemd(workers: usize) -> Result<Option<Vec<Vec<StdListener>>>, String> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let (Some(pid), Some(n)) = (
        std::env::var_os("LISTEN_PID"),
        std::env::var_os("LISTEN_FDS"),
    ) else {
        return Ok(None);
    };
    if pid.to_str().and_then(|p| p.parse::<u32>().ok()) != Some(std::process::id()) {
        return Ok(None);
    }
    let n: i32 = n
        .to_str()
        .and_then(|n| n.parse().ok())
        .filter(|n| (1..=1024).contains(n))
        .ok_or("LISTEN_FDS is not a number of sockets")?;
    // Not for whatever this process may start.
    for var in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        std::env::remove_var(var);
    }
    SYSTEMD_SOCKETS.store(true, std::sync::atomic::Ordering::Relaxed);
    let workers = workers.max(1);
    let mut per_worker: Vec<Vec<StdListener>> = (0..workers).map(|_| Vec::new()).collect();
    for fd in 3..3 + n {
        // SAFETY: systemd passes these descriptors to this process (LISTEN_PID) for it to
        // own; nothing else in the process has taken them.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        let socket = Socket::from(owned);
        let fail = |e: std::io::Error| format!("socket {fd} from systemd: {e}");
        let local = socket.local_addr().map_err(fail)?;
        socket.set_nonblocking(true).map_err(fail)?;
        socket.set_cloexec(true).map_err(fail)?;
        for list in &mut per_worker {
            let s = socket.try_clone().map_err(fail)?;
            list.push(if local.is_unix() {
                StdListener::Unix(s.into(), None)
            } else {
                StdListener::Tcp(s.into())
            });
        }
    }
    Ok(Some(per_worker))
}

/// Accepts until the process stops accepting (online restart), or, on TCP, until a
/// graceful shutdown begins; each client gets its own task. The Unix socket accepts
/// through a shutdown, for the admin console.
pub async fn run(app: Arc<App>, console: crate::client::Console, listener: Listener) {
    // A socket bound to one address has that address as every connection's local end, so
    // only a wildcard bind needs getsockname per connection.
    let stop = stop_token();
    let bound_to = match &listener {
        Listener::Tcp(l) => l
            .local_addr()
            .ok()
            .filter(|a| !a.ip().is_unspecified())
            .map(Endpoint::tcp),
        Listener::Unix(..) => Some(Endpoint::Unix),
    };
    loop {
        let tcp = crate::tcp_options::TcpOptions::from_config(&app.snapshot.load().config.general);
        let closing = async {
            match &listener {
                Listener::Tcp(_) => CLOSE_TCP.cancelled().await,
                Listener::Unix(..) => std::future::pending().await,
            }
        };
        let accepted = tokio::select! {
            biased;
            () = closing => return,
            _ = stop.cancelled() => return,
            r = accept(&listener, &tcp) => r,
        };
        match accepted {
            Ok((stream, peer)) => {
                let local = bound_to.clone().unwrap_or_else(|| stream.local());
                tokio::spawn(crate::client::serve(
                    app.clone(),
                    console,
                    stream,
                    peer,
                    local,
                ));
            }
            // The socket was shut down by `close_tcp`: the loop ends on its next turn.
            Err(_) if CLOSE_TCP.is_cancelled() => {}
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!("accept failed: {e}");
                crate::timers::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

/// The connection and its peer's address, as accept() gave it (no getpeername).
async fn accept(
    listener: &Listener,
    tcp: &crate::tcp_options::TcpOptions,
) -> std::io::Result<(Stream, Endpoint)> {
    match listener {
        Listener::Tcp(l) => {
            let (s, peer) = l.accept().await?;
            tcp.apply(socket2::SockRef::from(&s))?;
            Ok((Stream::Tcp(s), Endpoint::tcp(peer)))
        }
        Listener::Unix(l, _) => Ok((Stream::Unix(l.accept().await?.0), Endpoint::Unix)),
    }
}

/// Gives the Unix socket to `unix_socket_group`, so its members may connect.
fn set_group(path: &std::path::Path, group: &str) -> Result<(), String> {
    let cname = std::ffi::CString::new(group).map_err(|_| format!("bad group name {group:?}"))?;
    // SAFETY: getgrnam returns a pointer into static storage, read at once and not kept.
    let gid = unsafe {
        let gr = libc::getgrnam(cname.as_ptr());
        if gr.is_null() {
            return Err(format!("unix_socket_group: group {group} not found"));
        }
        (*gr).gr_gid
    };
    std::os::unix::fs::chown(path, None, Some(gid)).map_err(|e| format!("unix_socket_group: {e}"))
}

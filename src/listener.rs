//! Accepting clients on TCP (every listen_addr) and on the Unix socket.

use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpListener, UnixListener};
use weir_config::General;

use crate::app::App;
use crate::stream::Stream;

/// A bound socket, made before the runtime exists (so a port in use is reported before
/// daemonizing). The Unix socket's owner (the one that removes the file) carries its path.
pub enum StdListener {
    Tcp(std::net::TcpListener),
    Unix(std::os::unix::net::UnixListener, Option<PathBuf>),
}

impl StdListener {
    pub fn into_tokio(self) -> std::io::Result<Listener> {
        Ok(match self {
            StdListener::Tcp(l) => Listener::Tcp(TcpListener::from_std(l)?),
            StdListener::Unix(l, path) => Listener::Unix(UnixListener::from_std(l)?, path),
        })
    }
}

pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, Option<PathBuf>),
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, Some(path)) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn tcp_listener(
    addr: SocketAddr,
    g: &General,
    reuse_port: bool,
) -> std::io::Result<std::net::TcpListener> {
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
    socket.bind(&addr.into())?;
    socket.listen(g.listen_backlog.min(i32::MAX as u32) as i32)?;
    Ok(socket.into())
}

/// Binds everything the configuration asks for, once per worker thread: each worker has
/// its own TCP sockets (SO_REUSEPORT, so the kernel spreads new connections over the
/// workers without waking them all) and a handle on the one Unix socket. Any failure is
/// fatal at startup.
pub fn bind_all_std(g: &General, workers: usize) -> Result<Vec<Vec<StdListener>>, String> {
    let workers = workers.max(1);
    let mut per_worker: Vec<Vec<StdListener>> = (0..workers).map(|_| Vec::new()).collect();
    let mut any = false;
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
                // take half the connections: make sure nobody has it first.
                if let Err(e) = tcp_listener(sa, g, false) {
                    if addr == "*" && ip.is_ipv6() {
                        tracing::warn!("cannot listen on {sa}: {e}");
                        continue 'ips;
                    }
                    return Err(format!("cannot listen on {sa}: {e}"));
                }
            }
            for (i, listeners) in per_worker.iter_mut().enumerate() {
                match tcp_listener(sa, g, workers > 1) {
                    Ok(l) => {
                        listeners.push(StdListener::Tcp(l));
                        any = true;
                    }
                    // "*" on a host without IPv6 still serves IPv4.
                    Err(e) if i == 0 && addr == "*" && ip.is_ipv6() => {
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
        if path.exists() {
            if std::os::unix::net::UnixStream::connect(&path).is_ok() {
                return Err(format!(
                    "unix socket {} is in use by another process",
                    path.display()
                ));
            }
            let _ = std::fs::remove_file(&path);
        }
        let l = std::os::unix::net::UnixListener::bind(&path)
            .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
        l.set_nonblocking(true).map_err(|e| e.to_string())?;
        let _ =
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(g.unix_socket_mode));
        if let Some(group) = g.unix_socket_group.as_deref().filter(|s| !s.is_empty()) {
            set_group(&path, group)?;
        }
        for listeners in per_worker.iter_mut().skip(1) {
            let clone = l
                .try_clone()
                .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
            listeners.push(StdListener::Unix(clone, None));
        }
        per_worker[0].push(StdListener::Unix(l, Some(path)));
        any = true;
    }
    if !any {
        return Err("nothing to listen on: set listen_addr or unix_socket_dir".into());
    }
    Ok(per_worker)
}

/// Accepts until shutdown; each client gets its own task.
pub async fn run(app: Arc<App>, listener: Listener) {
    loop {
        let tcp = crate::tcp_options::TcpOptions::from_config(&app.snapshot.load().config.general);
        let accepted = tokio::select! {
            _ = app.shutdown.cancelled() => return,
            r = accept(&listener, &tcp) => r,
        };
        match accepted {
            Ok(stream) => {
                tokio::spawn(crate::client::serve(app.clone(), stream));
            }
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

async fn accept(
    listener: &Listener,
    tcp: &crate::tcp_options::TcpOptions,
) -> std::io::Result<Stream> {
    match listener {
        Listener::Tcp(l) => {
            let (s, _) = l.accept().await?;
            tcp.apply(socket2::SockRef::from(&s))?;
            Ok(Stream::Tcp(s))
        }
        Listener::Unix(l, _) => Ok(Stream::Unix(l.accept().await?.0)),
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

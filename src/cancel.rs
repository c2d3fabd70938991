//! Cancel requests. A client is given a key of Weir's own; while it is lent a server, its
//! registry entry points at that server's real key. A cancel request opens a fresh
//! connection straight to that server: it never waits for a pool slot.
//!
//! Peers (`peer_id`, `[peers]`, as PgBouncer 1.19+): several Weir processes or hosts
//! behind one address (so_reuseport, a TCP load balancer) each stamp their id on the keys
//! they give out, and a cancel request that lands on another one is passed on to the
//! right one. Weir stamps the id in the key's second half (the secret's high 16 bits),
//! where PgBouncer uses the pid's middle bytes: Weir keeps its pids whole, as the
//! identity of its clients. The secret's low 2 bits are a time to live, as PgBouncer's,
//! taken down at each hop, so that a loop between misconfigured peers ends.
//!
//! Keys of protocol 3.2 are longer (4 to 256 bytes); the stamp and time to live are on
//! their first 4 bytes all the same, and the rest travels untouched: to a peer, to the
//! previous process of an online restart, and to a server, which gets its own key whole.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

use crate::protocol::messages;
use crate::registry::clients::{by_cancel_key, CancelTarget, ClientState};
use crate::registry::keys::{peer_id, TTL};
use crate::server::{BackendKey, ServerAddr};

/// The peer a key was given out by (0: none), and what it has left to live.
fn stamp(key: &BackendKey) -> (u32, u32) {
    (key.secret >> 16, key.secret & TTL)
}

/// Forwards a client's cancel request to the server running its query; a client still
/// waiting for a server is taken out of the queue instead; a key of another peer goes to
/// that peer.
pub async fn forward(app: &crate::app::App, key: BackendKey) {
    let own = peer_id();
    let (peer, ttl) = stamp(&key);
    if own != 0 && peer != 0 && peer != own {
        return to_peer(app, key, peer, ttl).await;
    }
    // A key this process gave out, maybe passed on by peers on its way here: the time to
    // live it was given with is whole again.
    let key = match own {
        0 => key,
        _ => key.with_secret(key.secret | TTL),
    };
    let Some(client) = by_cancel_key(&key) else {
        let pid = key.pid;
        // During an online restart the client may still be on the previous process.
        if crate::registry::handover::forward_cancel(key) {
            tracing::debug!(pid, "cancel request passed to the previous process");
            return;
        }
        tracing::debug!(pid, "cancel request with an unknown key");
        return;
    };
    client.note_cancel();
    let Some(target) = client.link() else {
        if client.state() == ClientState::Waiting {
            client.raise(crate::registry::clients::CANCEL);
        } else {
            tracing::debug!(
                pid = key.pid,
                "cancel request for a client with no query running"
            );
        }
        return;
    };
    send(target).await;
}

async fn to_peer(app: &crate::app::App, key: BackendKey, peer: u32, ttl: u32) {
    if ttl == 0 {
        tracing::warn!(
            peer,
            "cancel request not forwarded: its time to live is exhausted (a loop between peers?)"
        );
        return;
    }
    let addr = {
        let snap = app.snapshot.load();
        let Some((_, p)) = snap.config.peers.iter().find(|(id, _)| *id == peer) else {
            tracing::warn!(
                peer,
                "cancel request for peer {peer}, which is not in [peers]"
            );
            return;
        };
        if p.host.starts_with('/') {
            ServerAddr::Unix {
                path: format!("{}/.s.PGSQL.{}", p.host, p.port).into(),
            }
        } else {
            ServerAddr::Tcp {
                host: p.host.clone(),
                port: p.port,
            }
        }
    };
    let key = key.with_secret(key.secret.wrapping_sub(1));
    tracing::debug!(peer, %addr, "forwarding cancel request to peer");
    send_to(&addr, &key).await;
}

/// Sends a cancel request for the query running on `target`. Until PostgreSQL has
/// finished with it (it closes the cancel connection once it has signalled the backend),
/// the server is not lent to another client (pool::lease): PostgreSQL signals the backend
/// twice (the process and its group), and a late second signal would cancel the next
/// client's query, as PgBouncer 1.18 found (its sv_being_canceled).
///
/// Counted before the future first runs, so that a caller that spawns it cannot hand the
/// server on meanwhile.
pub fn send(target: CancelTarget) -> impl std::future::Future<Output = ()> {
    let counted = crate::registry::servers::SERVERS
        .get(target.server_id)
        .map(InFlight::new);
    async move {
        send_to(&target.addr, &target.key).await;
        drop(counted);
    }
}

/// A cancel request counted on its server until dropped, whatever ends the sending.
struct InFlight(std::sync::Arc<crate::registry::servers::ServerInfo>);

impl InFlight {
    fn new(server: std::sync::Arc<crate::registry::servers::ServerInfo>) -> InFlight {
        server.cancel_started();
        InFlight(server)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.cancel_done();
    }
}

/// Waits for the other end to close: PostgreSQL answers a cancel request with nothing.
async fn until_closed(s: &mut (impl tokio::io::AsyncRead + Unpin)) -> std::io::Result<()> {
    let mut buf = [0u8; 64];
    while s.read(&mut buf).await? > 0 {}
    Ok(())
}

async fn send_to(addr: &ServerAddr, key: &BackendKey) {
    let packet = messages::cancel_request(key);
    let send = async {
        match addr {
            ServerAddr::Tcp { host, port } => {
                let mut s = TcpStream::connect((host.as_str(), *port)).await?;
                s.write_all(&packet).await?;
                s.shutdown().await?;
                until_closed(&mut s).await
            }
            ServerAddr::Unix { path } => {
                let mut s = UnixStream::connect(path).await?;
                s.write_all(&packet).await?;
                s.shutdown().await?;
                until_closed(&mut s).await
            }
        }
    };
    // As PgBouncer's cancel_wait_timeout: a server (or peer) that never takes the request
    // must not hold it, nor keep its server from being lent, for ever.
    let result = match crate::server::cancel_wait::limit() {
        None => Ok(send.await),
        Some(wait) => crate::timers::timeout(wait, send).await,
    };
    match result {
        Ok(Ok(())) => tracing::debug!(server = %addr, "forwarded cancel request"),
        Ok(Err(e)) => {
            tracing::warn!(server = %addr, "could not forward cancel request: {e}")
        }
        Err(_) => tracing::warn!(
            server = %addr,
            "cancel request closing because: cancel_wait_timeout"
        ),
    }
}

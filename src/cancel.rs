//! Cancel requests. A client is given a key of Weir's own; while it is lent a server, its
//! registry entry points at that server's real key. A cancel request opens a fresh
//! connection straight to that server: it never waits for a pool slot.

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, UnixStream};

use crate::protocol::messages;
use crate::registry::clients::{by_cancel_key, CancelTarget, ClientState};
use crate::server::{BackendKey, ServerAddr};

/// Forwards a client's cancel request to the server running its query; a client still
/// waiting for a server is taken out of the queue instead.
pub async fn forward(key: BackendKey) {
    let Some(client) = by_cancel_key(key) else {
        tracing::debug!(pid = key.pid, "cancel request with an unknown key");
        return;
    };
    let Some(target) = client.link() else {
        if client.state() == ClientState::Waiting {
            client.raise(crate::registry::clients::CANCEL);
        }
        return;
    };
    send(target).await;
}

/// Sends a cancel request for the query running on `target`.
pub async fn send(target: CancelTarget) {
    let packet = messages::cancel_request(target.key.pid, target.key.secret);
    let send = async {
        match &*target.addr {
            ServerAddr::Tcp { host, port } => {
                let mut s = TcpStream::connect((host.as_str(), *port)).await?;
                s.write_all(&packet).await?;
                s.shutdown().await
            }
            ServerAddr::Unix { path } => {
                let mut s = UnixStream::connect(path).await?;
                s.write_all(&packet).await?;
                s.shutdown().await
            }
        }
    };
    match crate::timers::timeout(Duration::from_secs(10), send).await {
        Ok(Ok(())) => tracing::debug!(server = %target.addr, "forwarded cancel request"),
        Ok(Err(e)) => {
            tracing::warn!(server = %target.addr, "could not forward cancel request: {e}")
        }
        Err(_) => tracing::warn!(server = %target.addr, "timed out forwarding cancel request"),
    }
}

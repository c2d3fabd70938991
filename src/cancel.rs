//! Cancel requests. A client is given a key of Weir's own; while it is lent a server, its
//! entry here points at that server's real key. A cancel request opens a fresh connection
//! straight to that server: it never waits for a pool slot.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, UnixStream};

use crate::protocol::messages;
use crate::server::{BackendKey, ServerAddr};

#[derive(Debug, Clone)]
pub struct CancelTarget {
    pub addr: ServerAddr,
    pub key: BackendKey,
}

/// One client's cancel key and the server it is on right now.
#[derive(Debug)]
pub struct CancelSlot {
    pub key: BackendKey,
    target: Mutex<Option<CancelTarget>>,
}

impl CancelSlot {
    pub fn set(&self, target: Option<CancelTarget>) {
        *self.target.lock().unwrap_or_else(|p| p.into_inner()) = target;
    }

    fn current(&self) -> Option<CancelTarget> {
        self.target
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[derive(Default)]
pub struct CancelRegistry {
    slots: Mutex<HashMap<u32, Arc<CancelSlot>>>,
}

impl CancelRegistry {
    /// Registers a new client under a fresh random key.
    pub fn register(self: &Arc<Self>) -> CancelHandle {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let key = loop {
            let pid = rand::random::<u32>() & 0x7fff_ffff;
            if pid != 0 && !slots.contains_key(&pid) {
                break BackendKey {
                    pid,
                    secret: rand::random(),
                };
            }
        };
        let slot = Arc::new(CancelSlot {
            key,
            target: Mutex::new(None),
        });
        slots.insert(key.pid, slot.clone());
        CancelHandle {
            slot,
            registry: self.clone(),
        }
    }

    fn lookup(&self, key: BackendKey) -> Option<CancelTarget> {
        let slot = self
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key.pid)
            .cloned()?;
        if slot.key.secret != key.secret {
            return None;
        }
        slot.current()
    }

    /// Forwards a client's cancel request to the server running its query, if any.
    pub async fn cancel(&self, key: BackendKey) {
        let Some(target) = self.lookup(key) else {
            tracing::debug!(pid = key.pid, "cancel request for no running query");
            return;
        };
        let packet = messages::cancel_request(target.key.pid, target.key.secret);
        let send = async {
            match &target.addr {
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
        match tokio::time::timeout(Duration::from_secs(10), send).await {
            Ok(Ok(())) => tracing::debug!(server = %target.addr, "forwarded cancel request"),
            Ok(Err(e)) => {
                tracing::warn!(server = %target.addr, "could not forward cancel request: {e}")
            }
            Err(_) => tracing::warn!(server = %target.addr, "timed out forwarding cancel request"),
        }
    }
}

/// A client's registration; dropping it removes the key.
pub struct CancelHandle {
    pub slot: Arc<CancelSlot>,
    registry: Arc<CancelRegistry>,
}

impl Drop for CancelHandle {
    fn drop(&mut self) {
        self.registry
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.slot.key.pid);
    }
}

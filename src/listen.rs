//! LISTEN in pooled modes: one server connection per pool listens for all of the pool's
//! listening clients, and hands each notification to the clients that listen on its
//! channel. A client that listens keeps no server of its own between transactions (with
//! PgBouncer, LISTEN in transaction mode silently stops working; pinning each listener to
//! a server would take a connection per listener).
//!
//! The hub's connection is a server checked out of the pool for as long as any client of
//! the pool listens, so it counts against the pool's limits and shows in SHOW SERVERS.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot};

use crate::pool::{Lease, Pool};
use crate::protocol::messages;
use crate::protocol::reader::read_message;
use crate::registry::clients::ClientInfo;

/// One pool's listeners.
pub struct Hub {
    state: Mutex<State>,
    cmds: mpsc::UnboundedSender<Cmd>,
}

#[derive(Default)]
struct State {
    /// Channel -> the clients listening on it.
    channels: HashMap<String, Vec<Arc<ClientInfo>>>,
    /// Notifications not yet taken by their client (by its key pid), as the
    /// NotificationResponse messages to send it.
    inbox: HashMap<u32, BytesMut>,
}

enum Cmd {
    /// LISTEN (true) or UNLISTEN (false) on the hub's connection; `done` answers once the
    /// server has, so that a client told "LISTEN" misses no notification sent after.
    Channel {
        name: String,
        listen: bool,
        done: Option<oneshot::Sender<()>>,
    },
}

type Key = (String, String);

/// Notifications kept for one client that has not taken them.
const MAX_INBOX: usize = 8 << 20;

static HUBS: LazyLock<Mutex<HashMap<Key, Arc<Hub>>>> = LazyLock::new(Default::default);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The pool's hub, started on first use.
fn hub(pool: &Arc<Pool>, scram: Option<weir_auth::scram::Credential>) -> Arc<Hub> {
    let key = (pool.database.clone(), pool.user.clone());
    let mut hubs = lock(&HUBS);
    if let Some(h) = hubs.get(&key) {
        return h.clone();
    }
    let (tx, rx) = mpsc::unbounded_channel();
    let hub = Arc::new(Hub {
        state: Mutex::default(),
        cmds: tx,
    });
    tokio::spawn(run(hub.clone(), pool.clone(), scram, rx));
    hubs.insert(key, hub.clone());
    hub
}

fn existing(pool: &Pool) -> Option<Arc<Hub>> {
    lock(&HUBS)
        .get(&(pool.database.clone(), pool.user.clone()))
        .cloned()
}

/// Starts delivering `channel`'s notifications to `client`; returns once the pool's
/// listening connection listens on it.
pub async fn listen(
    pool: &Arc<Pool>,
    scram: Option<weir_auth::scram::Credential>,
    client: &Arc<ClientInfo>,
    channel: &str,
) {
    let hub = hub(pool, scram);
    let first = {
        let mut st = lock(&hub.state);
        let subs = st.channels.entry(channel.to_owned()).or_default();
        if subs.iter().any(|c| Arc::ptr_eq(c, client)) {
            return;
        }
        subs.push(client.clone());
        subs.len() == 1
    };
    if first {
        let (tx, rx) = oneshot::channel();
        let _ = hub.cmds.send(Cmd::Channel {
            name: channel.to_owned(),
            listen: true,
            done: Some(tx),
        });
        let _ = rx.await;
    }
}

/// Stops delivering `channel` (every channel for None) to the client with key `pid`.
pub fn unlisten(pool: &Pool, pid: u32, channel: Option<&str>) {
    let Some(hub) = existing(pool) else {
        return;
    };
    let mut st = lock(&hub.state);
    let mut emptied = Vec::new();
    for (name, subs) in st.channels.iter_mut() {
        if channel.is_some_and(|c| c != name) {
            continue;
        }
        subs.retain(|c| c.key.pid != pid);
        if subs.is_empty() {
            emptied.push(name.clone());
        }
    }
    for name in emptied {
        st.channels.remove(&name);
        let _ = hub.cmds.send(Cmd::Channel {
            name,
            listen: false,
            done: None,
        });
    }
    if channel.is_none() {
        st.inbox.remove(&pid);
    }
}

/// The notifications waiting for the client with key `pid`.
pub fn take(pool: &Pool, pid: u32) -> Option<BytesMut> {
    let hub = existing(pool)?;
    let mut st = lock(&hub.state);
    st.inbox.remove(&pid)
}

/// The channels a client listens on, for a client that is asked (tests, the console).
pub fn channels_of(pool: &Pool, pid: u32) -> Vec<String> {
    let Some(hub) = existing(pool) else {
        return Vec::new();
    };
    let st = lock(&hub.state);
    let mut v: Vec<String> = st
        .channels
        .iter()
        .filter(|(_, subs)| subs.iter().any(|c| c.key.pid == pid))
        .map(|(n, _)| n.clone())
        .collect();
    v.sort();
    v
}

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The hub's task: holds a server while any channel is listened on, listens on it, and
/// dispatches what arrives. A lost connection is replaced and listens again (what was
/// sent meanwhile is lost, as for a client whose connection broke).
async fn run(
    hub: Arc<Hub>,
    pool: Arc<Pool>,
    scram: Option<weir_auth::scram::Credential>,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
) {
    let mut conn: Option<Lease> = None;
    let mut buf = BytesMut::new();
    let mut acks: Vec<oneshot::Sender<()>> = Vec::new();
    loop {
        let wanted = !lock(&hub.state).channels.is_empty();
        if wanted && conn.is_none() {
            match connect(&hub, &pool, &scram).await {
                Some(c) => {
                    conn = Some(c);
                    buf.clear();
                }
                None => {
                    crate::timers::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            }
        }
        if !wanted && acks.is_empty() && buf.is_empty() {
            if let Some(mut c) = conn.take() {
                // Nobody listens: the server goes back to the pool, listening on nothing.
                if c.run_internal("UNLISTEN *", Duration::from_secs(10))
                    .await
                    .is_ok()
                {
                    c.release();
                }
            }
        }
        let Some(c) = conn.as_mut() else {
            match cmds.recv().await {
                Some(cmd) => {
                    handle(&mut None, cmd, &mut acks).await;
                }
                None => return,
            }
            continue;
        };
        tokio::select! {
            cmd = cmds.recv() => match cmd {
                Some(cmd) => {
                    let mut some = Some(&mut **c);
                    if !handle(&mut some, cmd, &mut acks).await {
                        conn = None;
                    }
                }
                None => return,
            },
            msg = read_message(&mut c.stream, &mut buf, 1 << 30) => match msg {
                Ok(m) => match m.tag {
                    b'A' => dispatch(&hub, &m.body),
                    b'Z' if !acks.is_empty() => {
                        acks.remove(0).send(()).ok();
                    }
                    b'E' => tracing::warn!(
                        "listening connection: {}",
                        crate::protocol::PgError::parse(&m.body).message
                    ),
                    _ => {}
                },
                Err(_) => {
                    tracing::warn!(
                        "{}/{}: the listening connection was lost; listening again on a new one",
                        pool.database,
                        pool.user
                    );
                    conn = None;
                    acks.clear();
                }
            },
        }
    }
}

/// A server for the hub, listening on every channel someone listens on.
async fn connect(
    hub: &Hub,
    pool: &Arc<Pool>,
    scram: &Option<weir_auth::scram::Credential>,
) -> Option<Lease> {
    let mut lease = match pool.checkout(scram.clone(), false, None).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!("listening connection: {}", e.message);
            return None;
        }
    };
    lease.adopt().ok()?;
    let names: Vec<String> = lock(&hub.state).channels.keys().cloned().collect();
    if !names.is_empty() {
        let sql: String = names
            .iter()
            .map(|n| format!("LISTEN {};", quote_ident(n)))
            .collect();
        lease
            .run_internal(&sql, Duration::from_secs(10))
            .await
            .ok()?;
    }
    Some(lease)
}

/// Sends a LISTEN or UNLISTEN; its ReadyForQuery acknowledges it. False when the
/// connection failed.
async fn handle(
    conn: &mut Option<&mut crate::server::ServerConn>,
    cmd: Cmd,
    acks: &mut Vec<oneshot::Sender<()>>,
) -> bool {
    let Cmd::Channel { name, listen, done } = cmd;
    let Some(c) = conn.as_mut() else {
        // Not connected: the channel is listened on when the connection is made.
        if let Some(d) = done {
            let _ = d.send(());
        }
        return true;
    };
    let verb = if listen { "LISTEN" } else { "UNLISTEN" };
    let mut out = BytesMut::new();
    messages::query(&mut out, &format!("{verb} {}", quote_ident(&name)));
    if c.stream.write_all(&out).await.is_err() {
        return false;
    }
    acks.push(match done {
        Some(d) => d,
        None => oneshot::channel().0,
    });
    true
}

/// Hands a NotificationResponse to the clients listening on its channel.
fn dispatch(hub: &Hub, body: &[u8]) {
    let Some(channel) = body
        .get(4..)
        .and_then(|b| b.split(|&c| c == 0).next())
        .and_then(|c| std::str::from_utf8(c).ok())
    else {
        return;
    };
    let mut st = lock(&hub.state);
    let Some(subs) = st.channels.get(channel).cloned() else {
        return;
    };
    for c in subs {
        let inbox = st.inbox.entry(c.key.pid).or_default();
        if inbox.len() > MAX_INBOX {
            // A client that does not read for this long loses the oldest ones: a server
            // would have stopped, but this connection serves every listener.
            tracing::warn!(
                "notifications for client {} dropped: it does not read them",
                c.key.pid
            );
            inbox.clear();
        }
        inbox.put_u8(b'A');
        inbox.put_u32(body.len() as u32 + 4);
        inbox.put_slice(body);
        c.notify();
    }
}

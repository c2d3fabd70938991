//! A replication client (`replication=database|true`: pg_basebackup, pg_receivewal,
//! pg_recvlogical, subscriptions) is paired with a server of its own for its whole life,
//! as in PgBouncer 1.23. Once both are logged in the bytes are passed through untouched:
//! CopyBoth streams and replication commands (IDENTIFY_SYSTEM, BASE_BACKUP) have none of
//! the transaction boundaries the relay pools servers at, and the server is never pooled.

use std::sync::atomic::Ordering;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::login::LoggedIn;
use super::{refuse, ClientCount, PoolMember};
use crate::pool::Lease;
use crate::protocol::{messages, PgError};
use crate::registry::clients::{CancelTarget, ClientHandle};
use crate::stats::Traffic;
use crate::stream::Stream;

/// Serves the client to its end: its server is opened with its startup parameters, the
/// server's own greeting (with Weir's cancel key) welcomes it, then bytes flow both ways
/// until either side leaves, and the server is closed with it.
pub(super) async fn serve(
    mut stream: Stream,
    mut inbuf: BytesMut,
    client: LoggedIn,
    handle: ClientHandle,
    _count: ClientCount,
) {
    let LoggedIn {
        pool,
        requested,
        settings,
        scram_keys,
        replication,
        admission,
        ..
    } = client;
    // The registration uncounts the client when it goes.
    admission.keep();
    let info = handle.0.clone();
    pool.clients.fetch_add(1, Ordering::Relaxed);
    let _member = PoolMember(pool.clone());
    pool.stats.count_login();
    info.set_replication(replication);
    // Everything the client asked for goes into the server's startup packet: a physical
    // walsender runs no SQL, so nothing could be set afterwards.
    let params: Vec<(String, String)> = requested
        .iter()
        .chain(settings.iter())
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
        .collect();
    info.set_waiting(None, None);
    let mut opening = std::pin::pin!(pool.dedicated(replication, &params, scram_keys));
    // Watching the client too: one that gives up while the pool is full must not leave
    // its server to be opened for nobody (the slot goes back as the attempt is dropped).
    let opened = loop {
        tokio::select! {
            biased;
            (code, why) = info.killed() => break Err(PgError::fatal(code, why)),
            r = &mut opening => break r,
            r = stream.read_buf(&mut inbuf), if inbuf.len() < crate::protocol::MAX_STARTUP_PACKET => {
                if matches!(r, Ok(0) | Err(_)) {
                    crate::conn_log::client_closing(&info, "client unexpected eof");
                    return;
                }
            }
        }
    };
    let mut server = match opened {
        Ok(s) => s,
        Err(e) => {
            crate::conn_log::pooler_error(&info, &e.message);
            refuse(&mut stream, &e).await;
            crate::conn_log::client_closing(&info, "login failed");
            return;
        }
    };
    let reason = match welcome(&mut stream, &mut server, &handle).await {
        Err(e) => {
            refuse(&mut stream, &e).await;
            e.message.to_string()
        }
        Ok(()) => {
            let mut traffic = Traffic {
                server_assignments: 1,
                ..Traffic::default()
            };
            let reason = tokio::select! {
                biased;
                (code, why) = info.killed() => {
                    crate::conn_log::pooler_error(&info, why);
                    refuse(&mut stream, &PgError::fatal(code, why)).await;
                    why.to_owned()
                }
                r = pump(&mut stream, &mut server, &inbuf, &mut traffic) => r,
            };
            pool.stats.add_traffic(&traffic);
            reason
        }
    };
    crate::conn_log::server_closing(&server.info.0, "replication client gone");
    server.close().await;
    info.set_idle();
    crate::conn_log::client_closing(&info, &reason);
}

/// AuthenticationOk, the server's parameters, the client's cancel key (cancels reach the
/// server through Weir, as for any client), login_notify_message's notice and
/// ReadyForQuery, in one write.
async fn welcome(
    stream: &mut Stream,
    server: &mut Lease,
    handle: &ClientHandle,
) -> Result<(), PgError> {
    server
        .adopt()
        .map_err(|_| PgError::fatal("08006", "server conn crashed?"))?;
    let mut out = BytesMut::with_capacity(512);
    messages::auth_request(&mut out, messages::AUTH_OK, &[]);
    for (name, value) in server.params.iter() {
        messages::parameter_status(&mut out, name, value);
    }
    let key = &handle.0.key;
    messages::backend_key_data(&mut out, key);
    crate::login_notice::append(&mut out);
    messages::ready_for_query(&mut out, b'I');
    stream
        .write_all(&out)
        .await
        .map_err(|_| PgError::fatal("08006", "client gone"))?;
    handle.0.set_active(CancelTarget {
        addr: server.addr.clone(),
        key: server.key.clone(),
        server_id: server.id,
    });
    server.info.0.set_active(key.pid);
    Ok(())
}

/// Passes bytes both ways until one side closes; why the session ended, for the log.
async fn pump(
    stream: &mut Stream,
    server: &mut Lease,
    early: &[u8],
    traffic: &mut Traffic,
) -> String {
    if !early.is_empty() && server.stream.write_all(early).await.is_err() {
        return "server conn crashed?".into();
    }
    traffic.received += early.len() as u64;
    match tokio::io::copy_bidirectional(stream, &mut server.stream).await {
        Ok((up, down)) => {
            traffic.received += up;
            traffic.sent += down;
            "client close request".into()
        }
        Err(e) => format!("replication stream ended: {e}"),
    }
}

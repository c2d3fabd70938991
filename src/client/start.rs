//! From a new connection to a session: the login, then the session a logged-in client
//! runs in. Apart from the hot path (mod.rs), since it runs once per client.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;

use super::login::{self, LoggedIn, Outcome};
use super::relay::{self, Exchange};
use super::{refuse, ClientCount, Console, Extras, PoolMember, Session, Timeouts};
use crate::app::App;
use crate::pool::{Pool, PoolMode};
use crate::protocol::framer::Framer;
use crate::protocol::startup::Replication;
use crate::protocol::PgError;
use crate::registry::clients::ClientHandle;
use crate::stats::Traffic;
use crate::stream::{Endpoint, Stream};

/// Logs the client in and sets up its session; None when it ends here (refused, a cancel
/// request, gone, or an admin console session, served to its end).
pub(super) async fn start(
    app: &Arc<App>,
    console: Console,
    mut stream: Stream,
    peer: Endpoint,
    local: Endpoint,
) -> Option<Session> {
    let count = ClientCount::new(app);
    let mut inbuf = BytesMut::new();
    if matches!(stream.read_arrived(&mut inbuf), Ok(0)) {
        return None;
    }
    let login_timeout = app.snapshot.load().config.general.client_login_timeout;
    let attempt = login::login(app, &mut stream, &mut inbuf, &peer);
    let outcome = if login_timeout.is_zero() {
        attempt.await
    } else {
        crate::timers::timeout(login_timeout, attempt)
            .await
            .unwrap_or_else(|_| Err(PgError::fatal("08P01", "client_login_timeout").into()))
    };
    let client = match outcome {
        Ok(Outcome::LoggedIn(c)) => c,
        Ok(Outcome::Admin(admin)) => {
            // Boxed (by `console`): its state must not size every client's login.
            console(app.clone(), stream, inbuf, admin, (peer, local)).await;
            return None;
        }
        Ok(Outcome::Cancel) | Ok(Outcome::Gone) => return None,
        Err(refusal) => {
            crate::conn_log::refused(
                refusal.database.as_deref().unwrap_or("(nodb)"),
                refusal.user.as_deref().unwrap_or("(nouser)"),
                &peer,
                &refusal.error.message,
            );
            Box::pin(refuse(&mut stream, &refusal.error)).await;
            return None;
        }
    };
    let handle = register(&client, peer, local, &stream);
    crate::conn_log::login_attempt(&handle.0);
    if client.replication != Replication::None {
        Box::pin(super::replication::serve(
            stream, inbuf, client, handle, count,
        ))
        .await;
        return None;
    }
    let LoggedIn {
        user,
        database,
        pool,
        requested,
        settings,
        scram_keys,
        admission,
        replication: _,
        long_key: _,
    } = client;
    let settings = (!settings.is_empty()).then(|| Arc::new(settings));
    // The registration uncounts the client when it goes.
    admission.keep();
    pool.clients.fetch_add(1, Ordering::Relaxed);
    // Once per session, here and not in the relay: a parked session that resumes does not
    // log in again.
    pool.stats.count_login();
    let snap = app.snapshot.load_full();
    let no_entry = weir_config::Database::default();
    let mode = snap.pool_mode(
        snap.resolve_database(&database).map_or(&no_entry, |d| d.0),
        // The pool's user: a forced user's settings, not the logging-in user's.
        &pool.user,
    );
    let general = &snap.config.general;
    let extras = Extras {
        requested: Some(requested),
        scram_keys,
        gucs: settings.clone(),
        startup_gucs: settings,
        ..Extras::default()
    };
    let timeouts = Timeouts::from_config(general, snap.config.users.get(&user));
    let session = Session::new(
        stream, inbuf, mode, general, timeouts, handle, pool, count, extras,
    );
    Some(session)
}

/// Makes the client visible to the console and to cancel requests.
fn register(client: &LoggedIn, peer: Endpoint, local: Endpoint, stream: &Stream) -> ClientHandle {
    let handle = ClientHandle::register(
        &client.user,
        &client.database,
        peer,
        local,
        client.requested.get("application_name").unwrap_or(""),
        client.long_key,
    );
    if let Stream::Tls(t) = stream {
        if let tokio_rustls::TlsStream::Server(s) = &**t {
            let tls = crate::tls::connect::describe(s.get_ref().1);
            crate::registry::client_tls::set(&handle.0, tls);
        }
    }
    handle
}

impl Session {
    /// A logged-in client's session, idle, before its first request.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        stream: Stream,
        inbuf: BytesMut,
        mode: PoolMode,
        general: &weir_config::General,
        timeouts: Timeouts,
        client: ClientHandle,
        pool: Arc<Pool>,
        count: ClientCount,
        extras: Extras,
    ) -> Session {
        Session {
            stream,
            inbuf,
            cframe: Framer::default(),
            outbuf: BytesMut::new(),
            sframe: Framer::default(),
            mode,
            wanted: Arc::default(),
            // PostgreSQL refuses anything over 1 GB anyway; refusing it here gives the
            // client a clear error instead of a server that hangs up.
            max_packet: general.max_packet_size.min(relay::MAX_MESSAGE as u32),
            prepared_cap: if mode == PoolMode::Session {
                0
            } else {
                pool.settings().prepared_cap
            },
            exchange: Exchange::fresh(),
            shutting_down: false,
            held_back: false,
            touched: 0,
            ties: 0,
            client,
            pool: PoolMember(pool),
            delta: Traffic::default(),
            query_started: None,
            xact_started: None,
            idle_since: Instant::now(),
            timeouts,
            fast_close: general.server_fast_close,
            _count: count,
            extras: Some(Box::new(extras)),
        }
    }
}

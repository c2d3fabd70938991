//! A client's first moments: the startup packet (and the SSL/GSS/cancel requests that share
//! its framing), authentication against the auth_file, and the welcome.

use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use weir_auth::scram::{Credential, ServerSession, MECHANISM, MECHANISM_PLUS};
use weir_auth::Secret;
use weir_config::AuthType;

use super::auth_method::{self, Method};
use crate::app::{App, Snapshot};
use crate::gucs::Gucs;
use crate::params::{tracked_name, ParamSet};
use crate::pool::Pool;
use crate::protocol::messages::{
    self, AUTH_CLEARTEXT, AUTH_MD5, AUTH_OK, AUTH_SASL_CONTINUE, AUTH_SASL_FINAL,
};
use crate::protocol::reader::{read_message, read_startup_packet, ReadError};
use crate::protocol::startup::{self, Replication, StartupPacket};
use crate::protocol::{PgError, MAX_STARTUP_PACKET};
use crate::registry::client_limits::{self, Admission, Limits};
use crate::stream::Stream;

/// A client that has logged in: who it is, where it goes, what it asked for.
pub struct LoggedIn {
    pub user: String,
    pub database: String,
    pub pool: Arc<Pool>,
    /// Tracked parameters the client set at startup (client_encoding, DateStyle, ...).
    pub requested: ParamSet,
    /// The other settings it gave at startup (see client::state).
    pub settings: Gucs,
    /// Keys from the client's SCRAM proof, to log in to PostgreSQL on its behalf.
    pub scram_keys: Option<Credential>,
    /// The client's place in its database's and user's client counts, until registered.
    pub admission: Admission,
    /// A replication connection: it gets a server of its own (client::replication).
    pub replication: Replication,
    /// It speaks protocol 3.2: its cancel key is long (registry::keys).
    pub long_key: bool,
}

pub enum Outcome {
    LoggedIn(LoggedIn),
    /// A user of the admin console (database `pgbouncer`, or `weir`).
    Admin(AdminLogin),
    /// The connection was a cancel request, now forwarded.
    Cancel,
    /// The client left before finishing (nothing to report).
    Gone,
}

pub struct AdminLogin {
    pub user: String,
    /// May run every command, not only the read-only SHOW commands.
    pub full_access: bool,
    pub requested: ParamSet,
    pub admission: Admission,
    /// It speaks protocol 3.2: its (meaningless) cancel key is as long as any other's.
    pub long_key: bool,
}

/// A startup parameter or an `options` setting: a reported one is tracked as such, the
/// others join the client's settings.
pub(crate) fn startup_setting(
    requested: &mut ParamSet,
    settings: &mut Gucs,
    name: &str,
    value: &str,
) {
    match tracked_name(name) {
        Some(tracked) => requested.set(tracked, value),
        None => settings.put(&name.to_ascii_lowercase(), Some(value)),
    }
}

/// The protocol a client asking for 3.`minor` is served in, as PostgreSQL 18 serves it,
/// and whether its cancel key is long (3.2 and up). 3.2 differs from 3.0 only in the
/// cancel key, and the key a client gets is Weir's own whatever its servers speak (a
/// cancel goes on to each server with that server's own key), so a client gets 3.2
/// when it asks for it, and newer ones 3.2 too, told by NegotiateProtocolVersion. 3.1
/// was never a protocol (libpq 18 skips it; PostgreSQL 18 takes it without a word, with a
/// 4-byte key), nor is it one here.
fn protocol_for(minor: u16) -> (u32, bool) {
    let version = messages::PROTOCOL_3_0 | u32::from(minor);
    (version.min(messages::PROTOCOL_3_2), minor >= 2)
}

/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE: u8 = 0x16;

/// A TLS handshake begun without an SSLRequest. As PostgreSQL 17 does, the client must
/// name the protocol with ALPN (`postgresql`); the ClientHello bytes already read are
/// handed to rustls first.
async fn direct_tls(
    app: &App,
    stream: &mut Stream,
    buf: &mut BytesMut,
) -> Result<(), Box<Refusal>> {
    use tokio::io::AsyncReadExt;
    let refused = |why: &str| -> Box<Refusal> {
        // Nothing can be said in the clear to a client mid-handshake; the log says why.
        PgError::fatal("08P01", format!("direct TLS connection refused: {why}")).into()
    };
    let tls = app.snapshot.load().client_tls.clone();
    let Some(config) = tls.config.clone() else {
        return Err(refused(
            "TLS is not configured (client_tls_sslmode = disable)",
        ));
    };
    if matches!(stream, Stream::Unix(_)) {
        return Err(refused("not over the Unix socket"));
    }
    let mut acceptor = rustls::server::Acceptor::default();
    let accepted = loop {
        let mut fed = &buf[..];
        while !fed.is_empty() {
            acceptor
                .read_tls(&mut fed)
                .map_err(|e| refused(&e.to_string()))?;
        }
        buf.clear();
        match acceptor.accept() {
            Ok(Some(a)) => break a,
            Ok(None) => {}
            Err((e, _)) => return Err(refused(&e.to_string())),
        }
        if buf.len() > MAX_STARTUP_PACKET || stream.read_buf(buf).await.unwrap_or(0) == 0 {
            return Err(refused("the client left during the ClientHello"));
        }
    };
    let alpn_ok = accepted
        .client_hello()
        .alpn()
        .is_some_and(|mut protocols| protocols.any(|p| p == b"postgresql"));
    if !alpn_ok {
        return Err(refused("the client did not ask for ALPN \"postgresql\""));
    }
    let plain = std::mem::replace(stream, Stream::Parked(crate::stream::StdSocket::None));
    match tokio_rustls::StartHandshake::from_parts(accepted, plain)
        .into_stream(config)
        .await
    {
        Ok(tls) => {
            *stream = Stream::Tls(Box::new(tokio_rustls::TlsStream::Server(tls)));
            Ok(())
        }
        Err(e) => Err(refused(&format!("TLS handshake failed: {e}"))),
    }
}

/// The TLS handshake after the client's SSLRequest was answered 'S'.
async fn start_tls(
    stream: &mut Stream,
    config: std::sync::Arc<rustls::ServerConfig>,
) -> Result<(), Box<Refusal>> {
    let plain = std::mem::replace(stream, Stream::Parked(crate::stream::StdSocket::None));
    match tokio_rustls::TlsAcceptor::from(config).accept(plain).await {
        Ok(tls) => {
            *stream = Stream::Tls(Box::new(tokio_rustls::TlsStream::Server(tls)));
            Ok(())
        }
        // The client cannot be told anything in the clear now; the log says why.
        Err(e) => Err(PgError::fatal("08P01", format!("TLS handshake failed: {e}")).into()),
    }
}

/// The console's database names, unless the configuration uses the name for a real database.
pub fn is_admin_database(snap: &Snapshot, name: &str) -> bool {
    (name == "pgbouncer" || name == "weir") && snap.config.database(name).is_none()
}

/// What went wrong, and whether the client should be told.
pub struct Refusal {
    pub error: PgError,
    pub user: Option<String>,
    pub database: Option<String>,
}

impl From<PgError> for Box<Refusal> {
    fn from(error: PgError) -> Box<Refusal> {
        Box::new(Refusal {
            error,
            user: None,
            database: None,
        })
    }
}

fn read_error(e: ReadError) -> PgError {
    match e {
        ReadError::TooLarge(_) => PgError::fatal("08P01", "packet too large"),
        _ => PgError::fatal("08P01", "bad packet header"),
    }
}

pub async fn login(
    app: &App,
    stream: &mut Stream,
    buf: &mut BytesMut,
    peer: &crate::stream::Endpoint,
) -> Result<Outcome, Box<Refusal>> {
    // PostgreSQL 17's direct TLS (sslnegotiation=direct): a TLS ClientHello where the
    // length of a startup packet would be.
    if buf.first() == Some(&TLS_HANDSHAKE) && !stream.is_tls() {
        Box::pin(direct_tls(app, stream, buf)).await?;
    }
    let (minor, payload) = loop {
        let payload = match read_startup_packet(stream, buf, MAX_STARTUP_PACKET).await {
            Ok(p) => p,
            Err(ReadError::Closed) => return Ok(Outcome::Gone),
            Err(e) => return Err(read_error(e).into()),
        };
        match startup::parse(&payload) {
            Ok(StartupPacket::SslRequest) | Ok(StartupPacket::GssEncRequest) => {
                if !buf.is_empty() {
                    // Bytes after an SSLRequest, before our answer, could only be an attempt to
                    // inject plaintext into what the client believes is a TLS session.
                    return Err(PgError::fatal("08P01", "unexpected data after SSL request").into());
                }
                let tls = app.snapshot.load().client_tls.clone();
                let ssl = matches!(startup::parse(&payload), Ok(StartupPacket::SslRequest));
                match &tls.config {
                    // TLS is for TCP: over the Unix socket the answer is no, as PgBouncer's.
                    Some(config)
                        if ssl && !stream.is_tls() && !matches!(stream, Stream::Unix(_)) =>
                    {
                        stream
                            .write_all(b"S")
                            .await
                            .map_err(|_| PgError::fatal("08006", "client gone"))?;
                        start_tls(stream, config.clone()).await?;
                    }
                    _ => stream
                        .write_all(b"N")
                        .await
                        .map_err(|_| PgError::fatal("08006", "client gone"))?,
                }
            }
            Ok(StartupPacket::Cancel(key)) => {
                Box::pin(crate::cancel::forward(app, key)).await;
                return Ok(Outcome::Cancel);
            }
            Ok(StartupPacket::Startup { minor, .. }) => break (minor, payload),
            Err(startup::StartupError::Malformed) => {
                return Err(PgError::fatal("08P01", "bad startup packet").into());
            }
            Err(e @ startup::StartupError::UnsupportedVersion(..)) => {
                return Err(PgError::fatal("0A000", e.to_string()).into());
            }
        }
    };

    let snap = app.snapshot.load_full();
    if snap.client_tls.required() && !stream.is_tls() && !matches!(stream, Stream::Unix(_)) {
        return Err(PgError::fatal("28000", "SSL required").into());
    }
    let mut user = None;
    let mut database = None;
    let mut requested = ParamSet::default();
    let mut settings = Gucs::default();
    let mut unsupported_options = Vec::new();
    let ignored = |name: &str| {
        snap.config
            .general
            .ignore_startup_parameters
            .iter()
            .any(|p| p.eq_ignore_ascii_case(name))
    };
    let mut replication = Replication::None;
    for (name, value) in startup::params(&payload) {
        match name {
            "user" => user = Some(value.to_owned()),
            "database" => database = Some(value.to_owned()),
            // Not a setting: PostgreSQL would refuse it as one. It decides what kind of
            // server the client needs.
            "replication" => {
                replication = Replication::parse(value).ok_or_else(|| {
                    PgError::fatal(
                        "22023",
                        format!("invalid value for parameter \"replication\": \"{value}\""),
                    )
                })?;
            }
            n if n.starts_with("_pq_.") => unsupported_options.push(name.to_owned()),
            // Beyond PgBouncer, which refuses what it does not track: any other setting
            // (sqlx's extra_float_digits, pgJDBC's up to 42.7.4, PGOPTIONS) becomes one the
            // client made, carried to every server it is lent (see client::state).
            "options" => {
                let Some(pairs) = crate::gucs::from_options(value) else {
                    return Err(PgError::fatal(
                        "08P01",
                        "unsupported options startup parameter: only '-c config=val' and '--config=val' are allowed",
                    )
                    .into());
                };
                // As PgBouncer 1.21+ reads them: each `-c` setting is a startup
                // parameter of its own, dropped when ignore_startup_parameters lists it.
                // Listing `options` itself drops all but the tracked ones, which
                // PgBouncer still applies.
                let all_ignored = ignored("options");
                for (n, v) in pairs.iter().filter(|(n, _)| {
                    !ignored(n) && (!all_ignored || crate::params::tracked_name(n).is_some())
                }) {
                    startup_setting(&mut requested, &mut settings, n, v);
                }
            }
            _ if ignored(name) => {}
            n => startup_setting(&mut requested, &mut settings, n, value),
        }
    }
    let user = match user {
        Some(u) if !u.is_empty() => u,
        _ => {
            return Err(PgError::fatal(
                "28000",
                "no PostgreSQL user name specified in startup packet",
            )
            .into())
        }
    };
    let database = match database {
        Some(d) if !d.is_empty() => d,
        _ => user.clone(),
    };
    let refuse = |error: PgError| {
        Box::new(Refusal {
            error,
            user: Some(user.clone()),
            database: Some(database.clone()),
        })
    };
    let (version, long_key) = protocol_for(minor);
    // Told only what differs from what it asked for.
    if version != messages::PROTOCOL_3_0 | u32::from(minor) || !unsupported_options.is_empty() {
        let mut out = BytesMut::new();
        messages::negotiate_protocol_version(&mut out, version, &unsupported_options);
        stream
            .write_all(&out)
            .await
            .map_err(|_| refuse(PgError::fatal("08006", "client gone")))?;
    }
    // The console stays reachable when max_client_conn is full, as in PgBouncer: that is
    // when an operator needs it.
    if app.clients.load(std::sync::atomic::Ordering::Relaxed)
        > snap.config.general.max_client_conn as usize
        && !is_admin_database(&snap, &database)
    {
        return Err(refuse(PgError::fatal(
            "53300",
            "no more connections allowed (max_client_conn)",
        )));
    }
    if is_admin_database(&snap, &database) {
        if replication != Replication::None {
            return Err(refuse(PgError::fatal(
                "0A000",
                "the admin console does not accept replication connections",
            )));
        }
        let g = &snap.config.general;
        // PgBouncer's own-user login: the OS user running the pooler, over the Unix
        // socket, as user pgbouncer, gets in without a password (cron jobs and sidecars
        // on the same host rely on it).
        let own_user = user == ADMIN_DB && stream.peer_uid() == Some(effective_uid());
        if own_user {
            tracing::info!("{database}/{user}@{peer} pgbouncer access from unix socket");
        }
        let any = g.auth_type == AuthType::Any;
        let admin = g.admin_users.contains(&user);
        let full_access = own_user || any || admin;
        if !own_user {
            let method = auth_method::resolve(&snap, stream, peer, &database, &user, false)
                .map_err(refuse)?;
            // A console user missing from auth_file is looked up as PgBouncer 1.25 does:
            // with the global auth_user, in the global auth_dbname.
            let src = crate::auth_query::global_source(&snap);
            let looked_up = look_up(app, &snap, src, &user, &method)
                .await
                .map_err(refuse)?;
            let secret = snap.secret(&user).or(looked_up.as_ref());
            authenticate(&snap, stream, buf, &user, secret, method)
                .await
                .map_err(refuse)?;
        }
        // Only once the client has proved who it is, as in PgBouncer: refused before the
        // password, anyone could learn who is in admin_users and stats_users.
        if !full_access && !g.stats_users.contains(&user) {
            return Err(refuse(PgError::fatal(
                "28000",
                "not allowed to connect to the admin console",
            )));
        }
        let limits = Limits {
            database: g.max_db_client_connections,
            user: user_client_max(&snap, &user),
            exempt: admin,
        };
        let admission = client_limits::admit(ADMIN_DB, &user, &limits).map_err(refuse)?;
        let mut ok = BytesMut::new();
        messages::auth_request(&mut ok, AUTH_OK, &[]);
        send(stream, &ok).await.map_err(refuse)?;
        return Ok(Outcome::Admin(AdminLogin {
            user,
            full_access,
            requested,
            admission,
            long_key,
        }));
    }
    if let Some(e) = crate::pool::gates::login_refusal(&database) {
        return Err(refuse(e));
    }

    // An unknown database is only named once the client has authenticated, as in
    // PgBouncer: a wrong password must be answered alike whether the database exists or
    // not, or anyone could list the databases without a password.
    let known_database = snap.resolve_database(&database).is_some();
    let physical = replication == Replication::Physical;
    let method =
        auth_method::resolve(&snap, stream, peer, &database, &user, physical).map_err(refuse)?;
    let src = crate::auth_query::source(&snap, &database);
    let looked_up = look_up(app, &snap, src, &user, &method)
        .await
        .map_err(refuse)?;
    let secret = snap.secret(&user).or(looked_up.as_ref());
    let any = matches!(method, Method::Any);
    let proof = authenticate(&snap, stream, buf, &user, secret, method)
        .await
        .map_err(refuse)?;
    let scram_keys = proof.keys;
    // A password PAM or LDAP took is the one to log in to PostgreSQL with, as in
    // PgBouncer (unless the database entry gives its own).
    let looked_up = looked_up.or(proof.password.map(Secret::Plain));
    if !known_database {
        return Err(refuse(PgError::fatal(
            "3D000",
            format!("no such database: {database}"),
        )));
    }
    // auth_type any ignores the name the client gives, so only a database that logs in
    // as a user of its own may take it: else anyone would be whom they claim towards
    // PostgreSQL. PgBouncer refuses it alike.
    if any
        && snap
            .resolve_database(&database)
            .is_some_and(|(db, _)| db.user.is_none())
    {
        tracing::error!("auth_type=any requires forced user for database \"{database}\"");
        return Err(refuse(PgError::fatal("08P01", "bouncer config error")));
    }
    let g = &snap.config.general;
    let limits = Limits {
        database: snap
            .resolve_database(&database)
            .and_then(|(db, _)| db.max_db_client_connections)
            .unwrap_or(g.max_db_client_connections),
        user: user_client_max(&snap, &user),
        exempt: false,
    };
    let admission = client_limits::admit(&database, &user, &limits).map_err(refuse)?;
    let pool = app.pool(&snap, &database, &user).ok_or_else(|| {
        refuse(PgError::fatal(
            "3D000",
            format!("no such database: {database}"),
        ))
    })?;
    if let Some(keys) = &scram_keys {
        pool.remember_scram(keys);
    }
    // An empty secret (a NULL password, for trust) is nothing to log in to PostgreSQL with.
    if let Some(s) = looked_up
        .as_ref()
        .filter(|s| !matches!(s, Secret::Plain(p) if p.is_empty()))
    {
        let forced_password = snap
            .resolve_database(&database)
            .is_some_and(|(db, _)| db.user.is_some() && db.password.is_some());
        if !forced_password {
            pool.learn_secret(s);
        }
    }
    if let Some(name) = requested.get("application_name").map(str::to_owned) {
        if snap.config.general.application_name_add_host {
            requested.set("application_name", &format!("{name} - {peer}"));
        }
    }
    Ok(Outcome::LoggedIn(LoggedIn {
        user,
        database,
        pool,
        requested,
        settings,
        scram_keys,
        admission,
        replication,
        long_key,
    }))
}

/// The secret auth_query finds for a user missing from auth_file, when `method` needs
/// one: trust too, since an unknown user is refused, as PgBouncer does.
async fn look_up(
    app: &App,
    snap: &Snapshot,
    src: Option<crate::auth_query::LookupSource>,
    user: &str,
    method: &Method,
) -> Result<Option<Secret>, PgError> {
    // PAM and LDAP check the password themselves; auth_file and auth_query play no part.
    let needs_secret = !matches!(
        method,
        Method::Any | Method::Cert(_) | Method::Peer(_) | Method::Pam(_) | Method::Ldap(_)
    );
    match src {
        Some(src) if needs_secret && snap.secret(user).is_none() => {
            // Boxed: its state would otherwise size every login's future.
            Box::pin(crate::auth_query::lookup(app, snap, &src, user)).await
        }
        _ => Ok(None),
    }
}

/// The console's database (whichever name the client used) and its own user.
use crate::pool::gates::ADMIN_DB;

fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// max_user_client_connections for `user`: its [users] value, else the global one.
fn user_client_max(snap: &Snapshot, user: &str) -> u32 {
    snap.config
        .users
        .get(user)
        .and_then(|u| u.max_user_client_connections)
        .unwrap_or(snap.config.general.max_user_client_connections)
}

async fn send(stream: &mut Stream, out: &BytesMut) -> Result<(), PgError> {
    stream.write_all(out).await.map_err(|_| {
        PgError::fatal(
            "08006",
            "client closed the connection during authentication",
        )
    })
}

/// Reads the client's answer to an authentication request: a 'p' message.
async fn read_password(stream: &mut Stream, buf: &mut BytesMut) -> Result<bytes::Bytes, PgError> {
    let msg = read_message(stream, buf, MAX_STARTUP_PACKET)
        .await
        .map_err(read_error)?;
    if msg.tag != b'p' {
        return Err(PgError::fatal(
            "08P01",
            format!(
                "expected password response, got message type {}",
                msg.tag as char
            ),
        ));
    }
    Ok(msg.body)
}

/// PgBouncer's wording for any failed SCRAM exchange (a wrong password, an unknown user,
/// a secret SCRAM cannot use); the SQLSTATE stays PostgreSQL's, as for a wrong password.
fn sasl_failed() -> PgError {
    PgError::fatal("28P01", "SASL authentication failed")
}

fn password_failed(user: &str) -> PgError {
    PgError::fatal(
        "28P01",
        format!("password authentication failed for user \"{user}\""),
    )
}

/// What a login proved that can log in to PostgreSQL in the client's stead.
struct Proof {
    /// The keys of a SCRAM exchange.
    keys: Option<Credential>,
    /// The cleartext password PAM or LDAP accepted.
    password: Option<String>,
}

/// Asks for the password in the clear (AuthenticationCleartextPassword), without its NUL.
async fn cleartext(stream: &mut Stream, buf: &mut BytesMut) -> Result<bytes::Bytes, PgError> {
    let mut out = BytesMut::new();
    messages::auth_request(&mut out, AUTH_CLEARTEXT, &[]);
    send(stream, &out).await?;
    let body = read_password(stream, buf).await?;
    Ok(match body.strip_suffix(&[0]) {
        Some(p) => body.slice(..p.len()),
        None => body,
    })
}

/// Checks the client's credentials the way auth_type says.
async fn authenticate(
    snap: &Snapshot,
    stream: &mut Stream,
    buf: &mut BytesMut,
    user: &str,
    secret: Option<&Secret>,
    method: Method,
) -> Result<Proof, PgError> {
    // A user with an empty password (auth_file's "", auth_query's NULL) exists, for
    // trust, but no password proves it, as in PgBouncer and PostgreSQL.
    let exists = secret.is_some();
    let secret = secret.filter(|s| !matches!(s, Secret::Plain(p) if p.is_empty()));
    let known = secret.is_some();
    // An unknown user goes through the same exchange as a known one and fails at the same
    // point, as in PostgreSQL, so a client cannot probe which users exist.
    let made_up;
    let secret = match secret {
        Some(s) => Some(s),
        None => {
            made_up = if matches!(method, Method::Scram) {
                Secret::Scram(weir_auth::scram::mock_secret(user))
            } else {
                Secret::Plain(format!("{:032x}", rand::random::<u128>()))
            };
            Some(&made_up)
        }
    };
    let mut out = BytesMut::new();
    let mut keys = None;
    let mut password_learnt = None;
    match (method, &secret) {
        (Method::Any, _) => {}
        (Method::Trust, _) if exists => {}
        // hba's trust, as PostgreSQL's, needs no auth_file entry: the rule is the proof.
        (Method::Trust, _) if snap.config.general.auth_type == AuthType::Hba => {}
        (Method::Trust, _) => {
            return Err(PgError::fatal("28000", "\"trust\" authentication failed"))
        }
        (Method::Cert(map), _) => auth_method::check_cert(snap, stream, user, map.as_deref())?,
        (Method::Peer(map), _) => auth_method::check_peer(snap, stream, user, map.as_deref())?,
        (Method::Password, _) => {
            let password = cleartext(stream, buf).await?;
            match &secret {
                Some(s) if known && weir_auth::plain_verify(user, s, &password) => {}
                _ => return Err(password_failed(user)),
            }
        }
        // PgBouncer's words; the SQLSTATE is PostgreSQL's for a failed password (PgBouncer
        // sends 08P01, which drivers take for a broken connection rather than a refusal).
        (Method::Pam(rhost), _) => {
            let password = cleartext(stream, buf).await?;
            let confdir = snap.config.general.auth_pam_confdir.clone();
            if !crate::external_auth::pam::check(user, &password, rhost, confdir).await {
                return Err(PgError::fatal("28P01", "PAM authentication failed"));
            }
            password_learnt = String::from_utf8(password.to_vec()).ok();
        }
        (Method::Ldap(options), _) => {
            let password = cleartext(stream, buf).await?;
            if !crate::external_auth::ldap::check(options, user, &password).await {
                return Err(PgError::fatal("28P01", "LDAP authentication failed"));
            }
            password_learnt = String::from_utf8(password.to_vec()).ok();
        }
        (Method::Md5, Some(Secret::Plain(_) | Secret::Md5(_))) => {
            let salt: [u8; 4] = rand::random();
            messages::auth_request(&mut out, AUTH_MD5, &salt);
            send(stream, &out).await?;
            let body = read_password(stream, buf).await?;
            let response = body.strip_suffix(&[0]).unwrap_or(&body);
            if !known
                || !secret
                    .as_ref()
                    .is_some_and(|s| weir_auth::md5_verify(user, s, salt, response))
            {
                return Err(password_failed(user));
            }
        }
        // md5 with a SCRAM secret cannot work; PgBouncer upgrades the exchange to SCRAM.
        (Method::Md5 | Method::Scram, Some(s)) => {
            let Some(session) = ServerSession::for_user(user, s) else {
                return Err(sasl_failed());
            };
            // Boxed: its state would otherwise size every login's future (md5 and trust too).
            let end_point = snap.client_tls.end_point.clone();
            keys = Some(Box::pin(scram_exchange(stream, buf, session, end_point)).await?);
            if !known {
                return Err(sasl_failed());
            }
        }
        (Method::Md5 | Method::Scram, None) => return Err(password_failed(user)),
    }
    // AuthenticationOk is not sent here: it goes out with the rest of the welcome, in one
    // write.
    Ok(Proof {
        keys,
        password: password_learnt,
    })
}

/// A SASLInitialResponse body: the client-first-message, checked against the mechanism
/// the client chose (`plus`: SCRAM-SHA-256-PLUS was offered).
pub fn sasl_initial_response(body: &[u8], plus: bool) -> Result<&[u8], PgError> {
    let malformed = || PgError::fatal("08P01", "malformed SCRAM message");
    let nul = body.iter().position(|b| *b == 0).ok_or_else(malformed)?;
    let chosen = &body[..nul];
    if chosen != MECHANISM.as_bytes() && !(plus && chosen == MECHANISM_PLUS.as_bytes()) {
        return Err(PgError::fatal(
            "28000",
            "client selected an invalid SASL authentication mechanism",
        ));
    }
    let chose_plus = chosen == MECHANISM_PLUS.as_bytes();
    let rest = &body[nul + 1..];
    let (len, data) = rest.split_at_checked(4).ok_or_else(malformed)?;
    let len = i32::from_be_bytes([len[0], len[1], len[2], len[3]]);
    if len < 0 || len as usize != data.len() {
        return Err(malformed());
    }
    // The mechanism and the gs2 header must agree: PLUS binds ('p'), plain SCRAM does not.
    if chose_plus != data.first().is_some_and(|&b| b == b'p') {
        return Err(malformed());
    }
    Ok(data)
}

async fn scram_exchange(
    stream: &mut Stream,
    buf: &mut BytesMut,
    mut session: ServerSession,
    end_point: Option<Vec<u8>>,
) -> Result<Credential, PgError> {
    let malformed = || PgError::fatal("08P01", "malformed SCRAM message");
    let mut out = BytesMut::new();
    // Over TLS, SCRAM-SHA-256-PLUS first, as PostgreSQL lists them: libpq binds by default
    // (channel_binding=prefer), so a man in the middle with another certificate fails.
    let plus = end_point.is_some() && stream.is_tls();
    if let (true, Some(data)) = (plus, end_point) {
        session = session.with_channel_binding(data);
        messages::auth_sasl_mechanisms(&mut out, &[MECHANISM_PLUS, MECHANISM]);
    } else {
        messages::auth_sasl_mechanisms(&mut out, &[MECHANISM]);
    }
    send(stream, &out).await?;

    let initial = read_password(stream, buf).await?;
    let initial = sasl_initial_response(&initial, plus)?;
    let server_first = session.client_first(initial).map_err(|e| match e {
        weir_auth::AuthError::ChannelBindingDowngrade => {
            PgError::fatal("08P01", "SCRAM channel binding negotiation error")
        }
        _ => malformed(),
    })?;
    out.clear();
    messages::auth_request(&mut out, AUTH_SASL_CONTINUE, &server_first);
    send(stream, &out).await?;

    let client_final = read_password(stream, buf).await?;
    let done = session.client_final(&client_final).map_err(|e| match e {
        weir_auth::AuthError::WrongPassword => sasl_failed(),
        _ => malformed(),
    })?;
    out.clear();
    messages::auth_request(&mut out, AUTH_SASL_FINAL, &done.message);
    send(stream, &out).await?;
    Ok(Credential::Keys {
        client_key: done.client_key,
        server_key: done.server_key,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn protocol_as_postgresql_18_serves_it() {
        use crate::protocol::messages::{PROTOCOL_3_0, PROTOCOL_3_2};
        assert_eq!(super::protocol_for(0), (PROTOCOL_3_0, false));
        assert_eq!(super::protocol_for(1), (PROTOCOL_3_0 | 1, false));
        assert_eq!(super::protocol_for(2), (PROTOCOL_3_2, true));
        assert_eq!(super::protocol_for(9), (PROTOCOL_3_2, true));
    }
}

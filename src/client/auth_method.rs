//! Which way a client proves who it is: `auth_type`, or with `auth_type = hba` the first
//! matching rule of `auth_hba_file`; and the two methods that need no password: `cert`
//! (the TLS client certificate's common name) and `peer` (the Unix socket's OS user),
//! each optionally through a map of `auth_ident_file`.

use std::sync::Arc;

use weir_config::hba::{Conn, Method as HbaMethod};
use weir_config::ldap::LdapOptions;
use weir_config::AuthType;

use crate::app::Snapshot;
use crate::protocol::PgError;
use crate::stream::{Endpoint, Stream};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Method {
    Any,
    Trust,
    Password,
    Md5,
    Scram,
    /// With the `map=` of the hba rule.
    Cert(Option<String>),
    Peer(Option<String>),
    /// With the client's address, for PAM_RHOST.
    Pam(String),
    Ldap(Arc<LdapOptions>),
}

fn encryption(tls: bool) -> &'static str {
    if tls {
        "SSL encryption"
    } else {
        "no encryption"
    }
}

/// PostgreSQL's way to name the client in hba refusals.
fn client_desc(peer: &Endpoint, user: &str, database: &str, tls: bool) -> String {
    match peer.addr() {
        Some(a) => format!(
            "host \"{}\", user \"{user}\", database \"{database}\", {}",
            a.ip(),
            encryption(tls)
        ),
        None => format!("local user \"{user}\", database \"{database}\""),
    }
}

pub fn resolve(
    snap: &Snapshot,
    stream: &Stream,
    peer: &Endpoint,
    database: &str,
    user: &str,
    physical_replication: bool,
) -> Result<Method, PgError> {
    Ok(match snap.config.general.auth_type {
        AuthType::Any => Method::Any,
        AuthType::Trust => Method::Trust,
        AuthType::Plain => Method::Password,
        AuthType::Md5 => Method::Md5,
        AuthType::ScramSha256 => Method::Scram,
        AuthType::Cert => Method::Cert(None),
        AuthType::Pam => Method::Pam(rhost(peer)),
        AuthType::Ldap => match &snap.ldap {
            Some(o) => Method::Ldap(o.clone()),
            // Cannot happen: a load or SET without usable auth_ldap_options is refused.
            None => {
                tracing::error!("auth_type = ldap needs a valid auth_ldap_options");
                return Err(PgError::fatal("08P01", "bouncer config error"));
            }
        },
        AuthType::Hba => {
            let tls = stream.is_tls();
            let conn = Conn {
                addr: peer.addr().map(|a| a.ip()),
                tls,
                database,
                user,
                physical_replication,
            };
            let Some(rule) = snap.hba.as_ref().and_then(|h| h.find(&conn)) else {
                return Err(PgError::fatal(
                    "28000",
                    format!(
                        "no pg_hba.conf entry for {}",
                        client_desc(peer, user, database, tls)
                    ),
                ));
            };
            match rule.method {
                HbaMethod::Trust => Method::Trust,
                HbaMethod::Reject => {
                    return Err(PgError::fatal(
                        "28000",
                        format!(
                            "pg_hba.conf rejects connection for {}",
                            client_desc(peer, user, database, tls)
                        ),
                    ))
                }
                HbaMethod::Md5 => Method::Md5,
                HbaMethod::Password => Method::Password,
                HbaMethod::ScramSha256 => Method::Scram,
                HbaMethod::Cert => Method::Cert(rule.map.clone()),
                HbaMethod::Peer => Method::Peer(rule.map.clone()),
                HbaMethod::Ldap => match &rule.ldap {
                    Some(o) => Method::Ldap(o.clone()),
                    None => return Err(PgError::fatal("08P01", "bouncer config error")),
                },
            }
        }
    })
}

/// The client's address as PgBouncer gives it to PAM: the IP alone, `unix` for the socket.
fn rhost(peer: &Endpoint) -> String {
    match peer.addr() {
        Some(a) => a.ip().to_canonical().to_string(),
        None => "unix".to_owned(),
    }
}

/// The subject common name of the client's TLS certificate, if it gave one.
fn certificate_name(stream: &Stream) -> Option<String> {
    let Stream::Tls(t) = stream else {
        return None;
    };
    let tokio_rustls::TlsStream::Server(s) = &**t else {
        return None;
    };
    let der = s.get_ref().1.peer_certificates()?.first()?;
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_owned)
}

/// `cert`: a certificate (which rustls verified against client_tls_ca_file) whose common
/// name is the user, or maps to it.
pub fn check_cert(
    snap: &Snapshot,
    stream: &Stream,
    user: &str,
    map: Option<&str>,
) -> Result<(), PgError> {
    let failed = || {
        PgError::fatal(
            "28000",
            format!("certificate authentication failed for user \"{user}\""),
        )
    };
    let Some(name) = certificate_name(stream) else {
        return Err(PgError::fatal(
            "28000",
            "connection requires a valid client certificate",
        ));
    };
    let ok = match map {
        Some(m) => snap
            .ident
            .as_ref()
            .is_some_and(|i| i.allows(m, &name, user)),
        None => name == user,
    };
    if ok {
        return Ok(());
    }
    // PgBouncer's words when a map is in play, with the names it leaves out.
    match map {
        Some(m) => tracing::info!(
            "ident map: {m} does not have a match (certificate name \"{name}\", user \"{user}\")"
        ),
        None => tracing::info!("certificate name \"{name}\" does not match user \"{user}\""),
    }
    Err(failed())
}

/// The name of an OS user id.
fn os_user(uid: u32) -> Option<String> {
    let mut buf = vec![0 as libc::c_char; 4096];
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: getpwuid_r writes into pwd and buf, both live for the call; out is either
    // null or points at pwd.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr(), buf.len(), &mut out) };
    if rc != 0 || out.is_null() {
        return None;
    }
    // SAFETY: pw_name points into buf, NUL-terminated by getpwuid_r.
    let name = unsafe { std::ffi::CStr::from_ptr(pwd.pw_name) };
    name.to_str().ok().map(str::to_owned)
}

/// `peer`: the OS user at the other end of the Unix socket is the user, or maps to it.
pub fn check_peer(
    snap: &Snapshot,
    stream: &Stream,
    user: &str,
    map: Option<&str>,
) -> Result<(), PgError> {
    let failed = || {
        PgError::fatal(
            "28000",
            format!("Peer authentication failed for user \"{user}\""),
        )
    };
    let Some(name) = stream.peer_uid().and_then(os_user) else {
        return Err(failed());
    };
    let ok = match map {
        Some(m) => snap
            .ident
            .as_ref()
            .is_some_and(|i| i.allows(m, &name, user)),
        None => name == user,
    };
    if ok {
        return Ok(());
    }
    match map {
        Some(m) => {
            tracing::info!("ident map {m} cannot be matched (OS user \"{name}\", user \"{user}\")")
        }
        None => tracing::info!("OS user \"{name}\" does not match user \"{user}\""),
    }
    Err(failed())
}

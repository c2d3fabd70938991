//! `auth_type = ldap` and hba `ldap`: the client's cleartext password is checked by binding
//! to an LDAP server as the user, as PostgreSQL and PgBouncer do it. Simple bind: the DN
//! is `ldapprefix` + user + `ldapsuffix`. Search+bind: bind as `ldapbinddn` (anonymous
//! without it), find the one entry whose `ldapsearchattribute` (default `uid`) is the
//! user, or that `ldapsearchfilter` (`$username` replaced) finds, under `ldapbasedn`;
//! then bind as that entry on a new connection.

use std::sync::Arc;
use std::time::Duration;

use ldap3::{LdapConn, LdapConnSettings, Scope as LdapScope, SearchEntry};
use weir_config::ldap::{LdapOptions, Scope};

/// PgBouncer's LDAP network timeout.
const TIMEOUT: Duration = Duration::from_secs(3);

/// Whether the LDAP server takes `password` for `user`. Logs why not, with PgBouncer's
/// words.
pub async fn check(options: Arc<LdapOptions>, user: &str, password: &[u8]) -> bool {
    let Ok(password) = String::from_utf8(password.to_vec()) else {
        return false;
    };
    let user = user.to_owned();
    super::run_blocking(&super::LDAP_SLOTS, move || {
        authenticate(&options, &user, &password)
    })
    .await
}

fn servers(o: &LdapOptions) -> String {
    o.servers.join(" ")
}

/// A connection to the first server that answers, StartTLS done if asked for.
fn connect(o: &LdapOptions) -> Option<LdapConn> {
    let scheme = if o.ldaps { "ldaps" } else { "ldap" };
    let port = o.port.unwrap_or(if o.ldaps { 636 } else { 389 });
    let mut last = None;
    for server in &o.servers {
        let host = if server.contains(':') && !server.starts_with('[') {
            format!("[{server}]")
        } else {
            server.clone()
        };
        let settings = LdapConnSettings::new()
            .set_conn_timeout(TIMEOUT)
            .set_starttls(o.starttls);
        match LdapConn::with_settings(settings, &format!("{scheme}://{host}:{port}")) {
            Ok(mut conn) => {
                conn.with_timeout(TIMEOUT);
                return Some(conn);
            }
            Err(e) => last = Some(e),
        }
    }
    if let Some(e) = last {
        tracing::warn!(
            "could not connect to LDAP server \"{}\" on port {port}: {e}",
            servers(o)
        );
    }
    None
}

fn authenticate(o: &LdapOptions, user: &str, password: &str) -> bool {
    // An empty password would be an anonymous bind, which servers accept.
    if password.is_empty() {
        return false;
    }
    let Some(mut conn) = connect(o) else {
        return false;
    };
    let dn = match &o.basedn {
        Some(basedn) => match find_user(&mut conn, o, basedn, user) {
            Some(dn) => {
                let _ = conn.unbind();
                // A new connection, so that the bind below is the only identity on it.
                let Some(again) = connect(o) else {
                    return false;
                };
                conn = again;
                dn
            }
            None => {
                let _ = conn.unbind();
                return false;
            }
        },
        None => format!(
            "{}{user}{}",
            o.prefix.as_deref().unwrap_or(""),
            o.suffix.as_deref().unwrap_or("")
        ),
    };
    let result = conn.simple_bind(&dn, password).and_then(|r| r.success());
    let _ = conn.unbind();
    match result {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(
                "LDAP login failed for user {dn} on server {}: {e}",
                servers(o)
            );
            false
        }
    }
}

/// The DN of the one entry the search finds for `user`.
fn find_user(conn: &mut LdapConn, o: &LdapOptions, basedn: &str, user: &str) -> Option<String> {
    // Characters that would change the filter are not reasonable in a user name; refused
    // rather than escaped, as PostgreSQL does.
    if user.contains(['*', '(', ')', '\\', '/']) {
        tracing::warn!("invalid character in user name for LDAP authentication");
        return None;
    }
    let binddn = o.binddn.as_deref().unwrap_or("");
    if let Err(e) = conn
        .simple_bind(binddn, o.bindpasswd.as_deref().unwrap_or(""))
        .and_then(|r| r.success())
    {
        tracing::warn!(
            "could not perform initial LDAP bind for ldapbinddn \"{binddn}\" on server \"{}\": {e}",
            servers(o)
        );
        return None;
    }
    let (filter, attrs) = match &o.search_filter {
        Some(f) => (f.replace("$username", user), vec!["1.1".to_owned()]),
        None => {
            let attr = o.search_attribute.as_deref().unwrap_or("uid");
            (format!("({attr}={user})"), vec![attr.to_owned()])
        }
    };
    let scope = match o.scope {
        Scope::Base => LdapScope::Base,
        Scope::One => LdapScope::OneLevel,
        Scope::Sub => LdapScope::Subtree,
    };
    let entries = match conn
        .search(basedn, scope, &filter, attrs)
        .and_then(|r| r.success())
    {
        Ok((entries, _)) => entries,
        Err(e) => {
            tracing::warn!(
                "could not search LDAP for filter \"{filter}\" on server \"{}\": {e}",
                servers(o)
            );
            return None;
        }
    };
    match entries.len() {
        1 => {}
        0 => {
            tracing::warn!("LDAP user \"{user}\" does not exist");
            return None;
        }
        n => {
            tracing::warn!("LDAP user \"{user}\" is not unique ({n} entries)");
            return None;
        }
    }
    entries
        .into_iter()
        .next()
        .map(|e| SearchEntry::construct(e).dn)
}

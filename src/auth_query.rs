//! auth_query: a client missing from the auth_file has its secret looked up in PostgreSQL,
//! through a connection logged in as auth_user, on every login (so a changed password takes
//! effect at once).

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::AsyncWriteExt;
use weir_auth::Secret;

use crate::app::{App, Snapshot};
use crate::protocol::messages::put_message;
use crate::protocol::reader::read_message;
use crate::protocol::PgError;

/// Who runs the lookup, and where: None when auth_query is not configured for this
/// database.
pub struct LookupSource {
    pub auth_user: String,
    pub query: String,
    pub database: String,
}

/// Where to look `user` up for a login to `database`. For a database that is not
/// configured only a global auth_dbname names one to run the query in (the client's own
/// would be it, and there is none): None then, and the login goes on as for an unknown
/// user, so that a wrong password fails as it would for a database that exists.
pub fn source(snap: &Snapshot, database: &str) -> Option<LookupSource> {
    let g = &snap.config.general;
    let Some((db, _)) = snap.resolve_database(database) else {
        return global_source(snap);
    };
    let auth_user = db.auth_user.clone().or_else(|| g.auth_user.clone())?;
    Some(LookupSource {
        auth_user,
        query: db
            .auth_query
            .clone()
            .unwrap_or_else(|| g.auth_query.clone()),
        database: db
            .auth_dbname
            .clone()
            .or_else(|| g.auth_dbname.clone())
            .unwrap_or_else(|| database.to_owned()),
    })
}

/// The lookup the global settings name (auth_user, auth_query, auth_dbname): for a login
/// to a database that is not configured, and to the admin console, as in PgBouncer 1.25.
pub fn global_source(snap: &Snapshot) -> Option<LookupSource> {
    let g = &snap.config.general;
    let database = g.auth_dbname.clone()?;
    snap.resolve_database(&database)?;
    Some(LookupSource {
        auth_user: g.auth_user.clone()?,
        query: g.auth_query.clone(),
        database,
    })
}

/// PgBouncer's answer when auth_dbname names no database of the config: the client is
/// only told the pooler is misconfigured (the name is the operator's business), the log
/// says which.
fn config_error(database: &str) -> PgError {
    tracing::error!("authentication database \"{database}\" is not configured.");
    PgError::fatal("08P01", "bouncer config error")
}

/// Runs auth_query for `user`. Ok(None) when PostgreSQL has no row for it, or answered
/// the query with an error; an empty plain secret when its password is NULL (it exists,
/// and only trust lets it in, as in PgBouncer); Err when the lookup could not be run.
pub async fn lookup(
    app: &App,
    snap: &Snapshot,
    src: &LookupSource,
    user: &str,
) -> Result<Option<Secret>, PgError> {
    // As PgBouncer: a DISABLEd database takes no logins, not even its auth_user's.
    if crate::pool::gates::is_disabled(&src.database) {
        return Err(PgError::fatal(
            "08P01",
            format!("authentication database \"{}\" is disabled", src.database),
        ));
    }
    let pool = app
        .pool_as(snap, &src.database, &src.auth_user)
        .ok_or_else(|| config_error(&src.database))?;
    // A client logging in is no session yet: a safe shutdown reaches it through the pool.
    let mut lease = pool.checkout_for_login(None).await?;
    let mut out = BytesMut::with_capacity(src.query.len() + user.len() + 64);
    // Extended protocol, so the user name travels as a parameter and is never spliced
    // into SQL.
    put_message(&mut out, b'P', |b| {
        b.put_u8(0);
        b.put_slice(src.query.as_bytes());
        b.put_u8(0);
        b.put_i16(0);
    });
    put_message(&mut out, b'B', |b| {
        b.put_u8(0);
        b.put_u8(0);
        b.put_i16(0);
        b.put_i16(1);
        b.put_i32(user.len() as i32);
        b.put_slice(user.as_bytes());
        b.put_i16(0);
    });
    put_message(&mut out, b'E', |b| {
        b.put_u8(0);
        b.put_i32(0);
    });
    put_message(&mut out, b'S', |_| {});
    let failed =
        |e: &dyn std::fmt::Display| PgError::fatal("08P01", format!("auth_query failed: {e}"));
    lease.stream.write_all(&out).await.map_err(|e| failed(&e))?;
    let mut buf = BytesMut::with_capacity(512);
    let mut secret = None;
    let mut error = None;
    loop {
        let msg = read_message(&mut lease.stream, &mut buf, 1 << 20)
            .await
            .map_err(|e| failed(&e))?;
        match msg.tag {
            b'D' => secret = parse_row(msg.body),
            b'E' => error = Some(PgError::parse(&msg.body)),
            b'Z' => break,
            _ => {}
        }
    }
    if !buf.is_empty() {
        lease.close().await;
    } else {
        lease.release();
    }
    if let Some(e) = error {
        // Logged for the operator; the client is told no more than a wrong password
        // would tell it (the login goes on as for an unknown user, and fails with 28P01),
        // so a broken lookup reveals nothing about which users exist.
        tracing::warn!(user = %user, "auth_query failed: {e}");
        return Ok(None);
    }
    Ok(secret.map(|s| Secret::parse(&s.unwrap_or_default())))
}

/// The second column (the secret) of a DataRow, None when the row is malformed;
/// Some(None) for NULL: the user has no password.
pub(crate) fn parse_row(mut body: bytes::Bytes) -> Option<Option<String>> {
    if body.remaining() < 2 || body.get_i16() < 2 {
        return None;
    }
    let column = |body: &mut bytes::Bytes| -> Option<Option<String>> {
        if body.remaining() < 4 {
            return None;
        }
        let len = body.get_i32();
        if len < 0 {
            return Some(None);
        }
        let len = len as usize;
        if body.remaining() < len {
            return None;
        }
        let v = body.split_to(len);
        Some(Some(String::from_utf8_lossy(&v).into_owned()))
    };
    column(&mut body)?;
    column(&mut body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_secret_column() {
        let mut b = BytesMut::new();
        b.put_i16(2);
        b.put_i32(3);
        b.put_slice(b"bob");
        b.put_i32(5);
        b.put_slice(b"md5ab");
        assert_eq!(parse_row(b.clone().freeze()), Some(Some("md5ab".into())));
        let mut n = BytesMut::new();
        n.put_i16(2);
        n.put_i32(3);
        n.put_slice(b"bob");
        n.put_i32(-1);
        assert_eq!(parse_row(n.freeze()), Some(None));
        assert_eq!(parse_row(bytes::Bytes::from_static(b"\x00\x02\x00")), None);
    }
}

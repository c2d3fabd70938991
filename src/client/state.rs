//! Session state in pooled modes: what a client set (SET, RESET, set_config, SET ROLE)
//! follows it from server to server, and what cannot move (advisory locks, temporary
//! tables, WITH HOLD cursors, LISTEN) keeps it on its server until released.
//!
//! The relay only notes that a query *may* have changed something (sql::effects, a cheap
//! scan). After the transaction, the server is asked what the session now holds: that is
//! exact whatever happened in between (a rollback, a savepoint, an error, a function that
//! set something), where replaying the client's statements would not be.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::BytesMut;

use super::{Extras, Session, INTERNAL_QUERY_TIMEOUT, PINNED};
use crate::gucs::{self, Gucs, PIN_ROW};
use crate::pool::Lease;
use crate::protocol::framer::Frame;
use crate::protocol::{messages, PgError};
use crate::sql::effects::{self, DEFAULTS, EXACT, PIN, UNPIN};

/// How much of a simple query to see before passing it on: past this the rest is not
/// looked at, and the session is read back after it whatever it held.
pub const QUERY_PEEK: usize = 64 * 1024;

impl Session {
    /// Notes what a framed Query or Parse may do to the session (before it is rewritten).
    /// Returns the effects' flags (the pipelining classifier uses them too).
    pub(super) fn note_effects(&mut self, frame: &Frame) -> u8 {
        let Some(body) = frame.body.clone() else {
            return 0;
        };
        let body = &self.inbuf[body];
        let e = match frame.tag {
            b'Q' => {
                let text = body.strip_suffix(b"\0").unwrap_or(body);
                let e = effects::effects(text, body.ends_with(b"\0"));
                if self.listening() && e.flags & effects::UNPIN != 0 {
                    let text = text.to_vec();
                    self.note_unlistens(&text);
                }
                e
            }
            b'P' => {
                let mut parts = body.splitn(3, |&b| b == 0);
                let unnamed = parts.next().is_some_and(<[u8]>::is_empty);
                let text = parts.next().unwrap_or_default();
                let e = effects::effects(text, true);
                if unnamed {
                    // Its Binds name it by "": their parameters are read there.
                    let params = e.params.clone();
                    if !params.is_empty()
                        || self
                            .extras
                            .as_ref()
                            .is_some_and(|x| !x.unnamed_params.is_empty())
                    {
                        self.extras.get_or_insert_with(Box::default).unnamed_params = params;
                    }
                }
                e
            }
            b'B' => {
                let Some(params) = self.extras.as_ref().map(|x| &x.unnamed_params) else {
                    return 0;
                };
                if params.is_empty() {
                    return 0;
                }
                let mut parts = body.splitn(3, |&b| b == 0);
                let (Some(_), Some(b""), Some(rest)) = (parts.next(), parts.next(), parts.next())
                else {
                    return 0;
                };
                let stmt = effects::Effects {
                    params: params.clone(),
                    ..Default::default()
                };
                let mut e = effects::Effects::default();
                e.bind(&stmt, rest);
                e
            }
            _ => return 0,
        };
        let flags = e.flags;
        self.add_effects(e);
        flags
    }

    /// Records effects found in a message or in a prepared statement it runs.
    pub(super) fn add_effects(&mut self, e: effects::Effects) {
        if e.flags == 0 {
            return;
        }
        self.touched |= e.flags;
        if !e.names.is_empty() {
            let names = &mut self.extras.get_or_insert_with(Box::default).touched_names;
            for n in e.names {
                if !names.contains(&n) {
                    names.push(n);
                }
            }
        }
    }

    /// The settings the client has made, as last read back.
    pub(super) fn gucs(&self) -> Option<&Arc<Gucs>> {
        self.extras.as_ref().and_then(|e| e.gucs.as_ref())
    }

    /// The query that reads back what the queries since the last read-back may have
    /// changed (gucs::read_back); None when they changed nothing that needs one.
    pub(super) fn read_back_sql(&self) -> Option<String> {
        let flags = self.touched;
        let mut names: Vec<&str> = Vec::new();
        if let Some(x) = self.extras.as_ref() {
            names.extend(x.touched_names.iter().map(String::as_str));
            if let Some(g) = &x.gucs {
                for n in g.names() {
                    if !names.contains(&n) {
                        names.push(n);
                    }
                }
            }
        }
        let exact = flags & EXACT != 0;
        let pins = flags & PIN != 0 || (self.pinned() && flags & UNPIN != 0);
        if !exact && names.is_empty() && !pins {
            return None;
        }
        Some(gucs::read_back(&names, exact, pins))
    }

    /// After a transaction that may have changed the session: reads back what it holds
    /// from the server, which both the client and the server then record.
    pub(super) async fn read_back(&mut self, held: &mut Lease) -> Result<(), PgError> {
        let sql = self.read_back_sql();
        let flags = std::mem::take(&mut self.touched);
        if let Some(x) = self.extras.as_mut() {
            x.touched_names.clear();
        }
        let Some(sql) = sql else {
            return Ok(());
        };
        let mut rows = Vec::new();
        held.query_rows(&sql, INTERNAL_QUERY_TIMEOUT, Some(&mut rows))
            .await
            .map_err(|e| e.to_client_error())?;
        self.apply_read_back(&mut held.gucs, flags, rows);
        Ok(())
    }

    /// Records what a read-back found (rows of `read_back_sql`'s query, made for the
    /// effects `flags`): the client's settings, and the server's (`server_gucs`).
    pub(super) fn apply_read_back(
        &mut self,
        server_gucs: &mut Option<Arc<Gucs>>,
        flags: u8,
        rows: Vec<Vec<Option<String>>>,
    ) {
        let exact = flags & EXACT != 0;
        let pins = flags & PIN != 0 || (self.pinned() && flags & UNPIN != 0);
        let mut now = Gucs::default();
        let mut pinned_by = None;
        let mut reset_values = Vec::new();
        let mut at_default = Vec::new();
        for row in rows {
            let mut cols = row.into_iter();
            let (Some(Some(name)), Some(value)) = (cols.next(), cols.next()) else {
                continue;
            };
            if name == PIN_ROW {
                pinned_by = value;
            } else if let Some(reported) = name.strip_prefix(gucs::AT_DEFAULT_PREFIX) {
                at_default.push(reported.to_owned());
            } else if let Some(guarded) = name.strip_prefix(gucs::RESET_VALUE_PREFIX) {
                reset_values.push((guarded.to_owned(), value));
            } else {
                now.put(&name, value.as_deref());
            }
        }
        if flags & DEFAULTS != 0 {
            self.restore_startup_params(&at_default);
        }
        // Read whole, a guarded setting at its RESET value is one the session did not
        // set (or set back): nothing to carry.
        for (name, reset) in reset_values {
            if now.get(&name) == reset.as_deref() {
                now.put(&name, None);
            }
        }
        let now = (!now.is_empty()).then(|| Arc::new(now));
        *server_gucs = now.clone();
        let extras = self.extras.get_or_insert_with(Box::default);
        extras.gucs = match (&extras.startup_gucs, exact) {
            // What the client gave at startup is what RESET goes back to, as on a direct
            // connection: read whole, a startup setting the server no longer has (reset,
            // RESET ALL) is the startup value again, and the server gets it back at the
            // next lend. One a rolled-back RESET ALL left in place is kept as it is.
            (Some(startup), true) => {
                let mut with = now.as_deref().cloned().unwrap_or_default();
                for (name, value) in startup.iter() {
                    if with.get(name).is_none() {
                        with.put(name, Some(value));
                    }
                }
                (!with.is_empty()).then(|| Arc::new(with))
            }
            _ => now,
        };
        if pins {
            self.set_pinned(pinned_by.filter(|p| !p.is_empty()));
        }
        self.trim_extras();
    }

    /// RESET (ALL, or of one parameter) and DISCARD ALL put reported parameters back to
    /// the server's own startup values, which are not the client's: `at_default` names
    /// those the server holds at its own value, and the client is given its own back, as
    /// a direct connection would; the server is made to agree at its next lend (or, for
    /// a pinned client, before its next transaction). A RESET rolled back is not seen
    /// here: the server's value is then the one Weir set, not its own (unless the client
    /// had set exactly the server's own value).
    fn restore_startup_params(&mut self, at_default: &[String]) {
        let Some(startup) = self.client.0.startup() else {
            return;
        };
        let mut out = BytesMut::new();
        for name in at_default {
            let Some(value) = startup.get(name) else {
                continue;
            };
            if self.wanted.get(name) != Some(value) {
                messages::parameter_status(&mut out, name, value);
                Arc::make_mut(&mut self.wanted).set(name, value);
            }
        }
        if !out.is_empty() {
            // Where the framing is: after the client's ReadyForQuery, also when this
            // read-back's answer was taken from behind the request (on_the_way).
            let at = self.sframe.scanned();
            super::prepare::splice(&mut self.outbuf, at..at, &out);
            self.sframe.rewritten(at, out.len());
        }
    }

    fn set_pinned(&mut self, by: Option<String>) {
        let was = self.pinned();
        self.set_tie(PINNED, by.is_some());
        match (&by, was) {
            (Some(why), false) => {
                self.pool.pinned.fetch_add(1, Ordering::Relaxed);
                crate::conn_log::client_pinned(&self.client.0, why);
            }
            (None, true) => {
                self.pool.pinned.fetch_sub(1, Ordering::Relaxed);
            }
            _ => {}
        }
        self.client
            .0
            .set_pinned(by.as_deref().map_or(0, gucs::pin_bits));
    }

    /// Leaves nothing of the client's on a server it gives back for good: what pinned it
    /// and what it set that was not read back. False when the server must be closed.
    pub(super) async fn clean_for_next(&mut self, held: &mut Lease) -> bool {
        if !self.pinned() && self.touched == 0 {
            return true;
        }
        if self.pinned() {
            self.set_pinned(None);
        }
        self.touched = 0;
        // DISCARD ALL runs alone (not in a transaction block, where GUARD would put it):
        // a timeout the client left on the server is taken off first.
        let timeouts = held
            .gucs
            .as_ref()
            .is_some_and(|g| gucs::GUARDED.iter().any(|n| g.get(n).is_some()));
        if timeouts {
            let reset: String = gucs::GUARDED
                .iter()
                .map(|n| format!("RESET {n};"))
                .collect();
            let sql = format!("{}{reset}", gucs::GUARD);
            if held
                .run_internal_boxed(&sql, INTERNAL_QUERY_TIMEOUT)
                .await
                .is_err()
            {
                return false;
            }
        }
        held.run_internal_boxed("DISCARD ALL", INTERNAL_QUERY_TIMEOUT)
            .await
            .is_ok()
    }
}

/// Settings that act on an idle session: a server left idle in the pool with the
/// client's value would end itself there (idle_session_timeout).
const IDLE_ACTING: [&str; 1] = ["idle_session_timeout"];

/// Takes off a server going back to the pool the settings that would act on it while it
/// idles there; the client gets them back on its next server. False when the server
/// must be closed.
pub(super) async fn before_pooling(held: &mut Lease) -> bool {
    let Some(g) = held.gucs.as_ref() else {
        return true;
    };
    if !IDLE_ACTING.iter().any(|n| g.get(n).is_some()) {
        return true;
    }
    let mut left = (**g).clone();
    let mut sql = gucs::GUARD.to_owned();
    for n in IDLE_ACTING {
        left.put(n, None);
        sql.push_str(&format!("RESET {n};"));
    }
    held.gucs = (!left.is_empty()).then(|| Arc::new(left));
    held.run_internal_boxed(&sql, INTERNAL_QUERY_TIMEOUT)
        .await
        .is_ok()
}

/// How much of a client message's body the relay must see in pooled modes.
pub fn wants(tag: u8, prepared: bool) -> usize {
    match tag {
        b'Q' => QUERY_PEEK,
        b'P' | b'B' => usize::MAX,
        _ if prepared => super::prepare::client_wants(tag),
        _ => 0,
    }
}

impl Extras {
    pub(super) fn state_is_empty(&self) -> bool {
        self.gucs.is_none()
            && self.startup_gucs.is_none()
            && self.touched_names.is_empty()
            && self.unnamed_params.is_empty()
    }
}

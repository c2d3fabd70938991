//! Read/write splitting on the client's side (see split): which pool a request is sent
//! to, and what the relay does when a request that writes follows a read on a standby.

use super::relay::{ANSWERED, UNSYNCED};
use std::sync::Arc;

use super::Session;
use crate::pool::{Lease, Pool, PoolMode};
use crate::protocol::framer::Frame;
use crate::split::{verdicts, Class, Route};

/// The lease is the primary's, for a request that writes.
pub const WRITE: u8 = 1;
/// The lease is the primary's, for a read (no standby fit, or the client's own write not
/// replayed yet): a write that follows makes it WRITE.
pub const READ_ON_PRIMARY: u8 = 2;
/// The lease is a standby's: a write that follows waits for a server of the primary.
pub const READ_ON_STANDBY: u8 = 3;

/// What `Session::standby_lease` says of a server of the pool of reads.
pub enum StandbyLease {
    Use,
    /// Fine for others, but its host has not replayed this client's write yet.
    Release,
    /// Its host is no longer a fit standby (promoted, lagging, out of the rotation).
    Close,
}

/// Messages looked at when routing a request: a longer pipeline goes to the primary (what
/// follows a request routed to a standby is looked at by the relay).
const MAX_MESSAGES: usize = 256;

/// Where `route` sits in `Session::ties`.
const SHIFT: u8 = 6;

impl Session {
    pub(super) fn route(&self) -> u8 {
        self.ties >> SHIFT
    }

    pub(super) fn set_route(&mut self, route: u8) {
        self.ties = (self.ties & !(3 << SHIFT)) | (route << SHIFT);
    }

    /// The pool for the request waiting in the input buffer: the client's own, or for a
    /// read of a split entry its pool of reads. Sets `route`.
    pub(super) fn route_request(&mut self) -> Option<Arc<Pool>> {
        let settings = self.pool.settings();
        // Logged in before a reload turned splitting on, a session-mode client keeps its
        // server: there is nothing to route.
        let entry = match &settings.split {
            Some(e) if self.mode != PoolMode::Session => e.clone(),
            _ => {
                drop(settings);
                self.set_route(0);
                return None;
            }
        };
        let hosts = settings.target.hosts.clone();
        drop(settings);
        let class = self.request_class();
        let mut pending = self.extras.as_ref().and_then(|x| x.pending_write);
        let route = entry.route(class, &hosts, &mut pending, &self.pool);
        if let Some(x) = self.extras.as_mut() {
            x.pending_write = pending;
        }
        let reader = self.pool.reader.load_full();
        match (route, reader) {
            (Route::Standby, Some(r)) => {
                self.set_route(READ_ON_STANDBY);
                Some(r)
            }
            _ => {
                self.set_route(if class == Class::Write {
                    WRITE
                } else {
                    READ_ON_PRIMARY
                });
                None
            }
        }
    }

    /// What to do with a server just checked out of the pool of reads: it may serve the
    /// read if its host is still a fit standby that has replayed the client's own write.
    pub(super) fn standby_lease(&self, lease: &Lease) -> StandbyLease {
        let settings = self.pool.settings();
        let Some(entry) = &settings.split else {
            return StandbyLease::Close;
        };
        let lsn = self
            .extras
            .as_ref()
            .and_then(|x| x.pending_write)
            .map_or(0, |p| p.lsn());
        match entry.lends(&settings.target.hosts, &lease.addr, lsn) {
            Ok(true) => StandbyLease::Use,
            Ok(false) => StandbyLease::Release,
            Err(()) => StandbyLease::Close,
        }
    }

    /// The class of everything in the input buffer: a write if any of it writes, or if
    /// what is there ends inside an extended-protocol batch (the rest, not here yet, could
    /// write and would have to follow the batch's start), or if it is too long to look at.
    fn request_class(&mut self) -> Class {
        // With backslash escapes in plain literals the parser would read another
        // statement than the server does; and a standby refuses serializable transactions.
        if self.wanted.get("standard_conforming_strings") == Some("off")
            || self
                .gucs()
                .and_then(|g| g.get("default_transaction_isolation"))
                .is_some_and(|v| v.eq_ignore_ascii_case("serializable"))
        {
            return Class::Write;
        }
        let mut at = 0;
        let mut class = Class::Neutral;
        let mut parsed_unnamed = false;
        let mut unsynced = false;
        for _ in 0..MAX_MESSAGES {
            let Some(header) = self.inbuf.get(at..at + 5) else {
                return if unsynced || at < self.inbuf.len() {
                    Class::Write
                } else {
                    class
                };
            };
            let tag = header[0];
            let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
            if len < 4 {
                return Class::Write;
            }
            let end = at + 1 + len;
            let Some(body) = self.inbuf.get(at + 5..end) else {
                // Not all here yet: a message not seen whole could be anything.
                return Class::Write;
            };
            match tag {
                b'P' => parsed_unnamed |= body.first() == Some(&0),
                b'S' | b'Q' => unsynced = false,
                _ => {}
            }
            if matches!(tag, b'P' | b'B' | b'E' | b'D' | b'C' | b'H') {
                unsynced = true;
            }
            let c = message_class(&mut self.extras, &self.pool, tag, body, parsed_unnamed)
                .unwrap_or(Class::Neutral);
            match c {
                Class::Write => return Class::Write,
                Class::Read => class = Class::Read,
                Class::Neutral => {}
            }
            at = end;
        }
        Class::Write
    }

    /// In the relay, on a lease routed for a read: whether `frame` must wait for a server
    /// of the primary (a write after a read on a standby, between transactions: the
    /// server is given back once it has answered what it was sent, and the write goes to
    /// the primary). A write on the primary makes the lease WRITE. A write inside an
    /// open transaction, or in the middle of an extended-protocol batch, goes on where it
    /// is: moving would break the transaction (in a READ ONLY one, the server refuses it
    /// as it would anyway).
    pub(super) fn hold_for_primary(&mut self, frame: &Frame) -> bool {
        if self.route() < READ_ON_PRIMARY || !matches!(frame.tag, b'Q' | b'P' | b'B' | b'F') {
            return false;
        }
        // Nothing sent yet and nothing answered: this is the request the lease was routed
        // for, looked at whole then (a request not all there was routed as a write).
        if self.exchange.pending == 0 && !self.exchange.has(ANSWERED) {
            return false;
        }
        let Some(body) = frame.body.clone() else {
            return false;
        };
        let declared = self
            .inbuf
            .get(frame.start + 1..frame.start + 5)
            .map_or(0, |h| u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize);
        let whole = body.len() + 4 >= declared;
        let class = if whole {
            message_class(
                &mut self.extras,
                &self.pool,
                frame.tag,
                &self.inbuf[body],
                true,
            )
        } else {
            Some(Class::Write)
        };
        if class != Some(Class::Write) {
            return false;
        }
        if self.route() == READ_ON_PRIMARY {
            self.set_route(WRITE);
            return false;
        }
        let x = &self.exchange;
        !x.has(UNSYNCED) && x.status == b'I' && (x.pending > 0 || x.has(ANSWERED))
    }

    /// After a transaction on the primary that wrote: the client's next reads wait for
    /// the standbys to replay it.
    pub(super) fn note_write(&mut self) {
        if self.route() != WRITE {
            return;
        }
        let settings = self.pool.settings();
        if let Some(e) = &settings.split {
            let pending = e.lsn.wrote();
            drop(settings);
            self.extras.get_or_insert_with(Box::default).pending_write = Some(pending);
        }
    }
}

/// A message's class; None for messages with no statement of their own (Execute, Sync,
/// Describe, Close, Flush).
fn message_class(
    extras: &mut Option<Box<super::Extras>>,
    pool: &Arc<Pool>,
    tag: u8,
    body: &[u8],
    parsed_unnamed: bool,
) -> Option<Class> {
    let text = match tag {
        b'Q' => body.strip_suffix(b"\0").unwrap_or(body),
        b'P' => {
            let mut parts = body.splitn(3, |&b| b == 0);
            let _name = parts.next();
            parts.next().unwrap_or_default()
        }
        b'B' => {
            let mut parts = body.splitn(3, |&b| b == 0);
            let _portal = parts.next();
            let name = parts.next().unwrap_or_default();
            if name.is_empty() {
                // The unnamed statement's Parse came with it, and was classified.
                return (!parsed_unnamed).then_some(Class::Write);
            }
            let def = super::prepare::statements(extras).and_then(|p| p.names.get(name).cloned());
            return Some(match def {
                Some(d) if !d.sql => {
                    let text = d.body.split(|&b| b == 0).next().unwrap_or_default();
                    text_class(pool, text)
                }
                _ => Class::Write,
            });
        }
        b'F' => return Some(Class::Write),
        _ => return None,
    };
    Some(text_class(pool, text))
}

/// A statement text's class, its functions checked against the entry's list.
fn text_class(pool: &Arc<Pool>, text: &[u8]) -> Class {
    let v = verdicts::verdict(text);
    match v.class {
        Class::Read => match &pool.settings().split {
            Some(e) => e.read_or_write(&v.calls, pool),
            None => Class::Write,
        },
        c => c,
    }
}

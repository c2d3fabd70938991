//! A client's statements, and what the server owes for each message sent to it.
//!
//! Weir removes some of the client's messages (a Parse the server already has, a Close)
//! and adds its own (a Parse ahead of a Bind, a Close of an evicted statement). To give
//! the client exactly the replies a direct connection would, the relay keeps one entry
//! per message that gets a reply, in order, and knows by each reply's tag when an entry
//! is answered. After an error in an extended-protocol batch the server skips to Sync:
//! the entries it skipped are dropped and what they changed is undone.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::defs::Def;
use super::server::ServerStatements;
use crate::protocol::PgError;

/// A client's statement names, and how many of them each statement has: whether a
/// statement already has a name is a lookup, where a scan of every name on each Parse
/// made 40,000 Parses of distinct statements take 4.6 s of a worker thread (found with
/// the frontend_messages fuzz target's entry point and large inputs).
#[derive(Default)]
pub struct Names {
    map: HashMap<Box<[u8]>, Arc<Def>>,
    per_def: HashMap<u64, u32>,
}

impl Names {
    pub fn get(&self, name: &[u8]) -> Option<&Arc<Def>> {
        self.map.get(name)
    }

    pub fn contains_key(&self, name: &[u8]) -> bool {
        self.map.contains_key(name)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Box<[u8]>, &Arc<Def>)> {
        self.map.iter()
    }

    pub fn values(&self) -> impl Iterator<Item = &Arc<Def>> {
        self.map.values()
    }

    /// How many of the client's names mean the statement `id`.
    pub fn count(&self, id: u64) -> u32 {
        self.per_def.get(&id).copied().unwrap_or(0)
    }

    pub fn insert(&mut self, name: Box<[u8]>, def: Arc<Def>) -> Option<Arc<Def>> {
        *self.per_def.entry(def.id).or_default() += 1;
        let old = self.map.insert(name, def);
        if let Some(old) = &old {
            self.uncount(old.id);
        }
        old
    }

    /// Inserts unless the name is taken.
    pub fn insert_new(&mut self, name: Box<[u8]>, def: Arc<Def>) {
        if !self.map.contains_key(&name) {
            self.insert(name, def);
        }
    }

    pub fn remove(&mut self, name: &[u8]) -> Option<Arc<Def>> {
        self.remove_entry(name).map(|(_, def)| def)
    }

    pub fn remove_entry(&mut self, name: &[u8]) -> Option<(Box<[u8]>, Arc<Def>)> {
        let entry = self.map.remove_entry(name)?;
        self.uncount(entry.1.id);
        Some(entry)
    }

    fn uncount(&mut self, id: u64) {
        if let Some(n) = self.per_def.get_mut(&id) {
            *n -= 1;
            if *n == 0 {
                self.per_def.remove(&id);
            }
        }
    }
}

impl IntoIterator for Names {
    type Item = (Box<[u8]>, Arc<Def>);
    type IntoIter = std::collections::hash_map::IntoIter<Box<[u8]>, Arc<Def>>;

    fn into_iter(self) -> Self::IntoIter {
        self.map.into_iter()
    }
}

/// A client name and the statement it had before (None: it had none).
pub type NameUndo = (Box<[u8]>, Option<Arc<Def>>);

#[derive(Default)]
pub struct ClientStatements {
    /// The client's statement names.
    pub names: Names,
    /// Use `push` and `pop`, which keep the two counts below.
    pub replies: VecDeque<Reply>,
    /// Entries in `replies` whose effect an error may undo, and how many of them come
    /// after the last barrier (a Sync or a simple query): see `must_wait`.
    undoable: u32,
    undoable_since_barrier: u32,
    /// Entries in `replies` that end with a ReadyForQuery: while there are any, the
    /// transaction status the server will be in is not known yet.
    barriers: u32,
    /// Statements the client knows by more than one name: a Bind or Describe of one is
    /// recorded with its name, for the server's errors to be told with it.
    pub aliased: std::collections::HashSet<u64>,
    /// Counted since the last flush into the pool's stats.
    pub counts: crate::stats::PreparedCounts,
    /// The server skips to the next Sync after an error: what the client sends meanwhile
    /// gets no reply, not even one Weir would make.
    pub skipping: bool,
    /// Statements the request framed while queueing names, rewritten as if the server it
    /// gets holds them (so that it can go ahead, see pool::ahead); the client prepares
    /// the ones it lacks once it has the server (`Session::settle_ahead`).
    pub ahead: Vec<Arc<Def>>,
    /// What the statements run since the relay last looked may do to the session.
    pub effects: crate::sql::effects::Effects,
    /// A statement bound since the relay last looked is no plain one (sql::pipeline).
    pub opaque: bool,
    /// The last batch, kept to run it again after PostgreSQL refused a stale plan.
    pub retry: super::retry::Retry,
    /// A name the client prepared again while it still had it, for the relay to log.
    pub reused: Option<Box<[u8]>>,
    /// An Execute was sent since the last Sync or query: an error now must roll back
    /// what it did, which only the server can (see `rewrite::refuse_here`).
    pub ran: bool,
    /// Weir answered a message of this batch with an error itself (`Reply::Refused`):
    /// the rest of the batch is dropped up to its Sync, as PostgreSQL skips it.
    pub refusing: bool,
    /// A statement of the client's name Weir prepared on the server to have PostgreSQL
    /// refuse the client's Parse in its own words: closed after the batch's Sync.
    pub close_after_sync: Option<Box<[u8]>>,
    /// What the client was told of each statement it described, by statement id, for a
    /// statement it knows by one name: see `check` and `told`.
    pub described: HashMap<u64, super::check::Described>,
    /// The same for statements it knows by several names (`aliased`), by name: on a
    /// direct connection each name is a statement of its own, planned when it was
    /// prepared, so two names of one text may have been told different results.
    pub described_as: HashMap<Box<[u8]>, super::check::Described>,
    /// The description the server is sending, for a Describe of a statement.
    pub describing: super::check::Describing,
    /// `Reply::Check`s in the queue: the client's messages wait for their answer.
    pub checks: u32,
    /// The statement whose description a server just gave Weir (`check::before_use`).
    pub checked: Option<u64>,
}

impl ClientStatements {
    /// What the client was told of statement `id`, which it used by `name` (a message's
    /// `Reply::SentAs` carries it where the statement has several).
    pub fn told(&self, id: u64, name: Option<&[u8]>) -> Option<&super::check::Described> {
        if self.described.is_empty() && self.described_as.is_empty() {
            return None;
        }
        match name {
            Some(name) if self.aliased.contains(&id) => self.described_as.get(name),
            _ => self.described.get(&id),
        }
    }

    fn tell(&mut self, id: u64, name: Option<&[u8]>, told: super::check::Described) {
        match name {
            Some(name) if self.aliased.contains(&id) => {
                self.described_as.insert(name.into(), told);
            }
            _ => {
                self.described.insert(id, told);
            }
        }
    }

    /// `name` is to mean statement `id` from now on: a name prepared again is described
    /// again (or not at all). A second name for a statement keeps the first name's
    /// description apart, under that name (`alias`).
    pub fn rename_described(&mut self, id: u64, name: &[u8]) {
        self.described_as.remove(name);
        if self.names.count(id) > 0 {
            self.alias(id, name);
        } else if !self.aliased.contains(&id) {
            self.described.remove(&id);
        }
    }

    /// Statement `id` gets the client's name `new` beside the one it has: from now on
    /// what the client was told of it is kept by name. The first name takes what it was
    /// told, and the Binds and Describes sent by it that are still unanswered are
    /// recorded with it (a description arriving for one is the first name's).
    pub fn alias(&mut self, id: u64, new: &[u8]) {
        if !self.aliased.insert(id) {
            return;
        }
        let first = self
            .names
            .iter()
            .find(|(n, d)| d.id == id && &n[..] != new)
            .map(|(n, _)| n.clone());
        let Some(first) = first else {
            return;
        };
        if let Some(told) = self.described.remove(&id) {
            self.described_as.insert(first.clone(), told);
        }
        for r in self.replies.iter_mut() {
            if let Reply::SentAs(_, sent, name @ None) = r {
                if *sent == id {
                    *name = Some(first.clone());
                }
            }
        }
    }

    /// A description of statement `id` the client's Describe by `name` got: kept unless
    /// the name means another statement by now (closed and prepared again meanwhile).
    pub fn described_now(&mut self, id: u64, name: Option<&[u8]>, told: super::check::Described) {
        let still = match name {
            Some(name) => self.names.get(name).is_some_and(|d| d.id == id),
            None => self.names.count(id) > 0,
        };
        if still {
            self.tell(id, name, told);
        }
    }

    /// The client's `name` of statement `id` is closed.
    pub fn forget_described(&mut self, id: u64, name: &[u8]) {
        if self.aliased.contains(&id) {
            self.described_as.remove(name);
        } else if self.names.count(id) == 0 {
            self.described.remove(&id);
        }
    }

    /// Nothing worth keeping while the client is idle.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty() && self.replies.is_empty()
    }

    pub fn push(&mut self, r: Reply) {
        if let Reply::Check(_) = r {
            self.checks += 1;
        }
        self.barriers += u32::from(r.is_barrier());
        if r.undoable() {
            self.undoable += 1;
            self.undoable_since_barrier += 1;
        }
        if r.is_barrier() {
            // What a query that may be undone (a DEALLOCATE) changed is uncertain for
            // everything after it too.
            self.undoable_since_barrier = 0;
        }
        self.replies.push_back(r);
    }

    pub fn pop(&mut self) -> Option<Reply> {
        let r = self.replies.pop_front()?;
        if let Reply::Check(_) = r {
            self.checks -= 1;
        }
        self.barriers -= u32::from(r.is_barrier());
        if r.undoable() {
            self.undoable -= 1;
            self.undoable_since_barrier = self.undoable_since_barrier.min(self.undoable);
        }
        Some(r)
    }

    /// Puts a reply back at the front (one that stays owed after a change of kind).
    pub fn push_front(&mut self, r: Reply) {
        if let Reply::Check(_) = r {
            self.checks += 1;
        }
        self.barriers += u32::from(r.is_barrier());
        if r.undoable() {
            self.undoable += 1;
            if !self.replies.iter().any(Reply::is_barrier) {
                self.undoable_since_barrier += 1;
            }
        }
        self.replies.push_front(r);
    }

    /// PostgreSQL's 0A000 raised in front of the message of `replies[at]`
    /// (`check::raise_ahead`).
    pub fn insert_raise(&mut self, at: usize) {
        self.insert_reply(at, Reply::Raise(super::check::changed));
    }

    /// An entry for a message Weir puts in front of the one of `replies[at]` (in a
    /// request framed while queueing: `queued`).
    pub fn insert_reply(&mut self, at: usize, r: Reply) {
        if let Reply::Check(_) = r {
            self.checks += 1;
        }
        if r.undoable() {
            self.undoable += 1;
            if !self.replies.iter().skip(at).any(Reply::is_barrier) {
                self.undoable_since_barrier += 1;
            }
        }
        // A barrier put in the middle would make `undoable_since_barrier` wrong.
        debug_assert!(!r.is_barrier());
        self.replies.insert(at, r);
    }

    pub fn clear_replies(&mut self) {
        self.replies.clear();
        self.ran = false;
        self.refusing = false;
        self.close_after_sync = None;
        self.checks = 0;
        self.checked = None;
        self.retry.reset();
        self.undoable = 0;
        self.undoable_since_barrier = 0;
        self.barriers = 0;
    }

    /// True when a message that reads or changes the statements must wait: something
    /// sent before the last Sync or query may still fail and be undone, and what this
    /// message becomes depends on it. (Within one batch an error skips everything up to
    /// Sync, so messages of the same batch can go at once.)
    pub fn must_wait(&self) -> bool {
        self.undoable > self.undoable_since_barrier
    }

    /// True while a statement Weir counts the server as holding may yet turn out never
    /// prepared there (its Parse or PREPARE unanswered, and undone if the batch fails
    /// before it): a request checked against the server's statements meanwhile (another
    /// client's, pipelined behind this one: pool::ahead) could name one it lacks.
    pub fn preparing(&self) -> bool {
        self.replies.iter().any(|r| {
            matches!(
                r,
                Reply::Parsed { unmark: true, .. }
                    | Reply::PrepareSql { unmark: true, .. }
                    | Reply::Prepared(_)
                    | Reply::PreparedSql(_)
                    | Reply::PrepareThenRun(_)
            )
        })
    }

    /// True while a query or Sync sent before is unanswered: a message whose rewrite
    /// depends on the transaction status (a Parse, or a query on statements) waits.
    pub fn status_pending(&self) -> bool {
        self.barriers > 0
    }
}

pub enum Reply {
    /// A client message sent on (perhaps renamed); answered by one of its tag's replies.
    Sent(u8),
    /// A Bind or Describe of one of the client's statements: its id, and the name this one
    /// used where the client knows the statement by several.
    SentAs(u8, u64, Option<Box<[u8]>>),
    /// The client's Parse, sent under Weir's name (or unnamed, see `unmark`); if it fails
    /// or is skipped the client has no such statement, nor (when `unmark`) the server.
    Parsed {
        name: Box<[u8]>,
        def: Arc<Def>,
        unmark: bool,
    },
    /// Weir's Parse ahead of the client's Bind or Describe; its ParseComplete is removed.
    Prepared(Arc<Def>),
    /// Weir's Describe of a statement it prepared (`check::before_use`), and Flush: its
    /// ParameterDescription and RowDescription or NoData are removed, and kept as the
    /// server's description of it.
    Check(Arc<Def>),
    /// A Parse Weir sent only for the error it may raise; its ParseComplete is removed.
    Discarded,
    /// The client's SQL PREPARE, sent under Weir's name: as `Parsed`, for a query.
    PrepareSql {
        name: Box<[u8]>,
        def: Arc<Def>,
        unmark: bool,
    },
    /// Weir's SQL PREPARE ahead of the client's EXECUTE: everything it gets is removed, up
    /// to its ReadyForQuery.
    PreparedSql(Arc<Def>),
    /// The client's SQL EXECUTE of a statement of SQL PREPARE that the server lacked, sent
    /// in one query behind Weir's PREPARE of it (so that a PREPARE that fails, its text
    /// made invalid by DDL, runs nothing after it): the PREPARE's CommandComplete is
    /// removed, and the entry becomes `Sent(b'Q')`; an error before it is the client's,
    /// and leaves the server without the statement.
    PrepareThenRun(Arc<Def>),
    /// Weir's Close of a statement evicted from the server's cache; its CloseComplete is
    /// removed. Skipped, the server still has the statement.
    Evicted(Arc<Def>),
    /// Answered by Weir without the server: ParseComplete ('1'), CloseComplete ('3'), or
    /// a query's CommandComplete and ReadyForQuery: PREPARE ('P'), DEALLOCATE ('D').
    /// `undo` puts the client's name back as it was if an earlier error means PostgreSQL
    /// would not have got this far.
    Synth { tag: u8, undo: Option<NameUndo> },
    /// A client message sent as it came (a Parse of a name the client has, sent twice,
    /// or a message naming a name like Weir's own that the client lacks): PostgreSQL's
    /// error is the one a direct connection gets, in the client's words, and goes on as
    /// it is, never renamed (the name may be one of Weir's on this server).
    Own(u8),
    /// The client's SQL PREPARE of a name it has, sent twice in one query so that
    /// PostgreSQL refuses the second in the client's words: the first one's
    /// CommandComplete is removed, and the entry becomes `Own(b'Q')`.
    Twice,
    /// An error Weir answers itself, in place of PostgreSQL's, where sending the server
    /// anything that fails would put an error of Weir's making in its log. For an
    /// extended-protocol message, the client's messages up to Sync are dropped
    /// (`ClientStatements::refusing`); for a query, Weir adds its ReadyForQuery.
    Refused { error: PgError, query: bool },
    /// PostgreSQL raising the client's 0A000 for a statement whose result changed
    /// (`check::put_raise`): its CloseComplete, ParseComplete and BindComplete are
    /// removed, and its error
    /// gets the fields of the one a direct connection gets (routine RevalidateCachedQuery,
    /// which drivers look at, and no PL/pgSQL context). The error it gets instead is
    /// this one's (check::changed, or sql_via_extended).
    Raise(fn() -> PgError),
    /// Weir's Close and Sync after the client's Sync (`close_after_sync`): everything
    /// the server answers them with is removed, up to their ReadyForQuery.
    Tidy,
    /// The ReadyForQuery of a Sync Weir added (to prepare a statement before a simple
    /// query that needs it): removed.
    SwallowReady,
    /// The client's DEALLOCATE of its statement, sent as a DEALLOCATE of Weir's name (which
    /// the server then no longer holds); if it fails, both are as they were (`held`: the
    /// server had it).
    Dealloc {
        name: Box<[u8]>,
        def: Arc<Def>,
        held: bool,
    },
    /// A query dropping every statement of the session. Both sides are cleared when it is
    /// sent, for what follows it; if it fails, what it would have dropped is put back.
    Reset {
        names: Names,
        server: ServerStatements,
    },
}

impl Reply {
    fn undoable(&self) -> bool {
        match self {
            Reply::SentAs(..) => false,
            Reply::Parsed { .. }
            | Reply::PrepareSql { .. }
            | Reply::PreparedSql(_)
            | Reply::PrepareThenRun(_)
            | Reply::Prepared(_)
            | Reply::Evicted(_)
            | Reply::Reset { .. }
            | Reply::Dealloc { .. } => true,
            Reply::Synth { undo, .. } => undo.is_some(),
            Reply::Sent(_)
            | Reply::Own(_)
            | Reply::Twice
            | Reply::Refused { .. }
            | Reply::Tidy
            | Reply::SwallowReady
            | Reply::Check(_)
            | Reply::Raise(_)
            | Reply::Discarded => false,
        }
    }

    fn is_barrier(&self) -> bool {
        !self.is_extended()
    }

    /// True when a server message with this tag completes the reply.
    pub fn ends_with(&self, tag: u8) -> bool {
        match self {
            Reply::SentAs(t, ..) | Reply::Own(t) => Reply::Sent(*t).ends_with(tag),
            Reply::Sent(b'P') | Reply::Parsed { .. } | Reply::Prepared(_) | Reply::Discarded => {
                tag == b'1'
            }
            Reply::Sent(b'B') => tag == b'2',
            Reply::Sent(b'C') | Reply::Evicted(_) => tag == b'3',
            Reply::Sent(b'D') | Reply::Check(_) => matches!(tag, b'T' | b'n'),
            Reply::Sent(b'E') => matches!(tag, b'C' | b'I' | b's'),
            Reply::Sent(_)
            | Reply::Reset { .. }
            | Reply::Dealloc { .. }
            | Reply::PrepareSql { .. }
            | Reply::PreparedSql(_)
            | Reply::PrepareThenRun(_)
            | Reply::SwallowReady
            | Reply::Tidy
            | Reply::Twice => tag == b'Z',
            Reply::Synth { .. } | Reply::Refused { .. } | Reply::Raise(_) => false,
        }
    }

    /// True for extended-protocol messages: an error in one makes the server skip
    /// everything until Sync (a simple query's error does not).
    pub fn is_extended(&self) -> bool {
        !matches!(
            self,
            Reply::Sent(b'S' | b'Q' | b'F')
                | Reply::Synth {
                    tag: b'P' | b'D',
                    ..
                }
                | Reply::PrepareSql { .. }
                | Reply::PreparedSql(_)
                | Reply::PrepareThenRun(_)
                | Reply::Reset { .. }
                | Reply::Dealloc { .. }
                | Reply::SwallowReady
                | Reply::Tidy
                | Reply::Own(b'S' | b'Q' | b'F')
                | Reply::Twice
                | Reply::Refused { query: true, .. }
        )
    }

    /// True for what ends an extended-protocol batch: a Sync, the client's or Weir's.
    pub fn is_sync(&self) -> bool {
        matches!(self, Reply::Sent(b'S') | Reply::SwallowReady)
    }

    /// Undoes what the message changed, for one the server did not carry out.
    pub fn undo(self, names: &mut Names, server: &mut ServerStatements) {
        match self {
            Reply::Parsed { name, def, unmark } | Reply::PrepareSql { name, def, unmark } => {
                if names.get(&name).is_some_and(|d| Arc::ptr_eq(d, &def)) {
                    names.remove(&name);
                }
                if unmark {
                    server.remove(def.id);
                }
            }
            Reply::Prepared(def) | Reply::PreparedSql(def) | Reply::PrepareThenRun(def) => {
                server.remove(def.id)
            }
            Reply::Evicted(def) => server.insert(&def),
            Reply::Synth {
                undo: Some((name, before)),
                ..
            } => match before {
                Some(def) => {
                    names.insert(name, def);
                }
                None => {
                    names.remove(&name);
                }
            },
            Reply::Reset {
                names: old,
                server: old_server,
            } => {
                for (name, def) in old {
                    names.insert_new(name, def);
                }
                server.absorb(old_server);
            }
            Reply::Dealloc { name, def, held } => {
                names.insert_new(name, def.clone());
                if held {
                    server.insert(&def);
                }
            }
            Reply::Sent(_)
            | Reply::SentAs(..)
            | Reply::Synth { undo: None, .. }
            | Reply::Own(_)
            | Reply::Twice
            | Reply::Refused { .. }
            | Reply::Tidy
            | Reply::SwallowReady
            | Reply::Check(_)
            | Reply::Raise(_)
            | Reply::Discarded => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prepared::defs::intern;

    #[test]
    fn names_count_the_names_of_each_statement() {
        let (a, b) = (
            intern(b"select 'names a'\0\0\0"),
            intern(b"select 'names b'\0\0\0"),
        );
        let mut n = Names::default();
        n.insert(b"x"[..].into(), a.clone());
        n.insert(b"y"[..].into(), a.clone());
        assert_eq!((n.count(a.id), n.count(b.id)), (2, 0));
        // Repointing a name moves its count.
        n.insert(b"y"[..].into(), b.clone());
        assert_eq!((n.count(a.id), n.count(b.id)), (1, 1));
        n.insert_new(b"y"[..].into(), a.clone());
        assert_eq!(n.get(b"y").map(|d| d.id), Some(b.id));
        assert_eq!(n.remove(b"x").map(|d| d.id), Some(a.id));
        assert!(n.remove(b"x").is_none());
        assert_eq!((n.count(a.id), n.count(b.id), n.len()), (0, 1, 1));
    }

    /// Each Parse used to scan every name the client had: 40,000 took 4.6 s in a release
    /// build. Linear now (well under a second here); the bound only catches a quadratic.
    #[test]
    fn many_named_parses_stay_linear() {
        use crate::prepared::rewrite::{client_message, Context};
        let mut p = ClientStatements::default();
        let mut server = ServerStatements::default();
        let cx = Context {
            status: b'I',
            cap: 100,
            ahead: false,
            unsynced: false,
            whole: true,
        };
        let start = std::time::Instant::now();
        let mut out = bytes::BytesMut::new();
        for i in 0..40_000 {
            out.clear();
            let body = format!("s{i}\0select {i} as many_named_parses\0\0\0");
            client_message(
                b'P',
                body.as_bytes(),
                &mut p,
                Some(&mut server),
                &cx,
                &mut out,
            );
        }
        assert_eq!(p.names.len(), 40_000);
        let took = start.elapsed();
        assert!(took < std::time::Duration::from_secs(10), "{took:?}");
    }
}

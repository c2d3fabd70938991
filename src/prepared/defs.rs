//! Statements as the process knows them: one per distinct text and parameter types,
//! shared by every client that prepared it (10,000 clients preparing the same 20
//! statements hold 20 texts, not 200,000).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Weak};

use bytes::{BufMut, BytesMut};

/// Servers know a statement as this prefix and its id.
pub const SERVER_PREFIX: &[u8] = b"weir_";

pub struct Def {
    /// Unique for the life of the process: a server name never means two texts.
    pub id: u64,
    /// The Parse body after the statement name: the query text, its NUL, the parameter
    /// count and types, exactly as the client sent them.
    pub body: Arc<[u8]>,
    /// Some server has prepared it without error: a client's Parse of it can be answered
    /// before the client has a server (see `rewrite::answer_alone`).
    pub valid: AtomicBool,
    /// Prepared with SQL PREPARE: `body` is what follows the name there, "[(types)] AS
    /// statement", and the server gets `PREPARE weir_<id> <body>`.
    pub sql: bool,
    /// What running it may do to the session (client::state looks at each Bind of it).
    pub effects: crate::sql::effects::Effects,
    /// One plain statement, which another client's may be pipelined behind (sql::pipeline).
    pub plain: bool,
}

impl Def {
    /// Appends the name servers know this statement by, with its NUL.
    pub fn put_server_name(&self, out: &mut BytesMut) {
        out.put_slice(SERVER_PREFIX);
        out.put_slice(self.id.to_string().as_bytes());
        out.put_u8(0);
    }
}

impl std::fmt::Debug for Def {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "weir_{}", self.id)
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Keyed by the body itself (shared with the Def, not copied). Entries whose statement
/// every client has let go are removed by the statement's Drop.
type Interned = HashMap<Arc<[u8]>, Weak<Def>>;

static DEFS: LazyLock<Mutex<Interned>> = LazyLock::new(Default::default);
static SQL_DEFS: LazyLock<Mutex<Interned>> = LazyLock::new(Default::default);

fn defs_of(sql: bool) -> MutexGuard<'static, Interned> {
    let map = if sql { &SQL_DEFS } else { &DEFS };
    map.lock().unwrap_or_else(|p| p.into_inner())
}

fn defs() -> MutexGuard<'static, Interned> {
    defs_of(false)
}

/// The statement with this text and these parameter types, made if none is alive.
pub fn intern(body: &[u8]) -> Arc<Def> {
    intern_in(false, body)
}

/// The statement a SQL PREPARE makes of this text (what follows its name).
pub fn intern_sql(body: &[u8]) -> Arc<Def> {
    intern_in(true, body)
}

fn intern_in(sql: bool, body: &[u8]) -> Arc<Def> {
    let mut map = defs_of(sql);
    if let Some(def) = map.get(body).and_then(Weak::upgrade) {
        return def;
    }
    let body: Arc<[u8]> = Arc::from(body);
    let def = Arc::new(Def {
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        body: body.clone(),
        valid: AtomicBool::new(false),
        sql,
        effects: crate::sql::effects::effects(def_text(sql, &body), true),
        plain: !sql && crate::sql::pipeline::plain(def_text(sql, &body)),
    });
    map.insert(body, Arc::downgrade(&def));
    def
}

/// The query text of a statement's body.
fn def_text(sql: bool, body: &[u8]) -> &[u8] {
    if sql {
        body
    } else {
        body.split(|&b| b == 0).next().unwrap_or_default()
    }
}

/// Forgets the statement for new Parses of its text (they get a new one); those who hold
/// it keep it.
pub fn retire(def: &Def) {
    let mut map = defs_of(def.sql);
    if map
        .get(&*def.body)
        .is_some_and(|w| std::ptr::eq(w.as_ptr(), def))
    {
        map.remove(&*def.body);
    }
}

/// The statement with this text and these types, if some client holds it.
pub fn lookup(body: &[u8]) -> Option<Arc<Def>> {
    defs().get(body).and_then(Weak::upgrade)
}

impl Drop for Def {
    fn drop(&mut self) {
        let mut map = defs_of(self.sql);
        // Another client may have interned the same text again meanwhile: its entry stays.
        if map.get(&*self.body).is_some_and(|w| w.strong_count() == 0) {
            map.remove(&*self.body);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_text_and_types_share_one_statement() {
        let a = intern(b"select 1 -- defs test\0\0\0");
        let b = intern(b"select 1 -- defs test\0\0\0");
        assert!(Arc::ptr_eq(&a, &b));
        let typed = intern(b"select 1 -- defs test\0\0\x01\0\0\0\x17");
        assert_ne!(a.id, typed.id);
        let id = a.id;
        drop((a, b));
        let again = intern(b"select 1 -- defs test\0\0\0");
        assert_ne!(again.id, id, "a statement nobody holds is forgotten");
    }
}

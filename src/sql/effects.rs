//! What a query may do to the session it runs in, for the pooler to find out afterwards.
//!
//! The pooler does not replay what it reads here: after a transaction that may have changed
//! something, it asks the server what the session now holds (see client::state). So this
//! only has to say *whether* to ask and *what about*, and may err on the side of asking.

use super::lexer::{tokens, Spanned, Tok};
use super::{statement, word, Stmt};

/// Settings named in `Effects::names` may have changed: their values are read back.
pub const SETTING: u8 = 1;
/// Settings may have changed that are not named, or gone back to their defaults: the
/// session's settings are read back whole.
pub const EXACT: u8 = 2;
/// RESET ALL or DISCARD ALL: the reported parameters went back to the server's own.
pub const RESET_ALL: u8 = 4;
/// Something may now tie the session to its server (an advisory lock, a temporary table,
/// a WITH HOLD cursor, LISTEN, SET SESSION AUTHORIZATION).
pub const PIN: u8 = 8;
/// Such a tie may have been released.
pub const UNPIN: u8 = 16;
/// A reported parameter may have gone back to the server's own value (RESET of one,
/// RESET ALL, DISCARD ALL, a DO block): the client is to have its startup value back.
pub const DEFAULTS: u8 = 32;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Effects {
    pub flags: u8,
    /// Names of the settings a SET, RESET or set_config() names, as the server folds them.
    pub names: Vec<String>,
    /// Bind parameters (1-based) that name a setting (`set_config($1, ...)`): their values
    /// at each Bind join `names`.
    pub params: Vec<u16>,
}

impl Effects {
    /// The effects of a Bind of a statement with effects `stmt`; `bind_rest` is the
    /// Bind's body after the statement name.
    pub fn bind(&mut self, stmt: &Effects, bind_rest: &[u8]) {
        self.merge(stmt);
        for &n in &stmt.params {
            if let Some(name) = bind_param(bind_rest, n) {
                self.name(&name.to_ascii_lowercase());
            }
        }
    }

    pub fn merge(&mut self, other: &Effects) {
        self.flags |= other.flags;
        for n in &other.names {
            if !self.names.contains(n) {
                self.names.push(n.clone());
            }
        }
    }

    fn name(&mut self, name: &str) {
        if crate::params::tracked_name(name).is_some() || NOT_CARRIED.contains(&name) {
            // Reported with ParameterStatus, and followed that way; or nothing to carry.
            return;
        }
        if name == "session_authorization" {
            // set_config('session_authorization', ...): SET SESSION AUTHORIZATION.
            self.flags |= PIN | UNPIN;
            return;
        }
        self.flags |= SETTING;
        if !self.names.iter().any(|n| n == name) {
            self.names.push(name.to_owned());
        }
    }
}

/// Settings a session cannot carry to another server with set_config(): seed (SHOW says
/// "unavailable", which set_config refuses), the transaction_* ones (they last one
/// transaction, and refuse to change after its first query), and the read-only ones (a
/// SET of them fails, but the name read back would then be put on the next server, and
/// fail there). Putting one on the next server would end the client.
const NOT_CARRIED: [&str; 24] = [
    "block_size",
    "data_checksums",
    "data_directory_mode",
    "debug_assertions",
    "in_hot_standby",
    "integer_datetimes",
    "is_superuser",
    "lc_collate",
    "lc_ctype",
    "max_function_args",
    "max_identifier_length",
    "max_index_keys",
    "seed",
    "segment_size",
    "server_encoding",
    "server_version",
    "server_version_num",
    "shared_memory_size",
    "shared_memory_size_in_huge_pages",
    "ssl_library",
    "transaction_deferrable",
    "transaction_isolation",
    "transaction_read_only",
    "wal_block_size",
];

/// What `sql` (a Query's text, or a Parse's) may do to the session. `whole` is false when
/// `sql` is only the start of a longer text: then anything may follow, and the answer is
/// "read it all back".
pub fn effects(sql: &[u8], whole: bool) -> Effects {
    let mut e = Effects::default();
    if !whole {
        e.flags = EXACT | PIN | UNPIN;
    }
    if !worth_lexing(sql) {
        return e;
    }
    let text = String::from_utf8_lossy(sql);
    let toks = tokens(&text);
    for stmt in toks.split(|t| t.tok == Tok::Semi) {
        one(&text, stmt, &mut e);
    }
    e
}

fn one(sql: &str, t: &[Spanned], e: &mut Effects) {
    let first = word(t.first());
    let second = word(t.get(1));
    let third = word(t.get(2));
    // Function calls and temporary objects, wherever they are in the statement.
    calls(t, e);
    match first {
        Some("set") => match (second, third) {
            (Some("local" | "transaction" | "constraints"), _) => return,
            (Some("role"), _) | (Some("session"), Some("role")) => return e.name("role"),
            // SET SCHEMA 'x' is SET search_path TO 'x'.
            (Some("schema"), _) | (Some("session"), Some("schema")) => {
                return e.name("search_path")
            }
            (Some("session"), Some("authorization")) => {
                e.flags |= PIN | UNPIN;
                return;
            }
            (Some("session"), Some("characteristics")) => {
                e.flags |= EXACT;
                return;
            }
            _ => {}
        },
        Some("reset") => match second {
            Some("role") => return e.name("role"),
            Some("session") => {
                e.flags |= UNPIN;
                return;
            }
            _ => {}
        },
        Some("discard") => {
            match second {
                Some("all") => e.flags |= EXACT | RESET_ALL | DEFAULTS | UNPIN,
                Some("temp" | "temporary") => e.flags |= UNPIN,
                _ => {}
            }
            return;
        }
        Some("do") => return do_block(t, e, 0),
        Some("drop" | "close" | "unlisten") => e.flags |= UNPIN,
        _ => {}
    }
    match statement(sql, t) {
        Some(Stmt::Set { name, local, .. }) if !local => e.name(&name.to_ascii_lowercase()),
        Some(Stmt::Reset { name }) if crate::params::tracked_name(&name).is_some() => {
            e.flags |= EXACT | DEFAULTS
        }
        Some(Stmt::Reset { .. }) => e.flags |= EXACT,
        Some(Stmt::ResetAll) => e.flags |= EXACT | RESET_ALL | DEFAULTS,
        Some(Stmt::DiscardAll) => e.flags |= EXACT | RESET_ALL | DEFAULTS | UNPIN,
        Some(Stmt::Listen { .. } | Stmt::Pin(_)) => e.flags |= PIN,
        Some(Stmt::Unlisten { .. }) => e.flags |= UNPIN,
        // set_config() was seen by `calls`.
        Some(Stmt::Set { .. } | Stmt::SetConfig { .. }) | None => {}
    }
}

/// A function's name as called: a word, or a quoted identifier (kept as written, as the
/// server matches it).
fn func(t: &Spanned) -> Option<&str> {
    match &t.tok {
        Tok::Word(w) | Tok::Ident(w) => Some(w),
        _ => None,
    }
}

/// Calls that change the session or tie it to its server, and temporary objects, found
/// anywhere in a statement's tokens: in a select list among other columns, in a
/// subquery, schema-qualified, quoted, several of them.
fn calls(t: &[Spanned], e: &mut Effects) {
    for (i, tok) in t.iter().enumerate() {
        let Some(f) = func(tok) else {
            continue;
        };
        match f {
            "set_config" if punct(t.get(i + 1), b'(') => set_config_call(&t[i + 2..], e),
            "pg_advisory_lock"
            | "pg_advisory_lock_shared"
            | "pg_try_advisory_lock"
            | "pg_try_advisory_lock_shared" => e.flags |= PIN,
            f if f.starts_with("pg_advisory_unlock") => e.flags |= UNPIN,
            // A temporary table, view, sequence (CREATE [OR REPLACE] TEMP ..., SELECT ...
            // INTO TEMP ...), or anything made in pg_temp (a function): the read-back
            // of what pins finds which.
            "temp" | "temporary" if temp_object(t, i) => e.flags |= PIN,
            "pg_temp" => e.flags |= PIN,
            _ => {}
        }
    }
}

fn punct(t: Option<&Spanned>, c: u8) -> bool {
    t.is_some_and(|t| t.tok == Tok::Punct(c))
}

/// Whether the word TEMP or TEMPORARY at `i` makes a temporary object, rather than name
/// a column.
fn temp_object(t: &[Spanned], i: usize) -> bool {
    let before = i.checked_sub(1).and_then(|j| t.get(j)).and_then(func);
    let after = t.get(i + 1).and_then(func);
    matches!(
        before,
        Some("into" | "create" | "global" | "local" | "replace")
    ) || matches!(after, Some("table" | "view" | "sequence"))
}

/// The arguments of set_config( at `t` (just past the parenthesis). Only a session-wide
/// change matters: a transaction-local one is gone by the time Weir reads back. Whatever
/// cannot be told apart is taken as session-wide, and a name that is no literal makes
/// the whole session read back.
fn set_config_call(t: &[Spanned], e: &mut Effects) {
    let mut args: Vec<&[Spanned]> = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    let mut closed = false;
    for (i, tok) in t.iter().enumerate() {
        match tok.tok {
            Tok::Punct(b'(' | b'[') => depth += 1,
            Tok::Punct(b')' | b']') if depth > 0 => depth -= 1,
            Tok::Punct(b')') => {
                args.push(&t[start..i]);
                closed = true;
                break;
            }
            Tok::Punct(b',') if depth == 0 => {
                args.push(&t[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if !closed || args.len() != 3 {
        // Not a call PostgreSQL runs (or cut short): nothing to learn, but be safe.
        e.flags |= EXACT;
        return;
    }
    if is_true(bare(args[2])) {
        return;
    }
    match bare(args[0]) {
        [one] => match &one.tok {
            Tok::Str(n) => e.name(&n.to_ascii_lowercase()),
            Tok::Param(n) => {
                // pg_settings finds the built-in ones; a custom one only by its name.
                e.flags |= EXACT;
                if !e.params.contains(n) {
                    e.params.push(*n);
                }
            }
            _ => e.flags |= EXACT,
        },
        _ => e.flags |= EXACT,
    }
}

/// An argument without the parentheses around it and the casts after it
/// (`('x')::text`, `$1::pg_catalog.text`).
fn bare(mut t: &[Spanned]) -> &[Spanned] {
    loop {
        let n = t.len();
        if n >= 2 && punct(t.first(), b'(') && punct(t.last(), b')') {
            t = &t[1..n - 1];
            continue;
        }
        // `:: type` or `:: schema . type` at the end.
        let cast_at = (0..n.saturating_sub(2)).rev().find(|&i| {
            punct(t.get(i), b':')
                && punct(t.get(i + 1), b':')
                && t[i + 2..]
                    .iter()
                    .all(|x| matches!(x.tok, Tok::Word(_) | Tok::Ident(_) | Tok::Punct(b'.')))
        });
        match cast_at {
            Some(i) if i > 0 => t = &t[..i],
            _ => return t,
        }
    }
}

/// A literal PostgreSQL reads as boolean true (only the plain spellings: any other is
/// taken as false, which at worst reads back what did not change).
fn is_true(t: &[Spanned]) -> bool {
    let [one] = t else {
        return false;
    };
    let v = match &one.tok {
        Tok::Word(w) => w.as_str(),
        Tok::Str(s) => s.trim(),
        Tok::Number(n) => n.as_str(),
        _ => return false,
    };
    ["true", "t", "on", "yes", "y", "1"]
        .iter()
        .any(|x| x.eq_ignore_ascii_case(v))
}

/// DO runs code Weir does not parse (PL/pgSQL, dynamic SQL): every built-in setting, the
/// role and the pins are read back after it, and the custom settings its body names are
/// asked for by name. Reading back is exact for all but a custom setting whose name is
/// built at run time; pinning instead would hold a server for the rest of the session
/// for what is most often a one-off migration step.
fn do_block(t: &[Spanned], e: &mut Effects, depth: u8) {
    e.flags |= EXACT | PIN | UNPIN | DEFAULTS;
    for tok in t {
        if let Tok::Str(body) = &tok.tok {
            body_names(body, e, depth);
        }
    }
}

/// The custom settings a block of procedural code names in SET, RESET and set_config(),
/// wherever the statements start (after BEGIN, THEN, LOOP...), also in string literals
/// (EXECUTE 'SET ...').
fn body_names(body: &str, e: &mut Effects, depth: u8) {
    if depth > 2 {
        return;
    }
    let toks = tokens(body);
    let mut inner = Effects::default();
    calls(&toks, &mut inner);
    for (i, tok) in toks.iter().enumerate() {
        match (&tok.tok, word(toks.get(i + 1))) {
            (Tok::Word(w), next) if (w == "set" || w == "reset") && next != Some("local") => {
                if let Some((n, _)) = super::name(&toks[i + 1..]) {
                    inner.name(&n.to_ascii_lowercase());
                }
            }
            (Tok::Str(s), _) => body_names(s, e, depth + 1),
            _ => {}
        }
    }
    for n in inner.names.iter().filter(|n| n.contains('.')) {
        e.name(n);
    }
}

/// Bind parameter `n` (1-based) as text: text and binary formats agree for the text type
/// a setting's name has. `rest` is the Bind's body after the statement name.
fn bind_param(rest: &[u8], n: u16) -> Option<String> {
    let take = |at: &mut &[u8], len: usize| -> Option<Vec<u8>> {
        let (head, tail) = (at.get(..len)?, at.get(len..)?);
        *at = tail;
        Some(head.to_vec())
    };
    let u16_at = |at: &mut &[u8]| -> Option<u16> {
        let b = take(at, 2)?;
        Some(u16::from_be_bytes([b[0], b[1]]))
    };
    let mut at = rest;
    let formats = u16_at(&mut at)?;
    take(&mut at, usize::from(formats) * 2)?;
    let count = u16_at(&mut at)?;
    for i in 1..=count {
        let b = take(&mut at, 4)?;
        let len = i32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        let value = if len < 0 {
            None
        } else {
            Some(take(&mut at, len as usize)?)
        };
        if i == n {
            return value.and_then(|v| String::from_utf8(v).ok());
        }
    }
    None
}

/// The cheap check run on every query: false means nothing in `sql` can have an effect.
/// True for a statement that starts with a word that may (whatever follows), for the
/// functions that may, wherever they are, and for the word TEMP (SELECT ... INTO TEMP);
/// comments at a statement's start are not looked into, and so pass.
pub fn worth_lexing(sql: &[u8]) -> bool {
    const STARTS: [&[u8]; 10] = [
        b"set",
        b"reset",
        b"discard",
        b"listen",
        b"unlisten",
        b"create",
        b"declare",
        b"drop",
        b"close",
        b"do",
    ];
    // After an underscore: set_config, pg_advisory_[un]lock, pg_temp.
    const CALLS: [&[u8]; 4] = [b"config", b"lock", b"unlock", b"temp"];
    let starts_with = |at: &[u8], w: &[u8]| {
        at.len() >= w.len()
            && at[..w.len()].eq_ignore_ascii_case(w)
            && at
                .get(w.len())
                .is_none_or(|c| !c.is_ascii_alphanumeric() && *c != b'_')
    };
    let mut at = 0;
    loop {
        let rest = &sql[at..];
        let skip = rest
            .iter()
            .position(|c| !c.is_ascii_whitespace())
            .unwrap_or(rest.len());
        let rest = &rest[skip..];
        if matches!(rest.first(), Some(b'-' | b'/' | b'('))
            || STARTS.iter().any(|w| starts_with(rest, w))
        {
            return true;
        }
        match rest.iter().position(|&c| c == b';') {
            Some(i) => at += skip + i + 1,
            None => break,
        }
    }
    let at_word = |i: usize| i == 0 || !is_ident_byte(sql[i - 1]);
    sql.iter().enumerate().any(|(i, &c)| match c {
        b'_' => CALLS.iter().any(|w| {
            sql.len() >= i + 1 + w.len() && sql[i + 1..i + 1 + w.len()].eq_ignore_ascii_case(w)
        }),
        b't' | b'T' => {
            at_word(i) && sql.len() >= i + 4 && sql[i + 1..i + 4].eq_ignore_ascii_case(b"emp")
        }
        _ => false,
    })
}

fn is_ident_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c >= 0x80
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(sql: &str) -> u8 {
        effects(sql.as_bytes(), true).flags
    }

    fn names(sql: &str) -> Vec<String> {
        effects(sql.as_bytes(), true).names
    }

    #[test]
    fn ordinary_queries_are_not_lexed() {
        for q in [
            "select 1",
            "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = 3",
            "INSERT INTO pgbench_history (tid) VALUES (1)",
            "select offset_x from dataset",
            "select * from t where a = 'set x = 1'",
        ] {
            assert!(!worth_lexing(q.as_bytes()), "{q}");
            assert_eq!(flags(q), 0, "{q}");
        }
        assert!(worth_lexing(b"  SeT x = 1"));
        assert!(worth_lexing(b"select 1; set x = 1"));
        assert!(worth_lexing(b"/* c */ set x = 1"));
        assert!(worth_lexing(b"select SET_CONFIG('a', 'b', false)"));
        assert!(!worth_lexing(b"settle"));
    }

    #[test]
    fn settings_by_name() {
        assert_eq!(flags("SET search_path TO a, b"), SETTING);
        assert_eq!(names("SET search_path TO a, b"), vec!["search_path"]);
        assert_eq!(
            names("set myapp.user_id = 42; SET Work_Mem = '8MB'"),
            vec!["myapp.user_id", "work_mem"]
        );
        assert_eq!(
            names("select set_config('MyApp.X', $1, false)"),
            vec!["myapp.x"]
        );
        assert_eq!(flags("select set_config('myapp.x', $1, $2)"), SETTING);
        assert_eq!(names("set role bob"), vec!["role"]);
        assert_eq!(names("reset role"), vec!["role"]);
        // Reported parameters are followed through ParameterStatus instead.
        assert_eq!(flags("set application_name = 'x'"), 0);
        assert_eq!(flags("SET TIME ZONE 'UTC'"), 0);
    }

    #[test]
    fn transaction_scoped_changes_are_not_kept() {
        assert_eq!(flags("SET LOCAL search_path = a"), 0);
        assert_eq!(flags("select set_config('myapp.x', '1', true)"), 0);
        assert_eq!(flags("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"), 0);
        assert_eq!(flags("set constraints all deferred"), 0);
    }

    #[test]
    fn resets_and_unknown_names_read_everything_back() {
        assert_eq!(flags("RESET work_mem"), EXACT);
        assert_eq!(flags("set work_mem to default"), EXACT);
        assert_eq!(flags("select set_config($1, $2, false)"), EXACT);
        assert_eq!(flags("RESET ALL"), EXACT | RESET_ALL | DEFAULTS);
        assert_eq!(flags("discard all"), EXACT | RESET_ALL | DEFAULTS | UNPIN);
        assert_eq!(flags("reset application_name"), EXACT | DEFAULTS);
        assert_eq!(flags("SET TIME ZONE DEFAULT"), EXACT | DEFAULTS);
        assert_eq!(
            flags("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY"),
            EXACT
        );
    }

    #[test]
    fn pins_and_releases() {
        assert_eq!(flags("select pg_advisory_lock(1)"), PIN);
        assert_eq!(flags("select pg_advisory_xact_lock(1)"), 0);
        assert_eq!(flags("select pg_advisory_unlock(1)"), UNPIN);
        assert_eq!(flags("select pg_advisory_unlock_all()"), UNPIN);
        assert_eq!(flags("CREATE TEMP TABLE t (a int)"), PIN);
        assert_eq!(flags("create table t (a int)"), 0);
        assert_eq!(flags("drop table t"), UNPIN);
        assert_eq!(flags("DECLARE c CURSOR WITH HOLD FOR select 1"), PIN);
        assert_eq!(flags("close c"), UNPIN);
        assert_eq!(flags("LISTEN jobs"), PIN);
        assert_eq!(flags("UNLISTEN *"), UNPIN);
        assert_eq!(flags("discard temp"), UNPIN);
        assert_eq!(flags("set session authorization bob"), PIN | UNPIN);
        assert_eq!(flags("reset session authorization"), UNPIN);
    }

    #[test]
    fn setting_names_from_bind_parameters() {
        let stmt = effects(b"select set_config($2, $1, false)", true);
        assert_eq!(stmt.params, vec![2]);
        // No format codes, two text parameters: '8s' and 'MyApp.Tenant'.
        let mut bind = vec![0, 0, 0, 2];
        for v in [&b"8s"[..], b"MyApp.Tenant"] {
            bind.extend_from_slice(&(v.len() as i32).to_be_bytes());
            bind.extend_from_slice(v);
        }
        bind.extend_from_slice(&[0, 0]);
        let mut e = Effects::default();
        e.bind(&stmt, &bind);
        assert_eq!(e.names, vec!["myapp.tenant"]);
        assert_eq!(e.flags, EXACT | SETTING);
        let mut e = Effects::default();
        e.bind(&stmt, &[0, 0, 0, 1, 255, 255, 255, 255]);
        assert!(e.names.is_empty());
    }

    #[test]
    fn set_config_however_written() {
        for q in [
            "select set_config('myapp.x', 'v', 'false'::bool)",
            "select set_config('myapp.x', 'v', 0::bool)",
            "select \"set_config\"('myapp.x', 'v' || 'w', (false))",
            "select 1, pg_catalog.set_config('MyApp.X'::text, 'v', 1 = 2), 2",
            "select pg_advisory_xact_lock(1), set_config('myapp.x', 'v', false)",
        ] {
            assert_eq!(names(q), vec!["myapp.x"], "{q}");
        }
        assert_eq!(
            names("select set_config('a.b', '1', false), set_config('c.d', '2', 'f')"),
            vec!["a.b", "c.d"]
        );
        assert_eq!(flags("select set_config(n, v, false) from t"), EXACT);
        assert_eq!(flags("select set_config('a.b', 'v', 'on'::bool)"), 0);
        let e = effects(b"select set_config($1::text, $2::text, $3::bool)", true);
        assert_eq!((e.flags, e.params), (EXACT, vec![1]));
    }

    #[test]
    fn other_set_forms_and_do_blocks() {
        assert_eq!(names("SET SCHEMA 'x'"), vec!["search_path"]);
        assert_eq!(names("set session schema 'x'"), vec!["search_path"]);
        assert_eq!(names("set session role bob"), vec!["role"]);
        assert_eq!(names("SET \"Search_Path\" TO x"), vec!["search_path"]);
        let e = effects(
            b"DO $$BEGIN SET myapp.a = 1; EXECUTE 'SET myapp.b = 2'; \
              PERFORM set_config('myapp.c', '3', false); SET LOCAL myapp.d = 4; END$$",
            true,
        );
        assert_eq!(e.flags, EXACT | PIN | UNPIN | DEFAULTS | SETTING);
        let mut names = e.names;
        names.sort();
        assert_eq!(names, vec!["myapp.a", "myapp.b", "myapp.c"]);
    }

    #[test]
    fn temporary_objects_however_made() {
        for q in [
            "select 1 into temp t",
            "with w as (select 1) select * into temporary table t from w",
            "create or replace temp view v as select 1",
            "create temp sequence s",
            "create function pg_temp.f() returns int language sql as 'select 1'",
        ] {
            assert!(worth_lexing(q.as_bytes()), "{q}");
            assert_eq!(flags(q), PIN, "{q}");
        }
        assert_eq!(flags("select temp from weather"), 0);
        assert_eq!(flags("select \"pg_advisory_lock\"(1)"), PIN);
    }

    #[test]
    fn a_prefix_may_hide_anything() {
        assert_eq!(
            effects(b"insert into t values (1)", false).flags,
            EXACT | PIN | UNPIN
        );
    }
}

/// Whether `sql` (a Query's text, without its NUL) is only SET and RESET statements of
/// session settings: in the block a failed state query written in front of it leaves,
/// PostgreSQL refuses its first statement and skips the rest (client::on_the_way). Not
/// SET LOCAL, SET TRANSACTION, SET SESSION CHARACTERISTICS or SET CONSTRAINTS; nothing
/// with a backslash (see sql::pipeline).
pub fn only_settings(sql: &[u8]) -> bool {
    let scoped = ["local", "transaction", "characteristics", "constraints"];
    each_statement(sql, |w| {
        matches!(w[0], "set" | "reset") && !w[1..].iter().any(|x| scoped.contains(x))
    })
}

/// Whether a Query of `sql` (its text, without its NUL), run on an idle server, leaves it
/// idle whatever happens in it, and reads nothing more from the client: none of its
/// statements controls transactions (BEGIN, START, COMMIT, END, ROLLBACK and ABORT, which
/// may chain, SAVEPOINT, RELEASE, PREPARE TRANSACTION) or copies (COPY ... FROM STDIN
/// would take what follows for its data). A query written behind it in the same write
/// then runs in a transaction of its own, after it, whatever it did (client::on_the_way
/// reads the session back that way). Nothing with a backslash (see sql::pipeline).
pub fn stays_idle(sql: &[u8]) -> bool {
    each_statement(sql, |w| {
        let control = matches!(
            w[0],
            "begin"
                | "start"
                | "commit"
                | "end"
                | "rollback"
                | "abort"
                | "savepoint"
                | "release"
                | "copy"
                // A statement prepared as BEGIN (with max_prepared_statements = 0,
                // SQL EXECUTE reaches protocol-level names) opens a block.
                | "execute"
        ) || (w[0] == "prepare" && w[1] == "transaction");
        !control
    })
}

/// Whether `sql` has a statement and `ok` holds for each, given its first three words
/// (lower case, "" for what is no word). False for anything with a backslash (with
/// standard_conforming_strings off one may hide a statement, see sql::pipeline).
fn each_statement(sql: &[u8], ok: impl Fn(&[&str; 3]) -> bool) -> bool {
    if sql.contains(&b'\\') {
        return false;
    }
    let Ok(text) = std::str::from_utf8(sql) else {
        return false;
    };
    let toks = tokens(text);
    let mut any = false;
    for st in toks.split(|t| t.tok == Tok::Semi).filter(|s| !s.is_empty()) {
        let word = |i: usize| match st.get(i).map(|t| &t.tok) {
            Some(Tok::Word(w)) => w.as_str(),
            _ => "",
        };
        if !ok(&[word(0), word(1), word(2)]) {
            return false;
        }
        any = true;
    }
    any
}

#[cfg(test)]
mod stays_idle_tests {
    use super::stays_idle;

    #[test]
    fn no_transaction_control_and_no_copy() {
        for yes in [
            "SELECT set_config('myapp.x', 'y', false)",
            "RESET ALL",
            "reset all; set search_path to a",
            "DO $$ BEGIN PERFORM set_config('a.b', 'c', false); COMMIT; END $$",
            "select 'begin; commit' /* ; begin */; prepare p as select 1",
            "DISCARD ALL",
        ] {
            assert!(stays_idle(yes.as_bytes()), "{yes}");
        }
        for no in [
            "",
            ";",
            "BEGIN; SELECT set_config('a.b', 'c', false); COMMIT",
            "select set_config('a.b', 'c', false); begin",
            "START TRANSACTION",
            "commit and chain",
            "select 1; END",
            "ROLLBACK AND CHAIN",
            "abort",
            "savepoint s",
            "release s",
            "PREPARE TRANSACTION 'x'",
            "reset all; copy t from stdin",
            "select E'\\'; begin",
        ] {
            assert!(!stays_idle(no.as_bytes()), "{no}");
        }
    }
}

#[cfg(test)]
mod only_settings_tests {
    use super::only_settings;

    #[test]
    fn sets_and_resets_alone() {
        for yes in [
            "SET search_path TO a, public",
            "set application_name = 'x'; RESET work_mem;",
            "SET SESSION timezone TO 'UTC'",
            "SET TIME ZONE 'UTC'",
        ] {
            assert!(only_settings(yes.as_bytes()), "{yes}");
        }
        for no in [
            "",
            "SET LOCAL work_mem = '1MB'",
            "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
            "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
            "SET CONSTRAINTS ALL DEFERRED",
            "SET search_path = a; SELECT 1",
            "BEGIN; SET search_path = a",
            "SET search_path = E'a\\'b'",
            "select set_config('a.b', '1', false)",
        ] {
            assert!(!only_settings(no.as_bytes()), "{no}");
        }
    }
}

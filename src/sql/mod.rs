//! Recognition of the few SQL statements a transaction-mode pooler must see (SET, RESET,
//! set_config, DISCARD ALL, LISTEN, and what pins a client to its server).
//!
//! Hand-written rather than pg_query: pg_query links the whole PostgreSQL parser (a long C
//! build) and parses every message; this only tokenizes queries that [`may_matter`] lets
//! through, and ordinary queries cost one byte scan.

pub mod calls;
pub mod effects;
pub mod lexer;
pub mod pipeline;

use lexer::{Spanned, Tok};

/// An argument of set_config(): a literal or a bind parameter ($n, 1-based).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arg {
    Lit(String),
    Param(u16),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stmt {
    /// `value` is the source text after TO / =, to be replayed as is.
    Set {
        name: String,
        value: String,
        local: bool,
    },
    Reset {
        name: String,
    },
    ResetAll,
    DiscardAll,
    SetConfig {
        name: Arg,
        value: Arg,
        local: Arg,
    },
    Listen {
        channel: String,
    },
    Unlisten {
        channel: Option<String>,
    },
    /// Session state the pooler cannot move between servers.
    Pin(Pin),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pin {
    AdvisoryLock,
    TempTable,
    HoldCursor,
}

/// LISTEN (true) or UNLISTEN (false) a channel; None for UNLISTEN *.
pub type ListenOp = (bool, Option<String>);

/// Whether the first statement of `sql` is BEGIN or START (TRANSACTION), after any
/// blanks and comments. Only a word at the very start counts: a quoted identifier or
/// anything else before it is no transaction statement.
pub fn opens_block(sql: &[u8]) -> bool {
    let mut i = 0;
    loop {
        match sql.get(i..) {
            Some([c, ..]) if c.is_ascii_whitespace() => i += 1,
            Some([b'-', b'-', ..]) => {
                // As in PostgreSQL's scanner, a carriage return ends it too.
                while sql.get(i).is_some_and(|&c| c != b'\n' && c != b'\r') {
                    i += 1;
                }
            }
            Some([b'/', b'*', ..]) => match lexer::block_comment_end(sql, i) {
                Some(end) => i = end,
                None => return false,
            },
            _ => break,
        }
    }
    let rest = sql.get(i..).unwrap_or_default();
    let end = rest
        .iter()
        .position(|&c| !lexer::is_ident_byte(c))
        .unwrap_or(rest.len());
    let word = &rest[..end];
    word.eq_ignore_ascii_case(b"begin") || word.eq_ignore_ascii_case(b"start")
}

/// The LISTENs and UNLISTENs of a query made of nothing else (None otherwise).
pub fn listen_only(sql: &str) -> Option<Vec<ListenOp>> {
    let toks = lexer::tokens(sql);
    let mut ops = Vec::new();
    for stmt in toks.split(|t| t.tok == Tok::Semi).filter(|s| !s.is_empty()) {
        match statement(sql, stmt)? {
            Stmt::Listen { channel } => ops.push((true, Some(channel))),
            Stmt::Unlisten { channel } => ops.push((false, channel)),
            _ => return None,
        }
    }
    (!ops.is_empty()).then_some(ops)
}

/// The channels a query stops listening on, wherever they are in it: UNLISTEN, and
/// DISCARD ALL (every channel, as None).
pub fn unlistens(sql: &str) -> Vec<Option<String>> {
    let toks = lexer::tokens(sql);
    toks.split(|t| t.tok == Tok::Semi)
        .filter_map(|stmt| match statement(sql, stmt) {
            Some(Stmt::Unlisten { channel }) => Some(channel),
            Some(Stmt::DiscardAll) => Some(None),
            _ => None,
        })
        .collect()
}

/// The recognized statements of a Query string, in order; others are skipped.
#[cfg(test)]
pub fn classify(sql: &str) -> Vec<Stmt> {
    if !effects::worth_lexing(sql.as_bytes()) {
        return Vec::new();
    }
    let toks = lexer::tokens(sql);
    toks.split(|t| t.tok == Tok::Semi)
        .filter_map(|stmt| statement(sql, stmt))
        .collect()
}

fn word(t: Option<&Spanned>) -> Option<&str> {
    match t.map(|t| &t.tok) {
        Some(Tok::Word(w)) => Some(w),
        _ => None,
    }
}

/// A GUC name: words and quoted identifiers joined by dots (`myapp.user_id`).
fn name(toks: &[Spanned]) -> Option<(String, usize)> {
    let mut out = String::new();
    let mut i = 0;
    loop {
        match toks.get(i).map(|t| &t.tok) {
            Some(Tok::Word(w)) => out.push_str(w),
            Some(Tok::Ident(w)) => out.push_str(w),
            _ => return None,
        }
        i += 1;
        if toks.get(i).map(|t| &t.tok) == Some(&Tok::Punct(b'.')) {
            out.push('.');
            i += 1;
        } else {
            return Some((out, i));
        }
    }
}

fn statement(sql: &str, t: &[Spanned]) -> Option<Stmt> {
    match word(t.first())? {
        "set" => set(sql, &t[1..]),
        "reset" => match word(t.get(1)) {
            Some("all") if t.len() == 2 => Some(Stmt::ResetAll),
            _ => reset_name(&t[1..]).map(|name| Stmt::Reset { name }),
        },
        "discard" if word(t.get(1)) == Some("all") => Some(Stmt::DiscardAll),
        "listen" => name(&t[1..]).map(|(channel, _)| Stmt::Listen { channel }),
        "unlisten" => match t.get(1).map(|t| &t.tok) {
            Some(Tok::Punct(b'*')) => Some(Stmt::Unlisten { channel: None }),
            _ => name(&t[1..]).map(|(channel, _)| Stmt::Unlisten {
                channel: Some(channel),
            }),
        },
        "create" => create(t),
        "declare" => declare(t),
        _ => anywhere(t),
    }
}

fn reset_name(t: &[Spanned]) -> Option<String> {
    if word(t.first()) == Some("time") && word(t.get(1)) == Some("zone") {
        return Some("timezone".into());
    }
    let (n, used) = name(t)?;
    (used == t.len()).then_some(n)
}

fn set(sql: &str, t: &[Spanned]) -> Option<Stmt> {
    let (local, t) = match word(t.first()) {
        Some("local") => (true, &t[1..]),
        Some("session") if word(t.get(1)) != Some("authorization") => (false, &t[1..]),
        _ => (false, t),
    };
    // SET TIME ZONE x is the one form without TO / =.
    let (name, rest) = if word(t.first()) == Some("time") && word(t.get(1)) == Some("zone") {
        ("timezone".to_string(), &t[2..])
    } else {
        let (n, used) = name(t)?;
        match t.get(used).map(|t| &t.tok) {
            Some(Tok::Word(w)) if w == "to" => (n, &t[used + 1..]),
            Some(Tok::Punct(b'=')) => (n, &t[used + 1..]),
            _ => return None, // SET TRANSACTION, SET ROLE x, SET SESSION AUTHORIZATION...
        }
    };
    let first = rest.first()?;
    let value = sql[first.start..rest.last()?.end].to_string();
    if rest.len() == 1 && word(Some(first)) == Some("default") {
        return (!local).then_some(Stmt::Reset { name });
    }
    Some(Stmt::Set { name, value, local })
}

fn create(t: &[Spanned]) -> Option<Stmt> {
    let mut i = 1;
    if word(t.get(i)) == Some("global") || word(t.get(i)) == Some("local") {
        i += 1;
    }
    match word(t.get(i))? {
        "temp" | "temporary" => Some(Stmt::Pin(Pin::TempTable)),
        _ => anywhere(t),
    }
}

fn declare(t: &[Spanned]) -> Option<Stmt> {
    t.windows(2)
        .any(|w| word(Some(&w[0])) == Some("with") && word(Some(&w[1])) == Some("hold"))
        .then_some(Stmt::Pin(Pin::HoldCursor))
}

/// Function calls that may sit anywhere in a statement.
fn anywhere(t: &[Spanned]) -> Option<Stmt> {
    for (i, tok) in t.iter().enumerate() {
        match word(Some(tok)) {
            Some(
                "pg_advisory_lock"
                | "pg_advisory_lock_shared"
                | "pg_try_advisory_lock"
                | "pg_try_advisory_lock_shared",
            ) => {
                return Some(Stmt::Pin(Pin::AdvisoryLock));
            }
            Some("set_config") => {
                if let Some(s) = set_config(&t[i + 1..]) {
                    return Some(s);
                }
            }
            _ => {}
        }
    }
    None
}

/// `( arg , arg , arg )` with literal or $n arguments.
fn set_config(t: &[Spanned]) -> Option<Stmt> {
    let arg = |t: Option<&Spanned>| match t.map(|t| &t.tok) {
        Some(Tok::Str(s)) => Some(Arg::Lit(s.clone())),
        Some(Tok::Word(w)) if w == "true" || w == "false" => Some(Arg::Lit(w.clone())),
        Some(Tok::Param(n)) => Some(Arg::Param(*n)),
        _ => None,
    };
    let p = |i: usize, c: u8| t.get(i).map(|t| &t.tok) == Some(&Tok::Punct(c));
    if !(p(0, b'(') && p(2, b',') && p(4, b',') && p(6, b')')) {
        return None;
    }
    Some(Stmt::SetConfig {
        name: arg(t.get(1))?,
        value: arg(t.get(3))?,
        local: arg(t.get(5))?,
    })
}

#[cfg(test)]
mod tests;

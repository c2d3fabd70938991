//! Verdicts kept per statement text, so that a statement is parsed once per worker, not
//! once per run. The key is the text with its literals blanked out, comments and
//! repeated spaces dropped and letters outside quotes folded: `SELECT * FROM t WHERE
//! id = 42` and `select * from t where id = 7` are one entry (no literal value changes
//! what a statement may write), so queries that inline their values hit the cache too.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

#[cfg(test)]
use super::classify::Class;
use super::classify::{classify, Verdict};
use crate::sql::lexer::{
    block_comment_end, is_ident_byte as is_ident, skip_block_comment as skip_comment,
};

/// Entries per worker thread; the map starts again empty when it is full (the statements
/// an application runs are usually a few hundred).
const CAPACITY: usize = 8192;
/// A text longer than this that does not start with a write is not parsed: it goes to the
/// primary (parsing megabytes on every run, uncached, would cost more than the standby
/// saves).
pub const MAX_PARSED: usize = 64 * 1024;

thread_local! {
    static CACHE: RefCell<HashMap<Box<[u8]>, Rc<Verdict>>> = RefCell::new(HashMap::new());
    static KEY: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    static LAST: RefCell<(Vec<u8>, Option<Rc<Verdict>>)> = const { RefCell::new((Vec::new(), None)) };
}

/// The verdict on a query string (without its NUL): from the first word when that says
/// write, else from the cache, else parsed.
pub fn verdict(sql: &[u8]) -> Rc<Verdict> {
    thread_local! {
        static WRITE: Rc<Verdict> = Rc::new(Verdict::write());
    }
    if starts_with_write(sql) || sql.len() > MAX_PARSED {
        return WRITE.with(Rc::clone);
    }
    // The same text as the last one: a request is looked at when it is routed and again
    // as the relay passes it on, and a prepared statement's text at each of its Binds.
    if let Some(v) = LAST.with(|l| {
        let l = l.borrow();
        (l.0.as_slice() == sql).then(|| l.1.clone()).flatten()
    }) {
        return v;
    }
    let v = lookup(sql);
    LAST.with(|l| {
        let mut l = l.borrow_mut();
        l.0.clear();
        l.0.extend_from_slice(sql);
        l.1 = Some(v.clone());
    });
    v
}

fn classify_text(sql: &[u8]) -> Verdict {
    match std::str::from_utf8(sql) {
        Ok(text) => classify(text),
        Err(_) => Verdict::write(),
    }
}

fn lookup(sql: &[u8]) -> Rc<Verdict> {
    KEY.with(|k| {
        let mut key = k.borrow_mut();
        key.clear();
        if !normalize(sql, &mut key) {
            return Rc::new(classify_text(sql));
        }
        if let Some(v) = CACHE.with(|c| c.borrow().get(key.as_slice()).cloned()) {
            return v;
        }
        let v = Rc::new(classify_text(sql));
        CACHE.with(|c| {
            let mut c = c.borrow_mut();
            if c.len() >= CAPACITY {
                c.clear();
            }
            c.insert(key.as_slice().into(), v.clone());
        });
        v
    })
}

/// Statements that write whatever follows their first word: no need to parse them.
fn starts_with_write(sql: &[u8]) -> bool {
    let mut i = 0;
    loop {
        match sql.get(i) {
            Some(c) if c.is_ascii_whitespace() || *c == b'(' => i += 1,
            Some(b'-') if sql.get(i + 1) == Some(&b'-') => {
                while sql.get(i).is_some_and(|&c| c != b'\n' && c != b'\r') {
                    i += 1;
                }
            }
            Some(b'/') if sql.get(i + 1) == Some(&b'*') => i = skip_comment(sql, i),
            _ => break,
        }
    }
    let start = i;
    while sql.get(i).is_some_and(u8::is_ascii_alphabetic) {
        i += 1;
    }
    if sql.get(i).is_some_and(|&c| is_ident(c)) {
        return false;
    }
    let word = &sql[start..i];
    const WRITES: &[&[u8]] = &[
        b"insert",
        b"update",
        b"delete",
        b"merge",
        b"create",
        b"alter",
        b"drop",
        b"truncate",
        b"grant",
        b"revoke",
        b"vacuum",
        b"analyze",
        b"cluster",
        b"reindex",
        b"comment",
        b"lock",
        b"call",
        b"do",
        b"refresh",
        b"security",
        b"import",
        b"reassign",
    ];
    WRITES.iter().any(|w| word.eq_ignore_ascii_case(w))
}

/// Past a quoted literal or identifier opening at `i` (`quote` doubled inside is one
/// quote; with `backslash`, as in E'..', a backslash escapes the next byte).
fn skip_quoted(sql: &[u8], mut i: usize, quote: u8, backslash: bool) -> Option<usize> {
    i += 1;
    while i < sql.len() {
        let c = sql[i];
        if backslash && c == b'\\' {
            i += 2;
        } else if c == quote {
            if sql.get(i + 1) == Some(&quote) {
                i += 2;
            } else {
                return Some(i + 1);
            }
        } else {
            i += 1;
        }
    }
    None
}

/// The end of a $tag$ opening at `i`, if one does.
fn dollar_tag(sql: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    if sql.get(j).is_some_and(u8::is_ascii_digit) {
        return None;
    }
    while sql
        .get(j)
        .is_some_and(|&c| c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80)
    {
        j += 1;
    }
    (sql.get(j) == Some(&b'$')).then_some(j + 1)
}

/// The end of a numeric literal starting at `i`: digits (and `_`), a fraction, an
/// exponent, or a 0x/0o/0b integer. Letters right after it are not part of it (PostgreSQL
/// rejects `1for`; the key keeps them, so `select 1for update` and `select 1 update`
/// stay apart).
fn number_end(sql: &[u8], mut i: usize) -> usize {
    // Digits of one base, `_` only between two of them (as PostgreSQL 16+ takes them).
    let digits = |mut i: usize, ok: fn(u8) -> bool| {
        while i < sql.len() {
            if ok(sql[i]) {
                i += 1;
            } else if sql[i] == b'_'
                && i + 1 < sql.len()
                && ok(sql[i + 1])
                && i > 0
                && ok(sql[i - 1])
            {
                i += 2;
            } else {
                break;
            }
        }
        i
    };
    let base: Option<fn(u8) -> bool> = match (sql[i], sql.get(i + 1)) {
        (b'0', Some(b'x' | b'X')) => Some(|c| c.is_ascii_hexdigit()),
        (b'0', Some(b'o' | b'O')) => Some(|c| (b'0'..=b'7').contains(&c)),
        (b'0', Some(b'b' | b'B')) => Some(|c| c == b'0' || c == b'1'),
        _ => None,
    };
    if let Some(ok) = base {
        if sql.get(i + 2).is_some_and(|&c| ok(c)) {
            return digits(i + 2, ok);
        }
        // "0x" with no digit after it: the 0 alone (the x is kept in the key).
        return i + 1;
    }
    i = digits(i, |c| c.is_ascii_digit());
    if sql.get(i) == Some(&b'.') && sql.get(i + 1) != Some(&b'.') {
        i += 1;
        if sql.get(i).is_some_and(u8::is_ascii_digit) {
            i = digits(i, |c| c.is_ascii_digit());
        }
    }
    if matches!(sql.get(i), Some(b'e' | b'E')) {
        let mut j = i + 1;
        if matches!(sql.get(j), Some(b'+' | b'-')) {
            j += 1;
        }
        if sql.get(j).is_some_and(u8::is_ascii_digit) {
            i = digits(j, |c| c.is_ascii_digit());
        }
    }
    i
}

/// Writes the cache key of `sql` to `out` (see the module's comment). False when the text
/// has no key: a comment, literal or quoted name is not closed, or it holds a NUL byte
/// (the parser reads such a text otherwise than a closed one).
pub fn normalize(sql: &[u8], out: &mut Vec<u8>) -> bool {
    if sql.contains(&0) {
        return false;
    }
    let mut i = 0;
    let mut space = false;
    let prev_ident = |out: &Vec<u8>| out.last().is_some_and(|&c| is_ident(c));
    while i < sql.len() {
        let c = sql[i];
        let start = i;
        if c.is_ascii_whitespace() {
            i += 1;
            space = true;
            continue;
        }
        if c == b'-' && sql.get(i + 1) == Some(&b'-') {
            // A -- comment ends at a newline or a carriage return, as PostgreSQL's.
            while i < sql.len() && sql[i] != b'\n' && sql[i] != b'\r' {
                i += 1;
            }
            space = true;
            continue;
        }
        if c == b'/' && sql.get(i + 1) == Some(&b'*') {
            let Some(end) = block_comment_end(sql, i) else {
                return false;
            };
            i = end;
            space = true;
            continue;
        }
        if space && !out.is_empty() {
            out.push(b' ');
        }
        space = false;
        match c {
            b'\'' => {
                // E'..' (the E just copied, on its own, not the end of a word) and U&'..'
                // have escapes the parser may reject: they are kept whole. A plain
                // literal has none (standard_conforming_strings=off is never cached).
                let e =
                    i >= 1 && matches!(sql[i - 1], b'e' | b'E') && (i < 2 || !is_ident(sql[i - 2]));
                let u = i >= 1 && sql[i - 1] == b'&';
                let Some(end) = skip_quoted(sql, i, b'\'', e) else {
                    return false;
                };
                i = end;
                if e || u {
                    out.extend_from_slice(&sql[start..i]);
                } else {
                    out.extend_from_slice(b"'?'");
                }
            }
            b'"' => {
                let Some(end) = skip_quoted(sql, i, b'"', false) else {
                    return false;
                };
                i = end;
                out.extend_from_slice(&sql[start..i]);
            }
            b'$' if !prev_ident(out) => {
                if let Some(end) = dollar_tag(sql, i) {
                    let tag = &sql[i..end];
                    let body = &sql[end..];
                    i = match body.windows(tag.len()).position(|w| w == tag) {
                        Some(p) => end + p + tag.len(),
                        None => return false,
                    };
                    out.extend_from_slice(b"'?'");
                } else {
                    // $n, a parameter: part of the statement's shape.
                    i += 1;
                    while i < sql.len() && sql[i].is_ascii_digit() {
                        i += 1;
                    }
                    out.extend_from_slice(&sql[start..i]);
                }
            }
            b'0'..=b'9' if !prev_ident(out) => {
                i = number_end(sql, i);
                out.push(b'0');
            }
            _ => {
                out.push(c.to_ascii_lowercase());
                i += 1;
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(sql: &str) -> String {
        let mut out = Vec::new();
        assert!(normalize(sql.as_bytes(), &mut out), "{sql}");
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn literals_comments_and_case_do_not_matter() {
        assert_eq!(
            key("SELECT * FROM t WHERE id = 42 AND n = 'x''y'  -- c\n"),
            key("select *   from t /* a /* nested */ */ where id = 7 and n = 'zz'")
        );
        assert_eq!(
            key("select 1.5e3, t1.a2 from t1"),
            "select 0, t1.a2 from t1"
        );
        assert_eq!(key("select $1, $$a$$, $q$b$q$"), "select $1, '?', '?'");
        assert_eq!(key(r"select E'a\'b', 'c'"), r"select e'a\'b', '?'");
        assert_ne!(key(r"select U&'\zzzz'"), key("select U&'a'"));
        assert_ne!(key("select 0x"), key("select 1"));
        assert_ne!(key("--\r$"), key(""));
        assert_ne!(key("select 1_"), key("select 1"));
        assert_ne!(key("select 0b12"), key("select 0b1"));
        assert_eq!(
            key(r#"select "Quoted ""x""" from t"#),
            r#"select "Quoted ""x""" from t"#
        );
        assert_ne!(key("select f(1)"), key("select g(1)"));
        assert_ne!(key("select 1; delete from t"), key("select 1"));
    }

    #[test]
    fn unclosed_texts_have_no_key() {
        for sql in [
            "select '",
            "select 'a''",
            "/* /* x */",
            "select \"a",
            "select $q$ x",
            "select 1\0",
        ] {
            assert!(!normalize(sql.as_bytes(), &mut Vec::new()), "{sql}");
        }
        // Classified each time by the parser, which rejects them: writes.
        assert_eq!(verdict(b"/* /* ns'f('\0'5e3, $1)").class, Class::Write);
        assert_eq!(verdict(b"/* unclosed").class, Class::Write);
    }

    #[test]
    fn a_literal_cannot_hide_a_write() {
        // With standard_conforming_strings, a backslash does not escape in '..': the
        // DELETE is code, and must not share a key with a plain literal.
        assert_ne!(key(r"select 'a\'; delete from t; --'"), key(r"select 'b'"));
        assert_eq!(
            verdict(br"select 'a\'; delete from t; --'").class,
            Class::Write
        );
    }

    #[test]
    fn first_word_writes_skip_the_parser() {
        assert!(starts_with_write(b"  /* x */ INSERT INTO t VALUES (1)"));
        assert!(starts_with_write(b"(update t set a = 1)"));
        assert!(!starts_with_write(b"select 1"));
        assert!(!starts_with_write(b"inserted"));
        assert!(!starts_with_write(b"with x as (delete from t) select 1"));
        assert_eq!(
            verdict(b"with x as (delete from t returning 1) select * from x").class,
            Class::Write
        );
    }

    #[test]
    fn cached_verdicts_are_the_parsers() {
        for _ in 0..2 {
            assert_eq!(verdict(b"select * from t where a = 1").class, Class::Read);
            assert_eq!(
                verdict(b"SELECT * FROM t WHERE a = 2 FOR UPDATE").class,
                Class::Write
            );
            assert_eq!(verdict(b"set x = 1").class, Class::Neutral);
        }
    }
}

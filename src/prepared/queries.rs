//! Simple queries that act on prepared statements (SQL PREPARE, EXECUTE, DEALLOCATE,
//! DISCARD ALL), recognised from their first words.

/// What a simple query does to prepared statements, when that is all it does.
#[derive(Debug, PartialEq, Eq)]
pub enum QueryKind {
    /// DEALLOCATE [PREPARE] ALL or DISCARD ALL (Prisma sends the first, frameworks and
    /// poolers the second); recognised from the first words, whatever follows.
    DropAll,
    /// DEALLOCATE [PREPARE] name, alone in the query (Rails sends it when its statement
    /// cache evicts one it prepared with the protocol); the name as PostgreSQL folds it.
    Deallocate(Vec<u8>),
    /// PREPARE name ..., alone in the query: the name, and what follows it.
    Prepare(Vec<u8>, Vec<u8>),
    /// EXECUTE name [(parameters)], alone in the query: the name, and what follows it.
    Execute(Vec<u8>, Vec<u8>),
}

/// Classifies a simple query from its first bytes (`body`, a prefix of the query unless it
/// ends with the query's NUL). Leading blanks and semicolons are skipped.
pub fn query_kind(body: &[u8]) -> Option<QueryKind> {
    let mut rest = body;
    // Words are compared in place: this runs on every query of a pooled client.
    let mut word = || -> Option<&[u8]> {
        let start = rest
            .iter()
            .position(|&c| !(c.is_ascii_whitespace() || c == b';'))?;
        rest = &rest[start..];
        let len = rest
            .iter()
            .position(|&c| !(c.is_ascii_alphanumeric() || c == b'_' || c == b'$'))
            .unwrap_or(rest.len());
        let w = &rest[..len];
        rest = &rest[len..];
        (!w.is_empty()).then_some(w)
    };
    let is = |w: &[u8], k: &[u8]| w.eq_ignore_ascii_case(k);
    let first = word()?;
    if is(first, b"discard") {
        return word()
            .is_some_and(|w| is(w, b"all"))
            .then_some(QueryKind::DropAll);
    }
    let prepare = is(first, b"prepare");
    if (prepare || is(first, b"execute")) && body.ends_with(b"\0") {
        let (name, after) = name_token(rest)?;
        let after = &after[..after.len() - 1];
        // One statement only: a semicolon that is not the last thing may end it (or sit
        // in a literal; either way the query goes to the server as it is).
        let trimmed = after.trim_ascii_end();
        let trimmed = trimmed.strip_suffix(b";").unwrap_or(trimmed);
        if trimmed.contains(&b';') || (prepare && trimmed.trim_ascii().is_empty()) {
            return None;
        }
        let after = trimmed.to_vec();
        return Some(if prepare {
            QueryKind::Prepare(name, after)
        } else {
            QueryKind::Execute(name, after)
        });
    }
    if !is(first, b"deallocate") {
        return None;
    }
    let mut w = word();
    if w.is_some_and(|w| is(w, b"prepare")) {
        w = word();
    }
    match w {
        Some(w) if is(w, b"all") => Some(QueryKind::DropAll),
        Some(name) if body.ends_with(b"\0") && only_ends(rest) => {
            Some(QueryKind::Deallocate(name.to_ascii_lowercase()))
        }
        // A quoted name keeps its case.
        None if body.ends_with(b"\0") => quoted(rest).map(QueryKind::Deallocate),
        _ => None,
    }
}

/// A statement name at the start of `rest` (after blanks): unquoted and folded to lower
/// case as PostgreSQL folds it, or double-quoted; and what follows it.
fn name_token(rest: &[u8]) -> Option<(Vec<u8>, &[u8])> {
    let start = rest.iter().position(|&c| !c.is_ascii_whitespace())?;
    let rest = &rest[start..];
    if rest.first() == Some(&b'"') {
        let mut name = Vec::new();
        let mut i = 1;
        loop {
            match (rest.get(i)?, rest.get(i + 1)) {
                (b'"', Some(b'"')) => {
                    name.push(b'"');
                    i += 2;
                }
                (b'"', _) => return (!name.is_empty()).then_some((name, &rest[i + 1..])),
                (&c, _) => {
                    name.push(c);
                    i += 1;
                }
            }
        }
    }
    let len = rest
        .iter()
        .position(|&c| !(c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c >= 0x80))
        .unwrap_or(rest.len());
    (len > 0).then(|| (rest[..len].to_ascii_lowercase(), &rest[len..]))
}

/// True when nothing but blanks, semicolons and the NUL follows.
fn only_ends(rest: &[u8]) -> bool {
    rest.iter()
        .all(|&c| c.is_ascii_whitespace() || c == b';' || c == 0)
}

/// A double-quoted identifier at the start of `rest` (after blanks), alone.
fn quoted(rest: &[u8]) -> Option<Vec<u8>> {
    let start = rest.iter().position(|&c| !c.is_ascii_whitespace())?;
    let mut it = rest[start..].strip_prefix(b"\"")?.iter().enumerate();
    let mut name = Vec::new();
    while let Some((i, &c)) = it.next() {
        if c != b'"' {
            name.push(c);
            continue;
        }
        if rest[start + 1..].get(i + 1) == Some(&b'"') {
            name.push(b'"');
            it.next();
            continue;
        }
        return (only_ends(&rest[start + 2 + i..]) && !name.is_empty()).then_some(name);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_what_queries_do_to_statements() {
        for all in [
            "DEALLOCATE ALL",
            "  deallocate prepare all;",
            "discard ALL",
            ";DISCARD\tall",
            "discard all; select 1",
        ] {
            assert_eq!(
                query_kind(all.as_bytes()),
                Some(QueryKind::DropAll),
                "{all}"
            );
        }
        let name = |q: &str| query_kind(format!("{q}\0").as_bytes());
        let dealloc = |n: &str| Some(QueryKind::Deallocate(n.as_bytes().to_vec()));
        assert_eq!(name("DEALLOCATE a1"), dealloc("a1"));
        assert_eq!(name(" deallocate PREPARE My_Stmt ;"), dealloc("my_stmt"));
        assert_eq!(
            name("DEALLOCATE \"Odd \"\"Name\"\"\""),
            dealloc("Odd \"Name\"")
        );
        for no in [
            "DEALLOCATE a1; select 1",
            "deallocate",
            "discard plans",
            "select 'discard all'",
            "DEALLOCATE \"unterminated",
        ] {
            assert_eq!(name(no), None, "{no}");
        }
        assert_eq!(
            name("PREPARE q1 (int) AS select $1;"),
            Some(QueryKind::Prepare(
                b"q1".to_vec(),
                b" (int) AS select $1".to_vec()
            ))
        );
        assert_eq!(
            name("execute \"Q\"(1, 'a')"),
            Some(QueryKind::Execute(b"Q".to_vec(), b"(1, 'a')".to_vec()))
        );
        assert_eq!(name("PREPARE q1 AS select 1; select 2"), None);
        assert_eq!(name("PREPARE q1"), None);
        // A prefix of a longer query: the name may go on.
        assert_eq!(query_kind(b"DEALLOCATE a1"), None);
    }
}

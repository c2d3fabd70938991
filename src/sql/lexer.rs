//! Tokens of a PostgreSQL Query string: just enough to find statement boundaries and the
//! words of the few statements the pooler must see, never a parser.

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tok {
    /// Unquoted word, lowercased as the server folds it.
    Word(String),
    /// "quoted identifier", case kept, "" un-doubled.
    Ident(String),
    /// String literal value ('..', E'..', $tag$..$tag$).
    Str(String),
    /// $n bind parameter.
    Param(u16),
    Number(String),
    Semi,
    Punct(u8),
}

/// A token and where its source text starts and ends in the query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spanned {
    pub tok: Tok,
    pub start: usize,
    pub end: usize,
}

/// Splits `sql` into tokens; an unterminated literal or comment ends the input (the server
/// will reject it, the pooler only must not misread it).
pub fn tokens(sql: &str) -> Vec<Spanned> {
    let b = sql.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let start = i;
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if c == b'-' && b.get(i + 1) == Some(&b'-') {
            // As in PostgreSQL's scanner, a carriage return ends it too.
            while i < b.len() && b[i] != b'\n' && b[i] != b'\r' {
                i += 1;
            }
            continue;
        }
        if c == b'/' && b.get(i + 1) == Some(&b'*') {
            i = skip_block_comment(b, i);
            continue;
        }
        let tok = if (c == b'e' || c == b'E') && b.get(i + 1) == Some(&b'\'') {
            let (s, end) = quoted(b, i + 1, b'\'', true);
            i = end;
            Tok::Str(s)
        } else if c == b'\'' {
            let (s, end) = quoted(b, i, b'\'', false);
            i = end;
            Tok::Str(s)
        } else if c == b'"' {
            let (s, end) = quoted(b, i, b'"', false);
            i = end;
            Tok::Ident(s)
        } else if c == b'$' {
            match dollar(b, i) {
                Dollar::Param(n, end) => {
                    i = end;
                    Tok::Param(n)
                }
                Dollar::Quote(s, end) => {
                    i = end;
                    Tok::Str(s)
                }
                Dollar::Lone => {
                    i += 1;
                    Tok::Punct(b'$')
                }
            }
        } else if c.is_ascii_alphabetic() || c == b'_' || c >= 0x80 {
            while i < b.len() && is_ident_byte(b[i]) {
                i += 1;
            }
            Tok::Word(sql[start..i].to_ascii_lowercase())
        } else if c.is_ascii_digit() {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.' || b[i] == b'_') {
                i += 1;
            }
            Tok::Number(sql[start..i].to_string())
        } else if c == b';' {
            i += 1;
            Tok::Semi
        } else {
            i += 1;
            Tok::Punct(c)
        };
        out.push(Spanned {
            tok,
            start,
            end: i.min(b.len()),
        });
    }
    out
}

pub fn is_ident_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c >= 0x80
}

/// Block comments nest in PostgreSQL; an unterminated one runs to the end.
pub fn skip_block_comment(b: &[u8], i: usize) -> usize {
    block_comment_end(b, i).unwrap_or(b.len())
}

/// Past the comment opening at `i`, or None when it is never closed.
pub fn block_comment_end(b: &[u8], mut i: usize) -> Option<usize> {
    let mut depth = 0usize;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            depth += 1;
            i += 2;
        } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return Some(i);
            }
        } else {
            i += 1;
        }
    }
    None
}

/// A literal opened by `q` at `i`; doubled quotes stand for one, and with `escapes`
/// (E'...') a backslash escapes the next byte.
fn quoted(b: &[u8], i: usize, q: u8, escapes: bool) -> (String, usize) {
    let mut out = Vec::new();
    let mut j = i + 1;
    while j < b.len() {
        let c = b[j];
        if escapes && c == b'\\' && j + 1 < b.len() {
            out.push(match b[j + 1] {
                b'n' => b'\n',
                b't' => b'\t',
                b'r' => b'\r',
                other => other,
            });
            j += 2;
        } else if c == q {
            if b.get(j + 1) == Some(&q) {
                out.push(q);
                j += 2;
            } else {
                return (String::from_utf8_lossy(&out).into_owned(), j + 1);
            }
        } else {
            out.push(c);
            j += 1;
        }
    }
    (String::from_utf8_lossy(&out).into_owned(), j)
}

enum Dollar {
    Param(u16, usize),
    Quote(String, usize),
    Lone,
}

fn dollar(b: &[u8], i: usize) -> Dollar {
    let mut j = i + 1;
    if b.get(j).is_some_and(u8::is_ascii_digit) {
        let mut n: u32 = 0;
        while j < b.len() && b[j].is_ascii_digit() {
            n = n.saturating_mul(10).saturating_add(u32::from(b[j] - b'0'));
            j += 1;
        }
        return Dollar::Param(u16::try_from(n).unwrap_or(u16::MAX), j);
    }
    while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_' || b[j] >= 0x80) {
        j += 1;
    }
    if b.get(j) != Some(&b'$') {
        return Dollar::Lone;
    }
    let tag = &b[i..=j];
    let body = j + 1;
    let mut k = body;
    while k + tag.len() <= b.len() {
        if &b[k..k + tag.len()] == tag {
            return Dollar::Quote(
                String::from_utf8_lossy(&b[body..k]).into_owned(),
                k + tag.len(),
            );
        }
        k += 1;
    }
    Dollar::Quote(String::from_utf8_lossy(&b[body..]).into_owned(), b.len())
}

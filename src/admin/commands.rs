//! Parsing console queries the way PgBouncer's admin.c does: `CMD [arg]` and
//! `SET key = value` (or `TO`), words case-insensitive, identifiers optionally in double
//! quotes, SET values optionally in single quotes. Weir also accepts several commands
//! separated by `;` in one query.

/// One parsed command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `CMD [arg]`: the command word lower-cased, the argument as written (unquoted).
    Word { cmd: String, arg: String },
    /// `SET key = value`.
    Set { key: String, value: String },
    /// Not a command; answered with "invalid command".
    Invalid,
    /// Too long a word or value; answered with "bad arguments".
    BadArguments,
}

/// PgBouncer's buffer sizes: longer words do not fit and are refused.
const MAX_CMD: usize = 15;
const MAX_ARG: usize = 63;
const MAX_VAL: usize = 255;

/// Splits a query text into statements at `;` outside quotes; blank statements are
/// dropped. Returns the statements' texts (without the `;`).
pub fn split(query: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut quote: Option<char> = None;
    for (i, c) in query.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, ';') => {
                out.push(&query[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&query[start..]);
    out.into_iter().filter(|s| !s.trim().is_empty()).collect()
}

fn is_ws(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r')
}

struct Lexer<'a> {
    s: &'a str,
    pos: usize,
}

impl<'a> Lexer<'a> {
    fn rest(&self) -> &'a str {
        &self.s[self.pos..]
    }

    fn skip_ws(&mut self) -> bool {
        let before = self.pos;
        while let Some(c) = self.rest().chars().next() {
            if !is_ws(c) {
                break;
            }
            self.pos += c.len_utf8();
        }
        self.pos > before
    }

    /// WORD: `"..."` (with `""` for a quote) or `[0-9A-Za-z_]+`. Returns it unquoted.
    fn word(&mut self) -> Option<String> {
        self.quoted('"').or_else(|| {
            let len = self
                .rest()
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(self.rest().len());
            if len == 0 {
                return None;
            }
            let w = self.rest()[..len].to_owned();
            self.pos += len;
            Some(w)
        })
    }

    /// A string quoted with `q`, doubled `q` standing for itself; must not be empty.
    fn quoted(&mut self, q: char) -> Option<String> {
        let rest = self.rest();
        if !rest.starts_with(q) {
            return None;
        }
        let mut out = String::new();
        let mut chars = rest.char_indices().skip(1).peekable();
        while let Some((i, c)) = chars.next() {
            if c == q {
                if let Some(&(_, c2)) = chars.peek() {
                    if c2 == q {
                        out.push(q);
                        chars.next();
                        continue;
                    }
                }
                if out.is_empty() && q == '"' {
                    return None;
                }
                self.pos += i + c.len_utf8();
                return Some(out);
            }
            out.push(c);
        }
        None
    }

    fn keyword(&mut self, kw: &str) -> bool {
        let rest = self.rest();
        if rest.len() >= kw.len() && rest[..kw.len()].eq_ignore_ascii_case(kw) {
            self.pos += kw.len();
            true
        } else {
            false
        }
    }

    fn at_end(&mut self) -> bool {
        self.skip_ws();
        self.pos == self.s.len()
    }
}

/// Parses one statement (no `;`).
pub fn parse(stmt: &str) -> Command {
    if let Some(c) = parse_set(stmt) {
        return c;
    }
    let mut lx = Lexer { s: stmt, pos: 0 };
    lx.skip_ws();
    let Some(cmd) = lx.word() else {
        return Command::Invalid;
    };
    let mut arg = String::new();
    if lx.skip_ws() && !lx.at_end() {
        match lx.word() {
            Some(a) => arg = a,
            None => return Command::Invalid,
        }
    }
    if !lx.at_end() {
        return Command::Invalid;
    }
    if cmd.len() > MAX_CMD || arg.len() > MAX_ARG {
        return Command::BadArguments;
    }
    Command::Word {
        cmd: cmd.to_ascii_lowercase(),
        arg,
    }
}

fn parse_set(stmt: &str) -> Option<Command> {
    let mut lx = Lexer { s: stmt, pos: 0 };
    lx.skip_ws();
    if !lx.keyword("set") || !lx.skip_ws() {
        return None;
    }
    let key = lx.word()?;
    lx.skip_ws();
    if !lx.keyword("=") && !lx.keyword("to") {
        return None;
    }
    lx.skip_ws();
    let value = match lx.quoted('\'') {
        Some(v) => v,
        None if lx.rest().starts_with("''") => {
            lx.pos += 2;
            String::new()
        }
        None => lx.word()?,
    };
    if !lx.at_end() {
        return None;
    }
    if key.is_empty() || key.len() > MAX_ARG || value.len() > MAX_VAL {
        return Some(Command::BadArguments);
    }
    Some(Command::Set { key, value })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn word(cmd: &str, arg: &str) -> Command {
        Command::Word {
            cmd: cmd.into(),
            arg: arg.into(),
        }
    }

    #[test]
    fn commands_and_arguments() {
        assert_eq!(parse("SHOW POOLS"), word("show", "POOLS"));
        assert_eq!(
            parse("  show\tstats_totals  "),
            word("show", "stats_totals")
        );
        assert_eq!(parse("pause"), word("pause", ""));
        assert_eq!(parse("PAUSE \"my-db\""), word("pause", "my-db"));
        assert_eq!(parse("kill_client 12345"), word("kill_client", "12345"));
        assert_eq!(parse("show pools extra"), Command::Invalid);
        assert_eq!(parse("select 1+1"), Command::Invalid);
        assert_eq!(parse(""), Command::Invalid);
        assert_eq!(parse("averyveryverylongcommand"), Command::BadArguments);
    }

    #[test]
    fn set_forms() {
        let set = |k: &str, v: &str| Command::Set {
            key: k.into(),
            value: v.into(),
        };
        assert_eq!(
            parse("SET default_pool_size = 50"),
            set("default_pool_size", "50")
        );
        assert_eq!(
            parse("set default_pool_size to 50"),
            set("default_pool_size", "50")
        );
        assert_eq!(
            parse("SET server_reset_query = 'DISCARD ALL'"),
            set("server_reset_query", "DISCARD ALL")
        );
        assert_eq!(parse("SET x = 'it''s'"), set("x", "it's"));
        assert_eq!(parse("SET x = ''"), set("x", ""));
        assert_eq!(parse("SET x = 1.5"), Command::Invalid);
    }

    #[test]
    fn splitting() {
        assert_eq!(split("SHOW POOLS;"), vec!["SHOW POOLS"]);
        assert_eq!(split("show a; show b ;"), vec!["show a", " show b "]);
        assert_eq!(
            split("SET x = 'a;b'; show c"),
            vec!["SET x = 'a;b'", " show c"]
        );
        assert!(split(" ; ").is_empty());
    }
}

//! pgbouncer.ini syntax, as libusual's `parse_ini_file` reads it, and `%include`.
//!
//! Faithful details worth knowing:
//! - `;` and `#` start a comment only at the beginning of a line; later on a
//!   line they are part of the value (`max_client_conn = 10 ; x` is invalid).
//! - Values are the rest of the line with trailing blanks removed; quotes are
//!   not stripped.
//! - An unquoted key is made of letters, digits and `_.-*`. A key may be
//!   quoted with `'...'` (libusual, no escapes) or, for database names as
//!   PgBouncer's docs describe, with `"..."` where `""` is a literal quote.
//! - Section names are taken verbatim (no trimming) and matched exactly.
//! - `%include <file>` may appear on any line; a relative file name is
//!   relative to the current working directory, not the including file.
//!   PgBouncer allows nesting 10 levels deep; a loop is reported as such.

use std::path::{Path, PathBuf};

use crate::error::ConfigError;

/// Include nesting limit, libusual's `MAX_INCLUDE`.
const MAX_INCLUDE_DEPTH: usize = 10;

/// Where an item was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Location {
    pub file: PathBuf,
    pub line: usize,
}

impl Location {
    pub fn error(&self, message: impl Into<String>) -> ConfigError {
        ConfigError::new(&self.file, Some(self.line), message)
    }

    pub fn prefix(&self) -> String {
        format!("{}:{}", self.file.display(), self.line)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Item {
    Section(String),
    Entry { key: String, value: String },
}

/// Reads `path` and everything it includes, in order.
pub(crate) fn read(path: &Path) -> Result<Vec<(Location, Item)>, ConfigError> {
    let mut items = Vec::new();
    let mut stack = Vec::new();
    read_file(path, None, &mut stack, &mut items)?;
    Ok(items)
}

fn read_file(
    path: &Path,
    included_from: Option<&Location>,
    stack: &mut Vec<PathBuf>,
    items: &mut Vec<(Location, Item)>,
) -> Result<(), ConfigError> {
    let io_error = |what: &str, e: &dyn std::fmt::Display| match included_from {
        Some(loc) => loc.error(format!(
            "could not {what} included file \"{}\": {e}",
            path.display()
        )),
        None => ConfigError::new(path, None, format!("could not {what} file: {e}")),
    };
    let identity = std::fs::canonicalize(path).map_err(|e| io_error("open", &e))?;
    if stack.contains(&identity) {
        let loc = included_from.map(|l| l.line);
        let from = included_from.map_or(path, |l| l.file.as_path());
        return Err(ConfigError::new(
            from,
            loc,
            format!("include loop: \"{}\" includes itself", path.display()),
        ));
    }
    if stack.len() > MAX_INCLUDE_DEPTH {
        let loc = included_from.map(|l| l.line);
        let from = included_from.map_or(path, |l| l.file.as_path());
        return Err(ConfigError::new(
            from,
            loc,
            format!("include nesting level too deep (more than {MAX_INCLUDE_DEPTH})"),
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| io_error("read", &e))?;
    let text = String::from_utf8(bytes).map_err(|e| io_error("decode (not UTF-8)", &e))?;

    stack.push(identity);
    read_lines(path, &text, items, &mut |target, loc, items| {
        read_file(Path::new(target), Some(loc), stack, items)
    })?;
    stack.pop();
    Ok(())
}

/// Reads a file's text, `path` naming it in errors; `%include` is refused (no files are
/// opened), so that arbitrary text can be parsed safely (the fuzz targets).
pub(crate) fn read_str(text: &str, path: &Path) -> Result<Vec<(Location, Item)>, ConfigError> {
    let mut items = Vec::new();
    read_lines(path, text, &mut items, &mut |_, loc, _| {
        Err(loc.error("%include is not followed here"))
    })?;
    Ok(items)
}

type Include<'a> =
    dyn FnMut(&str, &Location, &mut Vec<(Location, Item)>) -> Result<(), ConfigError> + 'a;

fn read_lines(
    path: &Path,
    text: &str,
    items: &mut Vec<(Location, Item)>,
    include: &mut Include<'_>,
) -> Result<(), ConfigError> {
    for (index, line) in text.split('\n').enumerate() {
        let loc = Location {
            file: path.to_owned(),
            line: index + 1,
        };
        for element in parse_line(line).map_err(|m| loc.error(m))? {
            match element {
                LineElement::Include(target) => include(&target, &loc, items)?,
                LineElement::Item(item) => items.push((loc.clone(), item)),
            }
        }
    }
    Ok(())
}

#[derive(Debug, PartialEq, Eq)]
enum LineElement {
    Include(String),
    Item(Item),
}

fn is_key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "_.-*".contains(c)
}

/// Splits one line into its elements. libusual restarts its scan right after
/// a `]`, so `[pgbouncer] listen_port = 1` is a section plus an entry.
fn parse_line(line: &str) -> Result<Vec<LineElement>, String> {
    let mut elements = Vec::new();
    let mut rest = line;
    loop {
        rest = rest.trim_start();
        if rest.is_empty() || rest.starts_with(['#', ';']) {
            return Ok(elements);
        }
        if let Some(after) = rest.strip_prefix("%include") {
            if after.starts_with([' ', '\t']) {
                elements.push(LineElement::Include(after.trim().to_owned()));
                return Ok(elements);
            }
        }
        if let Some(after) = rest.strip_prefix('[') {
            let end = after.find(']').ok_or("syntax error: missing \"]\"")?;
            elements.push(LineElement::Item(Item::Section(after[..end].to_owned())));
            rest = &after[end + 1..];
            continue;
        }
        let (key, after_key) = parse_key(rest)?;
        let after_key = after_key.trim_start_matches([' ', '\t']);
        let value = after_key
            .strip_prefix('=')
            .ok_or_else(|| format!("syntax error: expected \"=\" after \"{key}\""))?;
        let value = value.trim_start_matches([' ', '\t']).trim_end();
        elements.push(LineElement::Item(Item::Entry {
            key,
            value: value.to_owned(),
        }));
        return Ok(elements);
    }
}

fn parse_key(s: &str) -> Result<(String, &str), String> {
    if let Some(body) = s.strip_prefix('\'') {
        let end = body
            .find('\'')
            .ok_or("syntax error: unterminated quoted key")?;
        if end == 0 {
            return Err("syntax error: empty quoted key".to_owned());
        }
        return Ok((body[..end].to_owned(), &body[end + 1..]));
    }
    if let Some(body) = s.strip_prefix('"') {
        let mut key = String::new();
        let mut chars = body.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            if c == '"' {
                if matches!(chars.peek(), Some((_, '"'))) {
                    chars.next();
                    key.push('"');
                    continue;
                }
                if key.is_empty() {
                    return Err("syntax error: empty quoted key".to_owned());
                }
                return Ok((key, &body[i + 1..]));
            }
            key.push(c);
        }
        return Err("syntax error: unterminated quoted key".to_owned());
    }
    let end = s.find(|c: char| !is_key_char(c)).unwrap_or(s.len());
    Ok((s[..end].to_owned(), &s[end..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str, value: &str) -> LineElement {
        LineElement::Item(Item::Entry {
            key: key.to_owned(),
            value: value.to_owned(),
        })
    }

    fn section(name: &str) -> LineElement {
        LineElement::Item(Item::Section(name.to_owned()))
    }

    #[test]
    fn entries_comments_and_sections() {
        assert_eq!(parse_line("  a = b  \r"), Ok(vec![entry("a", "b")]));
        assert_eq!(parse_line("a=b"), Ok(vec![entry("a", "b")]));
        assert_eq!(parse_line("a ="), Ok(vec![entry("a", "")]));
        assert_eq!(
            parse_line("a = 1 ; not a comment"),
            Ok(vec![entry("a", "1 ; not a comment")])
        );
        assert_eq!(
            parse_line("a = \"quoted\""),
            Ok(vec![entry("a", "\"quoted\"")])
        );
        assert_eq!(parse_line("; comment"), Ok(vec![]));
        assert_eq!(parse_line("   # comment"), Ok(vec![]));
        assert_eq!(parse_line(""), Ok(vec![]));
        assert_eq!(parse_line("[pgbouncer]"), Ok(vec![section("pgbouncer")]));
        assert_eq!(parse_line("[ x ]"), Ok(vec![section(" x ")]));
        assert_eq!(
            parse_line("[pgbouncer] listen_port = 1"),
            Ok(vec![section("pgbouncer"), entry("listen_port", "1")])
        );
        assert_eq!(
            parse_line("[pgbouncer] ; c"),
            Ok(vec![section("pgbouncer")])
        );
        assert_eq!(parse_line("*=host=x"), Ok(vec![entry("*", "host=x")]));
        assert_eq!(parse_line("db.name-1 = "), Ok(vec![entry("db.name-1", "")]));
    }

    #[test]
    fn quoted_keys() {
        assert_eq!(parse_line("'my db' = x"), Ok(vec![entry("my db", "x")]));
        assert_eq!(parse_line("\"a\"\"b\" = x"), Ok(vec![entry("a\"b", "x")]));
        assert!(parse_line("'' = x").is_err());
        assert!(parse_line("'abc = x").is_err());
        assert!(parse_line("\"abc = x").is_err());
    }

    #[test]
    fn syntax_errors() {
        assert!(parse_line("[pgbouncer").is_err());
        assert!(parse_line("foo bar = 1").is_err());
        assert!(parse_line("justaword").is_err());
        assert!(parse_line("%include").is_err());
    }

    #[test]
    fn include_directive() {
        assert_eq!(
            parse_line("%include  other.ini  "),
            Ok(vec![LineElement::Include("other.ini".to_owned())])
        );
        assert_eq!(
            parse_line("  %include\t/abs/path.ini"),
            Ok(vec![LineElement::Include("/abs/path.ini".to_owned())])
        );
    }
}

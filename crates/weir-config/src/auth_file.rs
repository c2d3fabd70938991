//! The `auth_file` (userlist.txt): `"user" "secret" ...` lines.
//!
//! Read as PgBouncer's `load_auth_file` does: blank lines and lines starting
//! with `;` are skipped (`#` is skipped too, a Weir addition); the first two
//! double-quoted fields are the user name and the secret, with `""` standing
//! for a quote; anything else on the line is ignored. A later line for the
//! same user wins. A malformed line is skipped and reported in the notices;
//! PgBouncer stops reading there instead, so that one bad line locks out every
//! user after it.

use std::collections::HashMap;
use std::path::Path;

use crate::error::ConfigError;

/// User name to secret, exactly as written (plain text, `md5<32 hex>` or
/// `SCRAM-SHA-256$...`).
pub type AuthFile = HashMap<String, String>;

/// PgBouncer 1.25's limits (`MAX_USERNAME`, `MAX_PASSWORD`, each counting
/// a C string's NUL), applied to the field as written, quotes doubled.
const MAX_USERNAME: usize = 128;
const MAX_PASSWORD: usize = 65_535;

/// An auth file's users plus what was wrong with it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadedAuthFile {
    pub users: AuthFile,
    /// Each line skipped and why, as `file:line: message`.
    pub notices: Vec<String>,
}

/// Reads an auth file. Only an unreadable file is an error; see
/// [`load_auth_file_with_notices`] to learn about malformed lines.
pub fn load_auth_file(path: &Path) -> Result<AuthFile, ConfigError> {
    load_auth_file_with_notices(path).map(|loaded| loaded.users)
}

/// Reads an auth file, reporting the malformed lines it skipped.
pub fn load_auth_file_with_notices(path: &Path) -> Result<LoadedAuthFile, ConfigError> {
    let bytes = std::fs::read(path)
        .map_err(|e| ConfigError::new(path, None, format!("could not read auth file: {e}")))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        ConfigError::new(
            path,
            None,
            format!("could not decode auth file (not UTF-8): {e}"),
        )
    })?;
    Ok(parse_auth_file(&text, path))
}

/// Parses auth file text; `path` is only used in notices.
pub fn parse_auth_file(text: &str, path: &Path) -> LoadedAuthFile {
    let mut loaded = LoadedAuthFile::default();
    for (index, line) in text.split('\n').enumerate() {
        let line = line.trim_start();
        if line.is_empty() || line.starts_with([';', '#']) {
            continue;
        }
        match parse_line(line) {
            Ok((user, secret)) => {
                loaded.users.insert(user, secret);
            }
            Err(message) => loaded.notices.push(format!(
                "{}:{}: {message}; the line is skipped",
                path.display(),
                index + 1
            )),
        }
    }
    loaded
}

fn parse_line(line: &str) -> Result<(String, String), &'static str> {
    let rest = line
        .strip_prefix('"')
        .ok_or("broken auth file: line does not start with '\"'")?;
    let (user, raw_len, rest) =
        quoted_field(rest).ok_or("broken auth file: unterminated user name")?;
    if raw_len >= MAX_USERNAME {
        return Err("user name too long in auth file");
    }
    let open = rest
        .find('"')
        .ok_or("broken auth file: missing password field")?;
    let (secret, raw_len, _) =
        quoted_field(&rest[open + 1..]).ok_or("broken auth file: unterminated password")?;
    if raw_len >= MAX_PASSWORD {
        return Err("password too long in auth file");
    }
    Ok((user, secret))
}

/// Reads a field after its opening quote: the unescaped value, its length as
/// written, and what follows the closing quote.
fn quoted_field(s: &str) -> Option<(String, usize, &str)> {
    let mut value = String::new();
    let mut chars = s.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c == '"' {
            if matches!(chars.peek(), Some((_, '"'))) {
                chars.next();
                value.push('"');
                continue;
            }
            return Some((value, i, &s[i + 1..]));
        }
        value.push(c);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> LoadedAuthFile {
        parse_auth_file(text, Path::new("userlist.txt"))
    }

    #[test]
    fn plain_md5_and_scram_secrets() {
        let scram = "SCRAM-SHA-256$4096:c2FsdHNhbHQ=$c3RvcmVka2V5:c2VydmVya2V5";
        let text = format!(
            "; comment\n# another\n\n\"admin\" \"1234\"\n  \"md5user\" \"md545f2603610af569b6155c45067268c6b\" extra fields\n\"scram\" \"{scram}\"\r\n"
        );
        let loaded = parse(&text);
        assert!(loaded.notices.is_empty(), "{:?}", loaded.notices);
        assert_eq!(loaded.users.len(), 3);
        assert_eq!(loaded.users["admin"], "1234");
        assert_eq!(
            loaded.users["md5user"],
            "md545f2603610af569b6155c45067268c6b"
        );
        assert_eq!(loaded.users["scram"], scram);
    }

    #[test]
    fn doubled_quotes_are_literal() {
        let loaded = parse("\"we\"\"ird\" \"pa\"\"ss\"\"\"\n\"empty\" \"\"\n");
        assert_eq!(loaded.users["we\"ird"], "pa\"ss\"");
        assert_eq!(loaded.users["empty"], "");
    }

    #[test]
    fn later_line_wins_and_separators_are_free() {
        let loaded = parse("\"u\" \"one\"\n\"u\"\t,\"two\"\n");
        assert_eq!(loaded.users["u"], "two");
    }

    #[test]
    fn malformed_line_is_skipped_alone() {
        let loaded = parse("\"a\" \"1\"\nb 2\n\"c\" \"3\"\n\"d\n\"e\" \"5\"\n");
        assert_eq!(loaded.users.len(), 3);
        assert_eq!(
            (
                &loaded.users["a"][..],
                &loaded.users["c"][..],
                &loaded.users["e"][..]
            ),
            ("1", "3", "5")
        );
        assert_eq!(loaded.notices.len(), 2, "{:?}", loaded.notices);
        assert!(loaded.notices[0].starts_with("userlist.txt:2: broken auth file"));
        assert!(loaded.notices[1].starts_with("userlist.txt:4: broken auth file"));
        assert!(loaded.notices[1].ends_with("; the line is skipped"));
        for bad in ["\"a\"", "\"a\" \"unterminated", "\"unterminated"] {
            let loaded = parse(bad);
            assert!(loaded.users.is_empty(), "{bad}");
            assert_eq!(loaded.notices.len(), 1, "{bad}");
        }
    }

    #[test]
    fn overlong_fields_are_rejected() {
        let long_user = "u".repeat(MAX_USERNAME);
        let loaded = parse(&format!("\"{long_user}\" \"x\""));
        assert!(loaded.users.is_empty());
        assert!(loaded.notices[0].contains("user name too long"));
        let ok_user = "u".repeat(MAX_USERNAME - 1);
        assert_eq!(parse(&format!("\"{ok_user}\" \"x\"")).users.len(), 1);
        let longest = "p".repeat(MAX_PASSWORD - 1);
        let text = format!("\"ok\" \"{longest}\"\n\"no\" \"{longest}p\"\n\"next\" \"n\"\n");
        let loaded = parse(&text);
        assert_eq!(loaded.users["ok"], longest);
        assert!(!loaded.users.contains_key("no"));
        assert_eq!(loaded.users["next"], "n");
        assert_eq!(loaded.notices.len(), 1);
        assert!(loaded.notices[0].starts_with("userlist.txt:2: password too long"));
    }

    #[test]
    fn unreadable_file_is_an_error() {
        let err = load_auth_file(Path::new("/nonexistent/weir/userlist.txt")).unwrap_err();
        assert_eq!(err.file, Path::new("/nonexistent/weir/userlist.txt"));
        assert!(err.message.starts_with("could not read auth file"));
    }
}

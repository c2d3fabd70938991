//! The `key=value key='quoted value'` strings of `[databases]`, `[users]`
//! and `[peers]`, split as PgBouncer's `cstr_get_pair` does:
//! - only the space character separates pairs (a tab is part of a value);
//! - a value in single quotes may contain spaces, and `''` is a literal quote
//!   (a backslash has no special meaning);
//! - empty values (`host=` or `host=''`) are a syntax error.

use std::time::Duration;

use crate::value::parse_duration;

/// Splits a connection string into its pairs, in order.
pub(crate) fn split_pairs(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut pairs = Vec::new();
    let mut rest = s;
    loop {
        rest = rest.trim_start_matches(' ');
        if rest.is_empty() {
            return Ok(pairs);
        }
        let key_end = rest.find(['=', ' ']).unwrap_or(rest.len());
        let key = &rest[..key_end];
        let after_key = rest[key_end..].trim_start_matches(' ');
        let Some(after_eq) = after_key.strip_prefix('=') else {
            return Err(format!(
                "syntax error in connection string: expected \"=\" after \"{key}\""
            ));
        };
        if key.is_empty() {
            return Err(
                "syntax error in connection string: \"=\" without a parameter name".to_owned(),
            );
        }
        let after_eq = after_eq.trim_start_matches(' ');
        let (value, after_value) = if let Some(quoted) = after_eq.strip_prefix('\'') {
            let (value, after) = unquote(quoted).ok_or_else(|| {
                format!(
                    "syntax error in connection string: unterminated quote in value of \"{key}\""
                )
            })?;
            if !(after.is_empty() || after.starts_with(' ')) {
                return Err(format!(
                    "syntax error in connection string: expected a space after the quoted value of \"{key}\""
                ));
            }
            (value, after)
        } else {
            let end = after_eq.find(' ').unwrap_or(after_eq.len());
            (after_eq[..end].to_owned(), &after_eq[end..])
        };
        if value.is_empty() {
            return Err(format!(
                "syntax error in connection string: empty value for \"{key}\""
            ));
        }
        pairs.push((key.to_owned(), value));
        rest = after_value;
    }
}

/// Reads a quoted value after its opening quote; returns it and what follows
/// the closing quote.
fn unquote(s: &str) -> Option<(String, &str)> {
    let mut value = String::new();
    let mut chars = s.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c == '\'' {
            if matches!(chars.peek(), Some((_, '\''))) {
                chars.next();
                value.push('\'');
                continue;
            }
            return Some((value, &s[i + 1..]));
        }
        value.push(c);
    }
    None
}

/// A count such as `pool_size`. PgBouncer reads these with `atoi` and treats
/// a negative number as "not set", so `-1` gives `None`.
pub(crate) fn count(raw: &str) -> Result<Option<u32>, String> {
    let value = decimal(raw)?;
    if value < 0 {
        return Ok(None);
    }
    u32::try_from(value)
        .map(Some)
        .map_err(|_| format!("integer value \"{raw}\" is out of range"))
}

/// A per-entry time in seconds (fractions and units allowed); a negative
/// number means "not set", as PgBouncer documents `-1`.
pub(crate) fn time(raw: &str) -> Result<Option<Duration>, String> {
    if raw.starts_with('-') {
        return decimal(raw).map(|_| None);
    }
    parse_duration(raw).map(Some)
}

/// A decimal integer: `atoi` accepts no hex or octal, but unlike `atoi`
/// trailing garbage is an error here.
pub(crate) fn decimal(raw: &str) -> Result<i64, String> {
    let digits = raw.strip_prefix(['-', '+']).unwrap_or(raw);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("invalid integer value \"{raw}\""));
    }
    raw.parse()
        .map_err(|_| format!("integer value \"{raw}\" is out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn plain_pairs() {
        assert_eq!(split_pairs(""), Ok(vec![]));
        assert_eq!(split_pairs("   "), Ok(vec![]));
        assert_eq!(
            split_pairs("host=localhost  port=5432 dbname = bazdb"),
            Ok(pairs(&[
                ("host", "localhost"),
                ("port", "5432"),
                ("dbname", "bazdb")
            ]))
        );
    }

    #[test]
    fn quoted_values() {
        assert_eq!(
            split_pairs("connect_query='SELECT 1' password='it''s'"),
            Ok(pairs(&[
                ("connect_query", "SELECT 1"),
                ("password", "it's")
            ]))
        );
        assert_eq!(
            split_pairs(r"password='a\b'"),
            Ok(pairs(&[("password", r"a\b")]))
        );
        assert_eq!(split_pairs("x='='"), Ok(pairs(&[("x", "=")])));
    }

    #[test]
    fn syntax_errors() {
        for bad in [
            "host",
            "host=",
            "host=''",
            "=x",
            "a='unterminated",
            "a='x'b=1",
            "host localhost",
        ] {
            assert!(split_pairs(bad).is_err(), "{bad}");
        }
    }
}

#[cfg(test)]
mod number_tests {
    use super::*;

    #[test]
    fn counts_and_times() {
        assert_eq!(count("10"), Ok(Some(10)));
        assert_eq!(count("-1"), Ok(None));
        assert_eq!(count("010"), Ok(Some(10)));
        assert!(count("ten").is_err());
        assert!(count("5x").is_err());
        assert_eq!(time("30"), Ok(Some(Duration::from_secs(30))));
        assert_eq!(time("-1"), Ok(None));
        assert_eq!(time("1.5"), Ok(Some(Duration::from_millis(1500))));
        assert!(time("soon").is_err());
        assert!(time("-x").is_err());
    }
}

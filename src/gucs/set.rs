//! SET statements that say what set_config() says: how Weir puts a setting on a server in
//! the query it writes in front of a client's request (gucs::on_the_way).

use crate::protocol::messages::quote_literal;

/// Settings whose value is a list of identifiers: a SET flattens each element it is given
/// with quote_identifier and joins them with ", " (where set_config() keeps the string
/// as it is).
const IDENTIFIER_LISTS: [&str; 4] = [
    "search_path",
    "temp_tablespaces",
    "session_preload_libraries",
    "local_preload_libraries",
];

/// A SET that gives `name` the value `value` exactly as set_config() would, where one can
/// be written: a utility statement costs PostgreSQL a fraction of a SELECT of
/// set_config() (measured in bench/README.md). None for an extension's setting (a dotted
/// name: it may be a list SET reads otherwise), and for a list of identifiers that SET
/// would not flatten back to the same text.
pub(super) fn set_statement(name: &str, value: &str) -> Option<String> {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return None;
    }
    if !IDENTIFIER_LISTS.contains(&name.to_ascii_lowercase().as_str()) {
        // The name quoted: nothing in it can make the statement one PostgreSQL cannot
        // parse (the whole query would fail without opening its block, and the request
        // behind it run).
        return Some(format!(
            "SET {} TO {};",
            super::quote_ident(name),
            quote_literal(value)
        ));
    }
    // Worked out once per value and worker thread: scanning each element for keywords
    // with PostgreSQL's scanner costs microseconds, at every hand-over between clients
    // with their own search_path, and the same values come back.
    if value.len() > LIST_KEPT_LEN {
        return list_statement(name, value);
    }
    let key = (name.to_owned(), value.to_owned());
    if let Some(known) = LISTS.with(|l| l.borrow().get(&key).cloned()) {
        return known;
    }
    let statement = list_statement(name, value);
    LISTS.with(|l| {
        let mut l = l.borrow_mut();
        if l.len() >= LISTS_KEPT {
            l.clear();
        }
        l.insert(key, statement.clone());
    });
    statement
}

thread_local! {
    static LISTS: std::cell::RefCell<std::collections::HashMap<(String, String), Option<String>>> =
        std::cell::RefCell::default();
}

/// Values of lists kept per thread (then forgotten all at once): far more than the
/// tenants a pool serves at a time. Only values up to LIST_KEPT_LEN bytes, so that a
/// client setting long values cannot make them hold more than ~10 MB per thread.
const LISTS_KEPT: usize = 2048;
const LIST_KEPT_LEN: usize = 1024;

/// `set_statement` of a list of identifiers.
fn list_statement(name: &str, value: &str) -> Option<String> {
    let elements = identifier_list(value)?;
    let flattened: Vec<String> = elements.iter().map(|e| quote_identifier(e)).collect();
    if flattened.join(", ") != value {
        return None;
    }
    let quoted: Vec<String> = elements
        .iter()
        .map(|e| format!("\"{}\"", e.replace('"', "\"\"")))
        .collect();
    Some(format!(
        "SET {} TO {};",
        super::quote_ident(name),
        quoted.join(", ")
    ))
}

/// The elements of a list of identifiers as PostgreSQL reads one (SplitIdentifierString):
/// separated by commas, each in double quotes ("" for a quote) or bare (folded to lower
/// case); None for an empty list or one PostgreSQL would refuse.
fn identifier_list(value: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut chars = value.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut element = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next()? {
                    '"' if chars.peek() == Some(&'"') => {
                        chars.next();
                        element.push('"');
                    }
                    '"' => break,
                    c => element.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == ',' || c.is_whitespace() {
                    break;
                }
                element.push(c.to_ascii_lowercase());
                chars.next();
            }
        }
        if element.is_empty() {
            return None;
        }
        out.push(element);
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        match chars.next() {
            None => return Some(out),
            Some(',') => {}
            Some(_) => return None,
        }
    }
}

/// PostgreSQL's quote_identifier: bare when lower-case letters, digits and underscores
/// not starting with a digit, and no keyword but an unreserved one.
fn quote_identifier(ident: &str) -> String {
    let bare = ident
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
        && ident
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    let keyword = || {
        pg_query::scan_tokens(ident).map_or(true, |t| {
            t.len() != 1
                || !matches!(
                    pg_query::protobuf::KeywordKind::try_from(t[0].keyword_kind),
                    Ok(pg_query::protobuf::KeywordKind::NoKeyword
                        | pg_query::protobuf::KeywordKind::UnreservedKeyword)
                )
        })
    };
    if bare && !keyword() {
        ident.to_owned()
    } else {
        format!("\"{}\"", ident.replace('"', "\"\""))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_says_what_set_config_says_or_is_not_used() {
        let set = |n: &str, v: &str| set_statement(n, v);
        assert_eq!(
            set("search_path", "\"$user\", public").as_deref(),
            Some("SET \"search_path\" TO \"$user\", \"public\";")
        );
        assert_eq!(
            set("search_path", "tenant_1, \"My \"\"S\"").as_deref(),
            Some("SET \"search_path\" TO \"tenant_1\", \"My \"\"S\";")
        );
        // set_config() keeps these as they are; SET would give them back otherwise.
        for odd in [
            "a,b",
            "User, public",
            "\"user\", \"select\"x",
            "",
            "a;b c",
            "\"open",
        ] {
            assert_eq!(set("search_path", odd), None, "{odd}");
        }
        // A keyword a SET would quote: the same text only when it is quoted already.
        assert_eq!(set("search_path", "user"), None);
        assert!(set("search_path", "\"user\"").is_some());
        assert_eq!(
            set("statement_timeout", "5s").as_deref(),
            Some("SET \"statement_timeout\" TO '5s';")
        );
        assert_eq!(
            set("DateStyle", "ISO, MDY").as_deref(),
            Some("SET \"DateStyle\" TO 'ISO, MDY';")
        );
        assert_eq!(set("myapp.user_id", "42"), None);
        assert_eq!(set("bad name", "1"), None);
    }
}

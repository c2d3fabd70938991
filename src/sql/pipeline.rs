//! Which statements may share a server's pipeline with another client's (pool::pipeline).
//!
//! A request may be sent behind another client's on the same server only when neither
//! can change what the other sees: each must be one implicit transaction that leaves the
//! session as it found it. So only an allow-list of first words passes (a query that
//! reads or writes rows), as one statement, with nothing `sql::effects` would have to
//! read back, and no call of a function that might change a reported parameter
//! (sql::calls). Anything else, or anything this cannot tell, is not pipelined.

use super::calls;
use super::effects;
use super::lexer::{is_ident_byte, tokens, Tok};

/// Statements that run inside the implicit transaction their message opens and end with
/// it. Not CALL (a procedure may COMMIT), not DO, not the utility commands.
const PLAIN_STARTS: [&str; 8] = [
    "select", "insert", "update", "delete", "with", "values", "table", "show",
];

/// Whether `sql` (a Query's text, or a Parse's, without its NUL) is one plain statement.
pub fn plain(sql: &[u8]) -> bool {
    plain_with(sql, effects::effects(sql, true).flags)
}

/// `plain`, for a text whose effects (`sql::effects` flags) the caller has found already.
pub fn plain_with(sql: &[u8], effect_flags: u8) -> bool {
    if effect_flags != 0 || calls_set_config(sql) {
        // It may set a reported parameter, which effects does not flag (the relay follows
        // ParameterStatus), but a request sent behind it would run with the new value.
        return false;
    }
    if sql.contains(&b'\\') {
        // The lexer reads literals as standard_conforming_strings on has them; with it
        // off a backslash escapes a quote, and a literal may end elsewhere (and a
        // statement, or a call effects looks for, begin in what looked quoted).
        return false;
    }
    let start = sql
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(sql.len());
    let rest = &sql[start..];
    let simple_start = rest.first().is_some_and(u8::is_ascii_alphabetic);
    // Without a parenthesis there is no call (sql::calls) to look at.
    if simple_start && !sql.contains(&b';') && !sql.contains(&b'(') {
        let end = rest
            .iter()
            .position(|c| !c.is_ascii_alphanumeric() && *c != b'_')
            .unwrap_or(rest.len());
        return PLAIN_STARTS
            .iter()
            .any(|w| rest[..end].eq_ignore_ascii_case(w.as_bytes()));
    }
    // Comments, parentheses or semicolons: the lexer says where statements start.
    let Ok(text) = std::str::from_utf8(sql) else {
        return false;
    };
    let toks = tokens(text);
    let mut statements = toks.split(|t| t.tok == Tok::Semi).filter(|s| !s.is_empty());
    let (Some(one), None) = (statements.next(), statements.next()) else {
        return false;
    };
    let first = one.iter().find(|t| t.tok != Tok::Punct(b'('));
    matches!(first.map(|t| &t.tok), Some(Tok::Word(w)) if PLAIN_STARTS.contains(&w.as_str()))
        && calls::only_known_calls(one)
}

/// "set_config" anywhere, in any case: one pass looking at underscores only.
fn calls_set_config(sql: &[u8]) -> bool {
    sql.iter().enumerate().any(|(i, &c)| {
        c == b'_'
            && i >= 3
            && sql[i - 3..i].eq_ignore_ascii_case(b"set")
            && sql
                .get(i + 1..i + 7)
                .is_some_and(|w| w.eq_ignore_ascii_case(b"config"))
    })
}

/// Folds `bytes` into a request's fingerprint (FNV-1a, xor-folded to 16 bits), each
/// literal (a quoted string, a number that is not part of a name) folded as one `?`: a
/// query whose values are inlined (client-side interpolation, `pgbench -M simple`) has
/// one fingerprint whatever the values, so the pool's memory of requests that ran long
/// (pool::pipeline) holds for its like.
pub fn fold(print: u16, bytes: &[u8]) -> u16 {
    let mut h = 0x811c_9dc5_u32 ^ u32::from(print);
    let mut mix = |b: u8| {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    };
    let mut i = 0;
    let mut prev = 0u8;
    while let Some(&b) = bytes.get(i) {
        i += 1;
        if b == b'\'' {
            // To its closing quote; a doubled one stands for a quote.
            while let Some(&c) = bytes.get(i) {
                i += 1;
                if c == b'\'' {
                    if bytes.get(i) != Some(&b'\'') {
                        break;
                    }
                    i += 1;
                }
            }
            mix(b'?');
        } else if b.is_ascii_digit() && !is_ident_byte(prev) {
            while bytes
                .get(i)
                .is_some_and(|c| c.is_ascii_digit() || *c == b'.')
            {
                i += 1;
            }
            mix(b'?');
        } else {
            mix(b);
        }
        prev = b;
    }
    ((h >> 16) ^ h) as u16
}

/// The fingerprint a request starts from.
pub const PRINT_SEED: u16 = 0;

#[cfg(test)]
mod tests {
    use super::{fold, plain, PRINT_SEED};

    fn print(sql: &str) -> u16 {
        fold(PRINT_SEED, sql.as_bytes())
    }

    #[test]
    fn a_fingerprint_leaves_the_values_out() {
        let same = [
            (
                "UPDATE pgbench_accounts SET abalance = abalance + -4021 WHERE aid = 81234",
                "UPDATE pgbench_accounts SET abalance = abalance + -3 WHERE aid = 7",
            ),
            (
                "select pg_sleep(0.2), 'slow'",
                "select pg_sleep(10), 'it''s slower'",
            ),
            (
                "select * from t where s = ''",
                "select * from t where s = 'x'",
            ),
        ];
        for (a, b) in same {
            assert_eq!(print(a), print(b), "{a} / {b}");
        }
        let different = [
            ("select * from t1", "select * from t2"),
            (
                "select * from t where id = 1",
                "select * from u where id = 1",
            ),
            ("select 'a', 1", "select 'a' || 1"),
            ("select $1", "select $2"),
        ];
        for (a, b) in different {
            assert_ne!(print(a), print(b), "{a} / {b}");
        }
    }

    #[test]
    fn reads_and_writes_of_rows_are_plain() {
        for sql in [
            "SELECT abalance FROM pgbench_accounts WHERE aid = 7",
            "select 1",
            "  UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = $1",
            "INSERT INTO t VALUES (1)",
            "delete from t where id = 3",
            "WITH x AS (SELECT 1) SELECT * FROM x",
            "VALUES (1), (2)",
            "TABLE t",
            "SHOW search_path",
            "SELECT 1;",
            "SELECT ';' AS semi",
            "/* app */ SELECT 1",
            "(SELECT 1) UNION (SELECT 2)",
            "SELECT * FROM t FOR UPDATE",
            "SELECT pg_sleep(0.01)",
        ] {
            assert!(plain(sql.as_bytes()), "{sql}");
        }
    }

    #[test]
    fn whatever_may_change_the_session_or_the_transaction_is_not() {
        for sql in [
            "BEGIN",
            "begin; select 1",
            "START TRANSACTION",
            "COMMIT",
            "ROLLBACK",
            "SELECT 1; SELECT 2",
            "SELECT 1; COMMIT",
            "SET search_path = x",
            "RESET ALL",
            "SELECT set_config('application_name', 'x', false)",
            "SELECT SET_CONFIG('TimeZone', 'UTC', true)",
            "SELECT pg_advisory_lock(1)",
            // A function of the application's may set a reported parameter (sql::calls).
            "SELECT leak_timezone()",
            "INSERT INTO t VALUES (f(1))",
            "SELECT * INTO TEMP t FROM x",
            "PREPARE p AS SELECT 1",
            "EXECUTE p",
            "DEALLOCATE ALL",
            "LISTEN c",
            "NOTIFY c",
            "DECLARE c CURSOR WITH HOLD FOR SELECT 1",
            "COPY t FROM STDIN",
            "DISCARD ALL",
            "LOCK TABLE t",
            "CALL p()",
            "DO $$ BEGIN END $$",
            "CREATE TABLE t (id int)",
            "VACUUM",
            "",
            "  ",
            "-- only a comment",
            // PostgreSQL ends a line comment at a carriage return too.
            "SELECT 1 --\r; BEGIN",
            "SELECT 1 -- x\r;COMMIT",
            // standard_conforming_strings off: a SELECT, then a BEGIN.
            r"select 'x\' '; begin; --'",
        ] {
            assert!(!plain(sql.as_bytes()), "{sql}");
        }
    }
}

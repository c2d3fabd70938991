//! Whether a statement calls only functions known not to change the session.
//!
//! A function of the application's (or a trigger's) may call set_config with a reported
//! parameter (TimeZone, DateStyle, ...): PostgreSQL reports the change just before the
//! request's ReadyForQuery, and a request pipelined behind it (pool::pipeline), already
//! on the server, would run with the new value before the relay can put the server
//! right. Which functions a name stands for is in the catalog, not in the text; so only
//! calls of PostgreSQL's own functions that read or compute (an allow-list, unqualified
//! or in pg_catalog) pass. Anything else, or anything this cannot place, is taken for a
//! call that might.

use super::lexer::{Spanned, Tok};

/// Words that stand before a parenthesis without being a call: keywords of the grammar
/// and the type names that take a modifier.
const NOT_CALLS: &[&str] = &[
    "all",
    "and",
    "any",
    "array",
    "as",
    "between",
    "bit",
    "by",
    "case",
    "cast",
    "char",
    "character",
    "conflict",
    "cube",
    "decimal",
    "distinct",
    "do",
    "else",
    "except",
    "exists",
    "extract",
    "filter",
    "float",
    "from",
    "group",
    "grouping",
    "having",
    "ilike",
    "in",
    "intersect",
    "interval",
    "is",
    "join",
    "lateral",
    "like",
    "limit",
    "not",
    "numeric",
    "offset",
    "on",
    "only",
    "or",
    "order",
    "over",
    "overlay",
    "partition",
    "position",
    "returning",
    "rollup",
    "row",
    "select",
    "set",
    "sets",
    "some",
    "substring",
    "then",
    "time",
    "timestamp",
    "trim",
    "union",
    "using",
    "values",
    "varchar",
    "when",
];

/// PostgreSQL's own functions that neither change settings nor take locks or state a
/// request behind could see. Not set_config, pg_advisory_*, nor anything of sessions
/// (pg_terminate_backend and pg_cancel_backend end or interrupt a backend, which a
/// request behind it survives as any lost server: pool::pipeline).
const KNOWN: &[&str] = &[
    "abs",
    "age",
    "array_agg",
    "array_length",
    "array_position",
    "array_to_string",
    "avg",
    "bool_and",
    "bool_or",
    "btrim",
    "ceil",
    "ceiling",
    "char_length",
    "clock_timestamp",
    "coalesce",
    "concat",
    "concat_ws",
    "count",
    "current_date",
    "current_setting",
    "date_part",
    "date_trunc",
    "decode",
    "encode",
    "every",
    "exp",
    "floor",
    "format",
    "gen_random_uuid",
    "generate_series",
    "greatest",
    "json_agg",
    "json_build_array",
    "json_build_object",
    "json_extract_path_text",
    "jsonb_agg",
    "jsonb_array_elements",
    "jsonb_array_length",
    "jsonb_build_array",
    "jsonb_build_object",
    "jsonb_extract_path",
    "jsonb_extract_path_text",
    "jsonb_object_agg",
    "jsonb_set",
    "jsonb_typeof",
    "least",
    "left",
    "length",
    "ln",
    "log",
    "lower",
    "lpad",
    "ltrim",
    "make_date",
    "max",
    "md5",
    "min",
    "mod",
    "now",
    "nullif",
    "octet_length",
    "pg_backend_pid",
    "pg_cancel_backend",
    "pg_sleep",
    "pg_terminate_backend",
    "power",
    "random",
    "regexp_replace",
    "repeat",
    "replace",
    "right",
    "round",
    "row_number",
    "row_to_json",
    "rpad",
    "rtrim",
    "sign",
    "split_part",
    "sqrt",
    "statement_timestamp",
    "string_agg",
    "strpos",
    "substr",
    "sum",
    "to_char",
    "to_json",
    "to_jsonb",
    "to_timestamp",
    "trunc",
    "upper",
];

/// True when every call in `toks` is of a function in `KNOWN`.
pub fn only_known_calls(toks: &[Spanned]) -> bool {
    toks.windows(2).enumerate().all(|(i, w)| {
        if w[1].tok != Tok::Punct(b'(') {
            return true;
        }
        let name = match &w[0].tok {
            Tok::Word(name) => name.as_str(),
            // A quoted name before a parenthesis: a column list after a table, or a call.
            Tok::Ident(_) => "",
            _ => return true,
        };
        if NOT_CALLS.contains(&name) || names_a_column_list(&toks[..=i]) {
            return true;
        }
        let qualifier = qualifier(&toks[..=i]);
        KNOWN.contains(&name) && qualifier.is_none_or(|q| q == "pg_catalog")
    })
}

/// The schema a name (the last token of `before`) is qualified with.
fn qualifier(before: &[Spanned]) -> Option<&str> {
    match before {
        [.., q, dot, _] if dot.tok == Tok::Punct(b'.') => match &q.tok {
            Tok::Word(s) | Tok::Ident(s) => Some(s.as_str()),
            _ => Some(""),
        },
        _ => None,
    }
}

/// Whether the name that ends `before` is a table or alias with its column list after
/// it: `INSERT INTO [schema.]t (a, b)`, `AS x (a, b)`, `WITH x (a) AS`.
fn names_a_column_list(before: &[Spanned]) -> bool {
    let mut i = before.len();
    // Back over the (maybe qualified) name.
    loop {
        if i == 0 || !matches!(before[i - 1].tok, Tok::Word(_) | Tok::Ident(_)) {
            return false;
        }
        i -= 1;
        if i > 0 && before[i - 1].tok == Tok::Punct(b'.') {
            i -= 1;
            continue;
        }
        break;
    }
    matches!(
        before.get(i.wrapping_sub(1)).map(|t| &t.tok),
        Some(Tok::Word(w)) if matches!(w.as_str(), "into" | "as" | "with" | "recursive")
    )
}

#[cfg(test)]
mod tests {
    use super::only_known_calls;
    use crate::sql::lexer::tokens;

    fn known(sql: &str) -> bool {
        only_known_calls(&tokens(sql))
    }

    #[test]
    fn calls_of_postgresqls_own_functions_pass() {
        for sql in [
            "select count(*), max(id) from t where id in (1, 2)",
            "insert into t (a, b) values (1, now())",
            "insert into public.t (a) select 1 from pg_sleep(0.1)",
            "select x.a from (select 1) as x (a)",
            "with x (a) as (select 1) select * from x",
            "select cast('1' as numeric(10, 2)), coalesce(a, 0) from t",
            "select pg_catalog.lower('A')",
            "select * from t where exists (select 1) and not (a = 1)",
        ] {
            assert!(known(sql), "{sql}");
        }
    }

    #[test]
    fn other_calls_do_not() {
        for sql in [
            "select leak_timezone()",
            "select app.f(1)",
            "select \"F\"(1)",
            "insert into t values (f(1))",
            "select pg_advisory_lock(1)",
            "select set_config('TimeZone', 'UTC', false)",
            "select public.count(1)",
        ] {
            assert!(!known(sql), "{sql}");
        }
    }
}

//! Which functions a read may call and stay a read. PostgreSQL forbids writes in STABLE
//! and IMMUTABLE functions, so those are safe; a VOLATILE one may write (nextval,
//! setval, a user's function that inserts) unless it is one of the few built-ins known
//! only to read (random, clock_timestamp, pg_sleep).
//!
//! Each database entry learns its own list from pg_proc (its users' functions too): a
//! name is safe when no function of that name, in any schema, with any arguments, is
//! volatile. Until the list is read, only the built-ins below are known.

use std::collections::HashSet;
use std::sync::Arc;

use arc_swap::ArcSwap;

/// Per function name: whether every function of that name is a non-volatile function
/// (or aggregate, window function), and whether all of them are built in (pg_catalog).
pub const CATALOG_SQL: &str = "SELECT proname, \
     bool_and(provolatile <> 'v' AND prokind IN ('f', 'a', 'w'))::text, \
     bool_and(pronamespace = 'pg_catalog'::regnamespace)::text \
     FROM pg_catalog.pg_proc GROUP BY proname \
     HAVING bool_and(provolatile <> 'v' AND prokind IN ('f', 'a', 'w')) \
     OR bool_and(pronamespace = 'pg_catalog'::regnamespace)";

/// Built-ins the catalog calls STABLE that still cannot run on a standby: they assign a
/// transaction ID.
const ASSIGN_XID: &[&str] = &["txid_current", "pg_current_xact_id"];

/// Volatile built-ins that only read.
const VOLATILE_READS: &[&str] = &[
    "random",
    "random_normal",
    "clock_timestamp",
    "timeofday",
    "gen_random_uuid",
    "pg_sleep",
    "pg_sleep_for",
    "pg_sleep_until",
    "pg_is_in_recovery",
    "pg_last_wal_receive_lsn",
    "pg_last_wal_replay_lsn",
    "pg_last_xact_replay_timestamp",
];

/// Common stable or immutable built-ins, known before a database's own list is read.
const BUILTIN_SAFE: &[&str] = &[
    "abs",
    "array_agg",
    "array_length",
    "avg",
    "bool_and",
    "bool_or",
    "btrim",
    "ceil",
    "char_length",
    "coalesce",
    "concat",
    "concat_ws",
    "count",
    "current_database",
    "current_schema",
    "current_setting",
    "current_user",
    "date_part",
    "date_trunc",
    "every",
    "extract",
    "floor",
    "format",
    "generate_series",
    "inet_server_addr",
    "inet_server_port",
    "json_agg",
    "json_build_object",
    "jsonb_agg",
    "jsonb_build_object",
    "left",
    "length",
    "lower",
    "ltrim",
    "max",
    "md5",
    "min",
    "now",
    "pg_backend_pid",
    "position",
    "replace",
    "right",
    "round",
    "row_number",
    "row_to_json",
    "rtrim",
    "split_part",
    "statement_timestamp",
    "string_agg",
    "substr",
    "substring",
    "sum",
    "to_char",
    "to_json",
    "to_jsonb",
    "to_timestamp",
    "transaction_timestamp",
    "trim",
    "trunc",
    "unnest",
    "upper",
    "version",
];

/// The safe function names of one database entry.
#[derive(Debug)]
pub struct SafeFunctions {
    names: ArcSwap<HashSet<Box<str>>>,
}

impl Default for SafeFunctions {
    fn default() -> Self {
        let names = BUILTIN_SAFE
            .iter()
            .chain(VOLATILE_READS)
            .map(|&n| Box::from(n))
            .collect();
        SafeFunctions {
            names: ArcSwap::from_pointee(names),
        }
    }
}

impl SafeFunctions {
    /// The catalog's answer (name, all non-volatile, all built in) replaces the built-in
    /// guess. The volatile built-ins that only read stay safe only while no function of
    /// the same name was created outside pg_catalog.
    pub fn learn(&self, catalog: impl IntoIterator<Item = (String, bool, bool)>) {
        let mut names = HashSet::new();
        for (name, safe, builtin) in catalog {
            if ASSIGN_XID.contains(&name.as_str()) {
                continue;
            }
            if safe || (builtin && VOLATILE_READS.contains(&name.as_str())) {
                names.insert(name.into_boxed_str());
            }
        }
        self.names.store(Arc::new(names));
    }

    pub fn all_safe(&self, calls: &[Box<str>]) -> bool {
        if calls.is_empty() {
            return true;
        }
        let names = self.names.load();
        calls.iter().all(|c| names.contains(c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_until_the_catalog_is_read() {
        let f = SafeFunctions::default();
        assert!(f.all_safe(&["now".into(), "random".into()]));
        assert!(!f.all_safe(&["now".into(), "nextval".into()]));
        f.learn([
            ("my_stable_fn".to_owned(), true, false),
            ("pg_sleep".to_owned(), false, true),
            ("random".to_owned(), false, false),
            ("txid_current".to_owned(), true, true),
            ("nextval".to_owned(), false, true),
        ]);
        assert!(f.all_safe(&["my_stable_fn".into(), "pg_sleep".into()]));
        assert!(
            !f.all_safe(&["now".into()]),
            "the catalog's list replaces the guess"
        );
        assert!(
            !f.all_safe(&["random".into()]),
            "a user's volatile random()"
        );
        assert!(!f.all_safe(&["txid_current".into()]));
        assert!(!f.all_safe(&["nextval".into()]));
    }
}

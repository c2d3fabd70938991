//! Settings a client set in its session that PostgreSQL does not report (search_path,
//! statement_timeout, myapp.user_id, the role, ...), as read back from the server after
//! the transaction that changed them; and the SQL that reads them and puts them on another
//! server. The reported ones (params::TRACKED) are followed through ParameterStatus instead.

use std::sync::Arc;

mod set;

use crate::params::ParamSet;
use crate::protocol::messages::quote_literal;
use set::set_statement;

/// name -> value, sorted by name, with `role` last: it is set last (what came before may
/// need the privileges it gives up) and reset first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Gucs(Vec<(String, String)>);

/// What the server said ties the session to it (client::state asks with the settings).
pub const PIN_ROW: &str = "";

/// What may tie a session to its server, as the read-back names it; a client's pins are
/// kept as bits in this order.
pub const PINS: [&str; 5] = [
    "advisory lock",
    "temporary table",
    "WITH HOLD cursor",
    "LISTEN",
    "SET SESSION AUTHORIZATION",
];

pub fn pin_bits(listed: &str) -> u8 {
    listed
        .split(',')
        .filter_map(|p| PINS.iter().position(|k| *k == p))
        .fold(0, |bits, i| bits | 1 << i)
}

pub fn pin_text(bits: u8) -> String {
    let named: Vec<&str> = PINS
        .iter()
        .enumerate()
        .filter(|(i, _)| bits & 1 << i != 0)
        .map(|(_, p)| *p)
        .collect();
    named.join(",")
}

impl Gucs {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(k, _)| k.as_str())
    }

    /// Records a value read back from the server; an unset one (role `none`, a custom
    /// setting that is empty or was never made) is removed.
    pub fn put(&mut self, name: &str, value: Option<&str>) {
        // Names are case-insensitive to the server; pg_settings spells some in capitals.
        let lower;
        let name = if name.bytes().any(|b| b.is_ascii_uppercase()) {
            lower = name.to_ascii_lowercase();
            lower.as_str()
        } else {
            name
        };
        self.0.retain(|(k, _)| k != name);
        let unset = match value {
            None | Some("") => true,
            Some(v) => name == "role" && v == "none",
        };
        if !unset {
            if let Some(v) = value {
                self.0.push((name.to_owned(), v.to_owned()));
            }
        }
        self.0
            .sort_by(|(a, _), (b, _)| (a == "role", a).cmp(&(b == "role", b)));
    }
}

/// The settings in a startup packet's `options` (libpq's PGOPTIONS: `-c name=value`,
/// `-cname=value` or `--name=value`, words split on blanks, a backslash keeping the next
/// character); None when it holds anything else (another server switch).
pub fn from_options(options: &str) -> Option<Vec<(String, String)>> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut chars = options.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => word.extend(chars.next()),
            c if c.is_whitespace() => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    let mut out = Vec::new();
    let mut words = words.into_iter();
    while let Some(w) = words.next() {
        let setting = if w == "-c" {
            words.next()?
        } else if let Some(s) = w.strip_prefix("--").or_else(|| w.strip_prefix("-c")) {
            s.to_owned()
        } else {
            return None;
        };
        let (name, value) = setting.split_once('=')?;
        if name.is_empty() {
            return None;
        }
        out.push((
            name.replace('-', "_").to_ascii_lowercase(),
            value.to_owned(),
        ));
    }
    Some(out)
}

fn array(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| quote_literal(n)).collect();
    format!("ARRAY[{}]::pg_catalog.text[]", quoted.join(","))
}

/// Settings that would cut or refuse Weir's own queries if the client's values applied
/// to them (a statement_timeout of 1 ms): [`GUARD`] turns them off for the rest of an
/// internal query's implicit transaction, which then ends with the client's values intact.
pub const GUARDED: [&str; 3] = [
    "statement_timeout",
    "lock_timeout",
    "idle_in_transaction_session_timeout",
];

/// Settings any session may set, read back by name without asking pg_settings (a scan
/// of every setting) whether the session did.
const SETTABLE: [&str; 16] = [
    "default_transaction_isolation",
    "default_transaction_read_only",
    "extra_float_digits",
    "idle_in_transaction_session_timeout",
    "idle_session_timeout",
    "jit",
    "lock_timeout",
    "maintenance_work_mem",
    "plan_cache_mode",
    "role",
    "row_security",
    "search_path",
    "statement_timeout",
    "synchronous_commit",
    "temp_tablespaces",
    "work_mem",
];

/// Put before an internal query of several statements (never before DISCARD ALL, which
/// refuses to run in a transaction block).
pub const GUARD: &str = "SET LOCAL statement_timeout = 0;SET LOCAL lock_timeout = 0;\
                         SET LOCAL idle_in_transaction_session_timeout = 0;";

/// In a read-back, the row that gives a guarded setting's value after RESET is named
/// with this prefix (see [`read_back`]).
pub const RESET_VALUE_PREFIX: char = '=';

/// In a whole read-back, a reported parameter at the server's own value (its RESET
/// value: reset, or never set by the session) comes in a row named with this prefix: the
/// client is to have its own startup value back, as RESET gives on a direct connection.
/// (Not `source <> 'session'`: RESET ALL then SET LOCAL in one transaction leaves the
/// RESET value with source session.)
pub const AT_DEFAULT_PREFIX: char = '~';

/// The query that reads back the settings a transaction may have changed: `names` by
/// name, and with `exact` every setting the session itself set (pg_settings does not list
/// custom ones, so those are asked for by name still). With `pins`, one more row, named
/// [`PIN_ROW`], lists what ties the session to its server. Rows are (name, value or NULL).
///
/// The guarded settings are read first, in a statement cheap enough for any timeout,
/// then turned off for the rest (pg_settings takes a millisecond to scan); with `exact`,
/// their values after RESET are read too (rows named `=name`), as pg_settings can no
/// longer tell whether the session set them.
pub fn read_back(names: &[&str], exact: bool, pins: bool) -> String {
    let mut sql = String::new();
    let guarded: Vec<&str> = GUARDED
        .iter()
        .copied()
        .filter(|g| exact || names.contains(g))
        .collect();
    if !guarded.is_empty() {
        sql.push_str(&format!(
            "SELECT n, pg_catalog.current_setting(n, true) FROM pg_catalog.unnest({}) n;",
            array(&guarded)
        ));
    }
    if exact {
        for g in GUARDED {
            sql.push_str(&format!("SET LOCAL {g} TO DEFAULT;"));
        }
        sql.push_str(&format!(
            "SELECT '{RESET_VALUE_PREFIX}' || n, pg_catalog.current_setting(n) \
             FROM pg_catalog.unnest({}) n;",
            array(&GUARDED)
        ));
    }
    let names: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| !GUARDED.contains(n))
        .collect();
    let mut parts = Vec::new();
    let by_name: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| n.contains('.') || (!exact && SETTABLE.contains(n)))
        .collect();
    // Other built-in names may be ones a session cannot set (max_connections): their
    // SET failed, and the value read back would fail on the next server. pg_settings
    // says whether the session set them.
    let checked: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| !exact && !n.contains('.') && !SETTABLE.contains(n))
        .collect();
    // Reading by name is as quick as the guard itself: the guard is for pg_settings and
    // the catalogs the pins are found in.
    let guard = if exact || pins || !checked.is_empty() {
        GUARD
    } else {
        ""
    };
    sql.push_str(guard);
    if !checked.is_empty() {
        parts.push(format!(
            "SELECT n, s.v FROM pg_catalog.unnest({}) n LEFT JOIN (SELECT \
             pg_catalog.lower(name) AS l, pg_catalog.current_setting(name) AS v \
             FROM pg_catalog.pg_settings WHERE source = 'session' \
             AND setting IS DISTINCT FROM reset_val) s ON s.l = n",
            array(&checked)
        ));
    }
    if exact {
        let list = |names: &mut dyn Iterator<Item = &str>| -> String {
            let quoted: Vec<String> = names
                .map(|n| quote_literal(&n.to_ascii_lowercase()))
                .collect();
            quoted.join(",")
        };
        let reported = list(&mut crate::params::TRACKED.iter().copied());
        let guarded = list(&mut GUARDED.iter().copied());
        // One scan of pg_settings: the settings the session made, and the reported
        // parameters it did not (or reset). One at its RESET value is taken as not made
        // (RESET ALL then SET LOCAL in one transaction leaves it with source session).
        parts.push(format!(
            "SELECT CASE WHEN pg_catalog.lower(name) IN ({reported}) \
             THEN '{AT_DEFAULT_PREFIX}' || name ELSE name END, \
             pg_catalog.current_setting(name) FROM pg_catalog.pg_settings \
             WHERE CASE WHEN pg_catalog.lower(name) IN ({reported}) \
             THEN setting = reset_val \
             ELSE source = 'session' AND setting IS DISTINCT FROM reset_val \
             AND pg_catalog.lower(name) NOT IN ({guarded}) END"
        ));
        parts.push(
            "SELECT 'role', pg_catalog.current_setting('role') \
             WHERE pg_catalog.current_setting('role') <> 'none'"
                .to_owned(),
        );
    }
    if !by_name.is_empty() {
        parts.push(format!(
            "SELECT n, pg_catalog.current_setting(n, true) FROM pg_catalog.unnest({}) n",
            array(&by_name)
        ));
    }
    if pins {
        parts.push(
            "SELECT '', pg_catalog.concat_ws(',', \
             CASE WHEN EXISTS (SELECT FROM pg_catalog.pg_locks WHERE locktype = 'advisory' \
             AND pid = pg_catalog.pg_backend_pid()) THEN 'advisory lock' END, \
             CASE WHEN pg_catalog.pg_my_temp_schema() <> 0 AND (EXISTS (SELECT FROM \
             pg_catalog.pg_class WHERE relnamespace = pg_catalog.pg_my_temp_schema()) \
             OR EXISTS (SELECT FROM pg_catalog.pg_proc \
             WHERE pronamespace = pg_catalog.pg_my_temp_schema()) \
             OR EXISTS (SELECT FROM pg_catalog.pg_type \
             WHERE typnamespace = pg_catalog.pg_my_temp_schema())) \
             THEN 'temporary table' END, \
             CASE WHEN EXISTS (SELECT FROM pg_catalog.pg_cursors WHERE is_holdable) \
             THEN 'WITH HOLD cursor' END, \
             CASE WHEN EXISTS (SELECT FROM pg_catalog.pg_listening_channels()) \
             THEN 'LISTEN' END, \
             CASE WHEN session_user <> (SELECT usename FROM pg_catalog.pg_stat_activity \
             WHERE pid = pg_catalog.pg_backend_pid()) THEN 'SET SESSION AUTHORIZATION' END)"
                .to_owned(),
        );
    }
    if parts.is_empty() {
        // Only guarded settings were asked for.
        sql.truncate(sql.len() - guard.len());
    } else {
        sql.push_str(&parts.join(" UNION ALL "));
    }
    sql
}

/// The SQL that turns a server holding `have` into one holding `want`; empty when they
/// agree. A role is given up first and taken last, so that the settings in between are
/// made with the privileges the client had when it made them.
pub fn apply(have: &Gucs, want: &Gucs) -> String {
    let (mut sql, pairs) = apply_parts(have, want);
    if !pairs.is_empty() {
        let calls: Vec<String> = pairs.iter().map(|(n, v)| set_config(n, v)).collect();
        sql.push_str(&format!("SELECT {};", calls.join(", ")));
    }
    sql
}

/// `apply` in two parts: the RESETs that come first, and the settings to make after them,
/// the role's last.
fn apply_parts<'a>(have: &'a Gucs, want: &'a Gucs) -> (String, Vec<(&'a str, &'a str)>) {
    let mut sql = String::new();
    let mut pairs = Vec::new();
    if have == want {
        return (sql, pairs);
    }
    let role_first = have.get("role").is_some();
    if role_first {
        sql.push_str("RESET role;");
    }
    for name in have.names() {
        if name != "role" && want.get(name).is_none() {
            sql.push_str(&format!("RESET {};", quote_ident(name)));
        }
    }
    for (name, value) in &want.0 {
        let same = have.get(name) == Some(value.as_str());
        if !same || (name == "role" && role_first) {
            pairs.push((name.as_str(), value.as_str()));
        }
    }
    (sql, pairs)
}

fn set_config(name: &str, value: &str) -> String {
    format!(
        "pg_catalog.set_config({}, {}, false)",
        quote_literal(name),
        quote_literal(value)
    )
}

/// The SQL that puts a server into a client's session state: the reported parameters
/// that differ (`params`, the server's, against `wanted`, the client's; skipped when
/// `params_synced`), then the settings (`have`, the server's, against `want`). Empty
/// when the server is in that state already. With settings to change, the guard comes
/// first: the server may hold the last client's statement_timeout.
pub fn state_sql(
    params: &ParamSet,
    params_synced: bool,
    wanted: &ParamSet,
    have: Option<&Arc<Gucs>>,
    want: Option<&Arc<Gucs>>,
) -> String {
    let mut sql = String::new();
    if !params_synced {
        for (name, value) in wanted.iter() {
            if params.get(name) != Some(value) {
                sql.push_str(&format!("SET {name} = {};", quote_literal(value)));
            }
        }
    }
    if !same(have, want) {
        let settings = sync_sql(have, want);
        if !settings.is_empty() {
            sql.insert_str(0, GUARD);
            sql.push_str(&settings);
        }
    }
    sql
}

/// What `on_the_way` found to write in front of a client's request.
#[derive(Debug)]
pub enum Way {
    /// The server holds the client's state already.
    Nothing,
    /// These messages put it there.
    Ahead(bytes::BytesMut),
    /// Only a query of its own, apart, can: the client's encoding changes (what follows
    /// would be read in the last client's), a value is not ASCII and the server's encoding
    /// not UTF-8, or a name is one a statement cannot spell exactly.
    Apart,
}

/// The Queries to write in front of a client's request, in the same write, that put the
/// server into the client's state (as `state_sql`, whose arguments it takes): the request
/// does not wait a round trip for them. `BEGIN` goes alone first, then the rest ending
/// in `COMMIT`: should any of the rest fail, even to parse, PostgreSQL leaves the block
/// open and aborted, and refuses what follows (25P02) instead of running the client's
/// request in the wrong state. So the request behind must not begin with a statement
/// that ends a block (COMMIT, ROLLBACK, ...), and nothing after its first Query or Sync
/// may follow in the write: a plain request (sql::pipeline) is one such, and so is one
/// led by BEGIN or made of SETs (client::on_the_way). Settings are
/// made by SET where that says the same as set_config() (`set_statement`), and no guard
/// comes first: this is only written where no timeout under a second is in force
/// (`leaves_time`), and it runs in microseconds.
pub fn on_the_way(
    params: &ParamSet,
    params_synced: bool,
    wanted: &ParamSet,
    have: Option<&Arc<Gucs>>,
    want: Option<&Arc<Gucs>>,
) -> Way {
    let mut pairs: Vec<(&str, &str)> = Vec::new();
    if !params_synced {
        for (name, value) in wanted.iter() {
            if params.get(name) != Some(value) {
                if name.eq_ignore_ascii_case("client_encoding") {
                    return Way::Apart;
                }
                pairs.push((name, value));
            }
        }
    }
    let empty = Gucs::default();
    let (have, want) = (have.map_or(&empty, |g| g), want.map_or(&empty, |g| g));
    if have.names().chain(want.names()).any(|n| !spellable(n)) {
        return Way::Apart;
    }
    let (resets, gucs) = apply_parts(have, want);
    pairs.extend(gucs);
    if pairs.is_empty() && resets.is_empty() {
        return Way::Nothing;
    }
    // SETs where they say the same as set_config(), the rest in one SELECT; the role's
    // last, after all of them.
    let mut sql = resets;
    let mut calls = Vec::new();
    let mut role = None;
    for (name, value) in pairs {
        match set_statement(name, value) {
            Some(set) if name == "role" => role = Some(set),
            Some(set) => sql.push_str(&set),
            None => calls.push(set_config(name, value)),
        }
    }
    if !calls.is_empty() {
        sql.push_str(&format!("SELECT {};", calls.join(", ")));
    }
    sql.extend(role);
    sql.push_str("COMMIT");
    let utf8 = params
        .get("client_encoding")
        .is_some_and(|e| e.eq_ignore_ascii_case("UTF8"));
    if !sql.is_ascii() && !utf8 {
        return Way::Apart;
    }
    let mut out = bytes::BytesMut::with_capacity(sql.len() + 16);
    crate::protocol::messages::query(&mut out, "BEGIN");
    crate::protocol::messages::query(&mut out, &sql);
    Way::Ahead(out)
}

/// A setting's name as a statement can spell it: dot-separated parts, none empty, none
/// over 63 bytes (the scanner would cut it, and RESET another setting).
fn spellable(name: &str) -> bool {
    name.split('.').all(|p| !p.is_empty() && p.len() <= 63)
}

/// Whether the server's settings leave Weir's statements written on the way (`on_the_way`)
/// time to run: a timeout under a second that cuts statements or transactions could end
/// them, and the client's request with them; Weir's own queries are then run apart,
/// where a cut one is run again (server::ServerConn::query_rows).
pub fn leaves_time(have: Option<&Arc<Gucs>>) -> bool {
    let Some(g) = have else {
        return true;
    };
    ["statement_timeout", "transaction_timeout"]
        .iter()
        .filter_map(|n| g.get(n))
        .all(|v| !short_timeout(v))
}

/// A time setting's value (as current_setting shows it: `250ms`, `5s`, `1min`, `0`)
/// under a second and not zero; anything unreadable is taken for short.
fn short_timeout(value: &str) -> bool {
    let value = value.trim();
    let digits = value.bytes().take_while(u8::is_ascii_digit).count();
    let Ok(n) = value[..digits].parse::<u64>() else {
        return true;
    };
    let ms = match value[digits..].trim() {
        "" | "ms" => n,
        "us" => n / 1000,
        "s" => n.saturating_mul(1000),
        "min" => n.saturating_mul(60_000),
        "h" => n.saturating_mul(3_600_000),
        "d" => n.saturating_mul(86_400_000),
        _ => return true,
    };
    n != 0 && ms < 1000
}

/// A setting's name for RESET: each dot-separated part quoted, as names come folded.
fn quote_ident(name: &str) -> String {
    name.split('.')
        .map(|p| format!("\"{}\"", p.replace('"', "\"\"")))
        .collect::<Vec<_>>()
        .join(".")
}

/// Whether two servers' (or a client's and a server's) settings agree.
pub fn same(a: Option<&Arc<Gucs>>, b: Option<&Arc<Gucs>>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
        _ => false,
    }
}

/// The SQL that makes a server's settings the client's.
pub fn sync_sql(server: Option<&Arc<Gucs>>, client: Option<&Arc<Gucs>>) -> String {
    let empty = Gucs::default();
    apply(server.map_or(&empty, |g| g), client.map_or(&empty, |g| g))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gucs(pairs: &[(&str, &str)]) -> Gucs {
        let mut g = Gucs::default();
        for (k, v) in pairs {
            g.put(k, Some(v));
        }
        g
    }

    #[test]
    fn role_sorts_last_and_unset_values_go() {
        let mut g = gucs(&[("role", "bob"), ("work_mem", "8MB"), ("a.b", "1")]);
        assert_eq!(
            g.names().collect::<Vec<_>>(),
            vec!["a.b", "work_mem", "role"]
        );
        g.put("role", Some("none"));
        g.put("a.b", Some(""));
        g.put("search_path", None);
        assert_eq!(g.names().collect::<Vec<_>>(), vec!["work_mem"]);
    }

    #[test]
    fn apply_resets_what_the_next_client_lacks() {
        let have = gucs(&[("search_path", "a"), ("my.x", "1")]);
        let want = gucs(&[("search_path", "b, \"C\"")]);
        assert_eq!(
            apply(&have, &want),
            "RESET \"my\".\"x\";\
             SELECT pg_catalog.set_config('search_path', 'b, \"C\"', false);"
        );
        assert_eq!(apply(&want, &want), "");
        assert_eq!(apply(&want, &Gucs::default()), "RESET \"search_path\";");
    }

    #[test]
    fn role_is_reset_first_and_set_last() {
        let have = gucs(&[("role", "bob")]);
        let want = gucs(&[("role", "bob"), ("work_mem", "8MB")]);
        assert_eq!(
            apply(&have, &want),
            "RESET role;SELECT pg_catalog.set_config('work_mem', '8MB', false), \
             pg_catalog.set_config('role', 'bob', false);"
        );
    }

    #[test]
    fn options_as_pgoptions_gives_them() {
        let pair = |n: &str, v: &str| (n.to_owned(), v.to_owned());
        assert_eq!(
            from_options("-c geqo=off --statement-timeout=5s -csearch_path=a\\,\\ b"),
            Some(vec![
                pair("geqo", "off"),
                pair("statement_timeout", "5s"),
                pair("search_path", "a, b")
            ])
        );
        assert_eq!(from_options("  "), Some(vec![]));
        assert_eq!(from_options("-e"), None);
        assert_eq!(from_options("-c novalue"), None);
    }

    #[test]
    fn short_timeouts_keep_the_state_off_the_way() {
        for short in ["1ms", "999ms", "1", "500us", "x", "1.5s"] {
            assert!(short_timeout(short), "{short}");
        }
        for long in ["0", "1s", "1000", "2min", "1h", "0ms"] {
            assert!(!short_timeout(long), "{long}");
        }
        let g = Arc::new(gucs(&[("statement_timeout", "20ms"), ("search_path", "a")]));
        assert!(!leaves_time(Some(&g)));
        let g = Arc::new(gucs(&[("statement_timeout", "30s")]));
        assert!(leaves_time(Some(&g)));
        assert!(leaves_time(None));
    }

    #[test]
    fn state_goes_in_a_block_of_its_own() {
        let want = Arc::new(gucs(&[("search_path", "t1")]));
        let mut wanted = ParamSet::default();
        wanted.set("application_name", "a1");
        let sql = state_sql(&ParamSet::default(), false, &wanted, None, Some(&want));
        assert_eq!(
            sql,
            format!(
                "{GUARD}SET application_name = 'a1';\
                 SELECT pg_catalog.set_config('search_path', 't1', false);"
            )
        );
        assert_eq!(
            state_sql(&wanted, true, &wanted, Some(&want), Some(&want)),
            ""
        );
        let Way::Ahead(msg) = on_the_way(&ParamSet::default(), false, &wanted, None, Some(&want))
        else {
            panic!("something to do");
        };
        assert_eq!(&msg[..11], b"Q\0\0\0\x0aBEGIN\0");
        let rest = &msg[11..];
        assert_eq!(rest[0], b'Q');
        let text = std::str::from_utf8(&rest[5..rest.len() - 1]).unwrap();
        assert_eq!(
            text,
            "SET \"application_name\" TO 'a1';SET \"search_path\" TO \"t1\";COMMIT"
        );
        assert!(matches!(
            on_the_way(&wanted, true, &wanted, Some(&want), Some(&want)),
            Way::Nothing
        ));
        // What cannot be written in front of the request goes apart.
        let mut latin = ParamSet::default();
        latin.set("client_encoding", "LATIN1");
        let mut utf8_client = wanted.clone();
        utf8_client.set("client_encoding", "UTF8");
        assert!(matches!(
            on_the_way(&latin, false, &utf8_client, None, Some(&want)),
            Way::Apart
        ));
        let mut accented = wanted.clone();
        accented.set("application_name", "Ángel");
        latin.set("application_name", "x");
        let mut utf8_latin = latin.clone();
        utf8_latin.set("client_encoding", "UTF8");
        accented.set("client_encoding", "UTF8");
        assert!(matches!(
            on_the_way(&utf8_latin, false, &accented, None, None),
            Way::Ahead(_)
        ));
        let odd = Arc::new(gucs(&[("a..b", "1")]));
        assert!(matches!(
            on_the_way(&wanted, true, &wanted, Some(&odd), None),
            Way::Apart
        ));
    }

    #[test]
    fn pins_as_bits() {
        let bits = pin_bits("advisory lock,LISTEN");
        assert_eq!(bits, 0b1001);
        assert_eq!(pin_text(bits), "advisory lock,LISTEN");
        assert_eq!(pin_bits(""), 0);
    }

    #[test]
    fn read_back_asks_by_name_or_whole() {
        assert_eq!(
            read_back(&["search_path"], false, false),
            "SELECT n, pg_catalog.current_setting(n, true) FROM \
             pg_catalog.unnest(ARRAY['search_path']::pg_catalog.text[]) n"
        );
        // A name a session may not be able to set is asked of pg_settings, guarded.
        let q = read_back(&["search_path", "max_connections"], false, false);
        assert!(q.starts_with(GUARD), "{q}");
        assert!(q.contains("ARRAY['max_connections']"), "{q}");
        assert!(q.contains("ARRAY['search_path']"), "{q}");
        // A guarded setting is read before the guard.
        assert_eq!(
            read_back(&["statement_timeout"], false, false),
            "SELECT n, pg_catalog.current_setting(n, true) FROM \
             pg_catalog.unnest(ARRAY['statement_timeout']::pg_catalog.text[]) n;"
        );
        let q = read_back(&["search_path", "my.x"], true, true);
        let guard = q.find(GUARD).expect("guarded");
        assert!(q[..guard].contains("SET LOCAL statement_timeout TO DEFAULT"));
        assert!(q[guard..].contains("NOT IN ("));
        assert!(q.contains("source = 'session'"));
        assert!(q.contains("ARRAY['my.x']"));
        assert!(!q.contains("'search_path'"));
        assert!(q.contains("pg_listening_channels"));
    }
}

//! PostgreSQL must never log an error Weir caused (issue 26). Clients run the same
//! sequences through Weir (transaction mode, several clients on two servers) and directly,
//! and PostgreSQL's own log is read: every ERROR it logged for a client through Weir
//! (SQLSTATE and message, told apart by the log line's user and application_name) must
//! be one it logged for the same sequence run directly. Weir may log fewer (it answers
//! some errors itself where no transaction must fail); never another. Each client must
//! also get exactly the replies the direct one got.
//!
//! The sequences: statement names already taken (protocol Parse and SQL PREPARE, in and
//! out of blocks, failed blocks), names like Weir's own (`weir_<n>`, which its servers
//! hold) prepared, bound, described, executed and deallocated by clients that never
//! prepared them, DEALLOCATE of statements the client's server lacks (also after DDL made
//! their text invalid), DEALLOCATE ALL and DISCARD ALL, and random seeded sequences of all
//! of it (WEIR_ERR_SEED=n picks the seed; WEIR_ERR_CLIENTS the number of clients).

mod common;

use std::collections::HashMap;

use common::proto::*;
use common::rng::Rng;
use common::*;

/// The user direct clients log in as; through Weir it is `postgres`.
const DIRECT: &str = "direct";

fn close(name: &str) -> Vec<u8> {
    let mut b = vec![b'S'];
    b.extend_from_slice(name.as_bytes());
    b.push(0);
    msg(b'C', &b)
}

/// A batch of messages sent at once; its replies are read up to one ReadyForQuery per
/// Sync and Query in it.
type Step = Vec<Vec<u8>>;

/// What a client sees of a reply, comparable across connections: errors by SQLSTATE and
/// message, rows by value.
fn describe_reply(m: &Msg) -> Option<String> {
    match m.tag {
        b'E' => {
            let e = parse_error(&m.body);
            Some(format!("E {} {}", e.code, e.message))
        }
        b'D' => Some(format!("D {:?}", data_row(&m.body))),
        b'C' | b'Z' => Some(format!(
            "{} {}",
            m.tag_char(),
            String::from_utf8_lossy(&m.body)
        )),
        b'N' | b'S' => None,
        _ => Some(format!("{} {:?}", m.tag_char(), m.body)),
    }
}

fn run(conn: &mut RawConn, steps: &[Step]) -> Vec<String> {
    let mut seen = Vec::new();
    for step in steps {
        conn.send(&step.concat());
        let mut readies = step.iter().filter(|m| matches!(m[0], b'S' | b'Q')).count();
        while readies > 0 {
            let m = conn.read_message_or_panic("a reply");
            if m.tag == b'Z' {
                readies -= 1;
            }
            seen.extend(describe_reply(&m));
        }
    }
    seen
}

fn script_text(steps: &[Step]) -> String {
    let mut out = String::new();
    for s in steps {
        out.push_str("\n  ");
        for m in s {
            let body = String::from_utf8_lossy(&m[5..m.len().min(48)]).replace('\0', "/");
            out.push_str(&format!("{}({}) ", m[0] as char, body));
        }
    }
    out
}

/// Each case that once put an error of Weir's making in PostgreSQL's log. `sfx` keeps
/// each client's table its own.
fn fixed_script(sfx: &str) -> Vec<Step> {
    let q = |s: &str| vec![query(s)];
    let in_block = |msgs: Step| vec![q("begin"), msgs, q("rollback")];
    let in_failed_block = |msgs: Step| {
        vec![
            vec![query("begin"), query("select 1/0")],
            msgs,
            q("rollback"),
        ]
    };
    let bind_run = |name: &str| vec![bind("", name, &[]), execute("", 0), sync()];
    let mut s = vec![
        // Statements enough that Weir's servers hold weir_1 to weir_6 (Weir numbers
        // statements from 1 as it first sees their texts).
        (1..=6)
            .map(|i| parse(&format!("s{i}"), &format!("select {i} as warm")))
            .chain([sync()])
            .collect(),
        vec![
            parse("x", "select 'x'"),
            parse("weir_1", "select 'mine'"),
            sync(),
        ],
        q("prepare q as select 'q'"),
    ];
    // (a) A taken name, and names like Weir's own, in a block, in a failed one, and out
    // of one after an Execute of the same batch (what that ran must roll back).
    for name in ["x", "weir_1"] {
        s.extend(in_block(vec![parse(name, "select 'again'"), sync()]));
        s.extend(in_block(vec![
            parse(name, "select 'again'"),
            bind("", name, &[]),
            execute("", 0),
            sync(),
        ]));
        s.extend(in_failed_block(vec![parse(name, "select 'again'"), sync()]));
        s.extend(in_block(vec![parse(name, "selec 'syntax'"), sync()]));
        s.push(vec![
            parse("", "select 'ran first'"),
            bind("", "", &[]),
            execute("", 0),
            parse(name, "select 'again'"),
            sync(),
        ]);
    }
    for name in ["weir_3", "weir_4", "weir_99"] {
        s.extend(in_block(bind_run(name)));
        s.extend(in_block(vec![describe(b'S', name), sync()]));
        s.extend(in_failed_block(bind_run(name)));
        s.extend(in_failed_block(vec![describe(b'S', name), sync()]));
        s.extend(in_block(q(&format!("execute {name}"))));
        s.extend(in_block(q(&format!("deallocate {name}"))));
        s.extend(in_failed_block(q(&format!("execute {name}"))));
        s.extend(in_failed_block(q(&format!("deallocate {name}"))));
        s.push(vec![
            parse("", "select 'ran first'"),
            bind("", "", &[]),
            execute("", 0),
            bind("", name, &[]),
            execute("", 0),
            sync(),
        ]);
    }
    // (b) SQL PREPARE of a name taken: by SQL PREPARE, by a protocol Parse, by a name like
    // Weir's own; in a failed block; with a syntax error; out of a block.
    for name in ["q", "x", "weir_1"] {
        let again = format!("prepare {name} as select 'again'");
        s.extend(in_block(q(&again)));
        s.extend(in_block(vec![query(&again), query("select 'after'")]));
        s.extend(in_failed_block(q(&again)));
        s.extend(in_block(q(&format!("prepare {name} as selec 'syntax'"))));
        s.push(q(&again));
        s.extend(in_block(q(&format!(
            "PREPARE {name} (int) AS select $1 -- a comment"
        ))));
    }
    // A Bind of SQL PREPARE's statement in a failed block, on a server that may lack it.
    s.extend(in_failed_block(vec![
        bind("", "q", &[]),
        execute("", 0),
        sync(),
    ]));
    // Each name still means its first statement.
    s.push(bind_run("x"));
    s.push(bind_run("weir_1"));
    s.push(q("execute q"));
    s.push(q("execute x"));
    // DEALLOCATE of statements the server may lack, one after DDL made its text invalid:
    // PostgreSQL drops it without looking at the text.
    s.push(q(&format!("create table dd_{sfx} (a int)")));
    s.push(vec![
        parse("dd", &format!("select a from dd_{sfx}")),
        sync(),
    ]);
    s.push(q(&format!("prepare qdd as select a from dd_{sfx}")));
    s.push(
        (10..16)
            .map(|i| parse(&format!("e{i}"), &format!("select {i} as evicting")))
            .chain([sync()])
            .collect(),
    );
    s.push(q(&format!("drop table dd_{sfx}")));
    // EXECUTE of SQL PREPARE's statement after the DDL: the text's own error.
    s.push(q("execute qdd"));
    s.extend(in_block(q("execute qdd")));
    s.push(q("deallocate dd"));
    s.push(q("deallocate qdd"));
    // A statement of SQL PREPARE whose text ends in a comment, run where it is missing.
    s.push(q("prepare qc (int) as select $1 -- a comment"));
    s.push(
        (20..26)
            .map(|i| parse(&format!("e{i}"), &format!("select {i} as evicting")))
            .chain([sync()])
            .collect(),
    );
    s.push(q("execute qc (3)"));
    s.extend(in_block(q("deallocate s2")));
    s.extend(in_failed_block(q("deallocate s3")));
    // DEALLOCATE ALL and DISCARD ALL in and out of blocks.
    s.extend(in_block(vec![query("deallocate all"), query("execute q")]));
    s.extend(in_block(q("discard all")));
    s.push(q("execute q"));
    s.push(q("deallocate all"));
    s.push(q("execute q"));
    s.push(bind_run("x"));
    s
}

fn pick<'a>(r: &mut Rng, from: &[&'a str]) -> &'a str {
    from[r.below(from.len() as u64) as usize]
}

/// A random client's sequence. Protocol messages name only statements no SQL PREPARE
/// made (a Bind of one that its server lacks, in the middle of a batch, is a known limit:
/// rewrite::ensure_any); SQL PREPARE of a protocol name always finds it taken.
fn random_script(seed: u64) -> Vec<Step> {
    let mut r = Rng::new(seed);
    let protocol = ["a", "b", "weir_1", "weir_2"];
    let missing = ["weir_3", "weir_5", "weir_8"];
    let sql = ["qa", "qb", "weir_4"];
    let texts = [
        "select $1::int as n",
        "select $1::text || 'x' as x",
        "select 1 / ($1::int - 21) as d",
        "select from from $1",
    ];
    let mut steps: Vec<Step> = Vec::new();
    let mut batch: Step = Vec::new();
    fn close_batch(steps: &mut Vec<Step>, batch: &mut Step) {
        if batch.last().is_some_and(|m| m[0] != b'Q' && m[0] != b'S') {
            batch.push(sync());
        }
        if !batch.is_empty() {
            steps.push(std::mem::take(batch));
        }
    }
    for _ in 0..60 {
        for _ in 0..1 + r.below(3) {
            let arg = if r.chance(30) { "21" } else { "5" };
            match r.below(20) {
                0..=2 => batch.push(parse(pick(&mut r, &protocol), pick(&mut r, &texts))),
                3..=5 => {
                    batch.push(bind("", pick(&mut r, &protocol), &[Some(arg)]));
                    batch.push(execute("", 0));
                }
                6 => batch.push(describe(b'S', pick(&mut r, &protocol))),
                7 => batch.push(close(pick(&mut r, &protocol))),
                8 => batch.push(sync()),
                9 => {
                    batch.push(parse("", pick(&mut r, &texts)));
                    batch.push(bind("", "", &[Some(arg)]));
                    batch.push(execute("", 0));
                }
                10 => {
                    let name = pick(&mut r, &missing);
                    if r.chance(50) {
                        batch.push(bind("", name, &[Some(arg)]));
                        batch.push(execute("", 0));
                    } else {
                        batch.push(describe(b'S', name));
                    }
                }
                11 | 12 => {
                    close_batch(&mut steps, &mut batch);
                    let sql = pick(
                        &mut r,
                        &["begin", "begin", "commit", "rollback", "select 1/0"],
                    );
                    batch.push(query(sql));
                }
                13 => {
                    // A protocol name taken, then SQL PREPARE of it.
                    close_batch(&mut steps, &mut batch);
                    let name = pick(&mut r, &protocol);
                    steps.push(vec![parse(name, texts[0]), sync()]);
                    batch.push(query(&format!("prepare {name} as select 'sql'")));
                }
                14 => {
                    // Session state, synced onto each server and read back after.
                    close_batch(&mut steps, &mut batch);
                    let set = pick(
                        &mut r,
                        &[
                            "set statement_timeout = '10s'",
                            "set search_path = public, pg_catalog",
                            "set myapp.x = 'v'",
                            "select pg_catalog.set_config('myapp.y', 'w', false)",
                            "reset all",
                            "reset statement_timeout",
                        ],
                    );
                    batch.push(query(set));
                }
                _ => {
                    close_batch(&mut steps, &mut batch);
                    let all: Vec<&str> = protocol
                        .iter()
                        .chain(&missing)
                        .chain(&sql)
                        .copied()
                        .collect();
                    let text = match r.below(9) {
                        0 | 1 => format!("prepare {} (int) as select $1 + 1", pick(&mut r, &sql)),
                        2 | 3 => format!("execute {} ({arg})", pick(&mut r, &sql)),
                        4 => format!("execute {} ({arg})", pick(&mut r, &all)),
                        5 | 6 => format!("deallocate {}", pick(&mut r, &all)),
                        7 => "deallocate all".to_string(),
                        _ => "discard all".to_string(),
                    };
                    batch.push(query(&text));
                }
            }
        }
        close_batch(&mut steps, &mut batch);
    }
    steps.push(vec![query("rollback")]);
    steps
}

/// ERROR lines by (user, application_name): "SQLSTATE message", in log order.
fn logged_errors(log: &str) -> HashMap<(String, String), Vec<String>> {
    let mut found: HashMap<(String, String), Vec<String>> = HashMap::new();
    for line in log.lines() {
        let Some((prefix, message)) = line.split_once(" ERROR:  ") else {
            continue;
        };
        let Some(tagged) = prefix.split_once('<').and_then(|(_, t)| t.split_once('>')) else {
            continue;
        };
        let mut parts = tagged.0.split('|');
        let (user, app, code) = (
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
        );
        // The position PostgreSQL adds is in the text it ran: Weir prepares the client's
        // SQL PREPARE under its own name, which moves it.
        let message = match message.rsplit_once(" at character ") {
            Some((m, at)) if at.bytes().all(|b| b.is_ascii_digit()) => m,
            _ => message,
        };
        found
            .entry((user.to_string(), app.to_string()))
            .or_default()
            .push(format!("{code} {message}"));
    }
    found
}

/// PostgreSQL with the SQLSTATE, user and application_name in each log line's prefix.
fn postgres() -> PgServer {
    let pg = PgServer::start();
    pg.exec(&format!("create role {DIRECT} superuser login"));
    pg.exec("alter system set log_line_prefix = '%m [%p] <%u|%a|%e> '");
    pg.reload();
    pg
}

/// Runs each client's script directly (one after another) and through Weir (all at
/// once, `app` naming each client), and checks replies and the log.
fn same_as_direct(pg: &PgServer, weir: &Weir, what: &str, scripts: &[(String, Vec<Step>)]) {
    fresh_log(pg);
    let direct: Vec<Vec<String>> = scripts
        .iter()
        .map(|(app, steps)| {
            let mut c =
                RawConn::startup(pg.port(), DIRECT, "postgres", &[("application_name", app)])
                    .unwrap();
            run(&mut c, steps)
        })
        .collect();
    let port = weir.port();
    let through: Vec<Vec<String>> = std::thread::scope(|s| {
        let running: Vec<_> = scripts
            .iter()
            .map(|(app, steps)| {
                s.spawn(move || {
                    let mut c = RawConn::startup(
                        port,
                        "postgres",
                        "postgres",
                        &[("application_name", app)],
                    )
                    .unwrap();
                    run(&mut c, steps)
                })
            })
            .collect();
        running.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for (((app, steps), want), got) in scripts.iter().zip(&direct).zip(&through) {
        if got != want {
            let at = got.iter().zip(want).take_while(|(g, w)| g == w).count();
            panic!(
                "{what} {app}: replies differ from a direct connection's at reply {at}: {:?} \
                 instead of {:?}\nbefore: {:?}\nscript: {}",
                got.get(at),
                want.get(at),
                &want[at.saturating_sub(12)..at],
                script_text(steps)
            );
        }
    }
    let apps: Vec<&str> = scripts.iter().map(|(app, _)| app.as_str()).collect();
    no_errors_of_weirs(pg, what, &apps);
}

/// Empties PostgreSQL's log, so that what is read later is from here on (PostgreSQL
/// appends to it).
fn fresh_log(pg: &PgServer) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(pg.log_path())
        .and_then(|f| f.set_len(0))
        .expect("truncating PostgreSQL's log");
}

/// Every ERROR PostgreSQL logged for the clients `apps` through Weir (user postgres) was
/// logged for their direct twins (user DIRECT, the same application_name), as many times.
fn no_errors_of_weirs(pg: &PgServer, what: &str, apps: &[&str]) {
    // PostgreSQL writes its log as it goes; the last client's lines are in by the time
    // its last reply is read, but give a slow disk a moment.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let log = pg.log();
    let errors = logged_errors(&log);
    let from = |user: &str, app: &str| -> Vec<String> {
        let key = (user.to_string(), app.to_string());
        errors.get(&key).cloned().unwrap_or_default()
    };
    // Each client's lines are matched to its direct twin's. A client's error raised in a
    // block after its RESET ALL is logged with the server's own (empty) application_name:
    // those are matched to what the direct twins left unmatched.
    let mut unmatched = Vec::new();
    let mut left_over = Vec::new();
    for &app in apps {
        let mut direct = from(DIRECT, app);
        for line in from("postgres", app) {
            match direct.iter().position(|d| *d == line) {
                Some(i) => drop(direct.swap_remove(i)),
                None => unmatched.push(format!("{app}: {line}")),
            }
        }
        left_over.extend(direct);
    }
    for line in from("postgres", "[unknown]") {
        match left_over.iter().position(|d| *d == line) {
            Some(i) => drop(left_over.swap_remove(i)),
            None => unmatched.push(format!("[unknown]: {line}")),
        }
    }
    let others = errors
        .iter()
        .filter(|((user, app), _)| {
            user == "postgres" && app != "[unknown]" && !apps.contains(&app.as_str())
        })
        .flat_map(|((_, app), lines)| lines.iter().map(move |l| format!("{app}: {l}")));
    let weirs_only: Vec<String> = unmatched.into_iter().chain(others).collect();
    assert!(
        weirs_only.is_empty(),
        "{what}: PostgreSQL logged errors through Weir that the same clients do not cause \
         directly:\n{}\n--- log\n{}",
        weirs_only.join("\n"),
        tail(&log, 200)
    );
}

fn weir(pg: &PgServer, cap: u32) -> Weir {
    Weir::for_pg(pg)
        .set("pool_mode", "transaction")
        .set("default_pool_size", 2)
        .set("max_prepared_statements", cap)
        .start()
}

/// No statement is left on a server under a client's name: each of the two servers is
/// held in a block by one client while it looks.
fn no_client_names_left(weir: &Weir) {
    let mut held: Vec<RawConn> = (0..2)
        .map(|_| RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap())
        .collect();
    for c in &mut held {
        c.simple_query("begin").unwrap();
    }
    for c in &mut held {
        let left = c
            .simple_query("select name from pg_prepared_statements where name !~ '^weir_[0-9]+$'")
            .unwrap();
        assert!(left.is_empty(), "{left:?}");
        c.simple_query("commit").unwrap();
    }
}

/// The cases one by one, on Weir with a cache large enough and with one of two
/// statements (servers then lack most statements a client has).
#[test]
fn fixed_cases_log_only_what_a_direct_connection_logs() {
    let pg = postgres();
    for cap in [200, 2] {
        let weir = weir(&pg, cap);
        let scripts: Vec<(String, Vec<Step>)> = (0..2)
            .map(|i| {
                (
                    format!("fixed{cap}_{i}"),
                    fixed_script(&format!("{cap}_{i}")),
                )
            })
            .collect();
        same_as_direct(&pg, &weir, &format!("cap {cap}"), &scripts);
        no_client_names_left(&weir);
    }
}

/// Random sequences on several clients sharing two servers.
#[test]
fn random_sequences_log_only_what_a_direct_connection_logs() {
    let seed: u64 = std::env::var("WEIR_ERR_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(26);
    let clients: u64 = std::env::var("WEIR_ERR_CLIENTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let pg = postgres();
    for cap in [200, 3] {
        let weir = weir(&pg, cap);
        let scripts: Vec<(String, Vec<Step>)> = (0..clients)
            .map(|i| (format!("r{cap}_{i}"), random_script(seed * 1000 + i)))
            .collect();
        same_as_direct(&pg, &weir, &format!("seed {seed}, cap {cap}"), &scripts);
        no_client_names_left(&weir);
    }
}

/// psycopg 3 and asyncpg at their defaults (tests/drivers/python/weir_errors.py), four
/// clients of each at once through Weir on two servers, and directly: each client gets
/// the same errors, and PostgreSQL logs for it only what it logs for the direct one.
#[test]
fn psycopg_and_asyncpg_log_only_what_they_log_directly() {
    let pg = postgres();
    let weir = weir(&pg, 200);
    fresh_log(&pg);
    let drivers = std::env::var_os("WEIR_DRIVERS_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(std::env::var("HOME").expect("HOME"))
                .join(".cache/weir-drivers")
        });
    let python = drivers.join("venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/install-drivers (scripts/test does)",
        python.display()
    );
    let program = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/drivers/python/weir_errors.py");
    let clients = 4;
    let run = |port: u16, user: &str| -> String {
        let mut cmd = clean_command(&python);
        cmd.arg(&program)
            .env("WEIR_HOST", "127.0.0.1")
            .env("WEIR_PORT", port.to_string())
            .env("WEIR_DB", "postgres")
            .env("WEIR_USER", user)
            .env("WEIR_CLIENTS", clients.to_string())
            .env("WEIR_APP_PREFIX", "py-");
        let out = run_with_timeout(&mut cmd, None, std::time::Duration::from_secs(120));
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "weir_errors.py as {user} on {port}: {:?}\n{stdout}\n{}\n--- weir\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            weir.log_tail()
        );
        stdout
    };
    let direct = run(pg.port(), DIRECT);
    let through = run(weir.port(), "postgres");
    assert_eq!(
        through, direct,
        "what the clients got through Weir and directly"
    );
    assert!(
        direct.contains("42P05") && direct.contains("26000"),
        "{direct}"
    );
    let apps: Vec<String> = (0..clients)
        .flat_map(|i| [format!("py-psycopg{i}"), format!("py-asyncpg{i}")])
        .collect();
    let apps: Vec<&str> = apps.iter().map(String::as_str).collect();
    no_errors_of_weirs(&pg, "psycopg and asyncpg", &apps);
}

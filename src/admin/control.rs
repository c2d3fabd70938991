//! The console's control commands (PAUSE, RESUME, SUSPEND, KILL, KILL_CLIENT, RECONNECT,
//! DISABLE, ENABLE, WAIT_CLOSE, RELOAD, SET, SHUTDOWN) and the state they leave behind,
//! which the data path consults through small hooks:
//!
//! * the pause/suspend/disable state lives in `pool::gates` (a checkout waits on it there);
//! * [`login_refusal`] at login: a disabled database (or a pooler shutting down
//!   gracefully) takes no new client;
//! * each client's kill token (`ClientInfo::kill`), which its session task selects on.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::app::{App, Snapshot};
pub use crate::pool::gates::{
    close_needed, is_disabled, is_paused, mode, shutdown_mode, shutdown_now_requested,
    shutdown_requested, Mode, ShutdownMode,
};
use crate::pool::gates::{state, sync_gates, wake_resumed, SHUTDOWN};
use crate::pool::Pool;
use crate::registry::clients::{KillReason, CLIENTS};
use crate::registry::servers::SERVERS;

// ---- the commands ----

/// The database entry a command names: configured, already pooled, or reachable through
/// the `*` fallback (as PgBouncer's find_or_register_database).
fn known_database(app: &App, name: &str) -> bool {
    app.snapshot.load().resolve_database(name).is_some()
        || app.all_pools().iter().any(|p| p.database == name)
}

/// Checks a command's database argument as PgBouncer does: a name it cannot find, or the
/// console's own database (which `what` cannot act on), is an error.
fn target(app: &App, arg: &str, what: &str) -> Result<(), String> {
    if crate::client::login::is_admin_database(&app.snapshot.load(), arg) {
        return Err(format!("cannot {what} admin db: {arg}"));
    }
    if !known_database(app, arg) {
        return Err(format!("no such database: {arg}"));
    }
    Ok(())
}

fn pools_of(app: &App, db: Option<&str>) -> Vec<Arc<Pool>> {
    app.all_pools_with_readers()
        .into_iter()
        .filter(|p| db.is_none_or(|d| p.database == d))
        .collect()
}

/// Server generations handed out by the console: the top bit keeps them apart from the
/// ones App hands out on reload.
static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1 << 63);

/// Makes every server of the pool close as soon as it is released (idle ones now), while
/// new connections may be opened at once: RECONNECT's mechanism, also used by PAUSE and KILL.
fn retire_servers(pool: &Pool) {
    let mut settings = (**pool.settings()).clone();
    settings.target.generation = NEXT_GENERATION.fetch_add(1, Ordering::Relaxed);
    pool.update_settings(settings);
}

/// Server ids of the pools' servers, by matching the registry to each pool's target.
pub fn servers_of(pools: &[Arc<Pool>]) -> HashSet<u64> {
    let targets: Vec<_> = pools
        .iter()
        .map(|p| {
            let s = p.settings();
            (
                s.target.addr.clone(),
                s.target.user.clone(),
                s.target.database.clone(),
            )
        })
        .collect();
    SERVERS
        .snapshot()
        .into_iter()
        .filter(|s| {
            targets
                .iter()
                .any(|(a, u, d)| *a == s.addr && *u == s.user && *d == s.database)
        })
        .map(|s| s.id)
        .collect()
}

fn busy_servers(pools: &[Arc<Pool>]) -> usize {
    pools
        .iter()
        .map(|p| {
            let c = p.counts();
            c.active + c.idle + c.connecting
        })
        .sum()
}

/// Polls until `done` holds; PAUSE and WAIT_CLOSE answer only then, as in PgBouncer.
async fn wait_until(mut done: impl FnMut() -> bool) {
    while !done() {
        crate::timers::sleep(Duration::from_millis(20)).await;
    }
}

pub async fn pause(app: &App, arg: &str) -> Result<&'static str, String> {
    if state().mode != Mode::Running {
        return Err("already suspended/paused".into());
    }
    if arg.is_empty() {
        tracing::info!("PAUSE command issued");
        enter_pause(app);
        release_paused_servers(app).await;
        return Ok("PAUSE");
    }
    tracing::info!("PAUSE '{arg}' command issued");
    target(app, arg, "pause")?;
    state().paused.insert(arg.to_owned());
    sync_gates();
    let pools = pools_of(app, Some(arg));
    for p in &pools {
        retire_servers(p);
    }
    wait_until(|| {
        let pools = pools_of(app, Some(arg));
        for p in &pools {
            retire_idle(p);
        }
        busy_servers(&pools) == 0 || !is_paused(arg)
    })
    .await;
    Ok("PAUSE")
}

fn enter_pause(app: &App) {
    state().mode = Mode::Paused;
    sync_gates();
    for p in &pools_of(app, None) {
        retire_servers(p);
    }
}

/// A global PAUSE's second half: servers close as their transactions end, until none is
/// left or the pause is lifted.
async fn release_paused_servers(app: &App) {
    wait_until(|| {
        for p in &pools_of(app, None) {
            retire_idle(p);
        }
        busy_servers(&pools_of(app, None)) == 0 || state().mode != Mode::Paused
    })
    .await;
}

/// SIGUSR1, as in PgBouncer: a global PAUSE that nobody waits on.
pub fn pause_signal(app: &Arc<App>) {
    if state().mode != Mode::Running {
        tracing::info!("got SIGUSR1, but already paused/suspended");
        return;
    }
    tracing::info!("got SIGUSR1, pausing all activity");
    enter_pause(app);
    let app = app.clone();
    tokio::spawn(async move { release_paused_servers(&app).await });
}

/// SIGUSR2, as in PgBouncer: a global RESUME, from PAUSE or SUSPEND (databases paused
/// one by one stay paused). Ignored while shutting down, as the console's RESUME is
/// refused then: resuming would take clients the shutdown is letting go.
pub fn resume_signal(app: &App) {
    if app.shutdown.is_cancelled() || shutdown_mode().is_some() {
        tracing::info!("got SIGUSR2 while shutting down, ignoring");
        return;
    }
    let mut st = state();
    match st.mode {
        Mode::Suspended => tracing::info!("got SIGUSR2, continuing from SUSPEND"),
        Mode::Paused => tracing::info!("got SIGUSR2, continuing from PAUSE"),
        Mode::Running => {
            tracing::info!("got SIGUSR2, but not paused/suspended");
            return;
        }
    }
    st.mode = Mode::Running;
    drop(st);
    sync_gates();
    wake_resumed();
}

/// Closes a pool's idle servers (PAUSE disconnects from the servers it no longer uses).
fn retire_idle(pool: &Pool) {
    if pool.counts().idle > 0 {
        retire_servers(pool);
    }
}

pub fn resume(app: &App, arg: &str) -> Result<&'static str, String> {
    if arg.is_empty() {
        tracing::info!("RESUME command issued");
        if app.shutdown.is_cancelled() || shutdown_mode().is_some() {
            return Err("pooler is shutting down".into());
        }
        let mut st = state();
        if st.mode == Mode::Running {
            return Err("pooler is not paused/suspended".into());
        }
        st.mode = Mode::Running;
    } else {
        tracing::info!("RESUME '{arg}' command issued");
        if crate::client::login::is_admin_database(&app.snapshot.load(), arg) {
            return Err(format!("database {arg} is not paused"));
        }
        if !known_database(app, arg) {
            return Err(format!("no such database: {arg}"));
        }
        if !state().paused.remove(arg) {
            return Err(format!("database {arg} is not paused"));
        }
    }
    sync_gates();
    wake_resumed();
    Ok("RESUME")
}

pub fn suspend(arg: &str) -> Result<&'static str, String> {
    if !arg.is_empty() {
        return Err(String::new());
    }
    let mut st = state();
    if st.mode != Mode::Running {
        return Err("already suspended/paused".into());
    }
    if !st.paused.is_empty() {
        return Err("cannot suspend with paused databases".into());
    }
    tracing::info!("SUSPEND command issued");
    st.mode = Mode::Suspended;
    drop(st);
    sync_gates();
    Ok("SUSPEND")
}

/// Called when a console session ends: a SUSPEND nobody is left to RESUME is undone.
pub fn admin_gone(sessions_left: usize) {
    if sessions_left == 0 {
        let mut st = state();
        if st.mode == Mode::Suspended {
            tracing::info!("admin disappeared when suspended, doing RESUME");
            st.mode = Mode::Running;
            drop(st);
            sync_gates();
            wake_resumed();
        }
    }
}

pub fn kill(app: &App, arg: &str) -> Result<&'static str, String> {
    if state().mode != Mode::Running {
        return Err("already suspended/paused".into());
    }
    let db = if arg.is_empty() {
        tracing::info!("KILL command issued");
        None
    } else {
        tracing::info!("KILL '{arg}' command issued");
        target(app, arg, "kill")?;
        Some(arg)
    };
    {
        let mut st = state();
        match db {
            Some(d) => {
                st.paused.insert(d.to_owned());
            }
            None => {
                let names: Vec<String> =
                    app.all_pools().iter().map(|p| p.database.clone()).collect();
                st.paused.extend(names);
            }
        }
    }
    sync_gates();
    for c in CLIENTS.snapshot() {
        if db.is_none_or(|d| &*c.database == d) {
            c.kill(KillReason::DatabaseRemoved);
        }
    }
    for p in pools_of(app, db) {
        retire_servers(&p);
    }
    Ok("KILL")
}

pub fn kill_client(arg: &str) -> Result<&'static str, String> {
    let Ok(id) = arg.parse::<u64>() else {
        return Err("invalid client pointer supplied".into());
    };
    // SHOW CLIENTS' id: a scan, at the console's pace.
    if let Some(c) = CLIENTS.snapshot().into_iter().find(|c| c.id == id) {
        c.kill(KillReason::AdminForced);
    } else if let Some(a) = super::sessions::all().into_iter().find(|a| a.serial == id) {
        a.kill("admin forced disconnect");
    } else {
        return Err("client not found".into());
    }
    Ok("KILL_CLIENT")
}

pub fn reconnect(app: &App, arg: &str) -> Result<&'static str, String> {
    let db = if arg.is_empty() {
        tracing::info!("RECONNECT command issued");
        None
    } else {
        tracing::info!("RECONNECT '{arg}' command issued");
        target(app, arg, "reconnect")?;
        Some(arg)
    };
    let pools = pools_of(app, db);
    let ids = servers_of(&pools);
    state().close_needed.extend(ids);
    for p in &pools {
        retire_servers(p);
    }
    Ok("RECONNECT")
}

pub async fn wait_close(app: &App, arg: &str) -> Result<&'static str, String> {
    let db = if arg.is_empty() {
        tracing::info!("WAIT_CLOSE command issued");
        None
    } else {
        tracing::info!("WAIT_CLOSE '{arg}' command issued");
        target(app, arg, "wait in")?;
        Some(arg)
    };
    wait_until(|| {
        let alive: HashSet<u64> = SERVERS.snapshot().iter().map(|s| s.id).collect();
        let mut st = state();
        st.close_needed.retain(|id| alive.contains(id));
        let mine = servers_of(&pools_of(app, db));
        !st.close_needed.iter().any(|id| mine.contains(id))
    })
    .await;
    Ok("WAIT_CLOSE")
}

pub fn disable(app: &App, arg: &str, enable: bool) -> Result<&'static str, String> {
    if arg.is_empty() {
        return Err("a database is required".into());
    }
    let word = if enable { "ENABLE" } else { "DISABLE" };
    tracing::info!("{word} '{arg}' command issued");
    target(app, arg, "disable")?;
    let mut st = state();
    if enable {
        st.disabled.remove(arg);
        Ok("ENABLE")
    } else {
        st.disabled.insert(arg.to_owned());
        Ok("DISABLE")
    }
}

/// Re-reads the configuration file and applies it: RELOAD and SIGHUP. systemd is told
/// (RELOADING=1, then READY=1 whether the new file was good or not), so that a
/// `Type=notify` unit shows the reload.
pub fn reload_config(app: &App) -> Result<(), String> {
    crate::systemd::reloading();
    let result = load_and_apply(app);
    crate::systemd::notify("READY=1");
    result
}

fn load_and_apply(app: &App) -> Result<(), String> {
    match Snapshot::load(&app.config_path) {
        Ok(snap) => {
            for notice in &snap.config.notices {
                tracing::warn!("{notice}");
            }
            app.apply(snap);
            tracing::info!("configuration reloaded from {}", app.config_path.display());
            crate::stats::config_reloaded(true);
            Ok(())
        }
        Err(e) => {
            tracing::error!("reload failed, keeping the old configuration: {e}");
            crate::stats::config_reloaded(false);
            Err(e)
        }
    }
}

/// Options that take effect only at startup (PgBouncer's CF_NO_RELOAD): SHOW CONFIG says
/// `changeable = no` and SET refuses them.
pub const NOT_RELOADABLE: &[&str] = &[
    "workers",
    "disable_pqexec",
    "http_listen",
    "job_name",
    "listen_addr",
    "listen_backlog",
    "listen_port",
    "peer_id",
    "pidfile",
    "pkt_buf",
    "resolv_conf",
    "so_reuseport",
    "unix_socket_dir",
    "unix_socket_group",
    "unix_socket_mode",
    "user",
];

/// Why the console's SET was refused: the SQLSTATE and message it gets.
#[derive(Debug)]
pub struct SetRefused {
    pub code: &'static str,
    pub message: String,
}

/// SET key = value on the live configuration (lost at the next RELOAD, as in PgBouncer),
/// for each pair of `sets`: the SETs of one console query, applied together or not at
/// all. Together, because a certificate and its key are two options that only make a
/// usable pair once both are set: `SET client_tls_key_file = ...; SET
/// client_tls_cert_file = ...` in one query switches both where two queries would
/// have the first refused (its key does not match the certificate still in force).
/// TLS settings that cannot be used are refused rather than applied without TLS (see
/// Snapshot::with_options); a file named while its side's sslmode is disable is not
/// read until a mode that uses it is set, as in PgBouncer.
pub fn set(app: &App, sets: &[(String, String)]) -> Result<Vec<String>, SetRefused> {
    let failed = || SetRefused {
        code: "08P01",
        message: "SET failed".to_owned(),
    };
    let snap = app.snapshot.load_full();
    let mut config = snap.config.clone();
    let mut changed = Vec::with_capacity(sets.len());
    for (key, value) in sets {
        let name = key.to_ascii_lowercase();
        if NOT_RELOADABLE.contains(&name.as_str()) {
            return Err(failed());
        }
        if let Err(e) = config.general.set_by_name(key, value) {
            tracing::warn!("SET {key}: {e}");
            return Err(failed());
        }
        changed.push(name);
    }
    let next = snap.with_options(config, &changed).map_err(|e| {
        // The PAM and LDAP checks' errors name their option (auth_type, auth_ldap_options,
        // auth_pam_confdir); anything else is TLS.
        let what = if e.starts_with("auth_") {
            "authentication"
        } else {
            "TLS"
        };
        tracing::error!("SET refused, {what} settings kept as they were: {e}");
        // F0000 (config_file_error) as RELOAD gives when TLS files cannot be used.
        SetRefused {
            code: "F0000",
            message: format!(
                "SET failed: {what} settings could not be applied, still using old configuration: {e}"
            ),
        }
    })?;
    app.apply(next);
    Ok(sets
        .iter()
        .map(|(key, value)| {
            tracing::info!("SET {key} = {value}");
            format!("SET {key}={value}")
        })
        .collect())
}

pub fn shutdown(app: &App, arg: &str) -> Result<ShutdownMode, String> {
    let mode = if arg.is_empty() {
        ShutdownMode::Immediate
    } else if arg.eq_ignore_ascii_case("WAIT_FOR_CLIENTS") {
        ShutdownMode::WaitForClients
    } else if arg.eq_ignore_ascii_case("WAIT_FOR_SERVERS") {
        ShutdownMode::WaitForServers
    } else {
        return Err(String::new());
    };
    match mode {
        ShutdownMode::Immediate => tracing::info!("SHUTDOWN command issued"),
        ShutdownMode::WaitForServers => {
            tracing::info!("SHUTDOWN WAIT_FOR_SERVERS command issued")
        }
        ShutdownMode::WaitForClients => {
            tracing::info!("SHUTDOWN WAIT_FOR_CLIENTS command issued")
        }
    }
    begin_shutdown(app, mode);
    Ok(mode)
}

/// Starts a shutdown, from the console or a signal. A graceful one closes the TCP
/// listeners at once, as PgBouncer 1.23+ does: new connections are refused, so that the
/// kernel gives them to another process on the port (`so_reuseport`), the rolling
/// restart PgBouncer documents. The Unix socket keeps accepting, for the admin console
/// only (`login_refusal`). The online-restart offer goes too: it holds copies of the
/// listening sockets, which would otherwise stay open and queue connections nobody
/// accepts.
pub fn begin_shutdown(app: &App, mode: ShutdownMode) {
    if mode != ShutdownMode::Immediate {
        crate::listener::close_tcp();
        crate::takeover::withdraw();
    }
    if mode == ShutdownMode::WaitForServers {
        app.shutdown.cancel();
        crate::client::begin_shutdown();
    }
    // WAIT_FOR_CLIENTS after WAIT_FOR_SERVERS does not take back what the latter began.
    SHUTDOWN.send_if_modified(|m| {
        let keep = *m == Some(ShutdownMode::WaitForServers) && mode == ShutdownMode::WaitForClients;
        if !keep {
            *m = Some(mode);
        }
        !keep
    });
}

//! Weir: a multi-threaded PostgreSQL connection pooler, a drop-in replacement for PgBouncer.
//!
//! A library only so that the fuzz targets (fuzz/, through [`fuzzing`]) reach the parsers;
//! the program is src/main.rs, and everything else stays private.

mod admin;
mod app;
mod auth_query;
mod bufpool;
mod cancel;
mod cli;
mod client;
mod conn_log;
mod external_auth;
mod fd_limit;
pub mod fuzzing;
mod gucs;
mod host_check;
mod idle_pools;
mod listen;
mod listener;
mod logging;
mod login_notice;
mod metrics_http;
mod params;
mod pool;
mod prepared;
mod protocol;
mod registry;
mod server;
mod split;
mod sql;
mod stats;
mod stream;
mod systemd;
mod takeover;
mod tcp_options;
mod timers;
mod tls;
mod workers;

use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::Duration;

use clap::Parser;
use tokio::signal::unix::{signal, SignalKind};

use admin::control::ShutdownMode;
use app::{App, Snapshot};
use weir_config::SigtermShutdown;

/// The whole program after the allocator is set up: what `main` returns.
pub fn run() -> ExitCode {
    let args = cli::Args::parse();
    let snap = match Snapshot::load(&args.config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("weir: {e}");
            return ExitCode::FAILURE;
        }
    };
    let g = &snap.config.general;
    let json = g.log_format == weir_config::LogFormat::Json;
    let fatal = |msg: &str| logging::before_init(json, "FATAL", msg);
    if args.daemon && g.logfile.is_none() && !g.syslog {
        fatal("in daemon mode logfile or syslog must be set");
        return ExitCode::FAILURE;
    }
    if args.daemon && g.pidfile.is_none() {
        // As PgBouncer: a daemon nobody can find is a daemon nobody can stop.
        fatal("daemon mode needs pidfile configured");
        return ExitCode::FAILURE;
    }
    // An online restart replaces the running process: its pidfile is expected.
    if let Some(pidfile) = g.pidfile.as_ref().filter(|_| !args.reboot) {
        if let Err(e) = cli::check_pidfile(pidfile) {
            fatal(&e.to_string());
            return ExitCode::FAILURE;
        }
    }
    let fds = fd_limit::raise(&snap.config);
    // Bind before daemonizing so that a port in use is reported to the terminal.
    let workers = match g.workers {
        0 => std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1)),
        n => n as usize,
    };
    let inherited = match args.reboot.then(|| takeover::request(g, workers)) {
        Some(Ok(i)) => i,
        Some(Err(e)) => {
            fatal(&e.to_string());
            return ExitCode::FAILURE;
        }
        None => None,
    };
    let activated = match listener::from_systemd(workers) {
        Ok(a) => a,
        Err(e) => {
            fatal(&e.to_string());
            return ExitCode::FAILURE;
        }
    };
    let (listeners, inherited_http, predecessor) = if let Some(i) = inherited {
        (i.listeners, i.http, Some(i.predecessor))
    } else if let Some(l) = activated {
        (l, None, None)
    } else {
        match listener::bind_all_std(g, workers) {
            Ok(l) => (l, None, None),
            Err(e) => {
                fatal(&e.to_string());
                return ExitCode::FAILURE;
            }
        }
    };
    let http = match inherited_http {
        Some(l) if g.http_listen.is_some() => Some(l),
        _ => match metrics_http::bind(g) {
            Ok(l) => l,
            Err(e) => {
                fatal(&e.to_string());
                return ExitCode::FAILURE;
            }
        },
    };
    let offer = takeover::Offer::new(
        &listeners,
        http.as_ref(),
        metrics_http::resume,
        admin::console,
    );
    if args.daemon {
        if let Err(e) = cli::daemonize() {
            fatal(&format!("cannot daemonize: {e}"));
            return ExitCode::FAILURE;
        }
    }
    let sinks = match logging::init(logging::LogOptions {
        stderr: !args.quiet && !args.daemon,
        logfile: g.logfile.clone(),
        syslog: g
            .syslog
            .then(|| (g.syslog_ident.clone(), g.syslog_facility.clone())),
        verbosity: args.verbose as u32 + g.verbose,
        json,
    }) {
        Ok(s) => s,
        Err(e) => {
            fatal(&format!("cannot open logfile: {e}"));
            return ExitCode::FAILURE;
        }
    };
    let run_as = args.user.clone().or_else(|| g.user.clone());
    if let Some(user) = run_as {
        if let Err(e) = cli::switch_user(&user) {
            tracing::error!("{e}");
            return ExitCode::FAILURE;
        }
    } else if unsafe_is_root() {
        tracing::warn!("running as root: consider -u or the user option");
    }
    let pidfile = g.pidfile.clone();
    // After an online restart the pidfile is the running process's until this one is
    // serving (see `serve`): should this one fail before, the other keeps its file.
    if let Some(p) = pidfile.as_ref().filter(|_| predecessor.is_none()) {
        if let Err(e) = cli::write_pidfile(p) {
            tracing::error!("{e}");
            return ExitCode::FAILURE;
        }
    }
    for notice in &snap.config.notices {
        tracing::warn!("{notice}");
    }
    if let Some(f) = fds {
        tracing::info!(
            "kernel file descriptor limit: {} (hard: {}); max_client_conn: {}, max expected fd use: {}",
            f.soft,
            f.hard,
            g.max_client_conn,
            f.expected
        );
        if f.soft < f.expected {
            tracing::warn!(
                "the file descriptor limit ({}) is below the expected use ({}): raise the hard limit (ulimit -Hn, LimitNOFILE=)",
                f.soft,
                f.expected
            );
        }
    }
    // The main thread's runtime handles signals, the admin console's timers and the
    // metrics endpoint; clients live on the worker threads (see `workers`).
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(serve(
        args.config.clone(),
        snap,
        Sockets {
            listeners,
            http,
            offer,
            predecessor,
        },
        sinks,
    ));
    // Once handed over, the file is the successor's, or about to be: reading it and then
    // removing it could remove the successor's, written in between.
    if let Some(p) = pidfile.as_ref().filter(|_| !takeover::handed_over()) {
        cli::remove_pidfile_if_ours(p);
    }
    takeover::remove_control_file();
    listener::remove_socket_file();
    // Open connections are not worth an orderly teardown once we are exiting, and the main
    // runtime is not shut down at all: its time driver holds the workers' timers too
    // (`timers`), and shutting it down would fail every one of them, as a panic on a worker
    // still polling its clients while the process exits.
    std::mem::forget(runtime);
    code
}

fn unsafe_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// What the process listens on, bound or inherited (`-R`), and what it offers a successor.
struct Sockets {
    listeners: Vec<Vec<listener::StdListener>>,
    http: Option<std::net::TcpListener>,
    offer: takeover::Offer,
    predecessor: Option<takeover::Predecessor>,
}

async fn serve(
    config_path: std::path::PathBuf,
    snap: Snapshot,
    sockets: Sockets,
    sinks: logging::Sinks,
) -> ExitCode {
    let Sockets {
        listeners,
        http,
        offer,
        predecessor,
    } = sockets;
    let (Ok(mut hup), Ok(mut int), Ok(mut term), Ok(mut quit), Ok(mut usr1), Ok(mut usr2)) = (
        signal(SignalKind::hangup()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::quit()),
        signal(SignalKind::user_defined1()),
        signal(SignalKind::user_defined2()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return ExitCode::FAILURE;
    };
    workers::set_main_runtime(tokio::runtime::Handle::current());
    timers::set_home(tokio::runtime::Handle::current());
    crate::registry::keys::set_peer_id(snap.config.general.peer_id);
    let app = App::new(config_path, snap);
    app.open_forced_pools();
    admin::start(&app);
    {
        // Until the process exits, shutdown included: unhandled, either signal would
        // kill it.
        let app = app.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    Some(()) = usr1.recv() => admin::control::pause_signal(&app),
                    Some(()) = usr2.recv() => admin::control::resume_signal(&app),
                    else => break,
                }
            }
        });
    }
    tokio::spawn(async {
        // Granularity of query_wait_notify and query_wait_timeout.
        let mut tick = timers::interval(
            Duration::from_millis(250),
            timers::MissedTickBehavior::Burst,
        );
        loop {
            tick.tick().await;
            registry::clients::enforce_waits();
        }
    });
    tokio::spawn(client::park::watch());
    host_check::start(&app);
    idle_pools::start(&app);
    if let Some(l) = http {
        if let Err(e) = metrics_http::start(&app, l) {
            tracing::error!("cannot serve http_listen: {e}");
            return ExitCode::FAILURE;
        }
    }
    let serving = app.clone();
    let serve = move |i: usize, listeners: Vec<listener::StdListener>| {
        let app = serving.clone();
        async move {
            for l in listeners {
                match l.into_tokio() {
                    Ok(l) => {
                        tokio::spawn(listener::run(app.clone(), admin::console, l));
                    }
                    Err(e) => tracing::error!("worker {i} cannot listen: {e}"),
                }
            }
        }
    };
    if let Err(e) = workers::start(listeners, serve) {
        tracing::error!("cannot start worker threads: {e}");
        return ExitCode::FAILURE;
    }
    tracing::info!(
        "weir {} started, process {}",
        env!("CARGO_PKG_VERSION"),
        std::process::id()
    );
    if let Some(p) = predecessor {
        takeover::take_over(&app, p);
        if let Some(p) = &app.snapshot.load().config.general.pidfile {
            if let Err(e) = cli::write_pidfile(p) {
                tracing::error!("{e}");
            }
        }
        // Under systemd (NotifyAccess=all), this process is the service from now on.
        systemd::notify(&format!("MAINPID={}", std::process::id()));
    }
    takeover::offer(app.clone(), offer);
    {
        let app = app.clone();
        tokio::spawn(async move {
            app.shutdown.cancelled().await;
            takeover::withdraw();
        });
    }
    systemd::notify("READY=1");
    loop {
        let graceful = loop {
            tokio::select! {
                () = takeover::taken_over() => {
                    tracing::info!("taken over by a new process: exiting once the clients left here have gone");
                    break true;
                }
                _ = hup.recv() => {
                    sinks.reopen();
                    let _ = admin::reload_config(&app);
                }
                mode = admin::shutdown_requested() => match mode {
                    // SHUTDOWN: exit now, as SIGQUIT.
                    ShutdownMode::Immediate => break false,
                    // WAIT_FOR_SERVERS (as SIGINT) and WAIT_FOR_CLIENTS (new clients
                    // refused): wait for the clients to leave.
                    _ => break true,
                },
                _ = int.recv() => {
                    tracing::info!("got SIGINT, shutting down when transactions finish");
                    safe_shutdown(&app);
                    break true;
                }
                _ = term.recv() => {
                    let how = app.snapshot.load().config.general.shutdown_on_sigterm;
                    match how {
                        SigtermShutdown::Immediate => {
                            tracing::info!("got SIGTERM, fast exit");
                            break false;
                        }
                        SigtermShutdown::WaitForServers => {
                            tracing::info!("got SIGTERM, draining: shutting down when transactions finish");
                            safe_shutdown(&app);
                        }
                        SigtermShutdown::WaitForClients => {
                            tracing::info!("got SIGTERM, shutting down when the clients have left");
                            admin::control::begin_shutdown(&app, ShutdownMode::WaitForClients);
                        }
                    }
                    break true;
                }
                _ = quit.recv() => {
                    tracing::info!("got SIGQUIT, fast exit");
                    break false;
                }
            }
        };
        // After an online restart the service goes on in the new process.
        if !takeover::handed_over() {
            systemd::notify("STOPPING=1");
        }
        if !graceful {
            return ExitCode::SUCCESS;
        }
        if let Some(code) = drain(&app, &mut int, &mut term, &mut quit).await {
            return code;
        }
    }
}

/// SIGINT's safe shutdown (also SIGTERM's with `shutdown_on_sigterm = wait_for_servers`):
/// the listeners close, /readyz turns 503, and every client leaves as soon as it holds no
/// server in a transaction.
fn safe_shutdown(app: &App) {
    admin::control::begin_shutdown(app, ShutdownMode::WaitForServers);
}

/// Waits for the clients to leave, for at most `shutdown_drain_timeout` (read now: a
/// reload may have changed it); then the rest are told "pooler is shutting down" and
/// closed. A SIGINT, SIGTERM or SIGQUIT meanwhile exits at once, as in PgBouncer 1.23+,
/// and so does the console's SHUTDOWN. None when the process serves again instead (the
/// new process of an online restart died).
async fn drain(
    app: &App,
    int: &mut tokio::signal::unix::Signal,
    term: &mut tokio::signal::unix::Signal,
    quit: &mut tokio::signal::unix::Signal,
) -> Option<ExitCode> {
    let limit = app.snapshot.load().config.general.shutdown_drain_timeout;
    let deadline = (!limit.is_zero()).then(|| std::time::Instant::now() + limit);
    // When the stragglers were told to go. A client's goodbye is bounded (see
    // `client::refuse`), so past this grace the process exits whoever is left.
    let mut killed_at: Option<std::time::Instant> = None;
    const GOODBYE_GRACE: Duration = Duration::from_secs(6);
    loop {
        // After an online restart, clients still on their way to the new process count,
        // and so does a previous process still running (it may send clients here yet).
        // Console sessions do not hold up a shutdown: the operator watches it through
        // them. After an online restart they do (they finish on this process).
        let consoles = if admin::control::shutdown_mode().is_some() {
            admin::sessions::count()
        } else {
            0
        };
        let n = app.clients.load(Ordering::Relaxed).saturating_sub(consoles)
            + takeover::in_flight()
            + usize::from(takeover::predecessor_running());
        if n == 0 {
            break;
        }
        let now = std::time::Instant::now();
        match (deadline, killed_at) {
            (Some(d), None) if now >= d => {
                tracing::warn!(
                    "shutdown_drain_timeout ({} s) reached: closing {n} remaining clients",
                    limit.as_secs()
                );
                for c in registry::clients::CLIENTS.snapshot() {
                    c.kill(registry::clients::KillReason::Shutdown);
                }
                killed_at = Some(now);
            }
            (_, Some(k)) if now.duration_since(k) >= GOODBYE_GRACE => {
                tracing::warn!("{n} clients did not leave after being closed; exiting");
                return Some(ExitCode::SUCCESS);
            }
            _ => {}
        }
        tokio::select! {
            _ = crate::timers::sleep(Duration::from_millis(50)) => {}
            () = takeover::resumed() => return None,
            _ = int.recv() => {
                tracing::info!("got SIGINT during shutdown, fast exit");
                return Some(ExitCode::SUCCESS);
            }
            () = admin::control::shutdown_now_requested() => {
                tracing::info!("SHUTDOWN during shutdown, fast exit");
                return Some(ExitCode::SUCCESS);
            }
            _ = term.recv() => {
                tracing::info!("got SIGTERM during shutdown, fast exit");
                return Some(ExitCode::SUCCESS);
            }
            _ = quit.recv() => {
                tracing::info!("got SIGQUIT during shutdown, fast exit");
                return Some(ExitCode::SUCCESS);
            }
        }
    }
    tracing::info!("shutdown complete");
    Some(ExitCode::SUCCESS)
}

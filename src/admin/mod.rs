//! The admin console: `psql -p 6432 -U admin pgbouncer`, PgBouncer's SHOW and control
//! commands over the simple query protocol, with PgBouncer's column names, order and types
//! so that pgbouncer_exporter, scripts and dashboards keep working.
//!
//! * `commands`: parsing queries as PgBouncer does (plus `;`-separated lists);
//! * `show`: the SHOW commands; `rowset`: the messages that carry them;
//! * `control`: PAUSE/RESUME/KILL/... and the hooks the data path consults;
//! * `period`: the stats-period task behind the averages;
//! * `sessions`: the console's own clients.

pub mod commands;
pub mod control;
pub mod period;
pub mod rowset;
pub mod sessions;
pub mod show;

use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;

use crate::app::App;
use crate::client::login::AdminLogin;
use crate::protocol::reader::read_message;
use crate::protocol::{messages, PgError};
use crate::stream::{Endpoint, Stream};
use commands::Command;
use control::ShutdownMode;
use rowset::RowSet;
use sessions::SessionHandle;

pub use control::{reload_config, shutdown_requested};
pub use period::start;

/// The PgBouncer release whose console Weir reproduces: reported in `server_version`
/// (as PgBouncer's `<version>/bouncer`) and SHOW VERSION, for tools that pick columns by
/// version.
use crate::cli::COMPAT_VERSION;

/// Console queries are small; anything larger is refused.
const MAX_MESSAGE: usize = 1 << 20;

/// What one command produced.
enum Reply {
    Rows(RowSet),
    /// CommandComplete with this tag.
    Done(String),
    /// A NOTICE (message, detail), then CommandComplete.
    Notice(&'static str, Option<&'static str>, &'static str),
    /// Nothing: the process is about to exit (SHUTDOWN).
    Exit,
}

/// Why a command failed: an ERROR with this message (and SQLSTATE).
struct Failure {
    code: &'static str,
    message: String,
}

fn fail(message: impl Into<String>) -> Failure {
    Failure {
        code: "08P01",
        message: message.into(),
    }
}

/// The option a statement SETs, unless it is not a SET of one (a client parameter SET
/// is answered with a notice by `execute`).
fn option_set(stmt: &str) -> Option<(String, String)> {
    match commands::parse(stmt) {
        Command::Set { key, value }
            if !show::FAKE_PARAMS
                .iter()
                .any(|(n, _)| n.eq_ignore_ascii_case(&key)) =>
        {
            Some((key, value))
        }
        _ => None,
    }
}

fn error(code: &str, message: &str) -> PgError {
    PgError::error(code, message)
}

const HELP_DETAIL: &str = "\n\tSHOW HELP|CONFIG|DATABASES|POOLS|CLIENTS|SERVERS|USERS|VERSION\n\
\tSHOW PEERS|PEER_POOLS\n\
\tSHOW FDS|SOCKETS|ACTIVE_SOCKETS|LISTS|MEM|STATE\n\
\tSHOW DNS_HOSTS|DNS_ZONES\n\
\tSHOW HOSTS\n\
\tSHOW STATS|STATS_TOTALS|STATS_AVERAGES|TOTALS\n\
\tSET key = arg\n\
\tRELOAD\n\
\tPAUSE [<db>]\n\
\tRESUME [<db>]\n\
\tDISABLE <db>\n\
\tENABLE <db>\n\
\tRECONNECT [<db>]\n\
\tKILL [<db>]\n\
\tKILL_CLIENT <client_id>\n\
\tSUSPEND\n\
\tSHUTDOWN\n\
\tSHUTDOWN WAIT_FOR_SERVERS|WAIT_FOR_CLIENTS\n\
\tWAIT_CLOSE [<db>]";

struct Console {
    app: Arc<App>,
    session: Arc<sessions::AdminSession>,
    full_access: bool,
}

/// Serves one console session until the client leaves.
/// `peer` and `local` are the connection's ends as the listener accepted it.
/// `serve` as the client session takes it (client::Console): boxed, so that the
/// console's state does not size every client's login.
pub fn console(
    app: Arc<App>,
    stream: Stream,
    inbuf: BytesMut,
    login: AdminLogin,
    ends: (Endpoint, Endpoint),
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(serve(app, stream, inbuf, login, ends))
}

async fn serve(
    app: Arc<App>,
    mut stream: Stream,
    mut inbuf: BytesMut,
    login: AdminLogin,
    (peer, local): (Endpoint, Endpoint),
) {
    period::start(&app);
    let handle = SessionHandle::register(
        &login.user,
        peer,
        local,
        login.requested.get("application_name").unwrap_or(""),
    );
    // The registration uncounts the session when it goes.
    login.admission.keep();
    crate::conn_log::console_login(handle.0.id, &handle.0.user, &handle.0.peer);
    sessions::count_login();
    let console = Console {
        app: app.clone(),
        session: handle.0.clone(),
        full_access: login.full_access,
    };
    let mut out = BytesMut::with_capacity(512);
    for (name, value) in [
        ("server_version", format!("{COMPAT_VERSION}/bouncer")),
        ("client_encoding", "UTF8".into()),
        ("server_encoding", "UTF8".into()),
        ("DateStyle", "ISO".into()),
        ("TimeZone", "GMT".into()),
        ("standard_conforming_strings", "on".into()),
        ("is_superuser", "on".into()),
    ] {
        messages::parameter_status(&mut out, name, &value);
    }
    let key = crate::protocol::BackendKey {
        pid: handle.0.id,
        secret: rand::random(),
        tail: login.long_key.then(crate::registry::keys::new_tail),
    };
    messages::backend_key_data(&mut out, &key);
    crate::login_notice::append(&mut out);
    messages::ready_for_query(&mut out, b'I');
    if stream.write_all(&out).await.is_ok() {
        let reason = console.run(&mut stream, &mut inbuf).await;
        crate::conn_log::console_closing(
            handle.0.id,
            &handle.0.user,
            &handle.0.peer,
            handle.0.connect_time,
            reason,
        );
    }
    drop(console);
    drop(handle);
    control::admin_gone(sessions::count());
}

impl Console {
    async fn run(&self, stream: &mut Stream, inbuf: &mut BytesMut) -> &'static str {
        // After an extended-protocol message, everything up to the next Sync is skipped.
        let mut skipping = false;
        loop {
            let msg = tokio::select! {
                m = read_message(stream, inbuf, MAX_MESSAGE) => m,
                reason = self.session.killed() => {
                    let _ = stream.write_all(&crate::stats::error_response(&PgError::fatal("08P01", reason))).await;
                    return reason;
                }
                // A graceful shutdown keeps the console: the operator watches it from here.
                () = control::shutdown_now_requested() => return "shutdown",
            };
            let Ok(msg) = msg else {
                return "client gone";
            };
            let mut out = BytesMut::new();
            match msg.tag {
                b'Q' => {
                    skipping = false;
                    let body = msg.body.strip_suffix(&[0]).unwrap_or(&msg.body);
                    let query = String::from_utf8_lossy(body).into_owned();
                    self.session.touch();
                    sessions::count_command();
                    let exit = tokio::select! {
                        exit = self.query(&query, &mut out) => exit,
                        reason = self.session.killed() => {
                            let _ = stream.write_all(&crate::stats::error_response(&PgError::fatal("08P01", reason))).await;
                            return reason;
                        }
                    };
                    if exit {
                        // SHUTDOWN: PgBouncer answers nothing; the process is going away.
                        let _ = stream.flush().await;
                        std::future::pending::<()>().await;
                    }
                    messages::ready_for_query(&mut out, b'I');
                }
                b'X' => return "client close request",
                b'P' | b'B' | b'E' | b'D' | b'C' => {
                    if !skipping {
                        out.extend_from_slice(&crate::stats::error_response(&error(
                            "08P01",
                            "extended query protocol not supported by admin console",
                        )));
                        skipping = true;
                    }
                }
                b'H' => {}
                b'S' => {
                    skipping = false;
                    messages::ready_for_query(&mut out, b'I');
                }
                other => {
                    let err = error(
                        "08P01",
                        &format!(
                            "unsupported packet type for admin console: {}",
                            other as char
                        ),
                    );
                    let _ = stream.write_all(&crate::stats::error_response(&err)).await;
                    return "bad packet";
                }
            }
            if !out.is_empty() && stream.write_all(&out).await.is_err() {
                return "client gone";
            }
        }
    }

    /// Runs every command of a query, stopping at the first error. Returns true when the
    /// process is exiting and nothing more should be sent.
    async fn query(&self, query: &str, out: &mut BytesMut) -> bool {
        tracing::debug!("got admin query: {query}");
        let stmts = commands::split(query);
        if stmts.is_empty() {
            messages::put_message(out, b'I', |_| {});
            return false;
        }
        let single = stmts.len() == 1;
        let mut rest = &stmts[..];
        while let Some((stmt, after)) = rest.split_first() {
            // A run of SETs is applied as one change (control::set says why).
            let sets: Vec<(String, String)> = rest.iter().map_while(|s| option_set(s)).collect();
            if !sets.is_empty() {
                rest = &rest[sets.len()..];
                match self.admin().and_then(|()| self.set(&sets)) {
                    Ok(tags) => tags.iter().for_each(|t| rowset::command_complete(out, t)),
                    Err(f) => {
                        self.report(f, out);
                        break;
                    }
                }
                continue;
            }
            rest = after;
            let shown = if single { query } else { stmt.trim() };
            match self.execute(stmt, shown).await {
                Ok(Reply::Rows(rs)) => rs.encode(out, "SHOW"),
                Ok(Reply::Done(tag)) => rowset::command_complete(out, &tag),
                Ok(Reply::Notice(msg, detail, tag)) => {
                    rowset::notice(out, "00000", msg, detail);
                    rowset::command_complete(out, tag);
                }
                Ok(Reply::Exit) => return true,
                Err(f) => {
                    self.report(f, out);
                    break;
                }
            }
        }
        false
    }

    fn report(&self, f: Failure, out: &mut BytesMut) {
        if self.app.snapshot.load().config.general.log_pooler_errors {
            tracing::warn!("admin console error: {}", f.message);
        }
        out.extend_from_slice(&crate::stats::error_response(&error(f.code, &f.message)));
    }

    fn set(&self, sets: &[(String, String)]) -> Result<Vec<String>, Failure> {
        control::set(&self.app, sets).map_err(|r| Failure {
            code: r.code,
            message: r.message,
        })
    }

    fn admin(&self) -> Result<(), Failure> {
        if self.full_access {
            Ok(())
        } else {
            Err(fail("admin access needed"))
        }
    }

    async fn execute(&self, stmt: &str, shown: &str) -> Result<Reply, Failure> {
        let invalid = || fail(format!("invalid command '{shown}', use SHOW HELP;"));
        let app = &self.app;
        let (cmd, arg) = match commands::parse(stmt) {
            Command::Word { cmd, arg } => (cmd, arg),
            Command::Set { key, value } => {
                if show::FAKE_PARAMS
                    .iter()
                    .any(|(n, _)| n.eq_ignore_ascii_case(&key))
                {
                    return Ok(Reply::Notice("SET ignored", None, "SET"));
                }
                self.admin()?;
                let mut tags = self.set(&[(key, value)])?;
                return Ok(Reply::Done(tags.pop().unwrap_or_default()));
            }
            Command::Invalid => return Err(invalid()),
            Command::BadArguments => return Err(fail("bad arguments")),
        };
        let done = |r: Result<&'static str, String>| match r {
            Ok(tag) => Ok(Reply::Done(tag.to_owned())),
            Err(e) if e.is_empty() => Err(invalid()),
            Err(e) => Err(fail(e)),
        };
        let arg = arg.as_str();
        match cmd.as_str() {
            "show" | "select" => self.show(arg).ok_or_else(invalid)?,
            "pause" => {
                self.admin()?;
                done(control::pause(app, arg).await)
            }
            "resume" => {
                self.admin()?;
                done(control::resume(app, arg))
            }
            "suspend" => {
                if !arg.is_empty() {
                    return Err(invalid());
                }
                self.admin()?;
                done(control::suspend(arg))
            }
            "kill" => {
                self.admin()?;
                done(control::kill(app, arg))
            }
            "kill_client" => {
                self.admin()?;
                done(control::kill_client(arg))
            }
            "reconnect" => {
                self.admin()?;
                done(control::reconnect(app, arg))
            }
            "wait_close" => {
                self.admin()?;
                done(control::wait_close(app, arg).await)
            }
            "disable" => {
                self.admin()?;
                done(control::disable(app, arg, false))
            }
            "enable" => {
                self.admin()?;
                done(control::disable(app, arg, true))
            }
            "reload" => {
                if !arg.is_empty() {
                    return Err(invalid());
                }
                self.admin()?;
                tracing::info!("RELOAD command issued");
                match control::reload_config(app) {
                    Ok(()) => Ok(Reply::Done("RELOAD".into())),
                    Err(_) => Err(Failure {
                        code: "F0000",
                        message: "RELOAD failed, see logs for additional details".into(),
                    }),
                }
            }
            "shutdown" => {
                let valid = arg.is_empty()
                    || arg.eq_ignore_ascii_case("WAIT_FOR_CLIENTS")
                    || arg.eq_ignore_ascii_case("WAIT_FOR_SERVERS");
                if !valid {
                    return Err(invalid());
                }
                self.admin()?;
                match control::shutdown(app, arg) {
                    Ok(ShutdownMode::Immediate) => Ok(Reply::Exit),
                    Ok(_) => Ok(Reply::Done("SHUTDOWN".into())),
                    Err(_) => Err(invalid()),
                }
            }
            _ => Err(invalid()),
        }
    }

    /// SHOW <what>; None for an unknown name.
    fn show(&self, what: &str) -> Option<Result<Reply, Failure>> {
        if let Some(rs) = show::fake_param(what) {
            return Some(Ok(Reply::Rows(rs)));
        }
        let app = &self.app;
        let rs = match what.to_ascii_lowercase().as_str() {
            "help" => {
                return Some(Ok(Reply::Notice(
                    "Console usage",
                    Some(HELP_DETAIL),
                    "SHOW",
                )));
            }
            "stats" => show::stats(app),
            "stats_totals" => show::stats_totals(app),
            "stats_averages" => show::stats_averages(app),
            "totals" => show::totals(app),
            "servers" => show::servers(app),
            "clients" => show::clients(app),
            "pools" => show::pools(app),
            "lists" => show::lists(app),
            "users" => show::users(app),
            "databases" => show::databases(app),
            "peers" => show::peers(app),
            "peer_pools" => show::peer_pools(),
            "fds" => {
                if let Err(f) = self.admin() {
                    return Some(Err(f));
                }
                show::fds()
            }
            "sockets" => show::sockets(app, false),
            "active_sockets" => show::sockets(app, true),
            "config" => show::config(app),
            "mem" => show::mem(),
            "dns_hosts" => show::dns_hosts(),
            "hosts" => show::hosts(app),
            "dns_zones" => show::dns_zones(),
            "state" => show::state(),
            "version" => show::version(),
            _ => return None,
        };
        Some(Ok(Reply::Rows(rs)))
    }
}

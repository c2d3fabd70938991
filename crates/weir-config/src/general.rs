//! The `[pgbouncer]` section: every option PgBouncer documents, with
//! PgBouncer's default (from the `bouncer_params` table in its src/main.c
//! and doc/config.md).

use std::path::PathBuf;
use std::time::Duration;

use crate::enums::{AuthType, LogFormat, PoolMode, SigtermShutdown, SslMode};
use crate::value::OptionValue;

const fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

const fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

fn some(s: &str) -> Option<String> {
    Some(s.to_owned())
}

/// Declares each option once: the field, its type and PgBouncer's default.
/// The option name in the file is the field name.
macro_rules! general_options {
    ($( $(#[$doc:meta])* $name:ident : $ty:ty = $default:expr; )*) => {
        /// The `[pgbouncer]` section, typed. Field names are PgBouncer's option names.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct General {
            $( $(#[$doc])* pub $name: $ty, )*
        }

        impl Default for General {
            fn default() -> Self {
                Self { $( $name: $default, )* }
            }
        }

        impl General {
            /// Every option name accepted in `[pgbouncer]`, in alphabetical order
            /// (aliases such as `service_name` are not listed).
            pub const OPTION_NAMES: &'static [&'static str] = &[ $( stringify!($name), )* ];

            /// Sets `name` (canonical, lower case) from its raw text.
            /// `None` means there is no such option.
            pub(crate) fn set_option(&mut self, name: &str, raw: &str) -> Option<Result<(), String>> {
                match name {
                    $( stringify!($name) => Some(
                        refuse_reserved(name, raw)
                            .and_then(|()| <$ty as OptionValue>::parse_value(raw))
                            .map(|v| self.$name = v)
                    ), )*
                    _ => None,
                }
            }

            /// Whether option `name` still has PgBouncer's default value
            /// (`true` for names that are not options).
            pub fn is_default(&self, name: &str) -> bool {
                let default = Self::default();
                match name {
                    $( stringify!($name) => self.$name == default.$name, )*
                    _ => true,
                }
            }

            /// The value of option `name` as PgBouncer's `SHOW CONFIG` prints it:
            /// `None` for no such option, `Some(None)` for an unset (NULL) value.
            pub fn show_option(&self, name: &str) -> Option<Option<String>> {
                use crate::value::ShowValue;
                match name {
                    $( stringify!($name) => Some(self.$name.show_value()), )*
                    _ => None,
                }
            }

            pub(crate) fn copy_option(&mut self, from: &General, name: &str) {
                match name {
                    $( stringify!($name) => self.$name = from.$name.clone(), )*
                    _ => {}
                }
            }
        }
    };
}

general_options! {
    /// Users allowed to run all console commands.
    admin_users: Vec<String> = Vec::new();
    application_name_add_host: bool = false;
    /// `[databases]` entry used for `auth_query`.
    auth_dbname: Option<String> = None;
    /// Kept as written; a relative path is relative to the working directory.
    auth_file: Option<PathBuf> = None;
    auth_hba_file: Option<PathBuf> = None;
    auth_ident_file: Option<PathBuf> = None;
    auth_ldap_options: Option<String> = None;
    /// Directory to use instead of /etc/pam.d (in PgBouncer's sample config).
    auth_pam_confdir: Option<PathBuf> = None;
    auth_query: String = "SELECT rolname, CASE WHEN rolvaliduntil < now() THEN NULL ELSE rolpassword END FROM pg_authid WHERE rolname=$1 AND rolcanlogin".to_owned();
    auth_type: AuthType = AuthType::Md5;
    auth_user: Option<String> = None;
    autodb_idle_timeout: Duration = secs(3600);
    cancel_wait_timeout: Duration = secs(10);
    /// Zero disables.
    client_idle_timeout: Duration = secs(0);
    client_login_timeout: Duration = secs(60);
    client_tls13_ciphers: Option<String> = None;
    client_tls_ca_file: Option<PathBuf> = None;
    client_tls_cert_file: Option<PathBuf> = None;
    client_tls_ciphers: String = "default".to_owned();
    client_tls_dheparams: String = "auto".to_owned();
    client_tls_ecdhcurve: String = "auto".to_owned();
    client_tls_key_file: Option<PathBuf> = None;
    client_tls_protocols: String = "secure".to_owned();
    client_tls_sslmode: SslMode = SslMode::Disable;
    /// Config file to use on the next reload, when set in the file.
    conffile: Option<PathBuf> = None;
    default_pool_size: u32 = 20;
    disable_pqexec: bool = false;
    dns_max_ttl: Duration = secs(15);
    dns_nxdomain_ttl: Duration = secs(15);
    dns_zone_check_period: Duration = secs(0);
    /// Weir's own option: how often each host of a database entry with several hosts (or
    /// with target_session_attrs) is checked (login, role, replication lag).
    host_check_interval: Duration = secs(5);
    /// Weir's own option: how long one host check may take.
    host_check_timeout: Duration = secs(2);
    /// Weir's own option: after this many failed checks in a row a host leaves the rotation
    /// (new server connections try it last) until a check succeeds.
    host_failure_threshold: u32 = 3;
    /// Weir's own option, not PgBouncer's: `host:port` of the built-in HTTP endpoint
    /// (Prometheus `/metrics`, `/healthz`, `/readyz` and the dashboard at `/`). Unset (the
    /// default) means no HTTP listener.
    http_listen: Option<String> = None;
    idle_transaction_timeout: Duration = secs(0);
    /// Startup parameters to accept and ignore.
    ignore_startup_parameters: Vec<String> = Vec::new();
    /// Also set by the Windows-only alias `service_name`.
    job_name: String = "pgbouncer".to_owned();
    /// Addresses to listen on; `*` means all; empty means Unix socket only.
    listen_addr: Vec<String> = Vec::new();
    listen_backlog: u32 = 128;
    listen_port: u16 = 6432;
    log_connections: bool = true;
    log_disconnections: bool = true;
    /// Weir's own option: `text` (PgBouncer's layout) or `json` (one object per line, the
    /// same lines with the connection's id, database, user and address as keys of their
    /// own). A reload or the console's SET switches it for the next line.
    log_format: LogFormat = LogFormat::Text;
    log_pooler_errors: bool = true;
    log_stats: bool = true;
    logfile: Option<PathBuf> = None;
    /// Text of a NOTICE every client gets as its login succeeds; unset sends none.
    login_notify_message: Option<String> = None;
    max_client_conn: u32 = 100;
    /// Zero means unlimited.
    max_db_client_connections: u32 = 0;
    /// Zero means unlimited.
    max_db_connections: u32 = 0;
    max_packet_size: u32 = 2_147_483_647;
    max_prepared_statements: u32 = 200;
    /// Weir's own option: with read_write_split, a standby whose replication lag (as the
    /// host checks see it) is over this gets no reads; 0 means no limit.
    max_replica_lag: Duration = secs(0);
    max_user_client_connections: u32 = 0;
    max_user_connections: u32 = 0;
    min_pool_size: u32 = 0;
    /// Zero disables peering.
    peer_id: u32 = 0;
    pidfile: Option<PathBuf> = None;
    /// Weir's own option: in transaction and statement modes, how many waiting clients'
    /// requests may be sent to a busy server behind the one it runs (pipelined
    /// transaction pooling, see README); 0 turns it off. Only single-statement
    /// implicit transactions go, behind one another. 2 carries about three times the
    /// transactions of no pipelining over a 1 ms link (bench/README.md).
    pipeline_depth: u32 = 2;
    /// Weir's own option: nothing is pipelined behind a request that has run this long,
    /// nor behind one of the same text (or prepared statement) once it has.
    pipeline_slow_query: Duration = millis(50);
    pkt_buf: u32 = 4096;
    /// A pool with no clients and no servers for this long is freed; zero disables.
    pool_idle_timeout: Duration = secs(0);
    pool_mode: PoolMode = PoolMode::Session;
    query_timeout: Duration = secs(0);
    query_wait_notify: Duration = secs(5);
    /// Zero disables.
    query_wait_timeout: Duration = secs(120);
    reserve_pool_size: u32 = 0;
    reserve_pool_timeout: Duration = secs(5);
    resolv_conf: Option<PathBuf> = None;
    sbuf_loopcnt: u32 = 5;
    scram_iterations: u32 = 4096;
    server_check_delay: Duration = secs(30);
    /// `None` (empty in the file) disables the check; `<empty>` sends an empty query.
    server_check_query: Option<String> = some("<empty>");
    server_connect_timeout: Duration = secs(15);
    server_fast_close: bool = false;
    server_idle_timeout: Duration = secs(600);
    server_lifetime: Duration = secs(3600);
    server_login_retry: Duration = secs(15);
    /// `None` (empty in the file) means no reset query.
    server_reset_query: Option<String> = some("DISCARD ALL");
    server_reset_query_always: bool = false;
    server_round_robin: bool = false;
    server_tls13_ciphers: Option<String> = None;
    server_tls_ca_file: Option<PathBuf> = None;
    server_tls_cert_file: Option<PathBuf> = None;
    server_tls_ciphers: String = "default".to_owned();
    server_tls_key_file: Option<PathBuf> = None;
    server_tls_protocols: String = "secure".to_owned();
    server_tls_sslmode: SslMode = SslMode::Prefer;
    /// Weir's own option: the longest a graceful shutdown (SIGINT, SIGTERM unless
    /// `shutdown_on_sigterm = immediate`, SHUTDOWN WAIT_FOR_SERVERS or WAIT_FOR_CLIENTS)
    /// waits for clients before closing the rest with 57P01. Zero means no limit, as
    /// PgBouncer.
    shutdown_drain_timeout: Duration = secs(0);
    /// Weir's own option: what SIGTERM does (see `SigtermShutdown`). The default is
    /// PgBouncer 1.23+'s, SHUTDOWN WAIT_FOR_CLIENTS.
    shutdown_on_sigterm: SigtermShutdown = SigtermShutdown::WaitForClients;
    so_reuseport: bool = false;
    stats_period: Duration = secs(60);
    stats_users: Vec<String> = Vec::new();
    suspend_timeout: Duration = secs(10);
    syslog: bool = false;
    syslog_facility: String = "daemon".to_owned();
    syslog_ident: String = "pgbouncer".to_owned();
    /// PgBouncer enables it by default only where TCP_DEFER_ACCEPT exists.
    tcp_defer_accept: bool = cfg!(target_os = "linux");
    tcp_keepalive: bool = true;
    /// Zero means the OS default.
    tcp_keepcnt: u32 = 0;
    /// Seconds; zero means the OS default.
    tcp_keepidle: u32 = 0;
    /// Seconds; zero means the OS default.
    tcp_keepintvl: u32 = 0;
    /// Zero means the OS default.
    tcp_socket_buffer: u32 = 0;
    /// Milliseconds, as PgBouncer takes it; zero means the OS default.
    tcp_user_timeout: u32 = 0;
    track_extra_parameters: Vec<String> = vec!["IntervalStyle".to_owned()];
    transaction_timeout: Duration = secs(0);
    /// `None` (empty in the file) disables the Unix socket; `@name` is abstract.
    unix_socket_dir: Option<String> = some("/tmp");
    unix_socket_group: Option<String> = None;
    /// Written in octal in the file, e.g. `0777`.
    unix_socket_mode: u32 = 0o777;
    /// Unix user to switch to after startup.
    user: Option<String> = None;
    verbose: u32 = 0;
    /// Weir's own option, not PgBouncer's: how many worker threads serve clients, each
    /// with its own event loop, sharing pools and limits. 0 (the default) means half the
    /// CPUs, at least one: on a small machine the pooler shares the cores with PostgreSQL,
    /// and one event loop crossing no threads beats two that keep waking each other.
    workers: u32 = 0;
}

impl General {
    /// Sets an option by the name a user typed (any case, aliases allowed) from
    /// its text, as the admin console's `SET key = value` does.
    pub fn set_by_name(&mut self, key: &str, raw: &str) -> Result<(), String> {
        let name = canonical_name(key).ok_or_else(|| format!("unknown option \"{key}\""))?;
        self.set_option(name, raw)
            .unwrap_or_else(|| Err(format!("unknown option \"{key}\"")))
    }
}

/// A value no option may take, as in PgBouncer: the admin console's database cannot be
/// where auth_query runs.
pub(crate) fn refuse_reserved(name: &str, raw: &str) -> Result<(), String> {
    if name == "auth_dbname" && raw.trim() == "pgbouncer" {
        return Err("cannot use the reserved \"pgbouncer\" database as an auth_dbname".into());
    }
    // PgBouncer holds it in a C int and refuses a value out of 0..=2147483647, in the
    // file (in these words) as by the console's SET.
    if name == "max_prepared_statements"
        && crate::value::parse_int(raw).is_ok_and(|v| !(0..=i64::from(i32::MAX)).contains(&v))
    {
        return Err(format!("invalid max_prepared_statements = {raw}"));
    }
    Ok(())
}

/// Other names PgBouncer accepts for an option.
const ALIASES: &[(&str, &str)] = &[("service_name", "job_name")];

/// Options whose PgBouncer default is NULL. libusual re-applies defaults each
/// time a `[pgbouncer]` header is read, but skips these, so they survive.
pub(crate) const KEPT_ON_SECTION_RESTART: &[&str] = &[
    "auth_dbname",
    "auth_file",
    "auth_ident_file",
    "auth_ldap_options",
    "auth_user",
    "client_tls13_ciphers",
    "conffile",
    "server_tls13_ciphers",
    "user",
    "verbose",
];

/// Maps a key as written to the canonical option name, if there is one.
/// Unlike PgBouncer (which compares exactly), case is ignored.
pub(crate) fn canonical_name(key: &str) -> Option<&'static str> {
    let lower = key.to_ascii_lowercase();
    if let Some((_, target)) = ALIASES.iter().find(|(alias, _)| *alias == lower) {
        return Some(target);
    }
    General::OPTION_NAMES.iter().copied().find(|n| *n == lower)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_pgbouncer() {
        let g = General::default();
        assert_eq!(g.listen_addr, Vec::<String>::new());
        assert_eq!(g.listen_port, 6432);
        assert_eq!(g.unix_socket_dir.as_deref(), Some("/tmp"));
        assert_eq!(g.unix_socket_mode, 0o777);
        assert_eq!(g.pool_mode, PoolMode::Session);
        assert_eq!(g.max_client_conn, 100);
        assert_eq!(g.default_pool_size, 20);
        assert_eq!(g.auth_type, AuthType::Md5);
        assert_eq!(g.auth_file, None);
        assert_eq!(g.server_reset_query.as_deref(), Some("DISCARD ALL"));
        assert_eq!(g.server_check_query.as_deref(), Some("<empty>"));
        assert_eq!(g.server_connect_timeout, secs(15));
        assert_eq!(g.server_login_retry, secs(15));
        assert_eq!(g.client_login_timeout, secs(60));
        assert_eq!(g.query_wait_timeout, secs(120));
        assert_eq!(g.server_lifetime, secs(3600));
        assert_eq!(g.server_idle_timeout, secs(600));
        assert_eq!(g.autodb_idle_timeout, secs(3600));
        assert_eq!(g.reserve_pool_timeout, secs(5));
        assert_eq!(g.cancel_wait_timeout, secs(10));
        assert_eq!(g.max_packet_size, 2_147_483_647);
        assert_eq!(g.pkt_buf, 4096);
        assert_eq!(g.listen_backlog, 128);
        assert_eq!(g.sbuf_loopcnt, 5);
        assert_eq!(g.max_prepared_statements, 200);
        assert_eq!(g.scram_iterations, 4096);
        assert_eq!(g.stats_period, secs(60));
        assert!(g.log_connections && g.log_disconnections && g.log_pooler_errors && g.log_stats);
        assert!(g.tcp_keepalive);
        assert!(!g.syslog);
        assert_eq!(g.log_format, LogFormat::Text);
        assert_eq!(g.syslog_ident, "pgbouncer");
        assert_eq!(g.syslog_facility, "daemon");
        assert_eq!(g.job_name, "pgbouncer");
        assert_eq!(g.client_tls_sslmode, SslMode::Disable);
        assert_eq!(g.server_tls_sslmode, SslMode::Prefer);
        assert_eq!(g.client_tls_protocols, "secure");
        assert_eq!(g.track_extra_parameters, vec!["IntervalStyle".to_owned()]);
        assert!(g
            .auth_query
            .starts_with("SELECT rolname, CASE WHEN rolvaliduntil"));
        assert_eq!(g.verbose, 0);
    }

    #[test]
    fn option_names_are_sorted_and_unique() {
        let names = General::OPTION_NAMES;
        assert!(
            names.windows(2).all(|w| w[0] < w[1]),
            "keep the table alphabetical"
        );
        assert!(names.len() >= 100, "{} options", names.len());
    }

    #[test]
    fn canonical_names_ignore_case_and_resolve_aliases() {
        assert_eq!(canonical_name("listen_port"), Some("listen_port"));
        assert_eq!(canonical_name("Listen_Port"), Some("listen_port"));
        assert_eq!(canonical_name("service_name"), Some("job_name"));
        assert_eq!(canonical_name("no_such_option"), None);
    }

    #[test]
    fn set_option_parses_by_type() {
        let mut g = General::default();
        assert_eq!(g.set_option("listen_port", "7000"), Some(Ok(())));
        assert_eq!(g.listen_port, 7000);
        assert!(matches!(g.set_option("listen_port", "x"), Some(Err(_))));
        assert_eq!(g.set_option("nope", "1"), None);
        for (raw, ok) in [
            ("-1", false),
            ("3147483648", false),
            ("0", true),
            ("2147483647", true),
        ] {
            let r = g.set_option("max_prepared_statements", raw);
            assert_eq!(r.as_ref().map(Result::is_ok), Some(ok), "{raw}: {r:?}");
        }
        assert_eq!(g.max_prepared_statements, 2_147_483_647);
        assert_eq!(g.set_option("unix_socket_dir", ""), Some(Ok(())));
        assert_eq!(g.unix_socket_dir, None);
        assert!(!g.is_default("unix_socket_dir"));
        assert!(g.is_default("max_client_conn"));
    }

    #[test]
    fn kept_options_exist() {
        for name in KEPT_ON_SECTION_RESTART {
            assert!(General::OPTION_NAMES.contains(name), "{name}");
        }
    }
}

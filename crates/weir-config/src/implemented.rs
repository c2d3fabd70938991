//! Which settings Weir acts on. Anything else that a config file sets (to a
//! non-default value) is accepted but reported in `Config::notices`, so an
//! operator migrating from PgBouncer sees what Weir ignores. Extend these
//! lists as features land.

use crate::general::General;

/// `[pgbouncer]` options Weir implements.
pub const IMPLEMENTED: &[&str] = &[
    "admin_users",
    "application_name_add_host",
    "auth_dbname",
    "auth_file",
    "auth_hba_file",
    "auth_ident_file",
    "auth_ldap_options",
    "auth_pam_confdir",
    "auth_query",
    "auth_type",
    "auth_user",
    "cancel_wait_timeout",
    "client_idle_timeout",
    "client_login_timeout",
    "client_tls13_ciphers",
    "client_tls_ca_file",
    "client_tls_cert_file",
    "client_tls_ciphers",
    // rustls chooses the key exchange itself (ECDHE with X25519, P-256 or P-384; no
    // finite-field DHE): these are accepted and have nothing to set.
    "client_tls_dheparams",
    "client_tls_ecdhcurve",
    "client_tls_key_file",
    "client_tls_protocols",
    "client_tls_sslmode",
    "default_pool_size",
    "dns_max_ttl",
    // Weir's own (health checks of a database entry's hosts), not PgBouncer options.
    "host_check_interval",
    "host_check_timeout",
    "host_failure_threshold",
    // Weir's own (the HTTP metrics endpoint), not a PgBouncer option.
    "http_listen",
    "idle_transaction_timeout",
    "ignore_startup_parameters",
    "job_name",
    "listen_addr",
    "listen_backlog",
    "listen_port",
    "log_connections",
    "log_disconnections",
    // Weir's own (JSON lines), not a PgBouncer option.
    "log_format",
    "log_pooler_errors",
    "log_stats",
    "logfile",
    "login_notify_message",
    "max_client_conn",
    "max_db_client_connections",
    "max_db_connections",
    "max_packet_size",
    "max_prepared_statements",
    // Weir's own (read/write splitting), not a PgBouncer option.
    "max_replica_lag",
    "max_user_client_connections",
    "max_user_connections",
    "min_pool_size",
    "peer_id",
    "pidfile",
    // Weir's own (pipelined transaction pooling), not PgBouncer options.
    "pipeline_depth",
    "pipeline_slow_query",
    "pkt_buf",
    "pool_idle_timeout",
    "pool_mode",
    "query_timeout",
    "query_wait_notify",
    "query_wait_timeout",
    "reserve_pool_size",
    "reserve_pool_timeout",
    "server_check_delay",
    "server_check_query",
    "server_connect_timeout",
    "server_fast_close",
    "server_idle_timeout",
    "server_lifetime",
    "server_login_retry",
    "server_reset_query",
    "server_reset_query_always",
    "server_round_robin",
    "server_tls13_ciphers",
    "server_tls_ca_file",
    "server_tls_cert_file",
    "server_tls_ciphers",
    "server_tls_key_file",
    "server_tls_protocols",
    "server_tls_sslmode",
    // Weir's own (graceful shutdown), not PgBouncer options.
    "shutdown_drain_timeout",
    "shutdown_on_sigterm",
    "so_reuseport",
    "stats_period",
    "stats_users",
    "syslog",
    "syslog_facility",
    "syslog_ident",
    "tcp_defer_accept",
    "tcp_keepalive",
    "tcp_keepcnt",
    "tcp_keepidle",
    "tcp_keepintvl",
    "tcp_socket_buffer",
    "tcp_user_timeout",
    "transaction_timeout",
    "unix_socket_dir",
    "unix_socket_group",
    "unix_socket_mode",
    "user",
    "verbose",
    "workers",
];

/// `[databases]` connection-string parameters Weir implements.
pub const IMPLEMENTED_DATABASE_PARAMS: &[&str] = &[
    "auth_dbname",
    "auth_query",
    "auth_user",
    "client_encoding",
    "connect_query",
    "datestyle",
    "dbname",
    "host",
    // Weir's own (a weight per host), not a PgBouncer parameter.
    "host_weights",
    "load_balance_hosts",
    "max_db_client_connections",
    "max_db_connections",
    // Weir's own (read/write splitting), not PgBouncer parameters.
    "max_replica_lag",
    "min_pool_size",
    "password",
    // Weir's own (pipelined transaction pooling), not a PgBouncer parameter.
    "pipeline_depth",
    "pool_mode",
    "pool_size",
    "port",
    "query_wait_timeout",
    "read_write_split",
    "reserve_pool",
    "reserve_pool_size",
    "server_lifetime",
    "target_session_attrs",
    "timezone",
    "user",
];

/// `[users]` parameters Weir implements.
pub const IMPLEMENTED_USER_PARAMS: &[&str] = &[
    "client_idle_timeout",
    "idle_transaction_timeout",
    "max_user_client_connections",
    "max_user_connections",
    "pool_mode",
    "pool_size",
    "query_timeout",
    "query_wait_timeout",
    "reserve_pool_size",
    "transaction_timeout",
];

/// `[databases]` parameters the parser accepts (PgBouncer documents them) but Weir does
/// not act on yet.
pub const UNIMPLEMENTED_DATABASE_PARAMS: &[&str] = &["application_name"];

/// `[users]` parameters the parser accepts but Weir does not act on yet.
pub const UNIMPLEMENTED_USER_PARAMS: &[&str] = &[];

/// The README's list of what is accepted but not acted on yet (between the markers of
/// its "Moving from PgBouncer" section), made from the lists above so that it cannot go
/// stale: a test compares the two.
pub fn unimplemented_markdown() -> String {
    fn listed<'a>(names: impl Iterator<Item = &'a str>) -> String {
        let names: Vec<String> = names.map(|n| format!("`{n}`")).collect();
        if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        }
    }
    let defaults = General::default();
    let general = General::OPTION_NAMES
        .iter()
        .copied()
        .filter(|n| !option_is_implemented(n, &defaults));
    format!(
        "- `[pgbouncer]`: {}.\n\
         - `[databases]` parameters: {}.\n\
         - `[users]` parameters: {}.\n",
        listed(general),
        listed(UNIMPLEMENTED_DATABASE_PARAMS.iter().copied()),
        listed(UNIMPLEMENTED_USER_PARAMS.iter().copied()),
    )
}

/// Whether the current value of a `[pgbouncer]` option is one Weir honours (every value
/// of the options it implements, today; the value is there for options that will not be
/// complete at once).
pub fn option_is_implemented(name: &str, _general: &General) -> bool {
    IMPLEMENTED.contains(&name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::enums::SslMode;

    #[test]
    fn listed_options_exist() {
        for name in IMPLEMENTED {
            assert!(General::OPTION_NAMES.contains(name), "{name}");
        }
    }

    #[test]
    fn no_parameter_is_both_implemented_and_not() {
        for name in UNIMPLEMENTED_DATABASE_PARAMS {
            assert!(!IMPLEMENTED_DATABASE_PARAMS.contains(name), "{name}");
        }
        for name in UNIMPLEMENTED_USER_PARAMS {
            assert!(!IMPLEMENTED_USER_PARAMS.contains(name), "{name}");
        }
    }

    #[test]
    fn every_tls_mode_is_implemented() {
        let mut g = General::default();
        for mode in [
            SslMode::Disable,
            SslMode::Allow,
            SslMode::Require,
            SslMode::VerifyFull,
        ] {
            g.server_tls_sslmode = mode;
            assert!(option_is_implemented("server_tls_sslmode", &g));
            g.client_tls_sslmode = mode;
            assert!(option_is_implemented("client_tls_sslmode", &g));
        }
        assert!(!option_is_implemented("sbuf_loopcnt", &g));
    }
}

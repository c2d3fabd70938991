//! The closed value sets of PgBouncer's lookup options. Like libusual's
//! `cf_set_lookup`, names are matched case-insensitively.

use crate::value::OptionValue;

macro_rules! lookup_enum {
    ($(#[$doc:meta])* $name:ident { $($variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name { $($variant),+ }

        impl $name {
            /// The spelling PgBouncer uses for this value.
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $text),+ }
            }

            pub(crate) fn parse(raw: &str) -> Result<Self, String> {
                $(if raw.eq_ignore_ascii_case($text) { return Ok(Self::$variant); })+
                Err(format!(
                    "invalid value \"{raw}\" (expected one of: {})",
                    [$($text),+].join(", ")
                ))
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl OptionValue for $name {
            fn parse_value(raw: &str) -> Result<Self, String> {
                Self::parse(raw)
            }
        }

        impl crate::value::ShowValue for $name {
            fn show_value(&self) -> Option<String> {
                Some(self.as_str().to_owned())
            }
        }
    };
}

lookup_enum! {
    /// When a server connection goes back to the pool.
    PoolMode { Session = "session", Transaction = "transaction", Statement = "statement" }
}

lookup_enum! {
    /// `auth_type`. `ldap` and `pam` exist only in PgBouncer builds with that support.
    AuthType {
        Any = "any",
        Trust = "trust",
        Plain = "plain",
        Md5 = "md5",
        ScramSha256 = "scram-sha-256",
        Cert = "cert",
        Hba = "hba",
        Ldap = "ldap",
        Pam = "pam",
    }
}

lookup_enum! {
    /// `client_tls_sslmode` / `server_tls_sslmode`.
    SslMode {
        Disable = "disable",
        Allow = "allow",
        Prefer = "prefer",
        Require = "require",
        VerifyCa = "verify-ca",
        VerifyFull = "verify-full",
    }
}

lookup_enum! {
    /// Per-database `load_balance_hosts`; PgBouncer's default is `round-robin`.
    /// `least-outstanding` is Weir's own: a new server connection goes to the host with
    /// the fewest open server connections of the entry.
    LoadBalanceHosts {
        Disable = "disable",
        RoundRobin = "round-robin",
        LeastOutstanding = "least-outstanding",
    }
}

lookup_enum! {
    /// Per-database `target_session_attrs`; PgBouncer's default is `any`.
    TargetSessionAttrs {
        Any = "any",
        ReadWrite = "read-write",
        ReadOnly = "read-only",
        Primary = "primary",
        Standby = "standby",
        PreferStandby = "prefer-standby",
    }
}

lookup_enum! {
    /// Weir's `shutdown_on_sigterm`: which of the admin console's SHUTDOWN modes SIGTERM
    /// means. `immediate` is PgBouncer before 1.23 (and Debian's 1.18); `wait_for_clients`
    /// is PgBouncer 1.23+'s "super safe shutdown"; `wait_for_servers` is SIGINT's safe
    /// shutdown, the drain for Kubernetes.
    SigtermShutdown {
        Immediate = "immediate",
        WaitForServers = "wait_for_servers",
        WaitForClients = "wait_for_clients",
    }
}

lookup_enum! {
    /// Weir's `log_format`: `text` is PgBouncer's line layout, `json` one JSON object per
    /// line for log collectors, with the connection prefix split into fields.
    LogFormat { Text = "text", Json = "json" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_are_case_insensitive() {
        assert_eq!(PoolMode::parse("Transaction"), Ok(PoolMode::Transaction));
        assert_eq!(AuthType::parse("SCRAM-SHA-256"), Ok(AuthType::ScramSha256));
        assert_eq!(SslMode::parse("verify-full"), Ok(SslMode::VerifyFull));
        assert_eq!(
            LoadBalanceHosts::parse("round-robin"),
            Ok(LoadBalanceHosts::RoundRobin)
        );
        assert_eq!(
            TargetSessionAttrs::parse("read-only"),
            Ok(TargetSessionAttrs::ReadOnly)
        );
    }

    #[test]
    fn unknown_values_list_the_choices() {
        let err = PoolMode::parse("sometimes").unwrap_err();
        assert_eq!(
            err,
            "invalid value \"sometimes\" (expected one of: session, transaction, statement)"
        );
        assert!(AuthType::parse("scram").is_err());
    }

    #[test]
    fn display_uses_pgbouncer_spelling() {
        assert_eq!(AuthType::ScramSha256.to_string(), "scram-sha-256");
        assert_eq!(SslMode::VerifyCa.as_str(), "verify-ca");
    }
}

//! One `[databases]` entry: `name = key=value ...`, with the parameters
//! PgBouncer's `parse_database` accepts (src/loader.c) plus those its docs
//! list. `None` everywhere means "not given": inherit the global setting.

use std::time::Duration;

use crate::connstr::{count, decimal, split_pairs, time};
use crate::enums::{LoadBalanceHosts, PoolMode, TargetSessionAttrs};

/// A `[databases]` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Database {
    /// Server-side database name; `None` means the same as the client's.
    pub dbname: Option<String>,
    /// Hosts in order; empty means a Unix socket in `unix_socket_dir`.
    /// A host starting with `/` is a socket directory, with `@` an abstract socket.
    pub host: Vec<String>,
    /// One port for all hosts or one per host; empty means 5432.
    pub port: Vec<u16>,
    /// Forced server user: one pool for the whole database.
    pub user: Option<String>,
    pub password: Option<String>,
    pub auth_user: Option<String>,
    pub auth_query: Option<String>,
    pub auth_dbname: Option<String>,
    pub pool_size: Option<u32>,
    /// Weir's own: this database's `pipeline_depth` (0 turns pipelining off for it).
    pub pipeline_depth: Option<u32>,
    pub min_pool_size: Option<u32>,
    /// Also accepted under its old name `reserve_pool`.
    pub reserve_pool_size: Option<u32>,
    pub max_db_connections: Option<u32>,
    pub max_db_client_connections: Option<u32>,
    pub pool_mode: Option<PoolMode>,
    pub connect_query: Option<String>,
    /// Undocumented in PgBouncer but accepted by its parser.
    pub application_name: Option<String>,
    pub client_encoding: Option<String>,
    pub datestyle: Option<String>,
    pub timezone: Option<String>,
    pub load_balance_hosts: Option<LoadBalanceHosts>,
    /// Weir's own: one weight per host (`host_weights=3,1`), each at least 1; round-robin
    /// and least-outstanding share new server connections out in proportion. Empty: all 1.
    pub host_weights: Vec<u32>,
    pub target_session_attrs: Option<TargetSessionAttrs>,
    /// Weir's own: send reads outside explicit write transactions to the standbys
    /// (`read_write_split=1`), writes to the primary. Pooled modes only.
    pub read_write_split: bool,
    /// Weir's own: a standby further behind than this gets no reads (`None`: the global
    /// `max_replica_lag`).
    pub max_replica_lag: Option<Duration>,
    /// PgBouncer treats 0 here as "not set", so 0 gives `None`.
    pub server_lifetime: Option<Duration>,
    /// `-1` (not set) gives `None`; 0 disables the timeout.
    pub query_wait_timeout: Option<Duration>,
}

/// The PgBouncer default port for server connections.
pub const DEFAULT_PORT: u16 = 5432;

impl Database {
    /// The port to use for the host at `index`.
    pub fn port_for(&self, index: usize) -> u16 {
        match self.port.as_slice() {
            [] => DEFAULT_PORT,
            [one] => *one,
            many => many.get(index).copied().unwrap_or(DEFAULT_PORT),
        }
    }

    /// Parses a connection string. Also returns the canonical names of the
    /// parameters given, in order, so unimplemented ones can be reported.
    pub(crate) fn parse(connstr: &str) -> Result<(Self, Vec<&'static str>), String> {
        let mut db = Database::default();
        let mut given = Vec::new();
        for (key, value) in split_pairs(connstr)? {
            let name = db
                .set(&key, &value)
                .map_err(|e| format!("parameter \"{key}\": {e}"))?;
            given.push(name);
        }
        if db.port.len() > 1 && db.port.len() != db.host.len().max(1) {
            return Err(format!(
                "invalid number of ports: {} given for {} hosts; give one port, or one per host",
                db.port.len(),
                db.host.len()
            ));
        }
        if !db.host_weights.is_empty() && db.host_weights.len() != db.host.len().max(1) {
            return Err(format!(
                "{} host_weights given for {} hosts; give one weight per host",
                db.host_weights.len(),
                db.host.len().max(1)
            ));
        }
        Ok((db, given))
    }

    fn set(&mut self, key: &str, value: &str) -> Result<&'static str, String> {
        let text = || Some(value.to_owned());
        Ok(match key {
            "dbname" => {
                self.dbname = text();
                "dbname"
            }
            "host" => {
                self.host = split_list(value, "host")?;
                "host"
            }
            "port" => {
                self.port = split_list(value, "port")?
                    .iter()
                    .map(|p| parse_port(p))
                    .collect::<Result<_, _>>()?;
                "port"
            }
            "user" => {
                self.user = text();
                "user"
            }
            "password" => {
                self.password = text();
                "password"
            }
            "auth_user" => {
                self.auth_user = text();
                "auth_user"
            }
            "auth_query" => {
                self.auth_query = text();
                "auth_query"
            }
            "auth_dbname" => {
                crate::general::refuse_reserved("auth_dbname", value)?;
                self.auth_dbname = text();
                "auth_dbname"
            }
            "pool_size" => {
                self.pool_size = count(value)?;
                "pool_size"
            }
            "pipeline_depth" => {
                self.pipeline_depth = count(value)?;
                "pipeline_depth"
            }
            "min_pool_size" => {
                self.min_pool_size = count(value)?;
                "min_pool_size"
            }
            "reserve_pool_size" | "reserve_pool" => {
                self.reserve_pool_size = count(value)?;
                "reserve_pool_size"
            }
            "max_db_connections" => {
                self.max_db_connections = count(value)?;
                "max_db_connections"
            }
            "max_db_client_connections" => {
                self.max_db_client_connections = count(value)?;
                "max_db_client_connections"
            }
            "pool_mode" => {
                self.pool_mode = Some(PoolMode::parse(value)?);
                "pool_mode"
            }
            "connect_query" => {
                self.connect_query = text();
                "connect_query"
            }
            "application_name" => {
                self.application_name = text();
                "application_name"
            }
            "client_encoding" => {
                self.client_encoding = text();
                "client_encoding"
            }
            "datestyle" => {
                self.datestyle = text();
                "datestyle"
            }
            "timezone" => {
                self.timezone = text();
                "timezone"
            }
            "load_balance_hosts" => {
                self.load_balance_hosts = Some(LoadBalanceHosts::parse(value)?);
                "load_balance_hosts"
            }
            "host_weights" => {
                self.host_weights = split_list(value, "host weight")?
                    .iter()
                    .map(|w| parse_weight(w))
                    .collect::<Result<_, _>>()?;
                "host_weights"
            }
            "target_session_attrs" => {
                self.target_session_attrs = Some(TargetSessionAttrs::parse(value)?);
                "target_session_attrs"
            }
            "read_write_split" => {
                self.read_write_split = crate::value::parse_bool(value)?;
                "read_write_split"
            }
            "max_replica_lag" => {
                self.max_replica_lag = time(value)?;
                "max_replica_lag"
            }
            "server_lifetime" => {
                self.server_lifetime = time(value)?.filter(|d| !d.is_zero());
                "server_lifetime"
            }
            "query_wait_timeout" => {
                self.query_wait_timeout = time(value)?;
                "query_wait_timeout"
            }
            _ => return Err("unrecognized connection parameter".to_owned()),
        })
    }
}

fn split_list(value: &str, what: &str) -> Result<Vec<String>, String> {
    let items: Vec<String> = value.split(',').map(|s| s.trim().to_owned()).collect();
    if items.iter().any(String::is_empty) {
        return Err(format!("empty {what} in list \"{value}\""));
    }
    Ok(items)
}

pub(crate) fn parse_port(raw: &str) -> Result<u16, String> {
    match decimal(raw) {
        Ok(p) if p > 0 => u16::try_from(p).map_err(|_| format!("invalid port \"{raw}\"")),
        _ => Err(format!("invalid port \"{raw}\"")),
    }
}

/// A host weight: a whole number from 1 to 1000 (a larger spread would be better said
/// with fewer hosts in the list).
fn parse_weight(raw: &str) -> Result<u32, String> {
    match decimal(raw) {
        Ok(w) if (1..=1000).contains(&w) => Ok(w as u32),
        _ => Err(format!(
            "invalid host weight \"{raw}\": give a whole number from 1 to 1000"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Database {
        match Database::parse(s) {
            Ok((db, _)) => db,
            Err(e) => panic!("{s}: {e}"),
        }
    }

    #[test]
    fn empty_connection_string_is_all_defaults() {
        assert_eq!(parse(""), Database::default());
        assert_eq!(parse("").port_for(0), 5432);
    }

    #[test]
    fn all_parameters() {
        let db = parse(
            "dbname=bazdb host=h1,h2 port=5433 user=u password='p w' auth_user=au \
             auth_query='SELECT usename, passwd FROM pg_shadow WHERE usename=$1' auth_dbname=authdb \
             pool_size=10 min_pool_size=2 reserve_pool=3 max_db_connections=50 \
             max_db_client_connections=500 pool_mode=transaction connect_query='SELECT 1' \
             application_name=app client_encoding=UTF8 datestyle=ISO timezone=UTC \
             load_balance_hosts=disable target_session_attrs=read-write server_lifetime=300 \
             query_wait_timeout=5",
        );
        assert_eq!(db.dbname.as_deref(), Some("bazdb"));
        assert_eq!(db.host, vec!["h1", "h2"]);
        assert_eq!(db.port, vec![5433]);
        assert_eq!(db.port_for(1), 5433);
        assert_eq!(db.user.as_deref(), Some("u"));
        assert_eq!(db.password.as_deref(), Some("p w"));
        assert_eq!(db.auth_user.as_deref(), Some("au"));
        assert_eq!(
            db.auth_query.as_deref(),
            Some("SELECT usename, passwd FROM pg_shadow WHERE usename=$1")
        );
        assert_eq!(db.auth_dbname.as_deref(), Some("authdb"));
        assert_eq!(db.pool_size, Some(10));
        assert_eq!(db.min_pool_size, Some(2));
        assert_eq!(db.reserve_pool_size, Some(3));
        assert_eq!(db.max_db_connections, Some(50));
        assert_eq!(db.max_db_client_connections, Some(500));
        assert_eq!(db.pool_mode, Some(PoolMode::Transaction));
        assert_eq!(db.connect_query.as_deref(), Some("SELECT 1"));
        assert_eq!(db.application_name.as_deref(), Some("app"));
        assert_eq!(db.client_encoding.as_deref(), Some("UTF8"));
        assert_eq!(db.datestyle.as_deref(), Some("ISO"));
        assert_eq!(db.timezone.as_deref(), Some("UTC"));
        assert_eq!(db.load_balance_hosts, Some(LoadBalanceHosts::Disable));
        assert_eq!(db.target_session_attrs, Some(TargetSessionAttrs::ReadWrite));
        assert_eq!(db.server_lifetime, Some(Duration::from_secs(300)));
        assert_eq!(db.query_wait_timeout, Some(Duration::from_secs(5)));
    }

    #[test]
    fn ports_per_host() {
        let db = parse("host=a,b,c port=1,2,3");
        assert_eq!(db.port, vec![1, 2, 3]);
        assert_eq!(db.port_for(2), 3);
        assert!(Database::parse("host=a,b port=1,2,3").is_err());
        assert!(Database::parse("port=0").is_err());
        assert!(Database::parse("port=65536").is_err());
        assert!(Database::parse("port=abc").is_err());
        assert!(Database::parse("host=a,,b").is_err());
    }

    #[test]
    fn host_weights_one_per_host() {
        let db = parse("host=a,b host_weights=3,1 load_balance_hosts=least-outstanding");
        assert_eq!(db.host_weights, vec![3, 1]);
        assert_eq!(
            db.load_balance_hosts,
            Some(LoadBalanceHosts::LeastOutstanding)
        );
        assert_eq!(parse("host=a").host_weights, Vec::<u32>::new());
        assert_eq!(
            Database::parse("host=a,b host_weights=3").unwrap_err(),
            "1 host_weights given for 2 hosts; give one weight per host"
        );
        for bad in ["0,1", "-1,1", "x,1", "1,,1", "1001,1", "1.5,1"] {
            let err = Database::parse(&format!("host=a,b host_weights={bad}")).unwrap_err();
            assert!(
                err.starts_with("parameter \"host_weights\""),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn inherit_markers() {
        let db = parse("pool_size=-1 server_lifetime=0 query_wait_timeout=-1");
        assert_eq!(db.pool_size, None);
        assert_eq!(db.server_lifetime, None);
        assert_eq!(db.query_wait_timeout, None);
        assert_eq!(
            parse("query_wait_timeout=0").query_wait_timeout,
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn reports_given_parameters_canonically() {
        let (_, given) = Database::parse("host=x reserve_pool=1 pool_size=2").unwrap();
        assert_eq!(given, vec!["host", "reserve_pool_size", "pool_size"]);
    }

    #[test]
    fn bad_parameters() {
        let err = Database::parse("host=x sslmode=require").unwrap_err();
        assert_eq!(
            err,
            "parameter \"sslmode\": unrecognized connection parameter"
        );
        assert!(Database::parse("pool_size=many").is_err());
        assert!(Database::parse("pool_mode=sometimes").is_err());
        assert!(Database::parse("load_balance_hosts=random").is_err());
        assert!(
            Database::parse("Host=x").is_err(),
            "parameter names are case-sensitive"
        );
    }
}

//! One `[users]` entry: `name = key=value ...`, with the settings PgBouncer
//! documents per user. `None` means "not given": inherit.

use std::time::Duration;

use crate::connstr::{count, split_pairs, time};
use crate::enums::PoolMode;

/// A `[users]` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct User {
    pub pool_mode: Option<PoolMode>,
    pub pool_size: Option<u32>,
    pub reserve_pool_size: Option<u32>,
    pub max_user_connections: Option<u32>,
    pub max_user_client_connections: Option<u32>,
    /// Times: a negative number (PgBouncer documents `-1`) gives `None`.
    pub query_timeout: Option<Duration>,
    pub query_wait_timeout: Option<Duration>,
    pub idle_transaction_timeout: Option<Duration>,
    pub transaction_timeout: Option<Duration>,
    pub client_idle_timeout: Option<Duration>,
}

impl User {
    /// Parses the settings string. Also returns the names of the settings
    /// given, in order, so unimplemented ones can be reported.
    pub(crate) fn parse(settings: &str) -> Result<(Self, Vec<&'static str>), String> {
        let mut user = User::default();
        let mut given = Vec::new();
        for (key, value) in split_pairs(settings)? {
            let name = user
                .set(&key, &value)
                .map_err(|e| format!("parameter \"{key}\": {e}"))?;
            given.push(name);
        }
        Ok((user, given))
    }

    fn set(&mut self, key: &str, value: &str) -> Result<&'static str, String> {
        Ok(match key {
            "pool_mode" => {
                self.pool_mode = Some(PoolMode::parse(value)?);
                "pool_mode"
            }
            "pool_size" => {
                self.pool_size = count(value)?;
                "pool_size"
            }
            "reserve_pool_size" => {
                self.reserve_pool_size = count(value)?;
                "reserve_pool_size"
            }
            "max_user_connections" => {
                self.max_user_connections = count(value)?;
                "max_user_connections"
            }
            "max_user_client_connections" => {
                self.max_user_client_connections = count(value)?;
                "max_user_client_connections"
            }
            "query_timeout" => {
                self.query_timeout = time(value)?;
                "query_timeout"
            }
            "query_wait_timeout" => {
                self.query_wait_timeout = time(value)?;
                "query_wait_timeout"
            }
            "idle_transaction_timeout" => {
                self.idle_transaction_timeout = time(value)?;
                "idle_transaction_timeout"
            }
            "transaction_timeout" => {
                self.transaction_timeout = time(value)?;
                "transaction_timeout"
            }
            "client_idle_timeout" => {
                self.client_idle_timeout = time(value)?;
                "client_idle_timeout"
            }
            _ => return Err("unrecognized user parameter".to_owned()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_settings() {
        let (user, given) = User::parse(
            "pool_mode=statement pool_size=5 reserve_pool_size=1 max_user_connections=10 \
             max_user_client_connections=100 query_timeout=30 query_wait_timeout=-1 \
             idle_transaction_timeout=0.5 transaction_timeout=60 client_idle_timeout=600",
        )
        .unwrap();
        assert_eq!(user.pool_mode, Some(PoolMode::Statement));
        assert_eq!(user.pool_size, Some(5));
        assert_eq!(user.reserve_pool_size, Some(1));
        assert_eq!(user.max_user_connections, Some(10));
        assert_eq!(user.max_user_client_connections, Some(100));
        assert_eq!(user.query_timeout, Some(Duration::from_secs(30)));
        assert_eq!(user.query_wait_timeout, None);
        assert_eq!(
            user.idle_transaction_timeout,
            Some(Duration::from_millis(500))
        );
        assert_eq!(user.transaction_timeout, Some(Duration::from_secs(60)));
        assert_eq!(user.client_idle_timeout, Some(Duration::from_secs(600)));
        assert_eq!(given.len(), 10);
    }

    #[test]
    fn bad_settings() {
        assert_eq!(
            User::parse("pool_mode=session color=blue").unwrap_err(),
            "parameter \"color\": unrecognized user parameter"
        );
        assert!(User::parse("pool_size=x").is_err());
        assert!(User::parse("pool_mode=").is_err());
        assert_eq!(User::parse(""), Ok((User::default(), vec![])));
    }
}

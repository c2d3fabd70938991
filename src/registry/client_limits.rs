//! How many clients are logged in per database and per user (SHOW DATABASES and SHOW USERS
//! `current_client_connections`), and max_db_client_connections and
//! max_user_client_connections, enforced on those same counts.
//!
//! Every logged-in client is counted, limit or not, as PgBouncer counts it: a limit set
//! later with SET or RELOAD applies to the clients already in. Console sessions count
//! under the database `pgbouncer`. A client is counted from `admit` until its registration
//! (ClientHandle, or the console's SessionHandle) is dropped, which calls `leave`.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, MutexGuard};

use crate::protocol::PgError;

#[derive(Default)]
struct Counts {
    databases: HashMap<String, usize>,
    users: HashMap<String, usize>,
}

static COUNTS: LazyLock<Mutex<Counts>> = LazyLock::new(Mutex::default);

fn counts() -> MutexGuard<'static, Counts> {
    COUNTS.lock().unwrap_or_else(|p| p.into_inner())
}

fn up(map: &mut HashMap<String, usize>, name: &str) -> usize {
    match map.get_mut(name) {
        Some(n) => {
            *n += 1;
            *n
        }
        None => {
            map.insert(name.to_owned(), 1);
            1
        }
    }
}

fn down(map: &mut HashMap<String, usize>, name: &str) {
    if let Some(n) = map.get_mut(name) {
        *n -= 1;
        if *n == 0 {
            map.remove(name);
        }
    }
}

/// The limits a login is held to; 0 is no limit.
pub struct Limits {
    pub database: u32,
    pub user: u32,
    /// An admin_users member logging in to the console: counted, never refused (as in
    /// PgBouncer, so that an operator can always get in to see what fills the limits).
    pub exempt: bool,
}

/// A client counted under its database and user. Dropped before `keep`, it is uncounted
/// (a login that failed after being admitted); after `keep`, its registration's drop
/// calls `leave`.
pub struct Admission {
    names: Option<(String, String)>,
}

impl Admission {
    pub fn keep(mut self) {
        self.names = None;
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        if let Some((database, user)) = &self.names {
            leave(database, user);
        }
    }
}

/// Counts one more client of `user` in `database`; refused, with PgBouncer's error, when
/// that goes past a limit (the database's is checked first, as PgBouncer does).
pub fn admit(database: &str, user: &str, limits: &Limits) -> Result<Admission, PgError> {
    let mut c = counts();
    let in_db = up(&mut c.databases, database);
    if !limits.exempt && limits.database > 0 && in_db > limits.database as usize {
        down(&mut c.databases, database);
        return Err(exceeded("max_db_client_connections"));
    }
    let of_user = up(&mut c.users, user);
    if !limits.exempt && limits.user > 0 && of_user > limits.user as usize {
        down(&mut c.databases, database);
        down(&mut c.users, user);
        return Err(exceeded("max_user_client_connections"));
    }
    Ok(Admission {
        names: Some((database.to_owned(), user.to_owned())),
    })
}

fn exceeded(setting: &str) -> PgError {
    PgError::fatal("08P01", format!("client connections exceeded ({setting})"))
}

/// Uncounts a client that has left.
pub fn leave(database: &str, user: &str) {
    let mut c = counts();
    down(&mut c.databases, database);
    down(&mut c.users, user);
}

pub fn in_database(name: &str) -> usize {
    counts().databases.get(name).copied().unwrap_or(0)
}

pub fn of_user(name: &str) -> usize {
    counts().users.get(name).copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_limits_and_frees() {
        let lim = |database, user| Limits {
            database,
            user,
            exempt: false,
        };
        let a = admit("cl_db", "cl_u", &lim(2, 0)).unwrap();
        let b = admit("cl_db", "cl_u2", &lim(2, 0)).unwrap();
        assert_eq!(in_database("cl_db"), 2);
        let e = admit("cl_db", "cl_u", &lim(2, 0)).err().unwrap();
        assert!(e.to_string().contains("max_db_client_connections"));
        assert_eq!((in_database("cl_db"), of_user("cl_u")), (2, 1));
        assert!(admit("cl_db", "cl_u", &lim(0, 1)).is_err());
        assert!(admit(
            "cl_db",
            "cl_u",
            &Limits {
                database: 2,
                user: 1,
                exempt: true
            }
        )
        .is_ok());
        drop(a);
        b.keep();
        assert_eq!((in_database("cl_db"), of_user("cl_u")), (1, 0));
        leave("cl_db", "cl_u2");
        assert_eq!(in_database("cl_db"), 0);
    }
}

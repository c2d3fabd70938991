//! When a pool may try a server login again after one failed.
//!
//! PgBouncer waits server_login_retry (15 s by default) after any failed login. Weir does
//! too when PostgreSQL refused the login itself (bad password, no such database, too many
//! connections): trying again sooner would only repeat the refusal. But when PostgreSQL
//! could not be reached or was not accepting logins yet (down, restarting, starting up),
//! clients queued meanwhile would wait out the whole delay though PostgreSQL may be back
//! a moment later; so those failures are retried after a short backoff (250 ms, doubling
//! to 1 s, never beyond server_login_retry). Clients still only wait up to
//! query_wait_timeout. See docs/recovery.md.

use std::time::{Duration, Instant};

use crate::protocol::PgError;
use crate::server::ConnectError;

const FIRST_RETRY: Duration = Duration::from_millis(250);
const MAX_RETRY: Duration = Duration::from_secs(1);

#[derive(Default)]
pub(super) struct LoginBackoff {
    last: Option<(Instant, PgError)>,
    /// How long after `last` the next attempt may be made.
    delay: Duration,
    /// Unreachable-server failures in a row, for the backoff.
    streak: u32,
    /// Whom the last failure is told to at once.
    tell: TellAtOnce,
}

/// Whom a failed login's error goes to at once, rather than waiting for the retry.
#[derive(Clone, Copy, Default, Debug, PartialEq)]
pub(super) struct TellAtOnce {
    /// Clients queued for a server: PostgreSQL turned the login away (`turns_away`).
    pub waiters: bool,
    /// Clients logging in to a pool with no server to greet them: also when a setting of
    /// Weir's own is at fault (TLS, an authentication method it cannot answer), which
    /// no retry mends. An unreachable server is waited for, as PgBouncer does.
    pub logins: bool,
}

impl LoginBackoff {
    /// Records a failed login; returns what clients are told and when to try again.
    pub fn failed(
        &mut self,
        e: &ConnectError,
        server_login_retry: Duration,
    ) -> (PgError, Duration) {
        let err = e.to_client_error();
        let waiters = turns_away(e);
        self.tell = TellAtOnce {
            waiters,
            logins: waiters || fails_logins(e),
        };
        self.delay = if unreachable(e) {
            let backoff = FIRST_RETRY
                .saturating_mul(1 << self.streak.min(8))
                .min(MAX_RETRY);
            self.streak = self.streak.saturating_add(1);
            backoff.min(server_login_retry)
        } else {
            self.streak = 0;
            server_login_retry
        };
        self.last = Some((Instant::now(), err.clone()));
        (err, self.delay)
    }

    /// The way to log in changed (RELOAD, the console's SET): the last failure no longer
    /// says anything.
    pub fn forget(&mut self) {
        self.succeeded();
    }

    pub fn succeeded(&mut self) {
        self.last = None;
        self.streak = 0;
        self.tell = TellAtOnce::default();
    }

    /// The last failure's error while no new attempt may be made yet, if PostgreSQL
    /// turned that login away.
    pub fn turned_away(&self) -> Option<&PgError> {
        self.blocked().filter(|_| self.tell.waiters)
    }

    /// Whom the last failure goes to at once while no new attempt may be made yet.
    pub fn tell_at_once(&self) -> TellAtOnce {
        self.tell
    }

    /// The last failure's error while no new attempt may be made yet.
    pub fn blocked(&self) -> Option<&PgError> {
        let (at, err) = self.last.as_ref()?;
        (at.elapsed() < self.delay).then_some(err)
    }

    pub fn last(&self) -> Option<&(Instant, PgError)> {
        self.last.as_ref()
    }
}

/// True when PostgreSQL refused the login itself, for a reason that waiting does not
/// remove (the role may not log in, a wrong password, no such database): the clients
/// waiting for a server are told at once (`Pool::connect`) rather than kept until
/// query_wait_timeout, as PgBouncer does. Not class 53 (too many connections, out of
/// memory): there the pool's own servers, as they are released, still serve the waiters.
pub(super) fn turns_away(e: &ConnectError) -> bool {
    match e {
        ConnectError::Server(pg) => !unreachable(e) && !pg.code.starts_with("53"),
        _ => false,
    }
}

/// True when a failure is told to a client logging in at once though its waiters wait:
/// a setting of Weir's own is at fault, or every host answered and none fits
/// target_session_attrs (08001, see server::hosts), which the client is told as a direct
/// libpq connection would.
fn fails_logins(e: &ConnectError) -> bool {
    match e {
        ConnectError::Auth(_) | ConnectError::Protocol(_) | ConnectError::Tls(_) => true,
        ConnectError::Server(pg) => pg.code == "08001",
        ConnectError::Io(_) | ConnectError::Closed | ConnectError::Timeout => false,
    }
}

/// True when PostgreSQL was not there to refuse: no connection, a connection closed or
/// timed out, or a server shutting down or still starting up (SQLSTATE class 57P, 08).
fn unreachable(e: &ConnectError) -> bool {
    match e {
        ConnectError::Io(_) | ConnectError::Closed | ConnectError::Timeout => true,
        ConnectError::Server(pg) => pg.code.starts_with("57P") || pg.code.starts_with("08"),
        // A TLS refusal or a certificate that fails the checks is a setting to fix.
        ConnectError::Auth(_) | ConnectError::Protocol(_) | ConnectError::Tls(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreachable_servers_are_retried_soon_and_refusals_late() {
        let retry = Duration::from_secs(15);
        let mut b = LoginBackoff::default();
        let refused = || ConnectError::Io(std::io::ErrorKind::ConnectionRefused.into());
        let delays: Vec<_> = (0..4).map(|_| b.failed(&refused(), retry).1).collect();
        assert_eq!(
            delays,
            [250, 500, 1000, 1000].map(Duration::from_millis).to_vec()
        );
        assert!(b.blocked().is_some());
        let starting = ConnectError::Server(PgError::fatal(
            "57P03",
            "the database system is starting up",
        ));
        assert_eq!(b.failed(&starting, retry).1, MAX_RETRY);
        assert!(b.turned_away().is_none());
        let auth = ConnectError::Server(PgError::fatal("28P01", "password authentication failed"));
        assert_eq!(b.failed(&auth, retry).1, retry);
        assert!(b.turned_away().is_some());
        let full = ConnectError::Server(PgError::fatal("53300", "too many connections"));
        assert_eq!(b.failed(&full, retry).1, retry);
        assert!(b.turned_away().is_none());
        // Never beyond server_login_retry.
        assert_eq!(
            b.failed(&refused(), Duration::from_millis(100)).1,
            Duration::from_millis(100)
        );
        // An unreachable server is waited for by logins too; no host fitting
        // target_session_attrs is told to them at once.
        assert!(!b.tell_at_once().logins);
        let unfit = ConnectError::Server(PgError::fatal("08001", "no server host fits"));
        b.failed(&unfit, retry);
        assert_eq!(
            b.tell_at_once(),
            TellAtOnce {
                waiters: false,
                logins: true
            }
        );
        b.succeeded();
        assert!(b.blocked().is_none() && b.last().is_none());
    }
}

//! The client-side timeouts (PgBouncer's client_idle_timeout, idle_transaction_timeout,
//! query_timeout, transaction_timeout, query_wait_notify), read once per client from the
//! configuration and kept small because every client carries them for its whole life.

/// The client-side timeouts of PgBouncer, in milliseconds, 0 where disabled: every
/// client carries them for its whole life, so they are kept small.
use std::time::Duration;

#[derive(Debug, Clone, Copy, Default)]
pub struct Timeouts {
    client_idle: u32,
    idle_transaction: u32,
    query: u32,
    transaction: u32,
    query_wait_notify: u32,
}

impl Timeouts {
    pub(super) fn from_config(
        g: &weir_config::General,
        user: Option<&weir_config::User>,
    ) -> Timeouts {
        // A nonzero timeout never rounds down to "disabled".
        let ms = |d: Duration| {
            if d.is_zero() {
                0
            } else {
                d.as_millis().clamp(1, u32::MAX.into()) as u32
            }
        };
        // A per-user value in [users] wins over the global one; 0 disables.
        let pick = |per_user: fn(&weir_config::User) -> Option<Duration>, global: Duration| {
            ms(user.and_then(per_user).unwrap_or(global))
        };
        Timeouts {
            client_idle: pick(|u| u.client_idle_timeout, g.client_idle_timeout),
            idle_transaction: pick(|u| u.idle_transaction_timeout, g.idle_transaction_timeout),
            query: pick(|u| u.query_timeout, g.query_timeout),
            transaction: pick(|u| u.transaction_timeout, g.transaction_timeout),
            query_wait_notify: ms(g.query_wait_notify),
        }
    }

    fn get(ms: u32) -> Option<Duration> {
        (ms != 0).then(|| Duration::from_millis(ms.into()))
    }

    pub fn client_idle(&self) -> Option<Duration> {
        Self::get(self.client_idle)
    }

    pub fn idle_transaction(&self) -> Option<Duration> {
        Self::get(self.idle_transaction)
    }

    pub fn query(&self) -> Option<Duration> {
        Self::get(self.query)
    }

    pub fn transaction(&self) -> Option<Duration> {
        Self::get(self.transaction)
    }

    pub fn query_wait_notify(&self) -> Option<Duration> {
        Self::get(self.query_wait_notify)
    }

    /// True when the relay has a deadline to watch at all.
    pub fn relay_has_any(&self) -> bool {
        self.idle_transaction != 0 || self.query != 0 || self.transaction != 0
    }
}

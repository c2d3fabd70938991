//! Passwords checked by someone else: PAM (`auth_type = pam`) and an LDAP server
//! (`auth_type = ldap`, hba `ldap`). Both are blocking calls (libpam, and the LDAP client's
//! own small runtime, with timers the workers' runtimes do not have), so each check runs
//! on Tokio's blocking pool, a few at once per kind, as PgBouncer runs them on a thread of
//! their own: a slow PAM module or LDAP server makes logins wait, never the relay.

pub mod ldap;
pub mod pam;

use tokio::sync::Semaphore;

/// How many checks of one kind run at once; more wait their turn (their login timeout
/// still runs). PgBouncer has one thread per kind; a few let a slow check not hold up
/// every other login.
const AT_ONCE: usize = 4;

static PAM_SLOTS: Semaphore = Semaphore::const_new(AT_ONCE);
static LDAP_SLOTS: Semaphore = Semaphore::const_new(AT_ONCE);

/// Runs `check` on the blocking pool once one of `slots` is free. False if the check
/// could not run (its thread panicked): a failed login, never an open door.
async fn run_blocking<F>(slots: &'static Semaphore, check: F) -> bool
where
    F: FnOnce() -> bool + Send + 'static,
{
    let Ok(_permit) = slots.acquire().await else {
        return false;
    };
    tokio::task::spawn_blocking(check).await.unwrap_or(false)
}

//! The file descriptor limit. Every client and every server connection is a descriptor;
//! a shell's default soft limit (1024) would cap max_client_conn silently, so the soft
//! limit is raised to the hard one at startup, and the figures are logged as PgBouncer
//! logs them.

use weir_config::Config;

pub struct FdLimit {
    pub soft: u64,
    pub hard: u64,
    /// Clients plus the servers the pools may open, plus a few for listeners and files.
    pub expected: u64,
}

/// Raises the soft RLIMIT_NOFILE to the hard limit; returns the limits now in force.
pub fn raise(config: &Config) -> Option<FdLimit> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit write or read only the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return None;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim = raised;
            }
        }
    }
    Some(FdLimit {
        soft: lim.rlim_cur,
        hard: lim.rlim_max,
        expected: expected_fds(config),
    })
}

/// PgBouncer's estimate: every client, and for every database its pool (and reserve),
/// once per user it knows of.
fn expected_fds(config: &Config) -> u64 {
    let g = &config.general;
    let users = config.users.len().max(1) as u64;
    let servers: u64 = config
        .databases
        .iter()
        .map(|(_, db)| {
            let size = db.pool_size.unwrap_or(g.default_pool_size);
            let reserve = db.reserve_pool_size.unwrap_or(g.reserve_pool_size);
            u64::from(size) + u64::from(reserve)
        })
        .sum();
    u64::from(g.max_client_conn) + servers * users + 10
}

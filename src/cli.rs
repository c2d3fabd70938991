//! The command line (PgBouncer's) and the process-level chores it asks for: daemonizing,
//! switching user, the pidfile.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use clap::Parser;

/// The PgBouncer release whose console, wording and settings Weir follows.
macro_rules! compat_version {
    () => {
        "1.24.1"
    };
}
pub const COMPAT_VERSION: &str = compat_version!();

/// What `-V` prints and SHOW VERSION answers, alike: PgBouncer's `PgBouncer X.Y.Z` first,
/// which exporters parse, then Weir's own version.
pub const VERSION: &str = concat!(
    "PgBouncer ",
    compat_version!(),
    " (weir ",
    env!("CARGO_PKG_VERSION"),
    ")"
);

#[derive(Debug, Parser)]
#[command(
    name = "weir",
    // clap prints `<display_name> <version>`: together, VERSION.
    display_name = "PgBouncer",
    version = VERSION.strip_prefix("PgBouncer ").unwrap_or(VERSION),
    about = "PostgreSQL connection pooler, a drop-in replacement for PgBouncer"
)]
pub struct Args {
    /// Run in the background (requires logfile or syslog).
    #[arg(short = 'd', long = "daemon")]
    pub daemon: bool,
    /// Do not log to stderr.
    #[arg(short = 'q', long = "quiet")]
    pub quiet: bool,
    /// More verbose logging; repeat for more.
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Online restart: take over the listening sockets and the idle clients of the Weir
    /// running with this configuration, which then exits once its last transaction ends.
    #[arg(short = 'R', long = "reboot", visible_alias = "takeover")]
    pub reboot: bool,
    /// Switch to this user at startup.
    #[arg(short = 'u', long = "user")]
    pub user: Option<String>,
    /// The configuration file, in PgBouncer's pgbouncer.ini format.
    pub config: PathBuf,
}

/// Refuses to start over the pidfile of a running instance; a stale one is replaced.
pub fn check_pidfile(path: &Path) -> Result<(), String> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(());
    };
    if let Ok(pid) = text.trim().parse::<i32>() {
        // SAFETY: kill with signal 0 only checks that the process exists.
        if pid > 0 && unsafe { libc::kill(pid, 0) } == 0 {
            return Err(format!(
                "pidfile {} exists and process {pid} is running: is another instance running?",
                path.display()
            ));
        }
    }
    Ok(())
}

pub fn write_pidfile(path: &Path) -> Result<(), String> {
    std::fs::write(path, format!("{}\n", std::process::id()))
        .map_err(|e| format!("cannot write pidfile {}: {e}", path.display()))
}

/// At exit: removes the pidfile unless it names another process (the one an online
/// restart handed over to).
pub fn remove_pidfile_if_ours(path: &Path) {
    let ours =
        std::fs::read_to_string(path).is_ok_and(|t| t.trim() == std::process::id().to_string());
    if ours {
        let _ = std::fs::remove_file(path);
    }
}

pub fn daemonize() -> std::io::Result<()> {
    // SAFETY: called before any threads exist (the runtime starts after), so fork is safe.
    match unsafe { libc::fork() } {
        -1 => return Err(std::io::Error::last_os_error()),
        0 => {}
        _ => std::process::exit(0),
    }
    // SAFETY: plain system calls on our own process and freshly opened descriptors.
    unsafe {
        if libc::setsid() == -1 {
            return Err(std::io::Error::last_os_error());
        }
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            libc::dup2(null, 0);
            libc::dup2(null, 1);
            libc::dup2(null, 2);
            if null > 2 {
                libc::close(null);
            }
        }
    }
    Ok(())
}

pub fn switch_user(name: &str) -> Result<(), String> {
    let cname = CString::new(name).map_err(|_| format!("bad user name {name:?}"))?;
    // SAFETY: getpwnam returns a pointer into static storage, read at once and not kept.
    unsafe {
        let pw = libc::getpwnam(cname.as_ptr());
        if pw.is_null() {
            return Err(format!("user {name} not found"));
        }
        let (uid, gid) = ((*pw).pw_uid, (*pw).pw_gid);
        if libc::geteuid() == uid {
            return Ok(());
        }
        if libc::initgroups(cname.as_ptr(), gid) != 0
            || libc::setgid(gid) != 0
            || libc::setuid(uid) != 0
        {
            return Err(format!(
                "cannot switch to user {name}: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

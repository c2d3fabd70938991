//! systemd's `Type=notify` protocol (sd_notify(3)): one datagram of `KEY=value` lines
//! to the Unix socket named by `NOTIFY_SOCKET`. Hand-rolled: it is a dozen lines, and a
//! crate for it would be one more dependency to audit for no gain.

use std::os::unix::net::UnixDatagram;

/// Tells the service manager `state` (e.g. `READY=1`), if Weir runs under one. Failures
/// are logged and otherwise ignored: a pooler must not stop serving because its
/// supervisor's socket went away.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    if let Err(e) = send(&path, state) {
        tracing::warn!("cannot notify systemd ({state:?}): {e}");
    }
}

fn send(path: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_bytes();
    let addr = match bytes.strip_prefix(b"@") {
        // '@' stands for the leading NUL of an abstract socket name.
        #[cfg(target_os = "linux")]
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            std::os::unix::net::SocketAddr::from_abstract_name(name)?
        }
        #[cfg(not(target_os = "linux"))]
        Some(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "abstract sockets exist only on Linux",
            ))
        }
        None => std::os::unix::net::SocketAddr::from_pathname(path)?,
    };
    let sock = UnixDatagram::unbound()?;
    sock.send_to_addr(state.as_bytes(), &addr)?;
    Ok(())
}

/// `RELOADING=1` with the CLOCK_MONOTONIC timestamp systemd asks for since v253 (it
/// ignores a RELOADING=1 without one when the unit is `Type=notify-reload`).
pub fn reloading() {
    notify(&format!("RELOADING=1\nMONOTONIC_USEC={}", monotonic_usec()));
}

fn monotonic_usec() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000 + (ts.tv_nsec as u64) / 1_000
}

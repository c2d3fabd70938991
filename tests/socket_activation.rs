//! systemd socket activation: sockets passed as LISTEN_FDS (from descriptor 3, for the
//! process named by LISTEN_PID) are served instead of listen_addr and unix_socket_dir.

// Tests run on their own runtime, which has a time driver (clippy.toml is for Weir's
// workers).
#![allow(clippy::disallowed_methods)]

mod common;

use common::weir::weir_bin;
use common::*;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::Stdio;

/// A TCP socket and a Unix socket made by "systemd" (this test), listening before Weir
/// starts: Weir serves both, and binds neither its configured port nor its own Unix
/// socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sockets_from_systemd_are_served() {
    let pg = PgServer::start();
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let tcp_port = tcp.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let unix_port = free_port();
    let unix_path = dir.path().join(format!(".s.PGSQL.{unix_port}"));
    let unix = std::os::unix::net::UnixListener::bind(&unix_path).unwrap();
    let own_port = free_port();
    let config = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .set("workers", 2)
        .write(dir.path(), own_port);
    let (tcp_fd, unix_fd) = (tcp.as_raw_fd(), unix.as_raw_fd());
    let log = std::fs::File::create(dir.path().join("stderr.log")).unwrap();
    let mut cmd = clean_command("sh");
    // $$ is the shell's pid, which exec gives to Weir.
    cmd.args([
        "-c",
        "LISTEN_PID=$$ LISTEN_FDS=2 exec \"$0\" \"$@\"",
        weir_bin(),
    ])
    .arg(&config)
    .stdout(Stdio::null())
    .stderr(Stdio::from(log));
    // SAFETY: only dup2 between fork and exec; the source descriptors stay open in the
    // parent until the child has started.
    unsafe {
        cmd.pre_exec(move || {
            // Out of the way first, in case either already sits on 3 or 4.
            let (a, b) = (libc::dup(tcp_fd), libc::dup(unix_fd));
            if a < 0 || b < 0 || libc::dup2(a, 3) < 0 || libc::dup2(b, 4) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let c = {
        let started = std::time::Instant::now();
        loop {
            match connect(tcp_port, "postgres", "postgres").await {
                Ok(c) => break c,
                Err(e) => {
                    assert!(
                        started.elapsed() < TIMEOUT,
                        "no answer on the activated socket: {e}\n{}",
                        std::fs::read_to_string(dir.path().join("stderr.log")).unwrap_or_default()
                    );
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    };
    assert_eq!(q1(&c, "select 1").await, "1");
    let mut over_unix = pg_config(unix_port, "postgres", "postgres");
    over_unix.host_path(dir.path());
    let u = connect_with(&over_unix).await.unwrap();
    assert_eq!(q1(&u, "select 2").await, "2");
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", own_port)).is_err(),
        "Weir bound its configured port too"
    );
    assert!(
        !dir.path().join(format!(".s.PGSQL.{own_port}")).exists(),
        "Weir made its own Unix socket too"
    );
    let _ = child.kill();
    let _ = child.wait();
    drop((tcp, unix));
}

//! Peers (`peer_id`, `[peers]`): two Weir processes share one TCP port (so_reuseport),
//! and a cancel request that reaches the one not holding the client is passed on to the
//! one that does, as PgBouncer 1.19+ does behind a load balancer.

mod common;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use common::proto::{cancel_request, cancel_request_key, query};
use common::*;

fn peer(pg: &PgServer, id: u32, port: u16, dirs: &[&Path; 2]) -> Weir {
    Weir::for_pg(pg)
        .set("pool_mode", "transaction")
        .set("admin_users", "postgres")
        .listen_on(port)
        .set("so_reuseport", 1)
        .set("peer_id", id)
        .set("unix_socket_dir", dirs[id as usize - 1].display())
        .extra(&format!(
            "\n[peers]\n1 = host={} port={port}\n2 = host={} port={port}\n",
            dirs[0].display(),
            dirs[1].display()
        ))
        .start()
}

/// Two peers on one port, each also on a Unix socket in its own directory.
struct Peers {
    port: u16,
    _dirs: [tempfile::TempDir; 2],
    paths: [std::path::PathBuf; 2],
    weirs: [Weir; 2],
}

fn two_peers(pg: &PgServer) -> Peers {
    let port = free_port();
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let paths = [dirs[0].path().to_owned(), dirs[1].path().to_owned()];
    let both = [paths[0].as_path(), paths[1].as_path()];
    let weirs = [peer(pg, 1, port, &both), peer(pg, 2, port, &both)];
    Peers {
        port,
        _dirs: dirs,
        paths,
        weirs,
    }
}

impl Peers {
    fn dirs(&self) -> [&Path; 2] {
        [self.paths[0].as_path(), self.paths[1].as_path()]
    }

    fn logs(&self) -> String {
        format!("{}\n{}", self.weirs[0].log_tail(), self.weirs[1].log_tail())
    }

    /// `c`'s query ends cancelled (57014) within 10 s.
    fn expect_cancelled(&self, c: &mut RawConn, attempt: usize) {
        c.set_read_timeout(Duration::from_secs(10));
        let err = c
            .error_or_eof()
            .unwrap_or_else(|| panic!("attempt {attempt}: no error\n{}", self.logs()));
        assert_eq!(
            err.code,
            "57014",
            "attempt {attempt}: {err:?}\n{}",
            self.logs()
        );
        c.read_until_ready();
    }
}

/// Sends a cancel request to the Weir listening in `dir`.
fn cancel_via(dir: &Path, port: u16, key: (i32, i32)) {
    let mut s = UnixStream::connect(dir.join(format!(".s.PGSQL.{port}"))).unwrap();
    s.write_all(&cancel_request(key.0, key.1)).unwrap();
}

/// The same with a whole key of any length (protocol 3.2).
fn cancel_key_via(dir: &Path, port: u16, pid: i32, secret: &[u8]) {
    let mut s = UnixStream::connect(dir.join(format!(".s.PGSQL.{port}"))).unwrap();
    s.write_all(&cancel_request_key(pid, secret)).unwrap();
}

/// Which of the two Weirs holds client `c`: its console (reached over its own Unix
/// socket) lists the client's address and port, as PgBouncer's SHOW CLIENTS does (its
/// `id` is the console's own counter, not the cancel key).
fn holder(dirs: &[&Path; 2], port: u16, c: &RawConn) -> usize {
    let client_port = c
        .stream
        .local_addr()
        .expect("local address")
        .port()
        .to_string();
    for (i, dir) in dirs.iter().enumerate() {
        let dir = dir.display().to_string();
        let rows = psql_at(&dir, port, "pgbouncer", "postgres", None, "SHOW CLIENTS")
            .unwrap_or_else(|e| panic!("console of peer {}: {e}", i + 1));
        if rows.split(['|', '\n']).any(|v| v == client_port) {
            return i;
        }
    }
    panic!("no peer lists a client from port {client_port}");
}

#[test]
fn a_cancel_that_lands_on_the_other_peer_is_passed_on() {
    let pg = PgServer::start();
    let peers = two_peers(&pg);
    let (port, dirs) = (peers.port, peers.dirs());
    for attempt in 0..4 {
        // Over TCP the kernel picks one of the two processes for each connection.
        let mut c = RawConn::startup(port, "postgres", "postgres", &[]).unwrap();
        let key = c.key.expect("BackendKeyData");
        let held_by = holder(&dirs, port, &c);
        c.send(&query("select pg_sleep(30)"));
        assert!(eventually(Duration::from_secs(10), || pg
            .count_backends_where(
                "query = 'select pg_sleep(30)' and state = 'active'"
            )
            == 1));
        // The cancel goes to the other process, which must pass it on.
        let other = dirs[1 - held_by];
        cancel_via(other, port, key);
        peers.expect_cancelled(&mut c, attempt);
    }
}

/// A protocol 3.2 client's 32-byte key is passed on whole: with its own tail it cancels
/// the query at the peer that holds the client, with another it cancels nothing there.
#[test]
fn a_long_key_is_passed_on_whole() {
    let pg = PgServer::start();
    let peers = two_peers(&pg);
    let (port, dirs) = (peers.port, peers.dirs());
    let sleeping = || pg.count_backends_where("query = 'select pg_sleep(30)' and state = 'active'");
    for attempt in 0..4 {
        let mut c = RawConn::startup_minor(port, 2);
        assert_eq!(c.secret.len(), 32, "a 3.2 client's key");
        let (pid, _) = c.key.expect("BackendKeyData");
        let other = dirs[1 - holder(&dirs, port, &c)];
        c.send(&query("select pg_sleep(30)"));
        assert!(eventually(Duration::from_secs(10), || sleeping() == 1));
        let mut forged = c.secret.clone();
        forged[20] ^= 0x40;
        cancel_key_via(other, port, pid, &forged);
        cancel_key_via(other, port, pid, &c.secret[..4]);
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            sleeping(),
            1,
            "attempt {attempt}: a forged key cancelled the query"
        );
        cancel_key_via(other, port, pid, &c.secret);
        peers.expect_cancelled(&mut c, attempt);
    }
}

/// A key whose time to live is spent is not passed on (a loop between peers ends).
#[test]
fn a_cancel_with_no_time_to_live_left_is_dropped() {
    let pg = PgServer::start();
    let peers = two_peers(&pg);
    let (port, dirs) = (peers.port, peers.dirs());
    let mut c = RawConn::startup(port, "postgres", "postgres", &[]).unwrap();
    let key = c.key.expect("BackendKeyData");
    let held_by = holder(&dirs, port, &c);
    // The holder's stamp, with its time to live (the low 2 bits) taken to 0.
    assert_eq!(
        (key.1 as u32) >> 16,
        held_by as u32 + 1,
        "a peer stamps its id on its keys"
    );
    c.send(&query("select pg_sleep(1), 'finished'"));
    cancel_via(dirs[1 - held_by], port, (key.0, key.1 & !3));
    c.set_read_timeout(Duration::from_secs(10));
    let msgs = c.read_until_ready();
    assert!(
        msgs.iter().all(|m| m.tag != b'E'),
        "a spent key was passed on: {msgs:?}\n{}",
        peers.logs()
    );
}

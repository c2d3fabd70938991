//! Protocol 3.2 (PostgreSQL 18, libpq's max_protocol_version=3.2), whose one change is a
//! longer cancel key (4 to 256 bytes; PostgreSQL 18 gives 32). Weir asks its servers for
//! 3.2 and keeps whatever key they give; a client asking for 3.2 gets it, with a 32-byte
//! key of Weir's own that a cancel request must name whole.

mod common;

use common::proto::{cancel_request_key, query, startup_message_version};
use common::*;

/// A client logged in asking for protocol 3.`minor`: the NegotiateProtocolVersion body
/// it was sent, if any, and its BackendKeyData (pid, secret).
struct Login {
    conn: RawConn,
    negotiated: Option<Vec<u8>>,
    pid: i32,
    secret: Vec<u8>,
}

fn login(port: u16, minor: u16, options: &[(&str, &str)]) -> Login {
    let mut conn = RawConn::connect(port);
    let mut params = vec![("user", "postgres"), ("database", "postgres")];
    params.extend_from_slice(options);
    conn.send(&startup_message_version(3, minor, &params));
    let msgs = conn.read_until_ready();
    let body = |tag| msgs.iter().find(|m| m.tag == tag).map(|m| m.body.clone());
    let key = body(b'K').expect("no BackendKeyData");
    Login {
        conn,
        negotiated: body(b'v'),
        pid: i32::from_be_bytes([key[0], key[1], key[2], key[3]]),
        secret: key[4..].to_vec(),
    }
}

/// Sends a cancel request naming `secret`; Weir closes the connection either way.
fn cancel(port: u16, pid: i32, secret: &[u8]) {
    let mut c = RawConn::connect(port);
    c.send(&cancel_request_key(pid, secret));
    assert!(c.closes(), "a cancel connection must be closed");
}

const SLEEP: &str = "select pg_sleep(30), 'not cancelled'";

fn sleeping(pg: &PgServer) -> i64 {
    pg.count_backends_where("query = 'select pg_sleep(30), ''not cancelled''' and state = 'active'")
}

/// Runs a 30 s sleep for `c`, tries each of `forged` (which must cancel nothing), then
/// cancels it with its own key: the client gets 57014 and the sleep is gone.
fn cancel_whole_key_only(pg: &PgServer, port: u16, c: &mut Login, forged: &[Vec<u8>]) {
    c.conn.send(&query(SLEEP));
    assert!(
        eventually(TIMEOUT, || sleeping(pg) == 1),
        "the sleep never ran"
    );
    for f in forged {
        cancel(port, c.pid, f);
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(sleeping(pg), 1, "a forged key cancelled the query");
    cancel(port, c.pid, &c.secret);
    let e = c.conn.expect_error();
    assert_eq!(e.code, "57014", "{e:?}");
    c.conn.read_until_ready();
    assert!(
        eventually(TIMEOUT, || sleeping(pg) == 0),
        "the sleep still runs"
    );
    assert_eq!(c.conn.query_one("select 'still here'"), "still here");
}

/// A client asking for 3.2 of Weir in front of PostgreSQL 15 (which speaks 3.0) gets 3.2
/// without a NegotiateProtocolVersion and a 32-byte key. A cancel must give all of it:
/// the first 4 bytes alone, or the right first 4 and a wrong rest, cancel nothing, and a
/// key over 256 bytes is refused; the key itself cancels the query on the server, which
/// Weir reaches with the server's own 4-byte key (PostgreSQL 15 answers Weir's request
/// for 3.2 with NegotiateProtocolVersion, and goes on in 3.0). A 3.0 client still has a
/// 4-byte key.
#[test]
fn a_3_2_client_gets_a_long_key_that_cancels_only_whole() {
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg)
        .set("pool_mode", "transaction")
        .arg("-v")
        .start();
    let mut c = login(weir.port(), 2, &[]);
    assert_eq!(c.negotiated, None);
    assert_eq!(
        c.secret.len(),
        32,
        "a 3.2 client's key is PostgreSQL 18's length"
    );
    let mut wrong_rest = c.secret.clone();
    wrong_rest[31] ^= 1;
    let mut too_long = c.secret.clone();
    too_long.resize(257, 0);
    let forged = [c.secret[..4].to_vec(), wrong_rest, too_long, Vec::new()];
    cancel_whole_key_only(&pg, weir.port(), &mut c, &forged);

    let mut old = login(weir.port(), 0, &[]);
    assert_eq!((old.negotiated.clone(), old.secret.len()), (None, 4));
    let mut longer = old.secret.clone();
    longer.extend_from_slice(&[0; 28]);
    cancel_whole_key_only(&pg, weir.port(), &mut old, &[longer]);
    // PostgreSQL 15, asked for 3.2, answered NegotiateProtocolVersion and went on in 3.0.
    assert!(
        weir.log()
            .contains("logged in with protocol 3.0, a cancel key of 4 bytes"),
        "{}",
        weir.log_tail()
    );
}

/// What a client asking for 3.`minor` (with protocol options) is told before it logs in
/// is byte for byte what PostgreSQL 18 tells it: nothing for 3.0 and 3.2 alone,
/// NegotiateProtocolVersion naming 3.2 for a newer minor, 3.0 for 3.1 (reserved, never a
/// protocol), and the options it did not know; with a key as long as PostgreSQL 18's.
#[test]
fn negotiation_is_postgresql_18s() {
    let pg18 = PgServer::start_18();
    let pg = PgServer::start();
    let weir = Weir::for_pg(&pg).start();
    let options: &[(&str, &str)] = &[("_pq_.compression", "on")];
    for (minor, options) in [
        (0, &[][..]),
        (1, &[]),
        (2, &[]),
        (3, &[]),
        (9, &[]),
        (0, options),
        (1, options),
        (2, options),
        (9, options),
    ] {
        let direct = login(pg18.port(), minor, options);
        let through = login(weir.port(), minor, options);
        assert_eq!(
            (through.negotiated, through.secret.len()),
            (direct.negotiated, direct.secret.len()),
            "3.{minor} {options:?}: Weir, then PostgreSQL 18"
        );
    }
}

/// Weir asks PostgreSQL 18 for 3.2 and keeps its 32-byte key: clients of 3.2 and 3.0
/// alike cancel their queries there (PostgreSQL 18 ignores a cancel whose key is not the
/// whole of its own), in transaction and session mode.
#[test]
fn weir_speaks_3_2_to_postgresql_18() {
    let pg = PgServer::start_18();
    for mode in ["transaction", "session"] {
        let weir = Weir::for_pg(&pg).set("pool_mode", mode).arg("-v").start();
        for minor in [2, 0] {
            let mut c = login(weir.port(), minor, &[]);
            cancel_whole_key_only(&pg, weir.port(), &mut c, &[]);
        }
        let log = weir.log();
        assert!(
            log.contains("logged in with protocol 3.2, a cancel key of 32 bytes"),
            "{mode}: no server login in 3.2 with a 32-byte key:\n{}",
            weir.log_tail()
        );
    }
}

/// A server in front of `pg` that knows only protocol 3.0, as some proxies and older
/// poolers do: it refuses a StartupMessage asking for anything else with 08P01 (as
/// PgBouncer refuses what it cannot read) and passes everything else on, in the clear.
/// Counts refusals.
struct Only30 {
    port: u16,
    refused: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Only30 {
    fn start(pg: &PgServer) -> Only30 {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let refused = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (count, pg_port) = (refused.clone(), pg.port());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let count = count.clone();
                std::thread::spawn(move || {
                    let mut client = client;
                    let mut head = [0u8; 8];
                    if client.read_exact(&mut head).is_err() {
                        return;
                    }
                    // No TLS here: Weir's SSLRequest is declined, and its startup follows.
                    if head[4..] == 80_877_103u32.to_be_bytes()
                        && (client.write_all(b"N").is_err()
                            || client.read_exact(&mut head).is_err())
                    {
                        return;
                    }
                    let version = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
                    if version >> 16 == 3 && version != 196_608 {
                        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let mut body = b"SFATAL\0C08P01\0Mbad packet header\0\0".to_vec();
                        let mut e = vec![b'E'];
                        e.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
                        e.append(&mut body);
                        let _ = client.write_all(&e);
                        return;
                    }
                    let Ok(mut server) = std::net::TcpStream::connect(("127.0.0.1", pg_port))
                    else {
                        return;
                    };
                    let _ = server.write_all(&head);
                    let (mut c2, mut s2) =
                        (client.try_clone().unwrap(), server.try_clone().unwrap());
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut s2, &mut c2);
                        let _ = c2.shutdown(std::net::Shutdown::Both);
                    });
                    let _ = std::io::copy(&mut client, &mut server);
                    let _ = server.shutdown(std::net::Shutdown::Write);
                });
            }
        });
        Only30 { port, refused }
    }

    fn refusals(&self) -> usize {
        self.refused.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A server that refuses protocol 3.2 instead of negotiating is asked for 3.0 again at
/// once, and for 3.0 alone from then on: its clients (3.2 ones too) are served, cancels
/// included, at the cost of one refused login.
#[test]
fn a_server_that_refuses_3_2_is_asked_for_3_0() {
    let pg = PgServer::start();
    let proxy = Only30::start(&pg);
    let weir = Weir::builder()
        .database(
            "postgres",
            &format!("host=127.0.0.1 port={} dbname=postgres", proxy.port),
        )
        .set("pool_mode", "session")
        .start();
    let mut a = login(weir.port(), 2, &[]);
    assert_eq!(a.conn.query_one("select 'through'"), "through");
    let mut b = login(weir.port(), 0, &[]);
    assert_eq!(b.conn.query_one("select 'again'"), "again");
    assert_eq!(proxy.refusals(), 1, "{}", weir.log_tail());
    assert!(
        weir.log().contains("refused protocol 3.2"),
        "{}",
        weir.log_tail()
    );
    cancel_whole_key_only(&pg, weir.port(), &mut a, &[]);
    cancel_whole_key_only(&pg, weir.port(), &mut b, &[]);
}

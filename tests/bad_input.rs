//! Bad input from clients: malformed or oversized packets, wrong protocol
//! versions, unknown databases. Each gets a PostgreSQL-style ErrorResponse
//! with the SQLSTATE of docs/errors.md, and Weir keeps serving everyone else.

mod common;

use common::*;
use std::time::Duration;

fn weir(pg: &PgServer) -> Weir {
    Weir::for_pg(pg).set("pool_mode", "transaction").start()
}

fn assert_fatal(f: &ErrorFields, code: &str) {
    assert_eq!(f.severity, "FATAL", "{f:?}");
    assert_eq!(f.code, code, "{f:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_database() {
    let pg = PgServer::start();
    let weir = weir(&pg);
    let e = RawConn::startup(weir.port(), "postgres", "nope", &[])
        .err()
        .expect("login to unknown db accepted");
    assert_fatal(&e, "3D000");
    assert_eq!(e.message, "no such database: nope");
    assert_serving(&weir, "postgres", "postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_length_too_small() {
    let pg = PgServer::start();
    let weir = weir(&pg);
    let mut c = RawConn::connect(weir.port());
    c.send(&[0, 0, 0, 3, 0, 3, 0, 0]);
    let f = c.expect_error();
    assert_fatal(&f, "08P01");
    assert!(c.closes(), "connection left open after a bad packet header");
    assert_serving(&weir, "postgres", "postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_packet_too_large() {
    let pg = PgServer::start();
    let weir = weir(&pg);
    let mut c = RawConn::connect(weir.port());
    let mut m = (100_000_000u32).to_be_bytes().to_vec();
    m.extend_from_slice(&[0, 3, 0, 0]);
    m.extend_from_slice(b"user\0postgres\0");
    c.send(&m);
    let f = c.expect_error();
    assert_fatal(&f, "08P01");
    assert!(
        c.closes(),
        "connection left open after an oversized startup packet"
    );
    assert_serving(&weir, "postgres", "postgres").await;
}

/// An HTTP request where a StartupMessage should be.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_request_instead_of_startup() {
    let pg = PgServer::start();
    let weir = weir(&pg);
    let mut c = RawConn::connect(weir.port());
    c.send(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n");
    let f = c.expect_error();
    assert_fatal(&f, "08P01");
    assert_serving(&weir, "postgres", "postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_version_2_is_refused() {
    let pg = PgServer::start();
    let weir = weir(&pg);
    let mut c = RawConn::connect(weir.port());
    c.send(&proto::startup_message_version(
        2,
        0,
        &[("user", "postgres"), ("database", "postgres")],
    ));
    let f = c.expect_error();
    assert_fatal(&f, "0A000");
    assert_eq!(
        f.message,
        "unsupported frontend protocol 2.0: server supports 3.0 to 3.2"
    );
    assert_serving(&weir, "postgres", "postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_version_4_is_refused() {
    let pg = PgServer::start();
    let weir = weir(&pg);
    let mut c = RawConn::connect(weir.port());
    c.send(&proto::startup_message_version(
        4,
        0,
        &[("user", "postgres"), ("database", "postgres")],
    ));
    let f = c.expect_error();
    assert_fatal(&f, "0A000");
    assert_eq!(
        f.message,
        "unsupported frontend protocol 4.0: server supports 3.0 to 3.2"
    );
    assert_serving(&weir, "postgres", "postgres").await;
}

/// A startup packet without a user name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_without_user_is_refused() {
    let pg = PgServer::start();
    let weir = weir(&pg);
    let e = {
        let mut c = RawConn::connect(weir.port());
        c.send(&proto::startup_message(&[("database", "postgres")]));
        c.expect_error()
    };
    assert_eq!(e.severity, "FATAL", "{e:?}");
    assert!(e.code == "08P01" || e.code == "28000", "{e:?}");
    assert_serving(&weir, "postgres", "postgres").await;
}

/// A client that closes half-way through its startup packet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_startup_then_close() {
    let pg = PgServer::start();
    let weir = weir(&pg);
    for _ in 0..20 {
        let mut c = RawConn::connect(weir.port());
        let m = proto::startup_message(&[("user", "postgres"), ("database", "postgres")]);
        c.send(&m[..m.len() / 2]);
        drop(c);
    }
    assert_serving(&weir, "postgres", "postgres").await;
}

/// After login: a message whose length word is below 4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_with_invalid_length_after_login() {
    let pg = PgServer::start();
    let weir = weir(&pg);
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    c.send(&[b'Q', 0, 0, 0, 2]);
    let f = c.expect_error();
    assert_fatal(&f, "08P01");
    assert!(
        c.closes(),
        "connection left open after an invalid message length"
    );
    assert_serving(&weir, "postgres", "postgres").await;
}

/// After login: a message claiming to be ~2 GB long, then the client stops.
/// Weir must neither wait for nor allocate 2 GB; the client is refused or
/// dropped, and others are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_claiming_2gb_after_login() {
    let pg = PgServer::start();
    let weir = weir(&pg);
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    c.send(&[b'Q', 0x7f, 0xff, 0xff, 0xff, b's', b'e', b'l']);
    if let Some(f) = c.error_or_eof() {
        assert_fatal(&f, "08P01");
    }
    assert_serving(&weir, "postgres", "postgres").await;
}

/// After login: an unknown message type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_message_type_after_login() {
    let pg = PgServer::start();
    let weir = weir(&pg);
    let mut c = RawConn::startup(weir.port(), "postgres", "postgres", &[]).unwrap();
    c.send(&proto::msg(b'y', b"junk"));
    let f = c.expect_error();
    assert_fatal(&f, "08P01");
    assert_serving(&weir, "postgres", "postgres").await;
}

/// A stream of broken clients does not disturb a client in the middle of
/// its work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_clients_do_not_disturb_good_ones() {
    let pg = PgServer::start();
    let weir = weir(&pg);
    let good = connect(weir.port(), "postgres", "postgres").await.unwrap();
    q(&good, "create table t (x int)").await.unwrap();
    let port = weir.port();
    let vandal = std::thread::spawn(move || {
        let junk: Vec<Vec<u8>> = vec![
            vec![0, 0, 0, 1],
            vec![0xff; 64],
            b"GET / HTTP/1.0\r\n\r\n".to_vec(),
            proto::startup_message_version(9, 9, &[("user", "x")]),
            proto::startup_message(&[("user", "postgres"), ("database", "nope")]),
        ];
        for round in 0..40 {
            let mut c = RawConn::connect(port);
            c.set_read_timeout(Duration::from_secs(5));
            let _ = c.try_send(&junk[round % junk.len()]);
            let _ = c.closes();
        }
    });
    for i in 0..100 {
        q(&good, &format!("insert into t values ({i})"))
            .await
            .unwrap();
    }
    vandal.join().unwrap();
    assert_eq!(q1(&good, "select count(*) from t").await, "100");
}

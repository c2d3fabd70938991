//! PostgreSQL 17's direct TLS negotiation (`sslnegotiation=direct`, issue 12): the
//! client opens with a TLS ClientHello naming ALPN `postgresql`, no SSLRequest first.
//! The client here is tokio-rustls plus tokio-postgres over the TLS stream, as libpq 17
//! does it; psql on this machine is older.

// Tests run on tokio's own runtime, which has a time driver.
#![allow(clippy::disallowed_methods)]

mod common;

use std::sync::Arc;

use common::tls::Certs;
use common::*;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn with_tls(pg: &PgServer, certs: &Certs, mode: &str) -> WeirBuilder {
    Weir::for_pg(pg)
        .set("client_tls_sslmode", mode)
        .set("client_tls_cert_file", certs.p("server.crt"))
        .set("client_tls_key_file", certs.p("server.key"))
}

fn connector(certs: &Certs, alpn: &[&[u8]]) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    let pem = std::fs::read(certs.path("ca.crt")).expect("read ca.crt");
    for cert in rustls::pki_types::pem::PemObject::pem_slice_iter(&pem) {
        roots.add(cert.expect("parse ca.crt")).expect("add root");
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// Opens TLS straight away (no SSLRequest), then logs in and runs a query over it.
async fn direct_query(
    weir: &Weir,
    certs: &Certs,
    alpn: &[&[u8]],
    sql: &str,
) -> Result<String, String> {
    let client = tls_client(weir, certs, alpn, false).await?;
    first_value(&client, sql).await
}

/// A logged-in tokio-postgres client over TLS, negotiated directly or after an
/// SSLRequest.
async fn tls_client(
    weir: &Weir,
    certs: &Certs,
    alpn: &[&[u8]],
    ssl_request: bool,
) -> Result<tokio_postgres::Client, String> {
    let mut tcp = TcpStream::connect(("127.0.0.1", weir.port()))
        .await
        .map_err(|e| e.to_string())?;
    if ssl_request {
        tcp.write_all(&[0, 0, 0, 8, 4, 0xd2, 0x16, 0x2f])
            .await
            .map_err(|e| e.to_string())?;
        let answer = tcp.read_u8().await.map_err(|e| e.to_string())?;
        if answer != b'S' {
            return Err(format!("SSLRequest answered {answer}"));
        }
    }
    let name = ServerName::try_from("localhost").expect("server name");
    let tls = connector(certs, alpn)
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let config = pg_config(weir.port(), "postgres", "postgres");
    let (client, conn) = config
        .connect_raw(tls, tokio_postgres::NoTls)
        .await
        .map_err(|e| format!("login: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

async fn first_value(client: &tokio_postgres::Client, sql: &str) -> Result<String, String> {
    let rows = client
        .simple_query(sql)
        .await
        .map_err(|e| format!("query: {e}"))?;
    rows.iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        })
        .ok_or_else(|| "no row".to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_tls_with_alpn_logs_in() {
    let pg = PgServer::start();
    let certs = Certs::new();
    let weir = with_tls(&pg, &certs, "require").start();
    let got = direct_query(&weir, &certs, &[b"postgresql"], "select 'direct'").await;
    assert_eq!(got.as_deref(), Ok("direct"));
    // The session is really over TLS: the admin console lists it as such is not needed;
    // a second, ordinary SSLRequest client still works beside it.
    assert_eq!(
        psql_at(
            "127.0.0.1",
            weir.port(),
            "dbname=postgres sslmode=require",
            "postgres",
            None,
            "select 2"
        )
        .as_deref(),
        Ok("2")
    );
}

/// Without ALPN `postgresql` the handshake is refused, as PostgreSQL 17 refuses it (a
/// client that does not name the protocol may be fooled into talking to another
/// service through a TLS-terminating proxy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_tls_without_alpn_is_refused() {
    let pg = PgServer::start();
    let certs = Certs::new();
    let weir = with_tls(&pg, &certs, "require").start();
    let got = direct_query(&weir, &certs, &[], "select 1").await;
    assert!(got.is_err(), "{got:?}");
    let got = direct_query(&weir, &certs, &[b"http/1.1"], "select 1").await;
    assert!(got.is_err(), "{got:?}");
    assert!(
        eventually(TIMEOUT, || weir.log().contains("ALPN")),
        "{}",
        weir.log_tail()
    );
    // Weir goes on serving.
    let got = direct_query(&weir, &certs, &[b"postgresql"], "select 3").await;
    assert_eq!(got.as_deref(), Ok("3"));
}

/// With TLS off, a ClientHello is closed at once, not read as a startup packet of
/// absurd length (0x16030100...).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_tls_when_tls_is_off_is_refused_at_once() {
    let pg = PgServer::start();
    let certs = Certs::new();
    let weir = Weir::for_pg(&pg).start();
    let got = tokio::time::timeout(
        TIMEOUT,
        direct_query(&weir, &certs, &[b"postgresql"], "select 1"),
    )
    .await
    .expect("refused within the timeout, not left hanging");
    assert!(got.is_err(), "{got:?}");
    assert!(
        eventually(TIMEOUT, || weir.log().contains("direct TLS")),
        "{}",
        weir.log_tail()
    );
}

/// A ClientHello that stops halfway is dropped at client_login_timeout and takes no
/// one else down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_client_hello_times_out() {
    let pg = PgServer::start();
    let certs = Certs::new();
    let weir = with_tls(&pg, &certs, "require")
        .set("client_login_timeout", 1)
        .start();
    let mut tcp = TcpStream::connect(("127.0.0.1", weir.port()))
        .await
        .expect("connect");
    // A TLS record header announcing 512 bytes of handshake, and only 5 of them.
    tcp.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03])
        .await
        .expect("write");
    let mut rest = Vec::new();
    let read = tokio::time::timeout(TIMEOUT, tcp.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "the half handshake was not closed");
    let got = direct_query(&weir, &certs, &[b"postgresql"], "select 4").await;
    assert_eq!(got.as_deref(), Ok("4"));
}

/// A TLS client that sits idle (long past the second after which idle plain clients are
/// parked) keeps its connection and its session, both ways of starting TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_tls_client_keeps_its_connection() {
    let pg = PgServer::start();
    let certs = Certs::new();
    let weir = with_tls(&pg, &certs, "require")
        .set("pool_mode", "transaction")
        .start();
    let mut clients = Vec::new();
    for ssl_request in [true, false] {
        let c = tls_client(&weir, &certs, &[b"postgresql"], ssl_request)
            .await
            .expect("TLS login");
        let set = c.simple_query("set application_name = 'idle_tls'").await;
        assert!(set.is_ok(), "{set:?}");
        clients.push(c);
    }
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    for c in &clients {
        assert_eq!(
            first_value(c, "show application_name").await.as_deref(),
            Ok("idle_tls"),
            "{}",
            weir.log_tail()
        );
    }
    assert!(
        !weir.log().contains("could not park"),
        "{}",
        weir.log_tail()
    );
}

mod common;
use common::*;
use std::io::{Read, Write};
fn get(port: u16, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\n\r\n").unwrap();
    let mut b = String::new(); s.read_to_string(&mut b).unwrap(); b
}
#[test]
fn show() {
    let mut pg = PgServer::start();
    let http = free_port();
    let weir = Weir::for_pg(&pg).set("pool_mode","transaction").set("http_listen", format!("127.0.0.1:{http}")).start();
    pgbench_direct(&pg, "postgres", "postgres", &["-i", "-s", "1"]).assert_ok();
    pgbench_via(&weir, "postgres", "postgres", &["-c", "4", "-T", "3"]).assert_clean();
    std::thread::sleep(std::time::Duration::from_secs(2));
    println!("{}", get(http, "/metrics"));
    println!("{}", &get(http, "/api/stats")[..3000]);
    pg.stop();
    println!("{}", get(http, "/readyz"));
}

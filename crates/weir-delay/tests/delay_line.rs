//! weir-delay end to end: the binary between a client and a small server on threads.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

struct Proxy {
    child: Child,
    listen: SocketAddr,
    control: SocketAddr,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts weir-delay in front of `upstream` on free ports, read from its first line.
fn start(upstream: SocketAddr, delay_us: u64) -> Proxy {
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir-delay"))
        .args(["--listen", "127.0.0.1:0", "--control", "127.0.0.1:0"])
        .args(["--upstream", &upstream.to_string()])
        .args(["--delay-us", &delay_us.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start weir-delay");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read the first line");
    // "weir-delay listening on A -> U, control C, delay N us"
    let word_after = |w: &str| -> SocketAddr {
        let rest = line
            .split(w)
            .nth(1)
            .unwrap_or_else(|| panic!("{w} in {line:?}"));
        let addr = rest
            .split([' ', ','])
            .find(|s| !s.is_empty())
            .expect("address");
        addr.parse().unwrap_or_else(|e| panic!("{addr}: {e}"))
    };
    let (listen, control) = (word_after("listening on "), word_after("control "));
    assert_eq!(word_after("-> "), upstream, "{line}");
    Proxy {
        child,
        listen,
        control,
    }
}

/// A server that echoes everything on every connection, until the client's EOF.
fn echo_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            thread::spawn(move || {
                let _ = c.set_nodelay(true);
                let _ = c.set_read_timeout(Some(Duration::from_secs(30)));
                let mut r = c.try_clone().expect("clone");
                let _ = std::io::copy(&mut r, &mut c);
                let _ = c.shutdown(Shutdown::Write);
            });
        }
    });
    addr
}

fn control(p: &Proxy, cmd: &str) -> String {
    let mut c = TcpStream::connect(p.control).expect("control connect");
    c.write_all(format!("{cmd}\n").as_bytes())
        .expect("control write");
    let mut line = String::new();
    BufReader::new(c)
        .read_line(&mut line)
        .expect("control read");
    line.trim_end().to_string()
}

fn round_trip(c: &mut TcpStream, msg: &[u8]) -> Duration {
    let t = Instant::now();
    c.write_all(msg).expect("write");
    let mut got = vec![0; msg.len()];
    c.read_exact(&mut got).expect("read the echo");
    assert_eq!(got, msg);
    t.elapsed()
}

/// Deterministic bytes that differ by connection and position (a shifted or dropped
/// chunk does not compare equal).
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn bytes_pass_intact_and_in_order_on_concurrent_connections() {
    let p = start(echo_server(), 1000);
    let conns: Vec<_> = (0..8u64)
        .map(|i| {
            let addr = p.listen;
            thread::spawn(move || {
                let data = pattern(i + 1, 1_500_000 + i as usize * 1000);
                let c = TcpStream::connect(addr).expect("connect");
                // A lost EOF fails the test instead of hanging it.
                c.set_read_timeout(Some(Duration::from_secs(30)))
                    .expect("timeout");
                let mut w = c.try_clone().expect("clone");
                let sent = data.clone();
                let writer = thread::spawn(move || {
                    // Uneven writes, so that chunks of every size cross.
                    for (k, part) in sent.chunks(7_919).enumerate() {
                        w.write_all(part).expect("write");
                        if k % 50 == 0 {
                            thread::sleep(Duration::from_micros(300));
                        }
                    }
                    w.shutdown(Shutdown::Write).expect("half-close");
                });
                let mut got = Vec::new();
                (&c).read_to_end(&mut got).expect("read the echo");
                writer.join().expect("writer");
                assert_eq!(got.len(), data.len(), "connection {i}: length");
                assert!(got == data, "connection {i}: bytes differ");
            })
        })
        .collect();
    for c in conns {
        c.join().expect("connection thread");
    }
}

#[test]
fn half_close_reaches_the_other_side_and_the_reply_still_comes_back() {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let upstream = l.local_addr().expect("addr");
    let server = thread::spawn(move || {
        let (mut c, _) = l.accept().expect("accept");
        c.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut got = Vec::new();
        // Ends only if the client's shutdown(Write) came through as EOF.
        c.read_to_end(&mut got).expect("read to EOF");
        c.write_all(b"after your EOF: ").expect("write");
        c.write_all(&got).expect("write");
        c.shutdown(Shutdown::Write).expect("server half-close");
        got
    });
    let p = start(upstream, 2000);
    let mut c = TcpStream::connect(p.listen).expect("connect");
    c.write_all(b"hello").expect("write");
    c.shutdown(Shutdown::Write).expect("client half-close");
    c.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut reply = Vec::new();
    c.read_to_end(&mut reply)
        .expect("the server's reply, then EOF");
    assert_eq!(server.join().expect("server"), b"hello");
    assert_eq!(reply, b"after your EOF: hello");
}

#[test]
fn a_delay_of_20_ms_each_way_makes_a_round_trip_last_40_ms_or_more() {
    let p = start(echo_server(), 20_000);
    let mut c = TcpStream::connect(p.listen).expect("connect");
    c.set_nodelay(true).expect("nodelay");
    for i in 0..5u8 {
        let rtt = round_trip(&mut c, &[i; 100]);
        assert!(rtt >= Duration::from_millis(40), "round trip {i}: {rtt:?}");
    }
}

#[test]
fn the_control_port_changes_the_delay() {
    let p = start(echo_server(), 0);
    assert_eq!(control(&p, "get"), "0");
    assert_eq!(control(&p, "delay 30000"), "ok");
    assert_eq!(control(&p, "get"), "30000");
    assert!(control(&p, "delay -1").starts_with("error"));
    assert!(control(&p, "delay 18446744073709551615").starts_with("error"));
    assert!(control(&p, "bogus").starts_with("error"));
    assert_eq!(control(&p, "get"), "30000");
    // A connection opened before the change is delayed too (chunks read from now on).
    let mut c = TcpStream::connect(p.listen).expect("connect");
    let rtt = round_trip(&mut c, b"x");
    assert!(rtt >= Duration::from_millis(60), "round trip {rtt:?}");
}

#[test]
fn a_failed_upstream_closes_the_client_not_the_proxy() {
    // A port with nothing listening on it.
    let dead = TcpListener::bind("127.0.0.1:0").expect("bind");
    let dead_addr = dead.local_addr().expect("addr");
    drop(dead);
    let mut p = start(dead_addr, 0);
    for _ in 0..3 {
        let mut c = TcpStream::connect(p.listen).expect("connect");
        c.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut buf = [0u8; 16];
        // Closed by the proxy: EOF or a reset, not a timeout.
        match c.read(&mut buf) {
            Ok(n) => assert_eq!(n, 0),
            Err(e) => assert!(
                !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ),
                "{e}"
            ),
        }
    }
    assert!(
        p.child.try_wait().expect("try_wait").is_none(),
        "the proxy exited"
    );
    assert_eq!(control(&p, "get"), "0");
}

#[test]
fn a_receiver_that_does_not_read_pushes_back_on_the_sender() {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let upstream = l.local_addr().expect("addr");
    // Accepts and then never reads.
    let server = thread::spawn(move || l.accept().map(|(c, _)| c));
    let p = start(upstream, 1000);
    let c = TcpStream::connect(p.listen).expect("connect");
    c.set_nonblocking(true).expect("nonblocking");
    let block = vec![7u8; 64 * 1024];
    let (mut sent, mut stalled_since) = (0usize, None::<Instant>);
    // With a queue without limit the proxy would take it all; bounded, it stops reading
    // and the client's writes stall at a few tens of MB (the proxy's queue and the
    // kernels' buffers).
    while sent < 200 << 20 {
        match (&c).write(&block) {
            Ok(n) => {
                sent += n;
                stalled_since = None;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let since = *stalled_since.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_millis(500) {
                    break;
                }
                thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("write: {e}"),
        }
    }
    assert!(
        sent < 100 << 20,
        "the proxy took {} MB from a client whose peer reads nothing",
        sent >> 20
    );
    drop(server.join());
}

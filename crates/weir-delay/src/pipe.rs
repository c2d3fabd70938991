//! One proxied connection: two directions, each a reader thread that stamps every chunk
//! with its deadline (read time + delay) and a writer thread that sleeps until the
//! deadline of the oldest chunk and writes it. The writer sleeps per chunk, not per
//! gap, so chunks in flight overlap as on a link with a fixed latency.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const CHUNK: usize = 64 * 1024;
/// Chunks held per direction before the reader stops reading: a receiver that does not
/// read pushes back on the sender through TCP, as on a real link, instead of the proxy
/// buffering without limit. At 1 ms, 256 chunks in flight per connection is far above
/// what a request/reply protocol sends.
const IN_FLIGHT: usize = 256;
/// The longest delay the control port and --delay-us accept (an Instant plus much more
/// would overflow).
pub const MAX_DELAY_US: u64 = 60_000_000;

type Chunk = (Instant, Vec<u8>);

/// Both sockets of a pair: any thread that meets an error closes both, which wakes the
/// other three (their reads return 0, their writes fail).
struct Pair {
    client: TcpStream,
    server: TcpStream,
}

impl Pair {
    fn close(&self) {
        let _ = self.client.shutdown(Shutdown::Both);
        let _ = self.server.shutdown(Shutdown::Both);
    }
}

pub fn builder(name: &str) -> thread::Builder {
    // Each thread holds little on its stack (the read buffer is on the heap).
    thread::Builder::new()
        .name(name.into())
        .stack_size(128 * 1024)
}

/// Carries one connection until both directions are done; runs on the caller's thread
/// (as the client-to-server reader) and three more.
pub fn run(client: TcpStream, server: TcpStream, delay: Arc<AtomicU64>) {
    // Small messages (a query, its reply) must leave as soon as their deadline passes.
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let pair = Arc::new(Pair { client, server });
    let (up_tx, up_rx) = mpsc::sync_channel(IN_FLIGHT);
    let (down_tx, down_rx) = mpsc::sync_channel(IN_FLIGHT);
    let spawns = [
        spawn_writer("up-writer", pair.clone(), up_rx, false),
        spawn_writer("down-writer", pair.clone(), down_rx, true),
        {
            let (pair, delay) = (pair.clone(), delay.clone());
            builder("down-reader").spawn(move || read_side(&pair, true, &down_tx, &delay))
        },
    ];
    if spawns.iter().any(|s| s.is_err()) {
        eprintln!("weir-delay: cannot start a connection's threads");
        pair.close();
        return;
    }
    read_side(&pair, false, &up_tx, &delay);
}

fn spawn_writer(
    name: &str,
    pair: Arc<Pair>,
    rx: Receiver<Chunk>,
    to_client: bool,
) -> std::io::Result<thread::JoinHandle<()>> {
    builder(name).spawn(move || write_side(&pair, to_client, rx))
}

/// Reads from the server (`from_server`) or the client, and queues each chunk with its
/// deadline. EOF drops the sender: the writer then flushes and half-closes.
fn read_side(pair: &Pair, from_server: bool, tx: &SyncSender<Chunk>, delay: &AtomicU64) {
    let mut src = if from_server {
        &pair.server
    } else {
        &pair.client
    };
    let mut buf = vec![0u8; CHUNK];
    loop {
        match src.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                let us = delay.load(Ordering::Relaxed);
                let deadline = Instant::now() + Duration::from_micros(us);
                if tx.send((deadline, buf[..n].to_vec())).is_err() {
                    return; // the writer met an error and closed the pair
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => {
                pair.close();
                return;
            }
        }
    }
}

/// Writes each chunk once its deadline has passed, in order; chunks already due are
/// written together. When the reader is done, shuts down the write half of `dst`.
fn write_side(pair: &Pair, to_client: bool, rx: Receiver<Chunk>) {
    set_timer_slack();
    let mut dst = if to_client {
        &pair.client
    } else {
        &pair.server
    };
    let mut next: Option<Chunk> = None;
    loop {
        let (deadline, mut data) = match next.take() {
            Some(c) => c,
            None => match rx.recv() {
                Ok(c) => c,
                Err(_) => {
                    let _ = dst.shutdown(Shutdown::Write);
                    return;
                }
            },
        };
        sleep_until(deadline);
        // Whatever else is due by now leaves in the same write.
        let now = Instant::now();
        loop {
            match rx.try_recv() {
                Ok((d, more)) if d <= now => data.extend_from_slice(&more),
                Ok(c) => {
                    next = Some(c);
                    break;
                }
                Err(TryRecvError::Empty) | Err(TryRecvError::Disconnected) => break,
            }
        }
        if dst.write_all(&data).is_err() {
            pair.close();
            return;
        }
    }
}

fn sleep_until(deadline: Instant) {
    // thread::sleep may return early on a signal; it loops itself, but check anyway.
    loop {
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        thread::sleep(deadline - now);
    }
}

/// The default timer slack of 50 µs would add up to a fifth of a 0.25 ms delay; 1 ns
/// makes the sleep end as close to the deadline as the scheduler allows.
fn set_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes plain integers and affects only this thread.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
    }
}

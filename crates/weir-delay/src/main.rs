//! weir-delay: a TCP delay line for bench/run's network-delay mode (issue 16).
//!
//! Every chunk read from either side is written to the other side no earlier than the
//! current delay after it was read, in order. Chunks in flight overlap: the delay is a
//! fixed one-way latency like Toxiproxy's latency toxic, not a queue in which each chunk
//! waits for the one before it. Toxiproxy takes whole milliseconds only; this takes
//! microseconds, so that 0.25 ms each way can be measured.
//!
//! Threads, not tokio: tokio's timer wheel has a resolution of 1 ms, the very thing this
//! escapes; a thread sleeping with 1 ns of timer slack wakes within a few µs of its
//! deadline. The benchmark puts at most a few hundred connections through it (four
//! threads each), which threads carry without trouble.

mod control;
mod pipe;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

struct Args {
    listen: SocketAddr,
    upstream: SocketAddr,
    control: Option<SocketAddr>,
    delay_us: u64,
}

const USAGE: &str = "usage: weir-delay --listen ADDR:PORT --upstream ADDR:PORT \
                     [--control ADDR:PORT] [--delay-us N] | --version";

fn parse_args() -> Result<Args, String> {
    let mut listen = None;
    let mut upstream = None;
    let mut control = None;
    let mut delay_us = 0;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            return Err(USAGE.to_string());
        }
        if flag == "--version" {
            println!("weir-delay {}", env!("CARGO_PKG_VERSION"));
            std::process::exit(0);
        }
        let value = it
            .next()
            .ok_or_else(|| format!("{flag}: missing value\n{USAGE}"))?;
        let addr = || -> Result<SocketAddr, String> {
            value.parse().map_err(|e| format!("{flag} {value}: {e}"))
        };
        match flag.as_str() {
            "--listen" => listen = Some(addr()?),
            "--upstream" => upstream = Some(addr()?),
            "--control" => control = Some(addr()?),
            "--delay-us" => {
                delay_us = value.parse().map_err(|e| format!("{flag} {value}: {e}"))?;
                if delay_us > pipe::MAX_DELAY_US {
                    return Err(format!("{flag} {value}: more than {}", pipe::MAX_DELAY_US));
                }
            }
            _ => return Err(format!("unknown argument {flag}\n{USAGE}")),
        }
    }
    Ok(Args {
        listen: listen.ok_or_else(|| format!("--listen is required\n{USAGE}"))?,
        upstream: upstream.ok_or_else(|| format!("--upstream is required\n{USAGE}"))?,
        control,
        delay_us,
    })
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let delay = Arc::new(AtomicU64::new(args.delay_us));
    let listener = match TcpListener::bind(args.listen) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("weir-delay: cannot listen on {}: {e}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    let control = match args.control.map(TcpListener::bind).transpose() {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "weir-delay: cannot listen for control on {:?}: {e}",
                args.control
            );
            return ExitCode::FAILURE;
        }
    };
    let listen_addr = listener.local_addr().unwrap_or(args.listen);
    let control_text = match &control {
        Some(c) => match c.local_addr() {
            Ok(a) => format!(", control {a}"),
            Err(_) => String::new(),
        },
        None => String::new(),
    };
    if let Some(c) = control {
        let delay = delay.clone();
        if let Err(e) = std::thread::Builder::new()
            .name("control".into())
            .spawn(move || control::serve(c, delay))
        {
            eprintln!("weir-delay: cannot start the control thread: {e}");
            return ExitCode::FAILURE;
        }
    }
    // bench/run and the tests wait for this line (with the ports actually bound, for :0).
    println!(
        "weir-delay listening on {listen_addr} -> {}{control_text}, delay {} us",
        args.upstream, args.delay_us
    );
    accept_loop(listener, args.upstream, delay)
}

fn accept_loop(listener: TcpListener, upstream: SocketAddr, delay: Arc<AtomicU64>) -> ExitCode {
    loop {
        match listener.accept() {
            Ok((client, _)) => {
                let delay = delay.clone();
                let spawned = pipe::builder("conn").spawn(move || connect(client, upstream, delay));
                if let Err(e) = spawned {
                    eprintln!("weir-delay: cannot start a connection thread: {e}");
                }
            }
            Err(e) => {
                // Out of descriptors and the like: the proxy carries on with the others.
                eprintln!("weir-delay: accept: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

fn connect(client: TcpStream, upstream: SocketAddr, delay: Arc<AtomicU64>) {
    let server = match TcpStream::connect(upstream) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("weir-delay: connect to {upstream}: {e}");
            return;
        }
    };
    pipe::run(client, server, delay);
}

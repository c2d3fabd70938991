//! The control port: `delay <µs>` sets the delay of every chunk read from then on
//! (answers `ok`), `get` answers the current delay in µs. One command per line.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub fn serve(listener: TcpListener, delay: Arc<AtomicU64>) {
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let delay = delay.clone();
        let _ = crate::pipe::builder("control-conn").spawn(move || session(conn, &delay));
    }
}

fn session(conn: TcpStream, delay: &AtomicU64) {
    let Ok(mut out) = conn.try_clone() else {
        return;
    };
    for line in BufReader::new(conn).lines() {
        let Ok(line) = line else { return };
        let answer = command(line.trim(), delay);
        if out.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

fn command(line: &str, delay: &AtomicU64) -> String {
    let mut words = line.split_whitespace();
    match (words.next(), words.next(), words.next()) {
        (Some("get"), None, _) => format!("{}\n", delay.load(Ordering::Relaxed)),
        (Some("delay"), Some(us), None) => match us.parse::<u64>() {
            Ok(us) if us > crate::pipe::MAX_DELAY_US => {
                format!(
                    "error: delay {us}: more than {} us\n",
                    crate::pipe::MAX_DELAY_US
                )
            }
            Ok(us) => {
                delay.store(us, Ordering::Relaxed);
                "ok\n".to_string()
            }
            Err(e) => format!("error: delay {us}: {e}\n"),
        },
        _ => format!("error: unknown command {line:?} (delay <us> | get)\n"),
    }
}

//! Log output in PgBouncer's shape (`2026-01-01 12:00:00.000 UTC [pid] LOG message`), or
//! as JSON objects (`log_format = json`, see `json`), to stderr, to `logfile` and to
//! syslog as configured.

mod json;

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;

pub struct LogOptions {
    pub stderr: bool,
    pub logfile: Option<PathBuf>,
    pub syslog: Option<(String, String)>,
    pub verbosity: u32,
    pub json: bool,
}

/// `log_format = json`, read by the formatter on each line, so that a reload or the
/// console's SET switches the format of the next line without rebuilding the subscriber.
static JSON: AtomicBool = AtomicBool::new(false);

/// Takes `log_format` from a configuration being installed.
pub fn set_json(on: bool) {
    JSON.store(on, Ordering::Relaxed);
}

/// Whether lines are JSON: conn_log then gives a connection's prefix as fields of the
/// event instead of writing it into the message.
pub fn json() -> bool {
    JSON.load(Ordering::Relaxed)
}

/// A line written before logging is set up (a startup that fails, or what an online
/// restart finds): `weir: msg` on stderr as before, or in JSON mode the same object as
/// every other line, so that a collector reading stderr gets no line it cannot parse.
pub fn before_init(json: bool, level: &str, msg: &str) {
    if json {
        eprint!("{}", json::bare(level, msg));
    } else {
        eprintln!("weir: {msg}");
    }
}

#[derive(Clone)]
pub struct Sinks(Arc<Inner>);

struct Inner {
    stderr: bool,
    /// Lines carry colour escapes (only when stderr is a terminal); the file and syslog
    /// get them stripped, since log tools and grep read those.
    ansi: bool,
    file: Mutex<Option<(PathBuf, File)>>,
    syslog: bool,
}

fn open_log(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

impl Sinks {
    /// Reopens the log file, for log rotation (done on SIGHUP, as PgBouncer does).
    pub fn reopen(&self) {
        let mut guard = self.0.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((path, file)) = guard.as_mut() {
            if let Ok(f) = open_log(path) {
                *file = f;
            }
        }
    }
}

pub fn init(opts: LogOptions) -> io::Result<Sinks> {
    set_json(opts.json);
    let file = match &opts.logfile {
        Some(p) => Some((p.clone(), open_log(p)?)),
        None => None,
    };
    if let Some((ident, facility)) = &opts.syslog {
        // openlog keeps the pointer: the ident must live as long as the process.
        let ident: &'static CString =
            Box::leak(Box::new(CString::new(ident.as_str()).unwrap_or_default()));
        // SAFETY: ident is a valid NUL-terminated string that is never freed.
        unsafe { libc::openlog(ident.as_ptr(), libc::LOG_PID, syslog_facility(facility)) };
    }
    // SAFETY: isatty only inspects the descriptor.
    let ansi = opts.stderr && unsafe { libc::isatty(2) } == 1;
    let sinks = Sinks(Arc::new(Inner {
        stderr: opts.stderr,
        ansi,
        file: Mutex::new(file),
        syslog: opts.syslog.is_some(),
    }));
    let level = match opts.verbosity {
        0 => Level::INFO,
        1 => Level::DEBUG,
        _ => Level::TRACE,
    };
    let filter = tracing_subscriber::filter::Targets::new()
        .with_target("weir", level)
        .with_default(Level::WARN);
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .event_format(PgBouncerFormat)
                .with_ansi(ansi)
                .with_writer(sinks.clone())
                .with_filter(filter),
        )
        .init();
    Ok(sinks)
}

use tracing_subscriber::Layer as _;

fn syslog_facility(name: &str) -> libc::c_int {
    match name {
        "auth" => libc::LOG_AUTH,
        "authpriv" => libc::LOG_AUTHPRIV,
        "user" => libc::LOG_USER,
        "local0" => libc::LOG_LOCAL0,
        "local1" => libc::LOG_LOCAL1,
        "local2" => libc::LOG_LOCAL2,
        "local3" => libc::LOG_LOCAL3,
        "local4" => libc::LOG_LOCAL4,
        "local5" => libc::LOG_LOCAL5,
        "local6" => libc::LOG_LOCAL6,
        "local7" => libc::LOG_LOCAL7,
        _ => libc::LOG_DAEMON,
    }
}

struct PgBouncerFormat;

fn level_word(level: &Level) -> &'static str {
    match *level {
        Level::ERROR => "ERROR",
        Level::WARN => "WARNING",
        Level::INFO => "LOG",
        Level::DEBUG => "DEBUG",
        Level::TRACE => "NOISE",
    }
}

impl<S, N> FormatEvent<S, N> for PgBouncerFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        if json() {
            return json::format(&mut w, event, SystemTime::now());
        }
        write!(
            w,
            "{} UTC [{}] {} ",
            timestamp(SystemTime::now(), ' '),
            std::process::id(),
            level_word(event.metadata().level())
        )?;
        ctx.field_format().format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
}

/// `YYYY-MM-DD HH:MM:SS.mmm` in UTC, without a date library (civil-from-days); `sep`
/// between date and time (RFC 3339 has a `T` there).
fn timestamp(now: SystemTime, sep: char) -> String {
    let d = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}{sep}{:02}:{:02}:{:02}.{:03}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// Collects one formatted line, then hands it to every sink.
pub struct LineWriter {
    sinks: Sinks,
    level: Level,
    line: Vec<u8>,
}

impl Write for LineWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.line.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for LineWriter {
    fn drop(&mut self) {
        let inner = &self.sinks.0;
        if inner.stderr {
            let _ = io::stderr().write_all(&self.line);
        }
        if inner.ansi {
            self.line = strip_ansi(&self.line);
        }
        if let Some((_, f)) = inner
            .file
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
        {
            let _ = f.write_all(&self.line);
        }
        if inner.syslog {
            // syslog adds its own time and pid: send only what follows "] ". A JSON line
            // goes whole: whoever chose JSON parses the message, and syslog's header
            // stays outside it.
            let text = String::from_utf8_lossy(&self.line);
            let msg = if text.starts_with('{') {
                &text
            } else {
                text.split_once("] ").map(|(_, m)| m).unwrap_or(&text)
            }
            .trim_end();
            if let Ok(c) = CString::new(msg.replace('\0', "")) {
                let prio = match self.level {
                    Level::ERROR => libc::LOG_ERR,
                    Level::WARN => libc::LOG_WARNING,
                    Level::INFO => libc::LOG_INFO,
                    _ => libc::LOG_DEBUG,
                };
                // SAFETY: both strings are valid and NUL-terminated; "%s" consumes one.
                unsafe { libc::syslog(prio, c"%s".as_ptr(), c.as_ptr()) };
            }
        }
    }
}

/// The line without its SGR escapes (`ESC [ ... m`), the only ones the formatter writes.
fn strip_ansi(line: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(line.len());
    let mut i = 0;
    while i < line.len() {
        if line[i] == 0x1b && line.get(i + 1) == Some(&b'[') {
            let end = line[i + 2..].iter().position(|b| b.is_ascii_alphabetic());
            i += 2 + end.map_or(line.len() - i - 2, |e| e + 1);
            continue;
        }
        out.push(line[i]);
        i += 1;
    }
    out
}

impl<'a> MakeWriter<'a> for Sinks {
    type Writer = LineWriter;
    fn make_writer(&'a self) -> LineWriter {
        LineWriter {
            sinks: self.clone(),
            level: Level::INFO,
            line: Vec::with_capacity(160),
        }
    }
    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> LineWriter {
        LineWriter {
            sinks: self.clone(),
            level: *meta.level(),
            line: Vec::with_capacity(160),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timestamp_is_civil_utc() {
        let t = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(timestamp(t, ' '), "2023-11-14 22:13:20.123");
        assert_eq!(timestamp(UNIX_EPOCH, ' '), "1970-01-01 00:00:00.000");
        assert_eq!(timestamp(t, 'T'), "2023-11-14T22:13:20.123");
    }

    #[test]
    fn strip_ansi_keeps_the_text() {
        assert_eq!(
            strip_ansi(b"a \x1b[3mdb\x1b[0m\x1b[2m=\x1b[0mx\n"),
            b"a db=x\n"
        );
        assert_eq!(strip_ansi(b"plain"), b"plain");
        assert_eq!(strip_ansi(b"cut \x1b[3"), b"cut ");
    }
}

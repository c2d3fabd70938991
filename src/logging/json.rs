//! `log_format = json`: the lines of the text layout, each as one JSON object, for log
//! collectors that would otherwise have to take PgBouncer's layout apart with patterns
//! (which break on a database or user name with a space or a slash in it).
//!
//! Keys, in this order: `ts` (RFC 3339, UTC, milliseconds), `level` (the text layout's
//! word), `pid`, then the connection's `conn`, `db`, `user` and `addr` when the event
//! carries them (conn_log's lines do), `msg`, and then any other field of the event under
//! its own name.

use std::fmt;
use std::time::SystemTime;

use serde::Serialize;
use tracing::field::{Field, Visit};
use tracing::Event;
use tracing_subscriber::fmt::format::Writer;

/// Fields that go right after `pid`, in this order, so that a line about a connection
/// reads the same way whatever order its event named them in.
const CONNECTION: [&str; 4] = ["conn", "db", "user", "addr"];

/// Keys the line itself writes: an event field of one of these names is renamed, so that
/// no object has a key twice.
const OWN: [&str; 4] = ["ts", "level", "pid", "msg"];

enum Value {
    Str(String),
    U64(u64),
    I64(i64),
    F64(f64),
    Bool(bool),
}

impl Serialize for Value {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Str(v) => s.serialize_str(v),
            Value::U64(v) => s.serialize_u64(*v),
            Value::I64(v) => s.serialize_i64(*v),
            // NaN and infinities have no JSON number: serde_json writes null.
            Value::F64(v) => s.serialize_f64(*v),
            Value::Bool(v) => s.serialize_bool(*v),
        }
    }
}

#[derive(Default)]
struct Fields {
    msg: String,
    connection: [Option<Value>; 4],
    rest: Vec<(&'static str, Value)>,
}

impl Fields {
    fn put(&mut self, field: &Field, value: Value) {
        let name = field.name();
        if let Some(i) = CONNECTION.iter().position(|n| *n == name) {
            self.connection[i] = Some(value);
        } else if name == "message" {
            if let Value::Str(s) = value {
                self.msg = s;
            }
        } else if !name.starts_with("log.") {
            // log.* are the target and location of a `log` crate record, which the text
            // layout leaves out too.
            self.rest.push((name, value));
        }
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::Str(value.to_owned()));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::U64(value));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::I64(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::F64(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::Bool(value));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, Value::Str(value.to_string()));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // A message's format_args and a `%field`'s Display both come through Debug.
        self.put(field, Value::Str(format!("{value:?}")));
    }
}

/// One event as one line.
pub(super) fn format(w: &mut Writer<'_>, event: &Event<'_>, now: SystemTime) -> fmt::Result {
    let mut fields = Fields::default();
    event.record(&mut fields);
    let level = super::level_word(event.metadata().level());
    let line = object(now, level, &fields.msg, fields.connection, fields.rest);
    w.write_str(&line)
}

/// A line for what is written before logging is set up (startup errors), in the same
/// shape as the rest.
pub(super) fn bare(level: &str, msg: &str) -> String {
    object(
        SystemTime::now(),
        level,
        msg,
        Default::default(),
        Vec::new(),
    )
}

fn object(
    now: SystemTime,
    level: &str,
    msg: &str,
    connection: [Option<Value>; 4],
    rest: Vec<(&'static str, Value)>,
) -> String {
    let mut out = Vec::with_capacity(256);
    let ts = format!("{}Z", super::timestamp(now, 'T'));
    out.push(b'{');
    key_value(&mut out, "ts", &ts, true);
    key_value(&mut out, "level", &level, false);
    key_value(&mut out, "pid", &std::process::id(), false);
    for (name, value) in CONNECTION.iter().zip(connection) {
        if let Some(v) = value {
            key_value(&mut out, name, &v, false);
        }
    }
    key_value(&mut out, "msg", &msg, false);
    for (name, value) in rest {
        if OWN.contains(&name) {
            key_value(&mut out, &format!("{name}_field"), &value, false);
        } else {
            key_value(&mut out, name, &value, false);
        }
    }
    out.extend_from_slice(b"}\n");
    // serde_json writes only UTF-8 (every input is a Rust string).
    String::from_utf8_lossy(&out).into_owned()
}

fn key_value<V: Serialize + ?Sized>(out: &mut Vec<u8>, key: &str, value: &V, first: bool) {
    if !first {
        out.push(b',');
    }
    // Writing to a Vec cannot fail, and strings, numbers and bools always serialize.
    let _ = serde_json::to_writer(&mut *out, key);
    out.push(b':');
    let _ = serde_json::to_writer(&mut *out, value);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn keys_in_order_and_escaped() {
        let t = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        let conn = [
            Some(Value::Str("C-0x000000000abc".into())),
            Some(Value::Str("my db".into())),
            Some(Value::Str("a\"b/c@d".into())),
            Some(Value::Str("127.0.0.1:5432".into())),
        ];
        let rest = vec![
            ("n", Value::U64(7)),
            ("pid", Value::I64(-1)),
            ("ok", Value::Bool(true)),
        ];
        let line = object(t, "LOG", "bad \u{1} \n \u{fffd}", conn, rest);
        let pid = std::process::id();
        assert_eq!(
            line,
            format!(
                "{{\"ts\":\"2023-11-14T22:13:20.123Z\",\"level\":\"LOG\",\"pid\":{pid},\
                 \"conn\":\"C-0x000000000abc\",\"db\":\"my db\",\"user\":\"a\\\"b/c@d\",\
                 \"addr\":\"127.0.0.1:5432\",\"msg\":\"bad \\u0001 \\n \u{fffd}\",\"n\":7,\
                 \"pid_field\":-1,\"ok\":true}}\n"
            )
        );
        let parsed: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(parsed["user"], "a\"b/c@d");
    }

    #[test]
    fn bare_lines_have_no_connection() {
        let line = bare("FATAL", "cannot open logfile");
        let parsed: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(parsed["level"], "FATAL");
        assert_eq!(parsed["msg"], "cannot open logfile");
        assert!(parsed.get("conn").is_none());
    }
}

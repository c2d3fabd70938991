//! Result sets as the console sends them: RowDescription, DataRow*, CommandComplete, with
//! the column types PgBouncer declares (its `pktbuf_write_RowDescription` letters).

use bytes::{BufMut, BytesMut};

use crate::protocol::messages::put_message;

/// A column type, as PgBouncer declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    /// 's' (and 'T', timestamps sent as text).
    Text,
    /// 'i'
    Int4,
    /// 'q'
    Int8,
    /// 'N'
    Numeric,
    /// 'b'
    Bytea,
}

impl Type {
    pub fn oid(self) -> u32 {
        match self {
            Type::Text => 25,
            Type::Int4 => 23,
            Type::Int8 => 20,
            Type::Numeric => 1700,
            Type::Bytea => 17,
        }
    }

    fn size(self) -> i16 {
        match self {
            Type::Text | Type::Numeric | Type::Bytea => -1,
            Type::Int4 => 4,
            Type::Int8 => 8,
        }
    }

    /// PgBouncer's type letters: `s`, `T` (text), `i`, `q`, `N`, `b`.
    pub fn from_letter(c: char) -> Type {
        match c {
            'i' => Type::Int4,
            'q' => Type::Int8,
            'N' => Type::Numeric,
            'b' => Type::Bytea,
            _ => Type::Text,
        }
    }
}

/// One value of a row: text, or NULL.
pub type Value = Option<String>;

pub fn text(s: impl Into<String>) -> Value {
    Some(s.into())
}

pub fn int(n: impl std::fmt::Display) -> Value {
    Some(n.to_string())
}

pub const NULL: Value = None;

/// A result set being built.
pub struct RowSet {
    columns: Vec<(&'static str, Type)>,
    rows: Vec<Vec<Value>>,
}

impl RowSet {
    /// Columns from PgBouncer's type string and names, e.g. `("ssi", &["a", "b", "c"])`.
    pub fn new(types: &str, names: &[&'static str]) -> RowSet {
        assert_eq!(types.chars().count(), names.len(), "one type per column");
        RowSet {
            columns: names
                .iter()
                .zip(types.chars())
                .map(|(n, t)| (*n, Type::from_letter(t)))
                .collect(),
            rows: Vec::new(),
        }
    }

    pub fn push(&mut self, row: Vec<Value>) {
        debug_assert_eq!(row.len(), self.columns.len(), "row width");
        self.rows.push(row);
    }

    pub fn rows(&self) -> &[Vec<Value>] {
        &self.rows
    }

    /// The position of a column, for readers of the rows (the metrics endpoint).
    pub fn column(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|(n, _)| *n == name)
    }

    /// RowDescription, the rows and `CommandComplete tag`.
    pub fn encode(&self, out: &mut BytesMut, tag: &str) {
        put_message(out, b'T', |b| {
            b.put_u16(self.columns.len() as u16);
            for (name, ty) in &self.columns {
                b.put_slice(name.as_bytes());
                b.put_u8(0);
                b.put_u32(0); // table oid
                b.put_u16(0); // column number
                b.put_u32(ty.oid());
                b.put_i16(ty.size());
                b.put_i32(-1); // type modifier
                b.put_u16(0); // text format
            }
        });
        for row in &self.rows {
            put_message(out, b'D', |b| {
                b.put_u16(row.len() as u16);
                for v in row {
                    match v {
                        Some(s) => {
                            b.put_u32(s.len() as u32);
                            b.put_slice(s.as_bytes());
                        }
                        None => b.put_i32(-1),
                    }
                }
            });
        }
        command_complete(out, tag);
    }
}

pub fn command_complete(out: &mut BytesMut, tag: &str) {
    put_message(out, b'C', |b| {
        b.put_slice(tag.as_bytes());
        b.put_u8(0);
    });
}

/// A NoticeResponse (severity NOTICE), optionally with a detail.
pub fn notice(out: &mut BytesMut, code: &str, message: &str, detail: Option<&str>) {
    put_message(out, b'N', |b| {
        for (tag, value) in [
            (b'S', "NOTICE"),
            (b'V', "NOTICE"),
            (b'C', code),
            (b'M', message),
        ] {
            b.put_u8(tag);
            b.put_slice(value.as_bytes());
            b.put_u8(0);
        }
        if let Some(d) = detail {
            b.put_u8(b'D');
            b.put_slice(d.as_bytes());
            b.put_u8(0);
        }
        b.put_u8(0);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_description_rows_and_tag() {
        let mut rs = RowSet::new("si", &["name", "n"]);
        rs.push(vec![text("a"), NULL]);
        let mut out = BytesMut::new();
        rs.encode(&mut out, "SHOW");
        assert_eq!(out[0], b'T');
        let len = u32::from_be_bytes([out[1], out[2], out[3], out[4]]) as usize;
        let d = &out[1 + len..];
        assert_eq!(d[0], b'D');
        // two columns: "a" then NULL (-1)
        assert_eq!(&d[5..7], &[0, 2]);
        assert_eq!(&d[7..11], &[0, 0, 0, 1]);
        assert_eq!(d[11], b'a');
        assert_eq!(&d[12..16], &[0xff, 0xff, 0xff, 0xff]);
        assert_eq!(d[16], b'C');
        assert!(out.ends_with(b"SHOW\0"));
        assert_eq!(Type::from_letter('N').oid(), 1700);
    }
}

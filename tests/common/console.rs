//! Admin console queries over the raw protocol: a result set with its RowDescription
//! (column names and type oids), command tags and notices, or the first error.

use super::proto::{self, ErrorFields, RawConn};

#[derive(Debug, Default)]
pub struct Res {
    /// (name, type oid)
    pub cols: Vec<(String, u32)>,
    pub rows: Vec<Vec<Option<String>>>,
    pub tags: Vec<String>,
    pub notices: Vec<String>,
}

impl Res {
    pub fn col(&self, name: &str) -> usize {
        self.cols
            .iter()
            .position(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no column {name} in {:?}", self.cols))
    }

    /// The rows where column `key` equals `value`.
    pub fn find(&self, key: &str, value: &str) -> Vec<&Vec<Option<String>>> {
        let i = self.col(key);
        self.rows
            .iter()
            .filter(|r| r[i].as_deref() == Some(value))
            .collect()
    }

    /// Column `name` of the single row where `key` = `value`.
    pub fn get(&self, key: &str, value: &str, name: &str) -> String {
        let rows = self.find(key, value);
        assert_eq!(
            rows.len(),
            1,
            "expected one row with {key}={value}: {self:#?}"
        );
        rows[0][self.col(name)].clone().unwrap_or_default()
    }

    pub fn num(&self, key: &str, value: &str, name: &str) -> i64 {
        self.get(key, value, name)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name} of {key}={value} is not a number: {self:#?}"))
    }
}

pub fn cstr(b: &[u8]) -> (String, &[u8]) {
    let end = b.iter().position(|&c| c == 0).unwrap();
    (
        String::from_utf8_lossy(&b[..end]).into_owned(),
        &b[end + 1..],
    )
}

pub fn row_description(body: &[u8]) -> Vec<(String, u32)> {
    let n = u16::from_be_bytes([body[0], body[1]]) as usize;
    let mut rest = &body[2..];
    let mut cols = Vec::new();
    for _ in 0..n {
        let (name, r) = cstr(rest);
        let oid = u32::from_be_bytes(r[6..10].try_into().unwrap());
        rest = &r[18..];
        cols.push((name, oid));
    }
    cols
}

/// Runs a console query; the last result set's columns and rows, or the first error.
pub fn run(c: &mut RawConn, sql: &str) -> Result<Res, ErrorFields> {
    c.send(&proto::query(sql));
    let mut res = Res::default();
    let mut err = None;
    for m in c.read_until_ready() {
        match m.tag {
            b'T' => {
                res.cols = row_description(&m.body);
                res.rows.clear();
            }
            b'D' => res.rows.push(proto::data_row(&m.body)),
            b'C' => res.tags.push(cstr(&m.body).0),
            b'N' => res.notices.push(proto::parse_error(&m.body).message),
            b'E' if err.is_none() => err = Some(proto::parse_error(&m.body)),
            _ => {}
        }
    }
    match err {
        Some(e) => Err(e),
        None => Ok(res),
    }
}

pub fn ok(c: &mut RawConn, sql: &str) -> Res {
    run(c, sql).unwrap_or_else(|e| panic!("{sql} failed: {e:?}"))
}

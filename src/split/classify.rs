//! Whether a query string may run on a standby: PostgreSQL's own parser (libpg_query)
//! reads it, and anything that writes, might write, or cannot be read is a write.
//!
//! A read that calls functions is a read only if each of them is known not to write
//! (see `functions`): the names are kept with the verdict, and checked per database.

use pg_query::protobuf::a_const::Val;
use pg_query::protobuf::TransactionStmtKind;
use pg_query::NodeEnum;
use serde_json::Value;

/// What a query string is, for routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Runs anywhere, reads nothing that matters: SET, RESET, DISCARD, COMMIT, ROLLBACK,
    /// DEALLOCATE, an empty query.
    Neutral,
    /// Reads only (provided its functions do).
    Read,
    /// Writes, may write, opens a transaction that may, or was not understood.
    Write,
}

/// A query string's class, and for a read the functions it calls (lowercase, without
/// their schema), which must all be known read-only for it to stay a read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub class: Class,
    pub calls: Box<[Box<str>]>,
}

impl Verdict {
    pub fn write() -> Verdict {
        Verdict::of(Class::Write)
    }

    fn of(class: Class) -> Verdict {
        Verdict {
            class,
            calls: Box::new([]),
        }
    }
}

/// Parses `sql` (one or several statements) and classifies it.
pub fn classify(sql: &str) -> Verdict {
    let Ok(parsed) = pg_query::parse(sql, 0) else {
        return Verdict::write();
    };
    let mut class = Class::Neutral;
    let mut calls = Vec::new();
    for raw in &parsed.protobuf.stmts {
        let Some(node) = raw.stmt.as_ref().and_then(|n| n.node.as_ref()) else {
            continue;
        };
        match statement(node, &mut calls) {
            Class::Write => return Verdict::write(),
            Class::Read => class = Class::Read,
            Class::Neutral => {}
        }
    }
    if class == Class::Neutral {
        return Verdict::of(Class::Neutral);
    }
    calls.sort();
    calls.dedup();
    Verdict {
        class,
        calls: calls.into_iter().map(String::into_boxed_str).collect(),
    }
}

fn statement(node: &NodeEnum, calls: &mut Vec<String>) -> Class {
    match node {
        NodeEnum::SelectStmt(_) => query(node, calls),
        NodeEnum::VariableShowStmt(_) => Class::Read,
        // A standby refuses serializable transactions ("cannot use serializable mode in a
        // hot standby").
        NodeEnum::VariableSetStmt(_) if serializable(node) => Class::Write,
        NodeEnum::VariableSetStmt(_) | NodeEnum::DiscardStmt(_) | NodeEnum::DeallocateStmt(_) => {
            Class::Neutral
        }
        NodeEnum::TransactionStmt(t) => match TransactionStmtKind::try_from(t.kind) {
            Ok(TransactionStmtKind::TransStmtBegin | TransactionStmtKind::TransStmtStart) => {
                if read_only(&t.options) && !serializable(node) {
                    Class::Read
                } else {
                    // What the transaction will do is not known yet.
                    Class::Write
                }
            }
            Ok(
                TransactionStmtKind::TransStmtPrepare
                | TransactionStmtKind::TransStmtCommitPrepared
                | TransactionStmtKind::TransStmtRollbackPrepared,
            ) => Class::Write,
            Ok(_) => Class::Neutral,
            Err(_) => Class::Write,
        },
        NodeEnum::ExplainStmt(e) => match e.query.as_ref().and_then(|q| q.node.as_ref()) {
            Some(q @ NodeEnum::SelectStmt(_)) => query(q, calls),
            _ => Class::Write,
        },
        NodeEnum::CopyStmt(c) if !c.is_from && !c.is_program && c.filename.is_empty() => {
            match c.query.as_ref().and_then(|q| q.node.as_ref()) {
                Some(q @ NodeEnum::SelectStmt(_)) => query(q, calls),
                Some(_) => Class::Write,
                None => Class::Read,
            }
        }
        _ => Class::Write,
    }
}

/// `BEGIN READ ONLY`, `START TRANSACTION READ ONLY, ISOLATION LEVEL ...`; as in
/// PostgreSQL, the last of READ ONLY and READ WRITE wins.
fn read_only(options: &[pg_query::protobuf::Node]) -> bool {
    options
        .iter()
        .rev()
        .find_map(|o| match o.node.as_ref() {
            Some(NodeEnum::DefElem(d)) if d.defname == "transaction_read_only" => {
                Some(match d.arg.as_ref().and_then(|a| a.node.as_ref()) {
                    Some(NodeEnum::AConst(c)) => {
                        matches!(&c.val, Some(Val::Ival(i)) if i.ival != 0)
                    }
                    _ => false,
                })
            }
            _ => None,
        })
        .unwrap_or(false)
}

/// Whether a SET or BEGIN names the serializable isolation level anywhere.
fn serializable(node: &NodeEnum) -> bool {
    serde_json::to_value(node).map_or(true, |v| mentions(&v, "serializable"))
}

fn mentions(v: &Value, word: &str) -> bool {
    match v {
        Value::String(s) => s.eq_ignore_ascii_case(word),
        Value::Array(a) => a.iter().any(|v| mentions(v, word)),
        Value::Object(m) => m.values().any(|v| mentions(v, word)),
        _ => false,
    }
}

/// A SELECT (or VALUES, TABLE): walked whole, through every clause, CTE and subquery,
/// as the parser's tree serialises, so that no node kind can be overlooked.
fn query(node: &NodeEnum, calls: &mut Vec<String>) -> Class {
    let Ok(tree) = serde_json::to_value(node) else {
        return Class::Write;
    };
    if writes(&tree, calls) {
        Class::Write
    } else {
        Class::Read
    }
}

/// True when the tree holds DML (a CTE's INSERT/UPDATE/DELETE/MERGE), row locks (FOR
/// UPDATE/SHARE), or SELECT INTO; collects the names of the functions called.
fn writes(v: &Value, calls: &mut Vec<String>) -> bool {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                match k.as_str() {
                    "InsertStmt" | "UpdateStmt" | "DeleteStmt" | "MergeStmt" => return true,
                    "locking_clause" if v.as_array().is_some_and(|a| !a.is_empty()) => return true,
                    "into_clause" if !v.is_null() => return true,
                    "FuncCall" => match function_name(v) {
                        Some(name) => calls.push(name),
                        None => return true,
                    },
                    _ => {}
                }
                if writes(v, calls) {
                    return true;
                }
            }
            false
        }
        Value::Array(items) => items.iter().any(|v| writes(v, calls)),
        _ => false,
    }
}

/// The last part of a FuncCall's name (`pg_catalog.now` is `now`), as the parser folded
/// it.
fn function_name(call: &Value) -> Option<String> {
    let parts = call.get("funcname")?.as_array()?;
    let last = parts.last()?;
    let s = last.get("node")?.get("String")?.get("sval")?.as_str()?;
    Some(s.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(sql: &str) -> Class {
        classify(sql).class
    }

    #[test]
    fn plain_reads() {
        for sql in [
            "select 1",
            "SELECT a FROM t WHERE b = $1",
            "values (1), (2)",
            "table t",
            "show search_path",
            "explain select * from t",
            "copy t to stdout",
            "copy (select 1) to stdout",
            "select 1; select 2",
            "begin read only; select 1; commit",
            "start transaction isolation level repeatable read, read only",
            "begin read write, read only",
            "with x as (select 1) select * from x",
            "select * from t join lateral (select 1) s on true",
        ] {
            assert_eq!(class(sql), Class::Read, "{sql}");
        }
    }

    #[test]
    fn writes_and_what_might_write() {
        for sql in [
            "insert into t values (1)",
            "update t set a = 1",
            "delete from t",
            "merge into t using s on t.a = s.a when matched then delete",
            "select * from t for update",
            "select * from t for share",
            "select * from t for no key update",
            "select * from t for key share",
            "select * from (select * from t for update) s",
            "with x as (insert into t values (1) returning *) select * from x",
            "with x as (select 1) , y as (delete from t returning 1) select * from x",
            "select * into t2 from t",
            "explain analyze insert into t values (1)",
            "explain insert into t values (1)",
            "create table t (a int)",
            "begin",
            "begin read write",
            "begin read only, read write",
            "begin isolation level serializable, read only, deferrable",
            "start transaction read only isolation level serializable",
            "set transaction isolation level serializable",
            "set default_transaction_isolation = 'serializable'",
            "set session characteristics as transaction isolation level serializable",
            "start transaction",
            "select 1; insert into t values (1)",
            "copy t from stdin",
            "copy t to '/tmp/x'",
            "copy t to program 'cat'",
            "listen x",
            "notify x",
            "prepare transaction 'x'",
            "commit prepared 'x'",
            "call p()",
            "do $$ begin end $$",
            "vacuum",
            "lock table t",
            "execute s",
            "prepare s as select 1",
            "declare c cursor for select 1",
            "select from",
            "this is not sql",
            "refresh materialized view m",
        ] {
            assert_eq!(class(sql), Class::Write, "{sql}");
        }
    }

    #[test]
    fn neutral() {
        for sql in [
            "",
            ";",
            "set search_path = a",
            "reset all",
            "discard all",
            "commit",
            "rollback",
            "deallocate all",
            "set transaction read only",
        ] {
            assert_eq!(class(sql), Class::Neutral, "{sql}");
        }
        assert_eq!(class("set x = 1; select 1"), Class::Read);
    }

    #[test]
    fn functions_called_are_kept_with_a_read() {
        let v = classify("select now(), pg_catalog.lower(a), count(*) from t where f(b) > 0 and exists (select nextval('s'))");
        assert_eq!(v.class, Class::Read);
        let calls: Vec<&str> = v.calls.iter().map(|c| &**c).collect();
        assert_eq!(calls, vec!["count", "f", "lower", "nextval", "now"]);
        let v = classify("select * from generate_series(1, 3) g order by random()");
        let calls: Vec<&str> = v.calls.iter().map(|c| &**c).collect();
        assert_eq!(calls, vec!["generate_series", "random"]);
    }
}

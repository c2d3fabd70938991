//! sqlx at its default settings through Weir in transaction mode: a PgPool whose
//! connections (10 by default, sqlx's own default too) share Weir's two servers. Every
//! query is persistent: a named statement `sqlx_s_<n>` in a cache of 100 per connection,
//! whose evictions sqlx closes (Close, Sync). Reads WEIR_URL, or WEIR_HOST, WEIR_PORT,
//! WEIR_DB and WEIR_USER; WEIR_CLIENTS connections at once. Exits 0 when every check passed.

use std::sync::Arc;

use futures_util::{future, Stream, StreamExt};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolCopyExt, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, FromRow, PgConnection};
use tokio::sync::Barrier;

type Result<T, E = String> = std::result::Result<T, E>;

/// sqlx's own default statement cache capacity: the distinct texts each client runs are
/// more, so the cache evicts (and closes) statements while the clients share servers.
const CACHE: usize = 100;

fn check(cond: bool, what: impl FnOnce() -> String) -> Result<()> {
    if cond {
        Ok(())
    } else {
        Err(format!("FAILED: {}", what()))
    }
}

/// Prefixes a driver error with what was being done.
fn ctx(what: &str) -> impl FnOnce(sqlx::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// The SQLSTATE of a server error, or the whole error when it is not one.
fn sqlstate<T: std::fmt::Debug>(r: Result<T, sqlx::Error>) -> Result<String> {
    match r {
        Err(sqlx::Error::Database(e)) => Ok(e.code().unwrap_or_default().into_owned()),
        other => Err(format!("expected a server error, got {other:?}")),
    }
}

fn url() -> String {
    if let Ok(url) = std::env::var("WEIR_URL") {
        return url;
    }
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set"));
    format!(
        "postgres://{}@{}:{}/{}",
        var("WEIR_USER"),
        var("WEIR_HOST"),
        var("WEIR_PORT"),
        var("WEIR_DB")
    )
}

/// One row of every type `Typed` reads back, bound as parameters of one statement.
#[derive(FromRow, Debug, PartialEq, Clone)]
struct Typed {
    i: i32,
    big: i64,
    t: String,
    absent: Option<String>,
    b: bool,
    f: f64,
    bytes: Vec<u8>,
    arr: Vec<i32>,
}

const TYPED_SQL: &str = "select $1::int4 as i, $2::int8 as big, $3::text as t, \
     $4::text as absent, $5::bool as b, $6::float8 as f, $7::bytea as bytes, $8::int4[] as arr";

async fn typed(pool: &PgPool, k: i32) -> Result<()> {
    let want = Typed {
        i: k,
        big: i64::from(k) << 40,
        t: format!("t-{k}-é"),
        absent: None,
        b: k % 2 == 0,
        f: f64::from(k) + 0.25,
        bytes: vec![0, 255, k as u8],
        arr: vec![k, -k, 7],
    };
    let got: Typed = sqlx::query_as(TYPED_SQL)
        .bind(want.i)
        .bind(want.big)
        .bind(&want.t)
        .bind(&want.absent)
        .bind(want.b)
        .bind(want.f)
        .bind(&want.bytes)
        .bind(&want.arr)
        .fetch_one(pool)
        .await
        .map_err(ctx("query_as"))?;
    check(got == want, || format!("query_as: {got:?} != {want:?}"))
}

/// The same text with other parameters, each run on whichever server is free.
async fn sums(conn: &mut PgConnection, i: i32, runs: std::ops::Range<i32>) -> Result<()> {
    for n in runs {
        let s: i32 = sqlx::query_scalar("select $1::int + $2::int")
            .bind(n)
            .bind(i)
            .fetch_one(&mut *conn)
            .await
            .map_err(ctx("sum"))?;
        check(s == n + i, || format!("client {i}: {s} != {}", n + i))?;
    }
    Ok(())
}

/// One client: a connection of its own from the pool for the whole run.
async fn client(pool: &PgPool, i: i32, meet: &Barrier) -> Result<()> {
    let mut conn = pool.acquire().await.map_err(ctx("acquire"));
    let before = match &mut conn {
        Ok(conn) => sums(conn, i, 0..4).await,
        Err(e) => Err(e.clone()),
    };
    // Every connection is open at once here, on two servers between them. A client that
    // failed still meets the others, so that they do not wait for it.
    meet.wait().await;
    before?;
    let mut conn = conn?;
    sums(&mut conn, i, 4..8).await?;

    // More distinct texts than the cache holds, twice over: the first pass fills it and
    // then evicts (sqlx closes the evicted statement), the second prepares again the texts
    // evicted and runs the rest from the cache, each statement under the name this
    // connection gave it, whichever server runs it.
    for pass in 0..2 {
        for k in 0..CACHE + 30 {
            let sql = format!("select $1::int + {k} as n, $2::text as t");
            let (n, t): (i32, String) = sqlx::query_as(AssertSqlSafe(sql))
                .bind(i)
                .bind(format!("{i}/{k}"))
                .fetch_one(&mut *conn)
                .await
                .map_err(ctx("past the cache"))?;
            check(n == i + k as i32 && t == format!("{i}/{k}"), || {
                format!("client {i} pass {pass} k {k}: ({n}, {t})")
            })?;
        }
    }

    // An error mid-transaction: the failed statement's SQLSTATE, then 25P02 for the next
    // one in the same transaction, and after the rollback the connection works and the
    // transaction's insert is gone.
    let lost = 100_000 + i;
    {
        let mut tx = conn.begin().await.map_err(ctx("begin"))?;
        sqlx::query("insert into drv_sqlx (id, v) values ($1, 'lost')")
            .bind(lost)
            .execute(&mut *tx)
            .await
            .map_err(ctx("insert in tx"))?;
        let code = sqlstate(
            sqlx::query_scalar::<_, i32>("select 1 / ($1::int - $1::int)")
                .bind(i)
                .fetch_one(&mut *tx)
                .await,
        )?;
        check(code == "22012", || {
            format!("client {i}: division by zero: {code}")
        })?;
        let code = sqlstate(sqlx::query("select 1").execute(&mut *tx).await)?;
        check(code == "25P02", || {
            format!("client {i}: after the error: {code}")
        })?;
        tx.rollback().await.map_err(ctx("rollback"))?;
    }
    let count: i64 = sqlx::query_scalar("select count(*) from drv_sqlx where id = $1")
        .bind(lost)
        .fetch_one(&mut *conn)
        .await
        .map_err(ctx("count after rollback"))?;
    check(count == 0, || {
        format!("client {i}: the failed transaction's insert is visible")
    })?;

    // The same, but the transaction dropped without a rollback: sqlx queues ROLLBACK and
    // sends it ahead of the connection's next query.
    {
        let mut tx = conn.begin().await.map_err(ctx("begin"))?;
        let code = sqlstate(sqlx::query("select 1/0").execute(&mut *tx).await)?;
        check(code == "22012", || format!("client {i}: 1/0: {code}"))?;
    }
    let one: i32 = sqlx::query_scalar("select 1")
        .fetch_one(&mut *conn)
        .await
        .map_err(ctx("after a dropped transaction"))?;
    check(one == 1, || "select 1".into())?;

    // A transaction that commits and one that rolls back.
    let base = i * 1000;
    let mut tx = conn.begin().await.map_err(ctx("begin"))?;
    for k in 0..5 {
        sqlx::query("insert into drv_sqlx (id, v) values ($1, $2)")
            .bind(base + k)
            .bind(format!("kept-{k}"))
            .execute(&mut *tx)
            .await
            .map_err(ctx("insert to commit"))?;
    }
    tx.commit().await.map_err(ctx("commit"))?;
    let mut tx = conn.begin().await.map_err(ctx("begin"))?;
    sqlx::query("update drv_sqlx set v = 'overwritten' where id / 1000 = $1")
        .bind(i)
        .execute(&mut *tx)
        .await
        .map_err(ctx("update to roll back"))?;
    sqlx::query("insert into drv_sqlx (id, v) values ($1, 'rolled back')")
        .bind(base + 99)
        .execute(&mut *tx)
        .await
        .map_err(ctx("insert to roll back"))?;
    tx.rollback().await.map_err(ctx("rollback"))?;
    let rows: Vec<(i32, String)> =
        sqlx::query_as("select id, v from drv_sqlx where id / 1000 = $1 order by id")
            .bind(i)
            .fetch_all(&mut *conn)
            .await
            .map_err(ctx("read back"))?;
    let want: Vec<(i32, String)> = (0..5).map(|k| (base + k, format!("kept-{k}"))).collect();
    check(rows == want, || {
        format!("client {i}: after commit and rollback: {rows:?}")
    })?;

    copy(&mut conn, i).await?;

    // Session state (SET search_path) follows the client in transaction mode, and
    // no other client on the same server sees it.
    sqlx::query(AssertSqlSafe(format!("set search_path to drv_schema_{i}, public")))
        .execute(&mut *conn)
        .await
        .map_err(ctx("set search_path"))?;
    meet.wait().await;
    let sp: String = sqlx::query_scalar("show search_path")
        .fetch_one(&mut *conn)
        .await
        .map_err(ctx("show search_path"))?;
    check(sp == format!("drv_schema_{i}, public"), || format!("client {i}: search_path {sp:?}"))?;
    Ok(())
}

/// Everything a COPY TO STDOUT sent, its CopyData messages joined.
async fn read_all<B: AsRef<[u8]>>(
    mut stream: impl Stream<Item = sqlx::Result<B>> + Unpin,
) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        out.extend_from_slice(chunk.map_err(ctx("copy out data"))?.as_ref());
    }
    Ok(out)
}

/// COPY in (copy_in_raw, in several CopyData messages), a COPY aborted with CopyFail
/// (the connection goes on), and COPY out (copy_out_raw).
async fn copy(conn: &mut PgConnection, i: i32) -> Result<()> {
    let base = i * 1000 + 500;
    let mut copy = conn
        .copy_in_raw("copy drv_sqlx (id, v) from stdin")
        .await
        .map_err(ctx("copy in"))?;
    for k in 0..100 {
        copy.send(format!("{}\tc{i}-{k}\n", base + k).into_bytes())
            .await
            .map_err(ctx("copy data"))?;
    }
    let copied = copy.finish().await.map_err(ctx("copy finish"))?;
    check(copied == 100, || format!("client {i}: copied {copied}"))?;

    let mut copy = conn
        .copy_in_raw("copy drv_sqlx (id, v) from stdin")
        .await
        .map_err(ctx("copy in to abort"))?;
    copy.send(&b"999999\tnever\n"[..])
        .await
        .map_err(ctx("copy data to abort"))?;
    let aborted = copy.abort("client gave up").await;
    check(aborted.is_ok(), || {
        format!("client {i}: copy abort: {aborted:?}")
    })?;

    let out = read_all(
        conn.copy_out_raw(&format!(
            "copy (select id, v from drv_sqlx where id / 1000 = {i} and id % 1000 >= 500 \
             order by id) to stdout"
        ))
        .await
        .map_err(ctx("copy out"))?,
    )
    .await?;
    let want: String = (0..100)
        .map(|k| format!("{}\tc{i}-{k}\n", base + k))
        .collect();
    check(out == want.as_bytes(), || {
        format!("client {i}: copy out: {}", String::from_utf8_lossy(&out))
    })?;
    let never: i64 = sqlx::query_scalar("select count(*) from drv_sqlx where id = 999999")
        .fetch_one(&mut *conn)
        .await
        .map_err(ctx("after copy abort"))?;
    check(never == 0, || "the aborted COPY's row is visible".into())
}

/// Through the pool itself: each query on whichever connection is free, many tasks at once,
/// the same texts from all of them; COPY on the pool too.
async fn pooled(pool: &PgPool) -> Result<()> {
    let tasks = (0..200).map(|k| async move {
        let d: i64 = sqlx::query_scalar("select $1::int8 * 2")
            .bind(k as i64)
            .fetch_one(pool)
            .await
            .map_err(ctx("pool: same query"))?;
        check(d == 2 * k as i64, || format!("pool: {k}: {d}"))?;
        typed(pool, k).await
    });
    for r in future::join_all(tasks).await {
        r?;
    }
    let mut copy = pool
        .copy_in_raw("copy drv_sqlx (id, v) from stdin")
        .await
        .map_err(ctx("pool copy in"))?;
    copy.send(&b"900000\tpooled\n900001\tpooled\n"[..])
        .await
        .map_err(ctx("pool copy data"))?;
    check(
        copy.finish().await.map_err(ctx("pool copy finish"))? == 2,
        || "pool copy".into(),
    )?;
    let out = read_all(
        pool.copy_out_raw("copy (select v from drv_sqlx where id >= 900000 order by id) to stdout")
            .await
            .map_err(ctx("pool copy out"))?,
    )
    .await?;
    check(out == b"pooled\npooled\n", || {
        format!("pool copy out: {}", String::from_utf8_lossy(&out))
    })
}

#[tokio::main]
async fn main() {
    let clients: usize = std::env::var("WEIR_CLIENTS")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(10);
    let options: PgConnectOptions = url().parse().expect("WEIR_URL");
    let pool = PgPoolOptions::new()
        .max_connections(clients as u32)
        .connect_lazy_with(options);
    let meet = Arc::new(Barrier::new(clients));
    let runs = (0..clients).map(|i| {
        let (pool, meet) = (pool.clone(), meet.clone());
        tokio::spawn(async move { client(&pool, i as i32, &meet).await })
    });
    let mut failed = 0;
    for (i, r) in future::join_all(runs).await.into_iter().enumerate() {
        if let Err(e) = r.map_err(|e| e.to_string()).and_then(|r| r) {
            println!("client {i}: {e}");
            failed += 1;
        }
    }
    if failed > 0 {
        eprintln!("{failed} client(s) failed");
        std::process::exit(1);
    }
    if let Err(e) = pooled(&pool).await {
        println!("{e}");
        std::process::exit(1);
    }
    pool.close().await;
    println!("sqlx 0.9: {clients} connections ok");
}

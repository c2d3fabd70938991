//! A connection to PostgreSQL: how it is opened and logged in, and what Weir knows of it.

pub mod cancel_wait;
pub mod hosts;
mod login;
pub mod passenger;
mod version;
pub mod welcome;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::gucs::Gucs;

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;

use crate::params::ParamSet;
use crate::protocol::reader::{read_message, ReadError};
use crate::protocol::{messages, PgError};
use crate::registry::servers::ServerHandle;
use crate::stream::Stream;

pub use login::{connect, connect_one, ConnectError, Login, ServerTarget};
pub use weir_auth::scram::Credential as ScramCredential;

pub use crate::protocol::BackendKey;
pub use crate::stream::ServerAddr;

pub struct ServerConn {
    pub id: u64,
    /// What the admin console sees of this connection; removed from view when dropped.
    pub info: ServerHandle,
    pub stream: Stream,
    /// What the server has reported with ParameterStatus, kept current while it is lent.
    pub params: ParamSet,
    /// The client parameter set `params` was last found to agree with; cleared whenever
    /// the server reports a parameter. Clients share their sets (server::welcome), so a
    /// lend to a client with the same set skips comparing them.
    pub synced_to: Option<Arc<ParamSet>>,
    pub key: BackendKey,
    /// Shared: every lend copies it into the client's cancel target.
    pub addr: Arc<ServerAddr>,
    pub created: Instant,
    pub idle_since: Instant,
    /// The worker thread whose runtime the socket is registered with.
    pub home: usize,
    /// The pool configuration this connection was opened under; a reload that changes how
    /// servers are reached makes older connections close instead of returning to the pool.
    pub generation: u64,
    /// Bytes of the next client's request already written by the task that released the
    /// server to it (pool::ahead); the client skips them. Zero otherwise.
    pub sent_ahead: usize,
    /// Answers to Weir's own query written in front of the next client's request to put
    /// the server into its state (gucs::on_the_way), owed before that request's: the
    /// client removes them (1), or none are (0).
    pub owed_internal: u8,
    /// What of that query could not be written yet (then nothing of the request was):
    /// the client writes it first.
    pub prefix_rest: bytes::Bytes,
    /// The statements prepared on it under Weir's names (pooled modes, see prepared).
    pub statements: crate::prepared::ServerStatements,
    /// The unreported settings a client left on it (see gucs); None when there are none.
    pub gucs: Option<Arc<Gucs>>,
    /// Clients whose requests were written behind the running one (pool::pipeline), in
    /// order: the first gets the server at the holder's last ReadyForQuery.
    pub passengers: std::collections::VecDeque<passenger::Passenger>,
    /// What the holder read past its last ReadyForQuery: the start of the first
    /// passenger's answer, which it relays first.
    pub carry: bytes::Bytes,
}

impl fmt::Debug for ServerConn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "S-{}({} pid {})", self.id, self.addr, self.key.pid)
    }
}

impl ServerConn {
    pub(crate) fn next_id() -> u64 {
        crate::registry::next_id()
    }

    /// Whether the socket is registered with another worker's runtime than this one.
    pub fn is_foreign(&self) -> bool {
        let here = crate::workers::current();
        self.home != here && here != crate::workers::MAIN
    }

    /// The same connection, registered with the current worker's runtime.
    pub fn adopted(self) -> std::io::Result<ServerConn> {
        let here = crate::workers::current();
        let ServerConn {
            id,
            info,
            stream,
            params,
            synced_to,
            key,
            addr,
            home: _,
            created,
            idle_since,
            generation,
            sent_ahead,
            owed_internal,
            prefix_rest,
            statements,
            gucs,
            passengers,
            carry,
        } = self;
        Ok(ServerConn {
            id,
            info,
            stream: stream.rebind()?,
            params,
            synced_to,
            key,
            addr,
            home: here,
            created,
            idle_since,
            generation,
            sent_ahead,
            owed_internal,
            prefix_rest,
            statements,
            gucs,
            passengers,
            carry,
        })
    }

    /// Whether something of the next client's was written to it by another task (its
    /// request, or the query that puts the server into its state): it is that client's,
    /// and cannot go back to the pool as it is.
    pub fn holds_ahead(&self) -> bool {
        self.sent_ahead > 0 || self.owed_internal > 0
    }

    /// True when the idle connection shows no sign of having been closed: a server that
    /// terminated it (restart, pg_terminate_backend, idle timeout) has left an error or EOF
    /// to read.
    pub fn is_healthy(&self) -> bool {
        let mut probe = [0u8; 1];
        matches!(self.stream.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }

    /// Runs a query whose results nobody reads (reset, parameter sync, connect_query) and
    /// waits for ReadyForQuery. Returns the first error the server reported, if any.
    pub async fn run_internal(&mut self, sql: &str, timeout: Duration) -> Result<(), ConnectError> {
        self.query_rows(sql, timeout, None).await
    }

    /// As `run_internal`, collecting the rows of a query whose columns are text.
    ///
    /// Weir's queries on a client's behalf start by turning its timeouts off (gucs::GUARD),
    /// but that first statement, and a read-back before it, still run under the client's
    /// statement_timeout, however short. Cut by it (57014), the query left the server idle
    /// and unchanged (its implicit transaction rolled back), and is run again.
    pub async fn query_rows(
        &mut self,
        sql: &str,
        timeout: Duration,
        mut rows: Option<&mut Vec<Vec<Option<String>>>>,
    ) -> Result<(), ConnectError> {
        const CANCELED_RETRIES: u32 = 10;
        let mut attempts = 0;
        loop {
            if let Some(r) = rows.as_deref_mut() {
                r.clear();
            }
            match self
                .query_rows_once(sql, timeout, rows.as_deref_mut())
                .await
            {
                Err(ConnectError::Server(e))
                    if e.code == "57014" && attempts < CANCELED_RETRIES =>
                {
                    attempts += 1;
                }
                r => return r,
            }
        }
    }

    async fn query_rows_once(
        &mut self,
        sql: &str,
        timeout: Duration,
        mut rows: Option<&mut Vec<Vec<Option<String>>>>,
    ) -> Result<(), ConnectError> {
        let lower = sql.to_ascii_lowercase();
        if lower.contains("discard") || lower.contains("deallocate") {
            // Whatever it dropped, Weir's statements are to be prepared again.
            self.statements.clear();
        }
        if lower.contains("discard all") || lower.contains("reset all") {
            self.gucs = None;
        }
        let mut out = BytesMut::with_capacity(sql.len() + 8);
        messages::query(&mut out, sql);
        let work = async {
            self.stream.write_all(&out).await?;
            let mut buf = BytesMut::with_capacity(1024);
            let mut first_error = None;
            loop {
                let msg = read_message(&mut self.stream, &mut buf, 1 << 30).await?;
                match msg.tag {
                    b'Z' => {
                        if !buf.is_empty() {
                            return Err(ConnectError::Protocol(
                                "unexpected data after ReadyForQuery",
                            ));
                        }
                        if msg.body.first() != Some(&b'I') && first_error.is_none() {
                            return Err(ConnectError::Protocol(
                                "internal query left a transaction open",
                            ));
                        }
                        return match first_error {
                            Some(e) => Err(ConnectError::Server(e)),
                            None => Ok(()),
                        };
                    }
                    b'E' => {
                        first_error.get_or_insert_with(|| PgError::parse(&msg.body));
                    }
                    b'S' => {
                        self.params.apply_status(&msg.body);
                        self.synced_to = None;
                    }
                    b'D' => {
                        if let Some(rows) = rows.as_deref_mut() {
                            rows.push(
                                data_row(&msg.body)
                                    .ok_or(ConnectError::Protocol("bad DataRow from server"))?,
                            );
                        }
                    }
                    _ => {}
                }
            }
        };
        match crate::timers::timeout(timeout, work).await {
            Ok(r) => r,
            Err(_) => Err(ConnectError::Timeout),
        }
    }

    /// `run_internal` on the heap, for callers on the hot path's task whose futures would
    /// otherwise grow by its size for a rare step.
    pub async fn run_internal_boxed(
        &mut self,
        sql: &str,
        timeout: Duration,
    ) -> Result<(), ConnectError> {
        Box::pin(self.run_internal(sql, timeout)).await
    }

    /// Closes politely: a Terminate lets PostgreSQL end the backend without logging an
    /// unexpected EOF.
    pub async fn terminate(mut self) {
        let _ = crate::timers::timeout(Duration::from_secs(1), async {
            self.stream.write_all(b"X\0\0\0\x04").await?;
            self.stream.shutdown().await
        })
        .await;
    }

    /// `terminate`, then waits (up to a second) for PostgreSQL to close its end, which it
    /// does once the backend has exited and no longer counts against a role's or a
    /// database's connection limit.
    pub async fn terminate_and_wait(mut self) {
        use tokio::io::AsyncReadExt;
        let _ = crate::timers::timeout(Duration::from_secs(1), async {
            self.stream.write_all(b"X\0\0\0\x04").await?;
            self.stream.flush().await?;
            let mut sink = [0u8; 256];
            while self.stream.read(&mut sink).await? > 0 {}
            Ok::<(), std::io::Error>(())
        })
        .await;
    }
}

/// The text columns of a DataRow, NULL as None.
pub(crate) fn data_row(body: &[u8]) -> Option<Vec<Option<String>>> {
    let mut at = body;
    let n = u16::from_be_bytes(at.get(..2)?.try_into().ok()?);
    at = &at[2..];
    let mut out = Vec::with_capacity(n.into());
    for _ in 0..n {
        let len = i32::from_be_bytes(at.get(..4)?.try_into().ok()?);
        at = &at[4..];
        if len < 0 {
            out.push(None);
            continue;
        }
        let len = len as usize;
        out.push(Some(String::from_utf8_lossy(at.get(..len)?).into_owned()));
        at = &at[len..];
    }
    Some(out)
}

impl From<ReadError> for ConnectError {
    fn from(e: ReadError) -> ConnectError {
        match e {
            ReadError::Io(io) => ConnectError::Io(io),
            ReadError::Closed => ConnectError::Closed,
            ReadError::BadLength | ReadError::TooLarge(_) => {
                ConnectError::Protocol("bad packet from server")
            }
        }
    }
}

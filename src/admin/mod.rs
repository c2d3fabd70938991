//! The admin console: `psql -p 6432 pgbouncer`, PgBouncer's SHOW and control commands.

use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;

use crate::app::App;
use crate::client::login::AdminLogin;
use crate::protocol::{messages, PgError};
use crate::stream::Stream;

/// Serves one console session until the client leaves.
pub async fn serve(_app: Arc<App>, mut stream: Stream, _inbuf: BytesMut, _login: AdminLogin) {
    let err = PgError::fatal("0A000", "the admin console is not available yet");
    let _ = stream.write_all(&messages::error_response(&err)).await;
}

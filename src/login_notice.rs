//! login_notify_message (PgBouncer's master after 1.25, its pull request #1488): a NOTICE every client gets as its
//! login succeeds, written with the rest of the welcome (after AuthenticationOk, before
//! ReadyForQuery, where the protocol allows notices), so that people connecting can tell
//! they reach a pooler and not PostgreSQL itself. PgBouncer writes it as its other
//! notices (severity NOTICE, SQLSTATE 00000); empty, the default, sends none.
//!
//! `configure` builds the message whenever a configuration is installed (start, RELOAD,
//! the console's SET), so that a login copies bytes and reads no configuration.

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use bytes::{Bytes, BytesMut};

use crate::protocol::{messages, PgError};

static NOTICE: ArcSwapOption<Bytes> = ArcSwapOption::const_empty();

/// Takes the login_notify_message of a configuration being installed.
pub fn configure(g: &weir_config::General) {
    NOTICE.store(g.login_notify_message.as_deref().map(|text| {
        // A NUL would end the C string early and leave the rest as a malformed field; a
        // text file can hold one, so the message stops there.
        let text = text.split('\0').next().unwrap_or_default();
        let notice = messages::notice_response(&PgError::new("NOTICE", "00000", text));
        Arc::new(notice.freeze())
    }));
}

/// Appends the notice, if one is configured, to a welcome being written.
pub fn append(out: &mut BytesMut) {
    if let Some(notice) = NOTICE.load().as_deref() {
        out.extend_from_slice(notice);
    }
}

//! A client's side of LISTEN in pooled modes (see crate::listen): a request that only
//! listens or unlistens is answered by the pool's listening hub without lending a server,
//! and the notifications the hub collects are passed on whenever the client is between
//! messages, idle or in a transaction.

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;

use super::{Session, LISTENING};
use crate::pool::PoolMode;
use crate::protocol::{messages, HEADER_LEN};
use crate::sql::ListenOp;

/// One whole message at the start of `buf`: (tag, body).
fn message(buf: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let tag = *buf.first()?;
    let len = u32::from_be_bytes(buf.get(1..5)?.try_into().ok()?) as usize;
    if len < 4 {
        return None;
    }
    let body = buf.get(HEADER_LEN..1 + len)?;
    Some((tag, body, &buf[1 + len..]))
}

fn cstr(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let i = b.iter().position(|&c| c == 0)?;
    Some((&b[..i], &b[i + 1..]))
}

/// A request at the start of `buf` that only listens: a Query, or the unnamed
/// Parse/Bind/[Describe portal]/Execute/Sync drivers send for one without parameters.
/// Its operations, the reply a server would give, and its length.
pub(crate) fn listen_request(buf: &[u8]) -> Option<(Vec<ListenOp>, BytesMut, usize)> {
    let (tag, body, rest) = message(buf)?;
    let mut reply = BytesMut::new();
    let tagged = |reply: &mut BytesMut, ops: &[ListenOp]| {
        for (listen, _) in ops {
            let verb = if *listen { "LISTEN" } else { "UNLISTEN" };
            messages::put_message(reply, b'C', |b| {
                b.extend_from_slice(verb.as_bytes());
                b.extend_from_slice(&[0]);
            });
        }
        messages::ready_for_query(reply, b'I');
    };
    match tag {
        b'Q' => {
            let text = std::str::from_utf8(cstr(body)?.0).ok()?;
            let ops = crate::sql::listen_only(text)?;
            tagged(&mut reply, &ops);
            Some((ops, reply, buf.len() - rest.len()))
        }
        b'P' => {
            let (name, after) = cstr(body)?;
            let (text, types) = cstr(after)?;
            if !name.is_empty() || types.get(..2)? != [0, 0] {
                return None;
            }
            let ops = crate::sql::listen_only(std::str::from_utf8(text).ok()?)?;
            if ops.len() != 1 {
                return None;
            }
            messages::put_message(&mut reply, b'1', |_| {});
            let (tag, bind, mut rest) = message(rest)?;
            // No portal name, no statement name, no parameters.
            if tag != b'B' || bind.get(..2)? != [0, 0] || bind.get(2..6)? != [0, 0, 0, 0] {
                return None;
            }
            messages::put_message(&mut reply, b'2', |_| {});
            let (mut tag, mut next, mut after) = message(rest)?;
            if tag == b'D' {
                if next != b"P\0" {
                    return None;
                }
                messages::put_message(&mut reply, b'n', |_| {});
                rest = after;
                (tag, next, after) = message(rest)?;
            }
            if tag != b'E' || next.first() != Some(&0) {
                return None;
            }
            let (tag, _, after) = message(after)?;
            if tag != b'S' {
                return None;
            }
            tagged(&mut reply, &ops);
            Some((ops, reply, buf.len() - after.len()))
        }
        _ => None,
    }
}

/// The cheap check first: does the request's text start with LISTEN or UNLISTEN?
pub(crate) fn may_listen(buf: &[u8]) -> bool {
    let text = match buf.first() {
        Some(b'Q') => buf.get(HEADER_LEN..),
        // The unnamed statement's text follows its empty name.
        Some(b'P') if buf.get(HEADER_LEN) == Some(&0) => buf.get(HEADER_LEN + 1..),
        _ => None,
    };
    let Some(text) = text else {
        return false;
    };
    let start = text
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(text.len());
    let word = &text[start..text.len().min(start + 8)];
    word.len() >= 6
        && (word[..6].eq_ignore_ascii_case(b"listen") || word.eq_ignore_ascii_case(b"unlisten"))
}

impl Session {
    /// True when the client's next request may be one `answer_listen` answers.
    pub(super) fn may_listen(&self) -> bool {
        self.mode != PoolMode::Session && may_listen(&self.inbuf)
    }

    /// Answers a request that only listens or unlistens through the pool's hub. False
    /// when the request is anything else (or not whole yet: then a server runs it, and
    /// the client is pinned to it while it listens there).
    pub(super) async fn answer_listen(&mut self) -> bool {
        if !self.may_listen() {
            return false;
        }
        let Some((ops, reply, len)) = listen_request(&self.inbuf) else {
            return false;
        };
        let pid = self.client.0.key.pid;
        for (listen, channel) in &ops {
            match (listen, channel) {
                (true, Some(ch)) => {
                    let keys = self.scram_keys();
                    crate::listen::listen(&self.pool, keys, &self.client.0, ch).await;
                }
                (_, ch) => crate::listen::unlisten(&self.pool, pid, ch.as_deref()),
            }
        }
        self.set_tie(
            LISTENING,
            !crate::listen::channels_of(&self.pool, pid).is_empty(),
        );
        let _ = self.inbuf.split_to(len);
        self.cframe.reset();
        self.outbuf.extend_from_slice(&reply);
        self.sframe.rewritten(0, self.outbuf.len());
        true
    }

    /// A query sent to a server that stops listening (asyncpg's pool sends UNLISTEN * on
    /// release, DISCARD ALL does it too) stops the hub's deliveries as well.
    pub(super) fn note_unlistens(&mut self, text: &[u8]) {
        let Ok(text) = std::str::from_utf8(text) else {
            return;
        };
        let pid = self.client.0.key.pid;
        for ch in crate::sql::unlistens(text) {
            crate::listen::unlisten(&self.pool, pid, ch.as_deref());
        }
        self.set_tie(
            LISTENING,
            !crate::listen::channels_of(&self.pool, pid).is_empty(),
        );
    }

    /// In the relay: adds the notifications waiting for the client after what is framed,
    /// when that ends at a message boundary.
    pub(super) fn add_notifications(&mut self) {
        if !self.sframe.at_boundary() || self.sframe.scanned() != self.outbuf.len() {
            return;
        }
        if !self.client.0.take_notified() {
            return;
        }
        if let Some(n) = crate::listen::take(&self.pool, self.client.0.key.pid) {
            let at = self.sframe.scanned();
            self.outbuf.extend_from_slice(&n);
            self.sframe.rewritten(at, n.len());
        }
    }

    /// While idle: sends the notifications waiting for the client. False when it is gone.
    pub(super) async fn send_notifications(&mut self) -> bool {
        if !self.client.0.take_notified() {
            return true;
        }
        match crate::listen::take(&self.pool, self.client.0.key.pid) {
            Some(n) => self.stream.write_all(&n).await.is_ok(),
            None => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::messages::put_message;

    fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut b = BytesMut::new();
        put_message(&mut b, tag, |o| o.extend_from_slice(body));
        b.to_vec()
    }

    #[test]
    fn simple_and_extended_listen_requests() {
        let q = msg(b'Q', b"LISTEN a; UNLISTEN b\0");
        let (ops, reply, len) = listen_request(&q).expect("listen");
        assert_eq!(
            ops,
            vec![(true, Some("a".into())), (false, Some("b".into()))]
        );
        assert_eq!(len, q.len());
        assert_eq!(
            &reply[..],
            [
                msg(b'C', b"LISTEN\0"),
                msg(b'C', b"UNLISTEN\0"),
                msg(b'Z', b"I")
            ]
            .concat()
        );

        let ext = [
            msg(b'P', b"\0LISTEN c\0\0\0"),
            msg(b'B', b"\0\0\0\0\0\0\0\0"),
            msg(b'D', b"P\0"),
            msg(b'E', b"\0\0\0\0\0"),
            msg(b'S', b""),
        ]
        .concat();
        let (ops, reply, len) = listen_request(&ext).expect("extended listen");
        assert_eq!(ops, vec![(true, Some("c".into()))]);
        assert_eq!(len, ext.len());
        assert_eq!(
            &reply[..],
            [
                msg(b'1', b""),
                msg(b'2', b""),
                msg(b'n', b""),
                msg(b'C', b"LISTEN\0"),
                msg(b'Z', b"I")
            ]
            .concat()
        );
        // Not whole yet, or not only LISTEN: a server runs it.
        assert!(listen_request(&ext[..ext.len() - 1]).is_none());
        assert!(listen_request(&msg(b'Q', b"LISTEN a; select 1\0")).is_none());
    }
}

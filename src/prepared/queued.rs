//! A request framed while its client queued (rewritten as if the server it gets held its
//! statements, see `ClientStatements::ahead`), read back once the client has a server:
//! where each use of a statement (a Bind or Describe by Weir's name) is, in the request's
//! bytes and in the reply queue, and where the batch holding it starts in both. What
//! Weir adds for a use goes there, not in front of the whole request: PostgreSQL skips
//! to the Sync after an error, so an error of Weir's addition must fail the batch that
//! needs it and no other.

use super::messages::{bind_parts, server_id, target_parts};
use super::replies::{ClientStatements, Reply};

pub struct Use {
    pub id: u64,
    /// The client's name where the statement has several (`Reply::SentAs`).
    pub name: Option<Box<[u8]>>,
    /// Its message's offset in the request, and its entry in the replies.
    pub at: usize,
    pub reply: usize,
    /// Where its batch starts: the offset after the last Sync or query before it, and
    /// the entry after the last one of those.
    pub batch_at: usize,
    pub batch_reply: usize,
}

/// Every use in `request` (the bytes framed while queueing, as rewritten), in order; Err
/// when the messages and the replies do not agree (a client naming a statement as Weir
/// names it on the server, which such a request cannot hold: those are held back).
pub fn uses(p: &ClientStatements, request: &[u8]) -> Result<Vec<Use>, ()> {
    let mut entries: std::collections::HashMap<u64, std::collections::VecDeque<usize>> =
        std::collections::HashMap::new();
    for (i, r) in p.replies.iter().enumerate() {
        if let Reply::SentAs(b'B' | b'D', id, _) = r {
            entries.entry(*id).or_default().push_back(i);
        }
    }
    let mut out = Vec::new();
    let mut batch_at = 0;
    let mut at = 0;
    while let Some(header) = request.get(at..at + 5) {
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        let next = at + 1 + len.max(4);
        let Some(body) = request.get(at + 5..next) else {
            break;
        };
        let named = match header[0] {
            b'S' | b'Q' | b'F' => {
                batch_at = next;
                None
            }
            b'B' => bind_parts(body).map(|(_, s, _)| s),
            b'D' => target_parts(body).and_then(|(k, n)| (k == b'S').then_some(n)),
            _ => None,
        };
        if let Some((id, queue)) = named
            .and_then(server_id)
            .and_then(|id| Some((id, entries.get_mut(&id)?)))
        {
            let reply = queue.pop_front().ok_or(())?;
            let name = match &p.replies[reply] {
                Reply::SentAs(_, _, name) => name.clone(),
                _ => None,
            };
            out.push(Use {
                id,
                name,
                at,
                reply,
                batch_at,
                batch_reply: batch_start(p, reply),
            });
        }
        at = next;
    }
    if entries.values().any(|q| !q.is_empty()) {
        return Err(());
    }
    Ok(out)
}

/// The first entry of the batch holding `replies[reply]`: after the last entry that ends
/// a batch (a Sync's, a query's) before it.
fn batch_start(p: &ClientStatements, reply: usize) -> usize {
    let mut i = reply;
    while i > 0 && p.replies[i - 1].is_extended() {
        i -= 1;
    }
    i
}

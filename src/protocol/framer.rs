//! Finds message boundaries in a stream that is forwarded as it arrives.
//!
//! The relay never waits for a whole message before passing bytes on: only the 5-byte
//! header is read, the body is skipped over (possibly across many reads), except for the
//! few message types the caller asks to see whole. Framing is by length, never by
//! scanning for a byte: a 'Z' inside a data row is not ReadyForQuery.

use std::ops::Range;

use super::HEADER_LEN;

/// 32-bit offsets: every client's session holds two framers, and neither a buffer (the
/// relay stops reading at 256 kB) nor a message (at most 1 GB) comes near 4 GB.
#[derive(Debug, Default)]
pub struct Framer {
    /// Bytes of the buffer before this offset have been framed and may be forwarded.
    scanned: u32,
    /// Bytes of the current message's body that have not arrived yet.
    skip: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub tag: u8,
    /// Offset of the message header in the buffer.
    pub start: usize,
    /// The body, present only for tags the caller wanted whole.
    pub body: Option<Range<usize>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("bad packet header")]
    BadLength,
    #[error("packet too large ({0} bytes)")]
    TooLarge(usize),
}

impl Framer {
    /// Frames the next message of `buf`, or returns None when more bytes are needed.
    pub fn next(
        &mut self,
        buf: &[u8],
        max_len: usize,
        wants_body: impl Fn(u8) -> bool,
    ) -> Result<Option<Frame>, FrameError> {
        self.next_peek(buf, max_len, |t| if wants_body(t) { usize::MAX } else { 0 })
    }

    /// As `next`, where `wants(tag)` says how much of a body to see before framing it:
    /// 0 for none, `usize::MAX` for all of it, n for its first n bytes (a prefix is enough
    /// to recognise a statement without holding a long one back whole).
    pub fn next_peek(
        &mut self,
        buf: &[u8],
        max_len: usize,
        wants: impl Fn(u8) -> usize,
    ) -> Result<Option<Frame>, FrameError> {
        let mut at = Offsets {
            scanned: self.scanned as usize,
            skip: self.skip as usize,
        };
        let frame = at.next(buf, max_len, wants);
        self.scanned = at.scanned as u32;
        self.skip = at.skip as u32;
        frame
    }

    /// How many leading bytes of the buffer are framed and may be forwarded.
    pub fn scanned(&self) -> usize {
        self.scanned as usize
    }

    /// True between messages: nothing of a started message is still to come.
    pub fn at_boundary(&self) -> bool {
        self.skip == 0
    }

    /// The caller removed `n` bytes from the front of the buffer.
    pub fn consumed(&mut self, n: usize) {
        debug_assert!(n <= self.scanned as usize);
        self.scanned -= (n as u32).min(self.scanned);
    }

    /// The caller cut the buffer at a frame's start (dropping that message and what follows).
    pub fn truncate(&mut self, at: usize) {
        self.scanned = at as u32;
        self.skip = 0;
    }

    /// The caller replaced the framed message at `start` (whole, so nothing of it is still
    /// to come) with `len` bytes, or inserted `len` bytes at a boundary `start`.
    pub fn rewritten(&mut self, start: usize, len: usize) {
        debug_assert_eq!(self.skip, 0);
        self.scanned = (start + len) as u32;
    }

    /// The caller put `len` bytes of whole messages in front of the buffer, to be
    /// forwarded first: they count as framed.
    pub fn prepended(&mut self, len: usize) {
        self.scanned += len as u32;
    }

    /// Forgets everything, for a buffer that was cleared.
    pub fn reset(&mut self) {
        *self = Framer::default();
    }
}

/// The framer's state in native width while it works.
struct Offsets {
    scanned: usize,
    skip: usize,
}

impl Offsets {
    fn next(
        &mut self,
        buf: &[u8],
        max_len: usize,
        wants: impl Fn(u8) -> usize,
    ) -> Result<Option<Frame>, FrameError> {
        if self.skip > 0 {
            let n = self.skip.min(buf.len() - self.scanned);
            self.scanned += n;
            self.skip -= n;
            if self.skip > 0 {
                return Ok(None);
            }
        }
        let rest = &buf[self.scanned..];
        if rest.len() < HEADER_LEN {
            return Ok(None);
        }
        let tag = rest[0];
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        if len < 4 {
            return Err(FrameError::BadLength);
        }
        if len > max_len {
            return Err(FrameError::TooLarge(len));
        }
        let total = len + 1;
        let start = self.scanned;
        let want = wants(tag);
        if want > 0 {
            let seen = HEADER_LEN + want.min(len - 4);
            if rest.len() < seen {
                return Ok(None);
            }
            self.scanned += seen;
            self.skip = total - seen;
            return Ok(Some(Frame {
                tag,
                start,
                body: Some(start + HEADER_LEN..start + seen),
            }));
        }
        let have = rest.len().min(total);
        self.scanned += have;
        self.skip = total - have;
        Ok(Some(Frame {
            tag,
            start,
            body: None,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut v = vec![tag];
        v.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn frames_by_length_not_by_content() {
        let mut buf = msg(b'D', b"Z\0\0\0\x05I");
        buf.extend(msg(b'Z', b"I"));
        let mut f = Framer::default();
        let a = f.next(&buf, 1 << 20, |t| t == b'Z').unwrap().unwrap();
        assert_eq!((a.tag, a.body), (b'D', None));
        let b = f.next(&buf, 1 << 20, |t| t == b'Z').unwrap().unwrap();
        assert_eq!(b.tag, b'Z');
        assert_eq!(&buf[b.body.unwrap()], b"I");
        assert_eq!(f.next(&buf, 1 << 20, |_| false).unwrap(), None);
        assert_eq!(f.scanned(), buf.len());
    }

    #[test]
    fn skips_bodies_across_reads() {
        let full = msg(b'd', &[7u8; 100]);
        let mut f = Framer::default();
        let mut buf = full[..10].to_vec();
        assert_eq!(f.next(&buf, 1000, |_| false).unwrap().unwrap().tag, b'd');
        assert_eq!(f.scanned(), 10);
        assert!(!f.at_boundary());
        // forward the 10 bytes, then the rest arrives
        f.consumed(10);
        buf = full[10..].to_vec();
        assert_eq!(f.next(&buf, 1000, |_| false).unwrap(), None);
        assert_eq!(f.scanned(), buf.len());
        assert!(f.at_boundary());
    }

    #[test]
    fn waits_for_wanted_bodies() {
        let full = msg(b'S', b"TimeZone\0UTC\0");
        let mut f = Framer::default();
        assert_eq!(f.next(&full[..8], 1000, |_| true).unwrap(), None);
        assert_eq!(f.scanned(), 0);
        assert!(f.next(&full, 1000, |_| true).unwrap().is_some());
    }

    #[test]
    fn peeks_at_a_prefix() {
        let full = msg(b'Q', b"DISCARD ALL and a long tail\0");
        let mut f = Framer::default();
        assert_eq!(f.next_peek(&full[..10], 1000, |_| 7).unwrap(), None);
        let q = f.next_peek(&full[..14], 1000, |_| 7).unwrap().unwrap();
        assert_eq!(&full[q.body.unwrap()], b"DISCARD");
        assert!(!f.at_boundary());
        // A body shorter than the prefix comes whole.
        let short = msg(b'Q', b"x\0");
        let mut f = Framer::default();
        let q = f.next_peek(&short, 1000, |_| 64).unwrap().unwrap();
        assert_eq!(&short[q.body.unwrap()], b"x\0");
        assert!(f.at_boundary());
    }

    #[test]
    fn rejects_bad_lengths() {
        let mut f = Framer::default();
        assert_eq!(
            f.next(b"Q\0\0\0\x01", 1000, |_| false),
            Err(FrameError::BadLength)
        );
        let mut f = Framer::default();
        assert_eq!(
            f.next(b"Q\0\x01\0\0", 1000, |_| false),
            Err(FrameError::TooLarge(65536))
        );
    }
}

//! Buffers lent to clients only while they have something to move. An idle client holds
//! no buffer at all (PgBouncer's pkt_buf discipline); a busy one takes a buffer from its
//! worker thread's free list and gives it back when it goes idle, so the hot path does not
//! allocate.

use std::cell::RefCell;

use bytes::BytesMut;

/// What a fresh buffer holds; it grows for larger messages and is dropped, not pooled,
/// when it grew past `KEEP_MAX`.
pub const SIZE: usize = 16 * 1024;
const KEEP_MAX: usize = 64 * 1024;
/// Free buffers kept per worker thread: about as many as clients busy at once on it.
const POOL_MAX: usize = 64;

thread_local! {
    static FREE: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
}

/// Makes sure `buf` has room to read into, taking a pooled buffer if it has none.
pub fn ensure(buf: &mut BytesMut) {
    if buf.capacity() == 0 {
        *buf = FREE
            .with(|f| f.borrow_mut().pop())
            .unwrap_or_else(|| BytesMut::with_capacity(SIZE));
    } else if buf.capacity() - buf.len() < SIZE / 4 {
        buf.reserve(SIZE);
    }
}

/// Gives an empty buffer back to the pool, leaving an unallocated one in its place.
pub fn park(buf: &mut BytesMut) {
    if !buf.is_empty() || buf.capacity() == 0 {
        return;
    }
    let mut b = std::mem::take(buf);
    b.clear();
    // Takes back the space consumed by `advance` without allocating; a buffer that cannot
    // hold SIZE that way (a small one from logging in) is freed, not grown to be pooled.
    if b.try_reclaim(SIZE) && b.capacity() <= KEEP_MAX {
        FREE.with(|f| {
            let mut f = f.borrow_mut();
            if f.len() < POOL_MAX {
                f.push(b);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn park_and_reuse() {
        let mut b = BytesMut::new();
        ensure(&mut b);
        assert!(b.capacity() >= SIZE);
        b.extend_from_slice(b"abc");
        park(&mut b);
        assert_eq!(
            b.capacity(),
            3.max(b.capacity()),
            "a non-empty buffer is kept"
        );
        b.clear();
        park(&mut b);
        assert_eq!(b.capacity(), 0);
        let mut c = BytesMut::new();
        ensure(&mut c);
        assert!(c.capacity() >= SIZE);
    }
}

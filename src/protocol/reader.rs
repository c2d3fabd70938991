//! Reading whole messages, for the phases where Weir must look inside every one (startup,
//! authentication, server login). The relay does not use this: it forwards without
//! buffering whole messages (see `framer`).

use std::io;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

use super::HEADER_LEN;

#[derive(Debug)]
pub struct Message {
    pub tag: u8,
    pub body: Bytes,
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("connection closed")]
    Closed,
    #[error("bad packet header")]
    BadLength,
    #[error("packet too large ({0} bytes)")]
    TooLarge(usize),
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// Reads one message, keeping bytes of the following ones in `buf` for the next call.
pub async fn read_message<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut BytesMut,
    max_len: usize,
) -> Result<Message, ReadError> {
    loop {
        if buf.len() >= HEADER_LEN {
            let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
            if len < 4 {
                return Err(ReadError::BadLength);
            }
            if len > max_len {
                return Err(ReadError::TooLarge(len));
            }
            if buf.len() > len {
                let tag = buf[0];
                buf.advance(HEADER_LEN);
                let body = buf.split_to(len - 4).freeze();
                return Ok(Message { tag, body });
            }
            buf.reserve(len + 1 - buf.len());
        } else {
            buf.reserve(512);
        }
        if r.read_buf(buf).await? == 0 {
            return Err(ReadError::Closed);
        }
    }
}

/// Reads a startup-phase packet: a length that counts itself, then the payload (no type byte).
pub async fn read_startup_packet<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut BytesMut,
    max_len: usize,
) -> Result<Bytes, ReadError> {
    loop {
        if buf.len() >= 4 {
            let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
            if len < 8 {
                return Err(ReadError::BadLength);
            }
            if len > max_len {
                return Err(ReadError::TooLarge(len));
            }
            if buf.len() >= len {
                buf.advance(4);
                return Ok(buf.split_to(len - 4).freeze());
            }
            buf.reserve(len - buf.len());
        } else {
            buf.reserve(256);
        }
        if r.read_buf(buf).await? == 0 {
            return Err(if buf.is_empty() {
                ReadError::Closed
            } else {
                ReadError::BadLength
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reads_messages_split_across_reads() {
        let data: &[u8] = b"Z\0\0\0\x05IZ\0\0\0\x05T";
        let mut r = data;
        let mut buf = BytesMut::new();
        let m = read_message(&mut r, &mut buf, 100).await.unwrap();
        assert_eq!((m.tag, &m.body[..]), (b'Z', &b"I"[..]));
        let m = read_message(&mut r, &mut buf, 100).await.unwrap();
        assert_eq!(&m.body[..], b"T");
        assert!(matches!(
            read_message(&mut r, &mut buf, 100).await,
            Err(ReadError::Closed)
        ));
    }

    #[tokio::test]
    async fn rejects_bad_lengths() {
        let mut r: &[u8] = b"Z\0\0\0\x02";
        let mut buf = BytesMut::new();
        assert!(matches!(
            read_message(&mut r, &mut buf, 100).await,
            Err(ReadError::BadLength)
        ));
        let mut r: &[u8] = b"Z\x7f\0\0\x02";
        let mut buf = BytesMut::new();
        assert!(matches!(
            read_message(&mut r, &mut buf, 100).await,
            Err(ReadError::TooLarge(_))
        ));
        let mut r: &[u8] = b"\0\0\0\x03";
        let mut buf = BytesMut::new();
        assert!(matches!(
            read_startup_packet(&mut r, &mut buf, 100).await,
            Err(ReadError::BadLength)
        ));
    }
}

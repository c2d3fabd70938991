//! A socket of either kind Weir talks over: TCP or a Unix-domain socket.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

#[derive(Debug)]
pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    /// Tries a non-blocking read: used to see whether an idle server connection was closed
    /// (or sent something unasked) while it sat in the pool.
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.try_read(buf),
            Stream::Unix(s) => s.try_read(buf),
        }
    }

    /// Writes without waiting; WouldBlock when the socket is not known to be writable.
    pub fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.try_write(buf),
            Stream::Unix(s) => s.try_write(buf),
        }
    }

    /// Reads what has already arrived, with one recv and without waiting for a readiness
    /// event. A socket just accepted has no readiness recorded yet, so an ordinary read
    /// would first go round the event loop even though (TCP_DEFER_ACCEPT) the startup
    /// packet is already there.
    pub fn read_arrived(&self, buf: &mut bytes::BytesMut) -> io::Result<usize> {
        buf.reserve(512);
        let spare = buf.spare_capacity_mut();
        let n = match self {
            Stream::Tcp(s) => socket2::SockRef::from(s).recv(spare)?,
            Stream::Unix(s) => socket2::SockRef::from(s).recv(spare)?,
        };
        // SAFETY: recv initialised the first n bytes of the spare capacity.
        unsafe { buf.set_len(buf.len() + n) };
        Ok(n)
    }

    /// Moves the socket's registration to the current thread's runtime. A server
    /// connection registered where it was opened would otherwise have every readiness
    /// event of the client now using it cross threads.
    pub fn rebind(self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(TcpStream::from_std(s.into_std()?)?),
            Stream::Unix(s) => Stream::Unix(UnixStream::from_std(s.into_std()?)?),
        })
    }

    /// Ready once the socket has something to read (or is closed); needs no buffer.
    pub fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Stream::Tcp(s) => s.poll_read_ready(cx),
            Stream::Unix(s) => s.poll_read_ready(cx),
        }
    }

    /// Our end of the connection.
    pub fn local(&self) -> Endpoint {
        match self {
            Stream::Tcp(s) => s.local_addr().map_or(Endpoint::Unknown, Endpoint::Tcp),
            Stream::Unix(_) => Endpoint::Unix,
        }
    }

    /// The client's end.
    pub fn peer(&self) -> Endpoint {
        match self {
            Stream::Tcp(s) => s.peer_addr().map_or(Endpoint::Unknown, Endpoint::Tcp),
            Stream::Unix(_) => Endpoint::Unix,
        }
    }
}

/// One end of a client connection, kept as an address and formatted only when shown: a
/// client that connects for one transaction should not pay for two strings it never shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Tcp(std::net::SocketAddr),
    Unix,
    /// The socket could not tell (it was already closed).
    Unknown,
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Tcp(a) => a.fmt(f),
            Endpoint::Unix => f.write_str("unix"),
            Endpoint::Unknown => f.write_str("?"),
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

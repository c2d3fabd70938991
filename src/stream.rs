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
    /// The socket was taken out (a parked client's, see client::park): every operation
    /// fails until it is attached again.
    Detached,
}

/// A socket outside any runtime, non-blocking, as a parked client keeps it.
#[derive(Debug)]
pub enum StdSocket {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

impl std::os::fd::AsRawFd for StdSocket {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        match self {
            StdSocket::Tcp(s) => s.as_raw_fd(),
            StdSocket::Unix(s) => s.as_raw_fd(),
        }
    }
}

fn detached() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "socket detached")
}

impl Stream {
    /// Tries a non-blocking read: used to see whether an idle server connection was closed
    /// (or sent something unasked) while it sat in the pool.
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.try_read(buf),
            Stream::Unix(s) => s.try_read(buf),
            Stream::Detached => Err(detached()),
        }
    }

    /// Takes the socket out of the runtime (its readiness record is freed), leaving
    /// `Detached` in its place.
    pub fn detach(&mut self) -> io::Result<StdSocket> {
        match std::mem::replace(self, Stream::Detached) {
            Stream::Tcp(s) => Ok(StdSocket::Tcp(s.into_std()?)),
            Stream::Unix(s) => Ok(StdSocket::Unix(s.into_std()?)),
            Stream::Detached => Err(detached()),
        }
    }

    /// Registers a detached socket with the current thread's runtime.
    pub fn attach(socket: StdSocket) -> io::Result<Stream> {
        Ok(match socket {
            StdSocket::Tcp(s) => Stream::Tcp(TcpStream::from_std(s)?),
            StdSocket::Unix(s) => Stream::Unix(UnixStream::from_std(s)?),
        })
    }

    /// Writes without waiting; WouldBlock when the socket is not known to be writable.
    pub fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.try_write(buf),
            Stream::Unix(s) => s.try_write(buf),
            Stream::Detached => Err(detached()),
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
            Stream::Detached => return Err(detached()),
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
            Stream::Detached => return Err(detached()),
        })
    }

    /// Ready once the socket has something to read (or is closed); needs no buffer.
    pub fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Stream::Tcp(s) => s.poll_read_ready(cx),
            Stream::Unix(s) => s.poll_read_ready(cx),
            Stream::Detached => Poll::Ready(Err(detached())),
        }
    }

    /// Our end of the connection.
    pub fn local(&self) -> Endpoint {
        match self {
            Stream::Tcp(s) => s.local_addr().map_or(Endpoint::Unknown, Endpoint::Tcp),
            Stream::Unix(_) => Endpoint::Unix,
            Stream::Detached => Endpoint::Unknown,
        }
    }

    /// The client's end.
    pub fn peer(&self) -> Endpoint {
        match self {
            Stream::Tcp(s) => s.peer_addr().map_or(Endpoint::Unknown, Endpoint::Tcp),
            Stream::Unix(_) => Endpoint::Unix,
            Stream::Detached => Endpoint::Unknown,
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
            Stream::Detached => Poll::Ready(Err(detached())),
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
            Stream::Detached => Poll::Ready(Err(detached())),
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
            Stream::Detached => Poll::Ready(Err(detached())),
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
            Stream::Detached => Poll::Ready(Err(detached())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Detached => Poll::Ready(Err(detached())),
        }
    }
}

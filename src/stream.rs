//! A socket of either kind Weir talks over: TCP or a Unix-domain socket, in the clear or
//! in TLS.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

#[derive(Debug)]
pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    /// Taken out of the runtime while its client is parked (client::park): every
    /// operation fails until it is unparked.
    Parked(StdSocket),
    /// TLS over one of the above (either side: tokio-rustls' stream is an enum). The
    /// socket stays a `Stream`, so that it can be moved to another runtime (`rebind`)
    /// with its TLS session. Boxed: rustls' state is large, and most streams are plain.
    Tls(Box<tokio_rustls::TlsStream<Stream>>),
}

fn tls_socket(t: &tokio_rustls::TlsStream<Stream>) -> &Stream {
    match t {
        tokio_rustls::TlsStream::Client(c) => c.get_ref().0,
        tokio_rustls::TlsStream::Server(s) => s.get_ref().0,
    }
}

fn tls_socket_mut(t: &mut tokio_rustls::TlsStream<Stream>) -> &mut Stream {
    match t {
        tokio_rustls::TlsStream::Client(c) => c.get_mut().0,
        tokio_rustls::TlsStream::Server(s) => s.get_mut().0,
    }
}

/// A socket outside any runtime, non-blocking, as a parked client keeps it.
#[derive(Debug)]
pub enum StdSocket {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
    /// Closed (taking the socket out of the runtime failed).
    None,
}

impl std::os::fd::AsRawFd for StdSocket {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        match self {
            StdSocket::Tcp(s) => s.as_raw_fd(),
            StdSocket::Unix(s) => s.as_raw_fd(),
            StdSocket::None => -1,
        }
    }
}

fn detached() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "socket parked")
}

impl Stream {
    /// Tries a non-blocking read: used to see whether an idle server connection was closed
    /// (or sent something unasked) while it sat in the pool.
    /// Over TLS the bytes are only peeked at (reading them would take them from the TLS
    /// session): what matters to the caller is whether anything or EOF arrived; `buf`
    /// is then not to be read.
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.try_read(buf),
            Stream::Unix(s) => s.try_read(buf),
            Stream::Parked(_) => Err(detached()),
            Stream::Tls(t) => {
                // Decrypted bytes nobody read, or the peer's close_notify, already taken
                // from the socket: the socket would look quiet.
                let wants_read = match &**t {
                    tokio_rustls::TlsStream::Client(c) => c.get_ref().1.wants_read(),
                    tokio_rustls::TlsStream::Server(s) => s.get_ref().1.wants_read(),
                };
                if !wants_read {
                    return Ok(1);
                }
                // SAFETY: MaybeUninit<u8> has u8's layout, and peek only writes into it.
                let spare = unsafe {
                    std::slice::from_raw_parts_mut(
                        buf.as_mut_ptr().cast::<std::mem::MaybeUninit<u8>>(),
                        buf.len(),
                    )
                };
                // The socket is non-blocking (Tokio's): nothing there is WouldBlock.
                match tls_socket(t) {
                    Stream::Tcp(s) => socket2::SockRef::from(s).peek(spare),
                    Stream::Unix(s) => socket2::SockRef::from(s).peek(spare),
                    _ => Err(detached()),
                }
            }
        }
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls(_))
    }

    /// What has arrived on a plain socket and is not read yet, left there (MSG_PEEK):
    /// asked straight of the kernel, since the runtime's readiness record may be stale
    /// on a socket another worker reads. None over TLS (the bytes are ciphertext) and
    /// on a parked socket.
    pub fn peek_arrived(&self, buf: &mut [u8]) -> Option<usize> {
        use std::os::fd::AsRawFd;
        let fd = match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Parked(_) | Stream::Tls(_) => return None,
        };
        // SAFETY: `buf` is valid for `buf.len()` bytes, and the descriptor is ours.
        let n = unsafe {
            libc::recv(
                fd,
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        Some(usize::try_from(n).unwrap_or(0))
    }

    /// Takes the socket out of the runtime (its readiness record is freed); returns its
    /// file descriptor, for the parking lot to watch.
    pub fn park(&mut self) -> io::Result<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        if self.is_tls() {
            // The TLS session would have to be kept apart from the socket: TLS clients
            // keep their tasks instead.
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "TLS clients are not parked",
            ));
        }
        let std = match std::mem::replace(self, Stream::Parked(StdSocket::None)) {
            Stream::Tcp(s) => StdSocket::Tcp(s.into_std()?),
            Stream::Unix(s) => StdSocket::Unix(s.into_std()?),
            Stream::Parked(s) => s,
            Stream::Tls(_) => unreachable!("checked above"),
        };
        let fd = std.as_raw_fd();
        *self = Stream::Parked(std);
        Ok(fd)
    }

    /// The file descriptor of a parked socket.
    pub fn parked_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        match self {
            Stream::Parked(s) => Some(s.as_raw_fd()),
            _ => None,
        }
    }

    /// Registers a parked socket with the current thread's runtime again.
    pub fn unpark(&mut self) -> io::Result<()> {
        if let Stream::Parked(s) = std::mem::replace(self, Stream::Parked(StdSocket::None)) {
            *self = match s {
                StdSocket::Tcp(s) => Stream::Tcp(TcpStream::from_std(s)?),
                StdSocket::Unix(s) => Stream::Unix(UnixStream::from_std(s)?),
                StdSocket::None => return Err(detached()),
            };
        }
        Ok(())
    }

    /// Writes without waiting; WouldBlock when the socket is not known to be writable.
    /// Not over TLS (the bytes would skip the encryption): WouldBlock there.
    pub fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.try_write(buf),
            Stream::Unix(s) => s.try_write(buf),
            Stream::Parked(_) => Err(detached()),
            Stream::Tls(_) => Err(io::ErrorKind::WouldBlock.into()),
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
            Stream::Parked(_) | Stream::Tls(_) => return Err(detached()),
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
            Stream::Parked(_) => return Err(detached()),
            Stream::Tls(mut t) => {
                let sock = tls_socket_mut(&mut t);
                let plain = std::mem::replace(sock, Stream::Parked(StdSocket::None));
                *sock = plain.rebind()?;
                Stream::Tls(t)
            }
        })
    }

    /// Ready once the socket has something to read (or is closed); needs no buffer.
    /// Over TLS always ready: the session may hold decrypted bytes the socket does not
    /// show (the read that follows waits properly).
    pub fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Stream::Tcp(s) => s.poll_read_ready(cx),
            Stream::Unix(s) => s.poll_read_ready(cx),
            Stream::Parked(_) => Poll::Ready(Err(detached())),
            Stream::Tls(_) => Poll::Ready(Ok(())),
        }
    }

    /// Over TLS, pushes out what the session still holds of earlier writes (a write may
    /// return having only encrypted its bytes); nothing to do otherwise.
    pub fn poll_flush_tls(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            Stream::Tls(t) => Pin::new(&mut **t).poll_flush(cx),
            _ => Poll::Ready(Ok(())),
        }
    }

    /// Our end of the connection.
    /// The uid of the process at the other end of a Unix socket (SO_PEERCRED); None on
    /// TCP, or when the kernel will not say.
    pub fn peer_uid(&self) -> Option<u32> {
        match self {
            Stream::Unix(s) => s.peer_cred().ok().map(|c| c.uid()),
            _ => None,
        }
    }

    pub fn local(&self) -> Endpoint {
        match self {
            Stream::Tcp(s) => s.local_addr().map_or(Endpoint::Unknown, Endpoint::tcp),
            Stream::Unix(_) => Endpoint::Unix,
            Stream::Parked(_) => Endpoint::Unknown,
            Stream::Tls(t) => tls_socket(t).local(),
        }
    }
}

/// One end of a client connection, kept as an address and formatted only when shown: a
/// client that connects for one transaction should not pay for two strings it never shows.
/// 16 bytes (a SocketAddr is 32): every client's registry entry holds two, and idle
/// clients are counted in bytes (client::park). IPv6 addresses are boxed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    V4(std::net::Ipv4Addr, u16),
    V6(Box<std::net::SocketAddrV6>),
    Unix,
    /// The socket could not tell (it was already closed).
    Unknown,
}

impl Endpoint {
    pub fn tcp(addr: std::net::SocketAddr) -> Endpoint {
        match addr {
            std::net::SocketAddr::V4(a) => Endpoint::V4(*a.ip(), a.port()),
            std::net::SocketAddr::V6(a) => Endpoint::V6(Box::new(a)),
        }
    }

    /// The address of a TCP end.
    pub fn addr(&self) -> Option<std::net::SocketAddr> {
        match self {
            Endpoint::V4(ip, port) => Some((*ip, *port).into()),
            Endpoint::V6(a) => Some((**a).into()),
            Endpoint::Unix | Endpoint::Unknown => None,
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self, self.addr()) {
            (_, Some(a)) => a.fmt(f),
            (Endpoint::Unix, None) => f.write_str("unix"),
            _ => f.write_str("?"),
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
            Stream::Parked(_) => Poll::Ready(Err(detached())),
            Stream::Tls(t) => Pin::new(&mut **t).poll_read(cx, buf),
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
            Stream::Parked(_) => Poll::Ready(Err(detached())),
            Stream::Tls(t) => {
                // A write may leave records in the session when the socket is full: push
                // them now, and the relay pushes the rest (`poll_flush_tls`).
                let r = Pin::new(&mut **t).poll_write(cx, buf);
                if matches!(r, Poll::Ready(Ok(_))) {
                    let _ = Pin::new(&mut **t).poll_flush(cx);
                }
                r
            }
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
            Stream::Parked(_) => Poll::Ready(Err(detached())),
            Stream::Tls(t) => Pin::new(&mut **t).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
            Stream::Parked(_) => Poll::Ready(Err(detached())),
            Stream::Tls(t) => Pin::new(&mut **t).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Parked(_) => Poll::Ready(Err(detached())),
            Stream::Tls(t) => Pin::new(&mut **t).poll_shutdown(cx),
        }
    }
}

/// Where a server listens.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ServerAddr {
    Tcp { host: String, port: u16 },
    Unix { path: std::path::PathBuf },
}

impl std::fmt::Display for ServerAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServerAddr::Tcp { host, port } => write!(f, "{host}:{port}"),
            ServerAddr::Unix { path } => write!(f, "{}", path.display()),
        }
    }
}

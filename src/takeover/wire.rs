//! The takeover channel's framing: a kind byte, a length, a payload, and at most one file
//! descriptor riding along (SCM_RIGHTS). Blocking sockets: each side's channel has threads
//! of its own, away from the runtimes that serve clients.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// The payloads are a client's state or a socket's description: a few kB at most, unless a
/// client holds many prepared statements. Past this, the peer is not one to trust.
const MAX_PAYLOAD: usize = 256 * 1024 * 1024;

const HEADER: usize = 5;

/// Room for the control message of one descriptor, aligned as cmsghdr wants.
#[repr(C, align(8))]
struct CmsgSpace([u8; 64]);

/// Descriptors one message may carry (a client's socket and its server's).
const MAX_FDS: usize = 2;

pub struct Message {
    pub kind: u8,
    pub payload: Vec<u8>,
    pub fds: Vec<OwnedFd>,
}

/// Sends one message, with `fds` on its first byte.
pub fn send(sock: &UnixStream, kind: u8, payload: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many descriptors",
        ));
    }
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|&n| (n as usize) <= MAX_PAYLOAD)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "takeover message too large"))?;
    let mut head = [0u8; HEADER];
    head[0] = kind;
    head[1..].copy_from_slice(&len.to_be_bytes());
    let mut space = CmsgSpace([0; 64]);
    let mut iov = libc::iovec {
        iov_base: head.as_mut_ptr().cast(),
        iov_len: HEADER,
    };
    // SAFETY: msghdr is plain data; every pointer set below outlives the sendmsg call, and
    // the control buffer is large and aligned enough for one descriptor's cmsg.
    let sent = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !fds.is_empty() {
            let fd_len = (std::mem::size_of::<RawFd>() * fds.len()) as u32;
            msg.msg_control = space.0.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(fd_len) as _;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(fd_len) as _;
            let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
            for (i, fd) in fds.iter().enumerate() {
                std::ptr::write_unaligned(data.add(i), fd.as_raw_fd());
            }
        }
        loop {
            let n = libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL);
            if n >= 0 {
                break n as usize;
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    };
    // The descriptor went with the first byte; the rest is plain stream data.
    let mut w = sock;
    w.write_all(&head[sent..])?;
    w.write_all(payload)
}

/// Receives one message; None at a clean end of the stream.
pub fn recv(sock: &UnixStream) -> io::Result<Option<Message>> {
    let mut head = [0u8; HEADER];
    let mut space = CmsgSpace([0; 64]);
    let mut iov = libc::iovec {
        iov_base: head.as_mut_ptr().cast(),
        iov_len: HEADER,
    };
    let mut fds: Vec<OwnedFd> = Vec::new();
    // SAFETY: as in `send`; descriptors the kernel passed are owned from here on (closed
    // on exec by MSG_CMSG_CLOEXEC), and cmsgs are walked with the libc macros within
    // msg_controllen.
    let got = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = space.0.as_mut_ptr().cast();
        msg.msg_controllen = space.0.len() as _;
        let n = loop {
            let n = libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC);
            if n >= 0 {
                break n as usize;
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        };
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg);
                let bytes = (*cmsg).cmsg_len as usize - (data as usize - cmsg as usize);
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    let fd = std::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        if msg.msg_flags & libc::MSG_CTRUNC != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "takeover message came with more descriptors than expected",
            ));
        }
        n
    };
    if got == 0 {
        return Ok(None);
    }
    let mut r = sock;
    r.read_exact(&mut head[got..])?;
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > MAX_PAYLOAD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "takeover message too large",
        ));
    }
    let mut payload = vec![0; len];
    r.read_exact(&mut payload)?;
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "takeover message came with too many descriptors",
        ));
    }
    Ok(Some(Message {
        kind: head[0],
        payload,
        fds,
    }))
}

/// The uid of the process at the other end.
pub fn peer_uid(sock: &UnixStream) -> io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a valid socket, and a ucred buffer of the size passed.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::addr_of_mut!(cred).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        Ok(cred.uid)
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_descriptor_travels_with_its_message() {
        let (a, b) = UnixStream::pair().expect("pair");
        let (x, mut y) = UnixStream::pair().expect("pair");
        use std::os::fd::AsFd;
        let (z, _w) = UnixStream::pair().expect("pair");
        send(&a, 7, b"hello", &[x.as_fd(), z.as_fd()]).expect("send");
        send(&a, 8, b"", &[]).expect("send");
        drop(a);
        let mut m = recv(&b).expect("recv").expect("a message");
        assert_eq!((m.kind, &m.payload[..], m.fds.len()), (7, &b"hello"[..], 2));
        m.fds.pop();
        let passed = UnixStream::from(m.fds.pop().expect("a descriptor"));
        (&passed).write_all(b"through").expect("write");
        let mut buf = [0u8; 7];
        y.read_exact(&mut buf).expect("read");
        assert_eq!(&buf, b"through");
        let m = recv(&b).expect("recv").expect("a message");
        assert_eq!((m.kind, m.payload.len(), m.fds.len()), (8, 0, 0));
        assert!(recv(&b).expect("recv").is_none());
        drop(x);
    }
}

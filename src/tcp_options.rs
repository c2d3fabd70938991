//! Socket options PgBouncer applies to every TCP connection, client and server side:
//! keepalive (tcp_keepalive, tcp_keepidle, tcp_keepintvl, tcp_keepcnt), tcp_user_timeout
//! and tcp_socket_buffer.

use std::time::Duration;

use socket2::{SockRef, TcpKeepalive};
use weir_config::General;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TcpOptions {
    pub keepalive: bool,
    pub keepidle: u32,
    pub keepintvl: u32,
    pub keepcnt: u32,
    pub user_timeout_ms: u32,
    pub socket_buffer: u32,
}

impl TcpOptions {
    pub fn from_config(g: &General) -> TcpOptions {
        TcpOptions {
            keepalive: g.tcp_keepalive,
            keepidle: g.tcp_keepidle,
            keepintvl: g.tcp_keepintvl,
            keepcnt: g.tcp_keepcnt,
            user_timeout_ms: g.tcp_user_timeout,
            socket_buffer: g.tcp_socket_buffer,
        }
    }

    /// Applies the options; 0 leaves the operating system's default, as in PgBouncer.
    pub fn apply(&self, socket: SockRef<'_>) -> std::io::Result<()> {
        socket.set_nodelay(true)?;
        if self.keepalive {
            let mut ka = TcpKeepalive::new();
            if self.keepidle > 0 {
                ka = ka.with_time(Duration::from_secs(self.keepidle.into()));
            }
            if self.keepintvl > 0 {
                ka = ka.with_interval(Duration::from_secs(self.keepintvl.into()));
            }
            if self.keepcnt > 0 {
                ka = ka.with_retries(self.keepcnt);
            }
            socket.set_tcp_keepalive(&ka)?;
        }
        if self.user_timeout_ms > 0 {
            socket
                .set_tcp_user_timeout(Some(Duration::from_millis(self.user_timeout_ms.into())))?;
        }
        if self.socket_buffer > 0 {
            socket.set_send_buffer_size(self.socket_buffer as usize)?;
            socket.set_recv_buffer_size(self.socket_buffer as usize)?;
        }
        Ok(())
    }
}

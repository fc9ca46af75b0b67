//! Socket options every TCP connection of a job gets: the store's and the data links'. A
//! leaf, so that the store (which the transport's waiters listen to) and the transport share
//! them without importing each other.

use std::net::TcpStream;
use std::time::Duration;

/// Silence after which a connection is probed, the interval between probes and how many may
/// go unanswered: a host that vanishes (cable cut, power lost) without closing its sockets is
/// noticed within about KEEPALIVE_IDLE + KEEPALIVE_PROBES x KEEPALIVE_INTERVAL = 11 s.
/// Nine probes because a lossy network loses probes too. With 5% of each host's packets
/// dropped in and out, a probe or its answer is lost about one time in five; three in a row
/// (the old count, 1 in 150 per idle spell) ended a healthy store connection in a CI run of
/// the lossy netns test. Nine in a row is about 1 in 4 million.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(2);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
const KEEPALIVE_PROBES: u32 = 9;

/// Turns on TCP keep-alive with the short timings above: on the job's store connections, whose
/// end on the server tells every rank that the host went away, and on the data links.
/// (Not TCP_USER_TIMEOUT: it would also end a healthy link whose receiver computes for longer
/// than the timeout while the sender's data waits in a full window.)
pub(crate) fn keep_alive(stream: &TcpStream) -> std::io::Result<()> {
    use rustix::net::sockopt;
    sockopt::set_socket_keepalive(stream, true)?;
    sockopt::set_tcp_keepidle(stream, KEEPALIVE_IDLE)?;
    sockopt::set_tcp_keepintvl(stream, KEEPALIVE_INTERVAL)?;
    sockopt::set_tcp_keepcnt(stream, KEEPALIVE_PROBES)?;
    Ok(())
}

/// Applies the socket options every data connection gets; `dscp`, when set, marks its packets
/// (see `mark_traffic`).
pub(crate) fn tune_socket(stream: &TcpStream, bufsize: usize, dscp: Option<u8>) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    keep_alive(stream)?;
    let s = socket2::SockRef::from(stream);
    s.set_send_buffer_size(bufsize)?;
    s.set_recv_buffer_size(bufsize)?;
    if let Some(dscp) = dscp {
        mark_traffic(stream, dscp)?;
    }
    Ok(())
}

/// Marks what `stream` sends with DSCP code point `dscp` (the IP header's traffic class, which
/// switches and routers queue by: the TCP counterpart of RoCE's traffic class) and gives it
/// the matching priority in this host's own queues (SO_PRIORITY, the class selector: DSCP / 8,
/// at most 6, the highest an unprivileged process may set). The ECN bits stay the kernel's.
pub(crate) fn mark_traffic(stream: &TcpStream, dscp: u8) -> std::io::Result<()> {
    let s = socket2::SockRef::from(stream);
    let tos = u32::from(dscp) << 2;
    match stream.local_addr()? {
        std::net::SocketAddr::V4(_) => s.set_tos_v4(tos)?,
        std::net::SocketAddr::V6(_) => s.set_tclass_v6(tos)?,
    }
    s.set_priority(u32::from(dscp >> 3).min(6))
}

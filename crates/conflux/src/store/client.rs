//! The store's client, and the monitor connection every rank keeps open.

use super::wire::{self, kind, Dec, Enc};
use super::{Event, StoreError};
use crate::auth::{self, AuthError, Purpose, Token};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Extra time the client waits for an answer beyond the server-side deadline.
const REPLY_SLACK: Duration = Duration::from_secs(5);

/// The request connection, and why it can no longer be used: a request that failed midway
/// (no answer in time, a broken frame) leaves the stream out of step, and the late answer
/// would be read as the next request's.
struct Line {
    stream: TcpStream,
    broken: Option<String>,
}

/// A connection to the store, usable from several threads (requests are serialized).
pub struct StoreClient {
    addr: SocketAddr,
    conn: Mutex<Line>,
    /// Proves every connection this client opens (monitors too), when the job has a token.
    token: Option<Token>,
}

impl StoreClient {
    /// Connects to `addr` ("host:port"), retrying until `timeout`: rank 0 may not be serving yet.
    /// With `token`, runs the mutual handshake first; its failure is final, not retried.
    pub fn connect(addr: &str, timeout: Duration, token: Option<Token>) -> Result<StoreClient, StoreError> {
        let deadline = Instant::now() + timeout;
        let fail = |detail: String| StoreError::Connection { addr: addr.to_string(), detail };
        let mut pause = Duration::from_millis(5);
        loop {
            let last = match resolve(addr) {
                Ok(sa) => match TcpStream::connect_timeout(&sa, Duration::from_secs(2)) {
                    Ok(conn) => {
                        let _ = conn.set_nodelay(true);
                        let left = deadline.saturating_duration_since(Instant::now());
                        prove(&conn, sa, token.as_ref(), left.min(auth::HANDSHAKE_TIMEOUT))?;
                        return Ok(StoreClient {
                            addr: sa,
                            conn: Mutex::new(Line { stream: conn, broken: None }),
                            token,
                        });
                    }
                    Err(e) => e.to_string(),
                },
                Err(e) => e,
            };
            if Instant::now() + pause > deadline {
                return Err(fail(format!("not reachable within {:.1}s: {last}", timeout.as_secs_f64())));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }

    pub fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let body = self.request(&Enc::new(kind::SET).bytes(key.as_bytes()).bytes(value).finish(), Duration::ZERO)?;
        expect(&body, kind::OK)
    }

    /// The value of `key`, waiting up to `timeout` for it to be set.
    pub fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        let body = self.request(&keys_request(kind::GET, &[key], timeout), timeout)?;
        let mut d = Dec::new(&body)?;
        match d.kind {
            kind::VALUE => Ok(d.bytes()?.to_vec()),
            kind::TIMEOUT => Err(timeout_error(&mut d, timeout)?),
            k => Err(wire::bad(&format!("unexpected reply {k} to get"))),
        }
    }

    /// Waits up to `timeout` until every key in `keys` is set.
    pub fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), StoreError> {
        let body = self.request(&keys_request(kind::WAIT, keys, timeout), timeout)?;
        let mut d = Dec::new(&body)?;
        match d.kind {
            kind::OK => Ok(()),
            kind::TIMEOUT => Err(timeout_error(&mut d, timeout)?),
            k => Err(wire::bad(&format!("unexpected reply {k} to wait"))),
        }
    }

    /// Adds `delta` to the integer at `key` (0 when unset) and returns the new value.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        let body =
            self.request(&Enc::new(kind::ADD).bytes(key.as_bytes()).u64(delta as u64).finish(), Duration::ZERO)?;
        let mut d = Dec::new(&body)?;
        match d.kind {
            kind::INT => Ok(d.u64()? as i64),
            _ => Err(StoreError::Protocol(format!("key {key} does not hold an integer"))),
        }
    }

    /// The store server's CLOCK_MONOTONIC in nanoseconds (rank 0 serves the store: its clock).
    pub fn server_clock_ns(&self) -> Result<u64, StoreError> {
        let body = self.request(&Enc::new(kind::CLOCK).finish(), Duration::ZERO)?;
        let mut d = Dec::new(&body)?;
        match d.kind {
            kind::INT => Ok(d.u64()?),
            k => Err(wire::bad(&format!("unexpected reply {k} to clock"))),
        }
    }

    /// The ranks that have left the job: their process died or said goodbye (sorted).
    pub fn gone(&self) -> Result<Vec<usize>, StoreError> {
        let body = self.request(&Enc::new(kind::GONE).finish(), Duration::ZERO)?;
        let mut d = Dec::new(&body)?;
        match d.kind {
            kind::VALUE => {
                Ok(d.bytes()?.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8")) as usize).collect())
            }
            k => Err(wire::bad(&format!("unexpected reply {k} to gone"))),
        }
    }

    /// Opens monitor `channel` of `rank`: channel 0 is the process's own line, whose closing
    /// without a goodbye means the rank died; each communicator opens one more of its own, so
    /// that each hears every event.
    /// Connecting may take up to `timeout`: the job's deadline, not a few seconds, since a lost
    /// SYN is sent again after 1, 2, 4, 8 s (at 5 s, three losses in a row failed one connection
    /// in 150 with 5% of each host's packets dropped).
    pub fn monitor(&self, rank: usize, channel: u64, timeout: Duration) -> Result<Monitor, StoreError> {
        let conn = TcpStream::connect_timeout(&self.addr, timeout).map_err(|e| self.broken(e))?;
        let _ = conn.set_nodelay(true);
        // And the store's host vanishing must end it here.
        let _ = crate::sockopt::keep_alive(&conn);
        prove(&conn, self.addr, self.token.as_ref(), auth::HANDSHAKE_TIMEOUT)?;
        let mut m = Monitor { conn, buf: Vec::new(), lost: false };
        m.send(&Enc::new(kind::MONITOR).u64(rank as u64).u64(channel).finish()).map_err(|e| self.broken(e))?;
        m.conn.set_nonblocking(true).map_err(|e| self.broken(e))?;
        Ok(m)
    }

    fn request(&self, frame: &[u8], server_wait: Duration) -> Result<Vec<u8>, StoreError> {
        let mut line = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(why) = &line.broken {
            return Err(StoreError::Connection {
                addr: self.addr.to_string(),
                detail: format!("connection unusable since an earlier request failed: {why}"),
            });
        }
        let r = exchange(&mut line.stream, frame, server_wait + REPLY_SLACK);
        r.map_err(|e| {
            let e = self.broken(e);
            line.broken = Some(e.to_string());
            e
        })
    }

    fn broken(&self, e: std::io::Error) -> StoreError {
        if e.kind() == ErrorKind::PermissionDenied {
            return StoreError::Auth { addr: self.addr.to_string(), source: AuthError::Required("store") };
        }
        StoreError::Connection { addr: self.addr.to_string(), detail: e.to_string() }
    }
}

/// Sends one request and reads its answer, waiting at most `patience` for it.
fn exchange(stream: &mut TcpStream, frame: &[u8], patience: Duration) -> std::io::Result<Vec<u8>> {
    stream.set_read_timeout(Some(patience))?;
    stream.write_all(frame)?;
    match wire::read_frame(stream) {
        Ok(Some(body)) => Ok(body),
        Ok(None) => Err(std::io::Error::new(ErrorKind::UnexpectedEof, "the store closed the connection")),
        // A read timeout surfaces as EAGAIN, whose text ("Resource temporarily unavailable")
        // would not tell the user that the store stopped answering.
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => Err(std::io::Error::new(
            ErrorKind::TimedOut,
            format!("no complete answer within {:.0}s", patience.as_secs_f64()),
        )),
        Err(e) => Err(e),
    }
}

/// Runs the handshake on a new connection to the store at `addr`, when there is a token.
fn prove(conn: &TcpStream, addr: SocketAddr, token: Option<&Token>, timeout: Duration) -> Result<(), StoreError> {
    match token {
        None => Ok(()),
        Some(t) => auth::connect(conn, t, Purpose::Store, timeout)
            .map_err(|source| StoreError::Auth { addr: addr.to_string(), source }),
    }
}

fn resolve(addr: &str) -> Result<SocketAddr, String> {
    let mut all = addr.to_socket_addrs().map_err(|e| format!("cannot resolve: {e}"))?;
    all.next().ok_or_else(|| "resolves to no address".to_string())
}

fn keys_request(k: u8, keys: &[&str], timeout: Duration) -> Vec<u8> {
    let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
    let mut e = Enc::new(k).u64(ms).u64(keys.len() as u64);
    for key in keys {
        e = e.bytes(key.as_bytes());
    }
    e.finish()
}

fn expect(body: &[u8], want: u8) -> Result<(), StoreError> {
    let d = Dec::new(body)?;
    if d.kind == want {
        Ok(())
    } else {
        Err(wire::bad(&format!("unexpected reply {}", d.kind)))
    }
}

fn timeout_error(d: &mut Dec<'_>, timeout: Duration) -> Result<StoreError, StoreError> {
    let missing = String::from_utf8_lossy(d.bytes()?).into_owned();
    Ok(StoreError::Timeout { keys: missing.split('\n').map(String::from).collect(), secs: timeout.as_secs_f64() })
}

/// This rank's line to the store for the job's life: it hears of dead and failing ranks, and
/// its closing without a goodbye tells the others this rank died.
pub struct Monitor {
    conn: TcpStream,
    buf: Vec<u8>,
    lost: bool,
}

impl AsFd for Monitor {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.conn.as_fd()
    }
}

impl Monitor {
    /// The next event, without blocking.
    pub fn try_event(&mut self) -> Option<Event> {
        if self.lost {
            return None;
        }
        loop {
            match wire::split_frame(&mut self.buf) {
                Ok(Some(body)) => {
                    if let Some(ev) = decode_event(&body) {
                        return Some(ev);
                    }
                    continue;
                }
                Ok(None) => {}
                Err(_) => return self.lose(),
            }
            let mut chunk = [0u8; 4096];
            match self.conn.read(&mut chunk) {
                Ok(0) => return self.lose(),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return None,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return self.lose(),
            }
        }
    }

    /// Tells the other ranks that this rank failed because of `culprit`.
    pub fn report_failure(&mut self, culprit: usize, reason: &str) {
        let _ = self.send(&Enc::new(kind::FAILURE).u64(culprit as u64).bytes(reason.as_bytes()).finish());
    }

    /// Says this rank leaves cleanly; its connection closing afterwards is not a death.
    pub fn goodbye(&mut self) {
        let _ = self.send(&Enc::new(kind::GOODBYE).finish());
    }

    fn lose(&mut self) -> Option<Event> {
        self.lost = true;
        Some(Event::StoreLost)
    }

    fn send(&mut self, frame: &[u8]) -> std::io::Result<()> {
        // Frames are tiny; a blocking write with a short timeout never waits in practice.
        let was_nonblocking = self.conn.set_nonblocking(false).is_ok();
        self.conn.set_write_timeout(Some(Duration::from_secs(2)))?;
        let r = self.conn.write_all(frame);
        if was_nonblocking {
            self.conn.set_nonblocking(true)?;
        }
        r
    }
}

fn decode_event(body: &[u8]) -> Option<Event> {
    let mut d = Dec::new(body).ok()?;
    match d.kind {
        kind::EV_DIED => Some(Event::RankDied { rank: d.u64().ok()? as usize }),
        kind::EV_LEFT => Some(Event::RankLeft { rank: d.u64().ok()? as usize }),
        kind::EV_FAILURE => {
            let culprit = d.u64().ok()? as usize;
            let reporter = d.u64().ok()? as usize;
            let reason = String::from_utf8_lossy(d.bytes().ok()?).into_owned();
            Some(Event::Failure { culprit, reporter, reason })
        }
        _ => None,
    }
}

//! The store's server: one thread per connection, all state behind one lock.
//!
//! A blocking get or wait parks its connection's thread on the condition variable until the
//! keys exist or the client's deadline passes; the client's own read timeout is longer, so it
//! always hears the answer.

use super::wire::{self, kind, Dec, Enc};
use super::{Event, StoreError};
use crate::auth::{self, Purpose, Token};
use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A monitor connection's identity: the rank and which of its lines.
type Channel = (usize, u64);

/// Serves the store until dropped.
pub struct StoreServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    /// Every connection must prove it holds this before a single request is read.
    token: Option<Token>,
}

#[derive(Default)]
struct State {
    kv: HashMap<String, Vec<u8>>,
    closing: bool,
    /// Every open connection, to shut down when the server goes.
    conns: Vec<TcpStream>,
    /// Monitor connections by (rank, channel), for pushing events. Channel 0 is a process's
    /// own line; each communicator of the process opens one more.
    monitors: HashMap<Channel, TcpStream>,
    goodbye: HashSet<Channel>,
    /// Ranks reported dead, each once.
    dead: HashSet<usize>,
    /// Events so far, replayed to monitors that register late.
    history: Vec<Event>,
}

impl StoreServer {
    /// Listens on `addr` (port 0 picks a free one). With `token`, serves only connections that
    /// pass the handshake; the others are closed unread, with a warning naming their address.
    pub fn bind(addr: SocketAddr, token: Option<Token>) -> Result<StoreServer, StoreError> {
        let err = |e: std::io::Error| StoreError::Connection { addr: addr.to_string(), detail: format!("bind: {e}") };
        let listener = TcpListener::bind(addr).map_err(err)?;
        let addr = listener.local_addr().map_err(err)?;
        let shared = Arc::new(Shared { token, ..Shared::default() });
        tracing::debug!(%addr, authenticated = shared.token.is_some(), "store: listening");
        let s = shared.clone();
        let accept = std::thread::Builder::new()
            .name("conflux-store".into())
            .spawn(move || accept_loop(listener, s))
            .map_err(err)?;
        Ok(StoreServer { addr, shared, accept: Some(accept) })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Waits until `world` ranks have said goodbye on channel 0 (or died), so that no rank
    /// sees the store vanish while it is still shutting down. Returns how many did.
    pub fn wait_goodbyes(&self, world: usize, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        let mut st = self.shared.lock();
        loop {
            let left = st.goodbye.iter().filter(|(r, ch)| *ch == 0 && !st.dead.contains(r)).count();
            let gone = left + st.dead.len();
            let now = Instant::now();
            if gone >= world || now >= deadline {
                return gone;
            }
            st = self.shared.changed.wait_timeout(st, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        {
            let mut st = self.shared.lock();
            st.closing = true;
            for c in &st.conns {
                let _ = c.shutdown(Shutdown::Both);
            }
        }
        self.shared.changed.notify_all();
        // Wake the accept loop so it sees `closing`.
        let _ = TcpStream::connect_timeout(&wake_addr(self.addr), Duration::from_millis(200));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

fn wake_addr(addr: SocketAddr) -> SocketAddr {
    let mut a = addr;
    if a.ip().is_unspecified() {
        a.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    a
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for conn in listener.incoming() {
        if shared.lock().closing {
            return;
        }
        let Ok(conn) = conn else { continue };
        let _ = conn.set_nodelay(true);
        // A rank whose host vanishes must end its connection here, which tells every rank.
        let _ = crate::sockopt::keep_alive(&conn);
        let Ok(clone) = conn.try_clone() else {
            continue;
        };
        shared.lock().conns.push(clone);
        let s = shared.clone();
        let _ = std::thread::Builder::new().name("conflux-store-conn".into()).spawn(move || serve(conn, s));
    }
}

/// Serves one connection until it closes or breaks the protocol.
fn serve(mut conn: TcpStream, shared: Arc<Shared>) {
    let mut channel = None;
    let proven = match &shared.token {
        None => Ok(()),
        Some(t) => auth::accept(&conn, t, Purpose::Store, auth::HANDSHAKE_TIMEOUT),
    };
    if let Err(e) = proven {
        if !shared.lock().closing {
            let peer = conn.peer_addr().map_or_else(|_| "an unknown address".into(), |a| a.to_string());
            tracing::warn!("store: refused the connection from {peer}: {e}");
        }
        // Skips the request loop: nothing this connection sent is ever parsed.
        return forget(conn, &shared, None);
    }
    while let Ok(Some(body)) = wire::read_frame(&mut conn) {
        let reply = match handle(&body, &shared, &mut channel, &conn) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("store: closing a connection: {e}");
                break;
            }
        };
        if let Some(r) = reply {
            if wire::write_frame(&mut conn, &r).is_err() {
                break;
            }
        }
    }
    forget(conn, &shared, channel);
}

/// Closes `conn` and drops it from the state; a monitor channel closing without a goodbye is
/// a rank's death.
fn forget(conn: TcpStream, shared: &Shared, channel: Option<Channel>) {
    let _ = conn.shutdown(Shutdown::Both);
    let mut st = shared.lock();
    st.conns.retain(|c| c.peer_addr().ok() != conn.peer_addr().ok() || c.local_addr().ok() != conn.local_addr().ok());
    if let Some(ch) = channel {
        st.monitors.remove(&ch);
        if !st.goodbye.contains(&ch) && !st.closing && st.dead.insert(ch.0) {
            push(&mut st, Event::RankDied { rank: ch.0 }, None);
        }
    }
    drop(st);
    shared.changed.notify_all();
}

fn handle(
    body: &[u8],
    shared: &Shared,
    channel: &mut Option<Channel>,
    conn: &TcpStream,
) -> Result<Option<Vec<u8>>, StoreError> {
    let mut d = Dec::new(body)?;
    match d.kind {
        kind::CLOCK => {
            let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
            let ns = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
            Ok(Some(Enc::new(kind::INT).u64(ns).finish()))
        }
        kind::SET => {
            let (k, v) = (d.str()?.to_string(), d.bytes()?.to_vec());
            shared.lock().kv.insert(k, v);
            shared.changed.notify_all();
            Ok(Some(Enc::new(kind::OK).finish()))
        }
        kind::GONE => {
            // Ranks whose process line closed: died, or said goodbye on channel 0.
            let st = shared.lock();
            let left = st.goodbye.iter().filter(|ch| ch.1 == 0).map(|ch| ch.0);
            let mut gone: Vec<usize> = st.dead.iter().copied().chain(left).collect();
            drop(st);
            gone.sort_unstable();
            gone.dedup();
            let list: Vec<u8> = gone.iter().flat_map(|&r| (r as u64).to_le_bytes()).collect();
            Ok(Some(Enc::new(kind::VALUE).bytes(&list).finish()))
        }
        kind::ADD => {
            let k = d.str()?.to_string();
            let delta = d.u64()? as i64;
            let mut st = shared.lock();
            let cur = st.kv.get(&k).map(|v| std::str::from_utf8(v).ok().and_then(|s| s.parse::<i64>().ok()));
            let cur = match cur {
                None => 0,
                Some(Some(n)) => n,
                Some(None) => return Ok(Some(Enc::new(kind::TIMEOUT).bytes(b"not an integer").finish())),
            };
            let new = cur.wrapping_add(delta);
            st.kv.insert(k, new.to_string().into_bytes());
            drop(st);
            shared.changed.notify_all();
            Ok(Some(Enc::new(kind::INT).u64(new as u64).finish()))
        }
        kind::GET | kind::WAIT => {
            let timeout = Duration::from_millis(d.u64()?);
            let n = d.u64()? as usize;
            if n > 1 << 16 {
                return Err(wire::bad("too many keys"));
            }
            let mut keys = Vec::with_capacity(n);
            for _ in 0..n {
                keys.push(d.str()?.to_string());
            }
            let deadline = Instant::now() + timeout;
            let mut st = shared.lock();
            loop {
                let missing: Vec<&String> = keys.iter().filter(|k| !st.kv.contains_key(*k)).collect();
                if missing.is_empty() {
                    let reply = if d.kind == kind::GET {
                        Enc::new(kind::VALUE).bytes(keys.first().and_then(|k| st.kv.get(k)).map_or(&[], |v| v))
                    } else {
                        Enc::new(kind::OK)
                    };
                    return Ok(Some(reply.finish()));
                }
                let now = Instant::now();
                if now >= deadline || st.closing {
                    let list = missing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n");
                    return Ok(Some(Enc::new(kind::TIMEOUT).bytes(list.as_bytes()).finish()));
                }
                st = shared.changed.wait_timeout(st, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
            }
        }
        kind::MONITOR => {
            let ch = (d.u64()? as usize, d.u64()?);
            let mut st = shared.lock();
            if st.monitors.contains_key(&ch) {
                return Err(wire::bad(&format!("rank {} opened monitor channel {} twice", ch.0, ch.1)));
            }
            let mut w = conn.try_clone().map_err(|e| wire::bad(&e.to_string()))?;
            let _ = w.set_write_timeout(Some(Duration::from_secs(1)));
            for ev in st.history.clone() {
                let _ = w.write_all(&event_frame(&ev));
            }
            st.monitors.insert(ch, w);
            *channel = Some(ch);
            Ok(None)
        }
        kind::FAILURE => {
            let from = channel.ok_or_else(|| wire::bad("failure report on a plain connection"))?;
            let culprit = d.u64()? as usize;
            let reason = String::from_utf8_lossy(d.bytes()?).into_owned();
            let mut st = shared.lock();
            push(&mut st, Event::Failure { culprit, reporter: from.0, reason }, Some(from));
            Ok(None)
        }
        kind::GOODBYE => {
            let ch = channel.ok_or_else(|| wire::bad("goodbye on a plain connection"))?;
            let mut st = shared.lock();
            // The process's own line: it is leaving the job altogether.
            if st.goodbye.insert(ch) && ch.1 == 0 {
                push(&mut st, Event::RankLeft { rank: ch.0 }, Some(ch));
            }
            drop(st);
            shared.changed.notify_all();
            Ok(None)
        }
        k => Err(wire::bad(&format!("unknown request kind {k}"))),
    }
}

/// Records `ev` and sends it to every monitor but `except`. Rank 0's own channels come last:
/// this server lives in rank 0's process, and rank 0 may exit as soon as it hears of a
/// failure, taking the store with it; by then every other rank has the event in its socket.
fn push(st: &mut State, ev: Event, except: Option<Channel>) {
    let frame = event_frame(&ev);
    for host_last in [false, true] {
        for (&ch, w) in st.monitors.iter_mut() {
            if Some(ch) != except && (ch.0 == 0) == host_last {
                let _ = w.write_all(&frame);
            }
        }
    }
    st.history.push(ev);
}

fn event_frame(ev: &Event) -> Vec<u8> {
    match ev {
        Event::RankDied { rank } => Enc::new(kind::EV_DIED).u64(*rank as u64).finish(),
        Event::RankLeft { rank } => Enc::new(kind::EV_LEFT).u64(*rank as u64).finish(),
        Event::Failure { culprit, reporter, reason } => {
            Enc::new(kind::EV_FAILURE).u64(*culprit as u64).u64(*reporter as u64).bytes(reason.as_bytes()).finish()
        }
        // Only a client concludes this; the server has nothing to send for it.
        Event::StoreLost => Vec::new(),
    }
}

//! Building a communicator's links: exchange addresses through the store, map the host's
//! shared segment, connect the TCP mesh, and wait until every rank is ready.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::OwnedFd;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::netif::data_listen_ip;
use crate::algo::select::{Model, ModelSource, Topo};
use crate::auth::{self, Purpose, Token};
use crate::config::{Config, TransportKind};
use crate::error::{Error, Result};
use crate::sockopt::tune_socket;
use crate::store::StoreClient;
use crate::transport::wait::{OnHost, Waiter, Watch};
use crate::transport::{Layout, Link, Segment, Streaming, TcpLink, Transport, Window};

/// The first word of a data connection's greeting, and of a control connection's (the
/// in-flight window's credits, `transport/window.rs`).
const HELLO_MAGIC: u64 = 0x6366_6c78_6865_6c6f;
const CONTROL_MAGIC: u64 = 0x6366_6c78_6374_6c30;

/// Which of a pair's two connections a greeting opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    Data,
    Control,
}

impl Stream {
    fn magic(self) -> u64 {
        match self {
            Stream::Data => HELLO_MAGIC,
            Stream::Control => CONTROL_MAGIC,
        }
    }
}

/// The two connections to one TCP peer.
pub(crate) struct Connected {
    pub peer: usize,
    pub data: TcpStream,
    pub control: TcpStream,
}

/// What each rank tells the others about itself.
#[derive(Debug, Clone)]
pub(crate) struct Peer {
    pub node: String,
    pub pid: u32,
    pub addr: SocketAddr,
    /// The CPUs it may run on. A node's cores are the union of its ranks' (a launcher that
    /// binds each rank to one core leaves every rank seeing a single CPU), the same on every
    /// rank, so that every rank judges oversubscription alike.
    pub cpus: Vec<usize>,
}

impl Peer {
    fn encode(&self) -> Vec<u8> {
        let cpus: Vec<String> = self.cpus.iter().map(|c| c.to_string()).collect();
        format!("{}\n{}\n{}\n{}", self.node, self.pid, self.addr, cpus.join(",")).into_bytes()
    }
    fn decode(b: &[u8]) -> Option<Peer> {
        let s = std::str::from_utf8(b).ok()?;
        let mut it = s.split('\n');
        Some(Peer {
            node: it.next()?.to_string(),
            pid: it.next()?.parse().ok()?,
            addr: it.next()?.parse().ok()?,
            cpus: it.next()?.split(',').filter(|c| !c.is_empty()).map(|c| c.parse().ok()).collect::<Option<_>>()?,
        })
    }
}

/// Cores that `ranks` (of one node) may run on between them.
fn node_cores(peers: &[Peer], ranks: &[usize]) -> usize {
    let mut all: Vec<usize> = ranks.iter().flat_map(|&r| peers[r].cpus.iter().copied()).collect();
    all.sort_unstable();
    all.dedup();
    all.len().max(1)
}

/// Where every rank is, from what each published: the same on every rank.
fn topology(peers: &[Peer], one_segment: bool, local_tcp: bool) -> Topo {
    let mut nodes: Vec<(String, Vec<usize>)> = Vec::new();
    for (r, p) in peers.iter().enumerate() {
        match nodes.iter_mut().find(|(id, _)| *id == p.node) {
            Some((_, ranks)) => ranks.push(r),
            None => nodes.push((p.node.clone(), vec![r])),
        }
    }
    let load = nodes.iter().map(|(_, ranks)| ranks.len() as f64 / node_cores(peers, ranks) as f64).fold(1.0, f64::max);
    Topo { size: peers.len(), nodes: nodes.into_iter().map(|(_, r)| r).collect(), one_segment, local_tcp, load }
}

/// Rank 0 reads the cost model (its tuning file, or the defaults) and publishes it; every
/// rank uses what rank 0 published, and learns from it whether it came from a file (the
/// published text's first line), since only rank 0's `CONFLUX_TUNE_FILE` counts.
fn agree_model(
    store: &StoreClient,
    prefix: &str,
    rank: usize,
    cfg: &Config,
    deadline: Instant,
) -> Result<(Model, ModelSource)> {
    let key = format!("{prefix}/model");
    if rank == 0 {
        let model = match &cfg.tune_file {
            None => Ok((Model::default(), ModelSource::Defaults)),
            Some(path) => std::fs::read_to_string(path)
                .map_err(|e| e.to_string())
                .and_then(|text| Model::from_text(&text))
                .map(|m| (m, ModelSource::TuningFile))
                .map_err(|e| format!("tuning file {}: {e}", path.display())),
        };
        // A bad file fails every rank with rank 0's reason, not just rank 0.
        let text =
            model.as_ref().map_or_else(|e| format!("!{e}"), |(m, src)| format!("{}\n{}", header(*src), m.to_text()));
        store.set(&key, text.as_bytes())?;
        return model.map_err(Error::Config);
    }
    let text = store.get(&key, left(deadline))?;
    let text = String::from_utf8_lossy(&text);
    if let Some(e) = text.strip_prefix('!') {
        return Err(Error::Config(format!("rank 0: {e}")));
    }
    let (head, params) = text.split_once('\n').unwrap_or((&text, ""));
    let src =
        [ModelSource::Defaults, ModelSource::TuningFile].into_iter().find(|s| header(*s) == head).ok_or_else(|| {
            Error::Config(format!(
                "rank 0 published a cost model headed {head:?}: do all ranks run one conflux version?"
            ))
        })?;
    let model = Model::from_text(params).map_err(|e| Error::Config(format!("rank 0's cost model: {e}")))?;
    Ok((model, src))
}

/// The first line of the model rank 0 publishes: where it came from.
fn header(src: ModelSource) -> &'static str {
    match src {
        ModelSource::Defaults => "source: defaults",
        ModelSource::TuningFile => "source: tuning file",
        ModelSource::MeasuredTcp => "source: measured",
    }
}

/// This host's identity: `CONFLUX_NODE_ID`, else hostname plus boot id.
pub(crate) fn node_id(cfg: &Config) -> String {
    if let Some(id) = &cfg.node_id {
        return id.clone();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host = host.trim();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    format!("{host}/{}", boot.trim())
}

pub(crate) fn resolve(addr: &str) -> Result<SocketAddr> {
    addr.to_socket_addrs()
        .map_err(|e| Error::Config(format!("cannot resolve store address {addr:?}: {e}")))?
        .next()
        .ok_or_else(|| Error::Config(format!("store address {addr:?} resolves to nothing")))
}

pub(crate) struct Built {
    pub transport: Transport,
    pub local_ranks: Vec<usize>,
    /// Where the ranks are, and the cost model's parameters: the same on every rank.
    pub topo: Topo,
    pub model: Model,
    /// Where `model` came from: as `known` said, else the defaults or rank 0's file.
    pub source: ModelSource,
}

/// Where a communicator meets: the store, the key prefix that is its own, the global rank of
/// each of its ranks, and the monitor channel this rank's transport listens on.
pub(crate) struct Meeting<'a> {
    pub store: &'a StoreClient,
    pub store_addr: SocketAddr,
    pub prefix: &'a str,
    pub world: Arc<[usize]>,
    pub channel: u64,
}

/// Builds this rank's links of the communicator `at`. `known`: its cost model when already
/// settled (a sub-group's parent's, or lane 0's for lane 1); else rank 0's is agreed on, so
/// that only the job's rank 0 ever reads a tuning file.
pub(crate) fn build(
    at: &Meeting<'_>,
    (rank, size): (usize, usize),
    cfg: &Config,
    abort: Arc<AtomicBool>,
    known: Option<(Model, ModelSource)>,
) -> Result<Built> {
    let (store, store_addr, prefix) = (at.store, at.store_addr, at.prefix);
    let deadline = Instant::now() + cfg.timeout;
    let ip = data_listen_ip(cfg, store_addr)?;
    let listener =
        TcpListener::bind((ip, 0)).map_err(|e| Error::setup(format!("binding a data listener on {ip}"), e))?;
    let me = Peer {
        node: node_id(cfg),
        pid: std::process::id(),
        addr: listener.local_addr().map_err(|e| Error::setup("data listener address", e))?,
        cpus: crate::cpus::allowed(),
    };
    tracing::debug!(rank, addr = %me.addr, authenticated = cfg.job_token.is_some(), "data listener bound");
    store.set(&format!("{prefix}/rank/{rank}"), &me.encode())?;
    let mut peers = Vec::with_capacity(size);
    for r in 0..size {
        let b = store.get(&format!("{prefix}/rank/{r}"), left(deadline))?;
        peers.push(Peer::decode(&b).ok_or_else(|| Error::Config(format!("rank {r} published a malformed address")))?);
    }

    let local_ranks: Vec<usize> = (0..size).filter(|&r| peers[r].node == me.node).collect();
    if cfg.transport == TransportKind::Shm && local_ranks.len() != size {
        let other = (0..size).find(|r| peers[*r].node != me.node).unwrap_or(0);
        return Err(Error::Config(format!(
            "CONFLUX_TRANSPORT=shm, but rank {other} is on node {:?} and this rank on {:?}",
            peers[other].node, me.node
        )));
    }
    let use_shm = cfg.transport != TransportKind::Tcp && local_ranks.len() > 1;
    let shm_peer = |p: usize| use_shm && peers[p].node == me.node;

    let me_local = local_ranks.iter().position(|&r| r == rank).expect("this rank is local to itself");
    let seg =
        if use_shm { Some(Arc::new(map_segment(store, prefix, &local_ranks, me_local, cfg, deadline)?)) } else { None };

    let mut links: Vec<Option<Link>> = (0..size).map(|_| None).collect();
    // With more local ranks than cores, ranks take turns on a core and a probe's time says more
    // about who ran than about where the caches are: streaming only when asked for.
    let oversubscribed = local_ranks.len() > node_cores(&peers, &local_ranks);
    let streaming = match cfg.shm_stream {
        Streaming::Auto if oversubscribed => Streaming::Never,
        s => s,
    };
    if let Some(seg) = &seg {
        if cfg.single_copy {
            crate::transport::single_copy::allow_peer_reads();
        }
        for (pi, &p) in local_ranks.iter().enumerate() {
            if p != rank {
                links[p] = Some(Link::shm(seg, me_local, pi, cfg.single_copy.then_some(peers[p].pid), streaming));
            }
        }
    }
    let bufsize = cfg.socket_buf_bytes.unwrap_or(cfg.tcp_chunk_bytes * cfg.tcp_inflight);
    let token = cfg.job_token.as_ref();
    let window_bytes = cfg.tcp_chunk_bytes * cfg.tcp_inflight;
    for Connected { peer: p, data, control } in
        connect_mesh(&listener, &peers, rank, &|p| !shm_peer(p), token, deadline)?
    {
        for s in [&data, &control] {
            tune_socket(s, bufsize, cfg.traffic_class)
                .map_err(|e| Error::setup(format!("socket options for rank {p}"), e))?;
        }
        let window = Window::new(control, window_bytes).map_err(|e| Error::setup("non-blocking control socket", e))?;
        let link = TcpLink::new(data, window, p, cfg.tcp_chunk_bytes, cfg.checksum)
            .map_err(|e| Error::setup("non-blocking socket", e))?;
        links[p] = Some(Link::tcp(link));
    }

    let mut pidfds: Vec<(usize, OwnedFd)> = Vec::new();
    for &p in &local_ranks {
        if p == rank {
            continue;
        }
        let pid = rustix::process::Pid::from_raw(peers[p].pid as i32);
        if let Some(pid) = pid {
            if let Ok(fd) = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) {
                pidfds.push((p, fd));
            }
        }
    }
    let monitor = store.monitor(at.world[rank], at.channel, left(deadline))?;
    let spin = cfg.spin.unwrap_or(if oversubscribed { Duration::from_micros(30) } else { Duration::from_micros(50) });
    let host = seg.map(|seg| OnHost { seg, me_local, ranks: local_ranks.clone() });
    let world = at.world.clone();
    let monitor = Some(monitor);
    let watch = Watch { host, pidfds, monitor, world, rank, abort, spin, yield_while_spinning: oversubscribed };
    let waiter = Waiter::new(watch).map_err(|e| Error::setup("creating the waiter's eventfd", e))?;

    store.set(&format!("{prefix}/ready/{rank}"), b"1")?;
    let keys: Vec<String> = (0..size).map(|r| format!("{prefix}/ready/{r}")).collect();
    let keys: Vec<&str> = keys.iter().map(|s| s.as_str()).collect();
    store.wait(&keys, left(deadline))?;
    let transport = Transport::new(rank, size, links, waiter);
    let topo = topology(&peers, use_shm && local_ranks.len() == size, cfg.transport == TransportKind::Tcp);
    let (model, source) = match known {
        Some(settled) => settled,
        None => agree_model(store, prefix, rank, cfg, deadline)?,
    };
    Ok(Built { transport, local_ranks, topo, model, source })
}

fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))
}

/// The leader creates the host's segment and publishes where to find it; the others open it.
fn map_segment(
    store: &StoreClient,
    prefix: &str,
    local_ranks: &[usize],
    me_local: usize,
    cfg: &Config,
    deadline: Instant,
) -> Result<Segment> {
    let layout = Layout::new(local_ranks.len(), cfg.shm_ring_bytes, cfg.shm_chunk_bytes);
    let key = format!("{prefix}/shm/{}", local_ranks[0]);
    if me_local == 0 {
        let seg = Segment::create(layout).map_err(|e| Error::setup("creating the shared segment (memfd)", e))?;
        store.set(&key, format!("{} {}", std::process::id(), seg.raw_fd()).as_bytes())?;
        seg.prefault(me_local);
        Ok(seg)
    } else {
        let v = store.get(&key, left(deadline))?;
        let s = String::from_utf8_lossy(&v);
        let mut it = s.split(' ').map(|x| x.parse::<i64>());
        let (Some(Ok(pid)), Some(Ok(fd))) = (it.next(), it.next()) else {
            return Err(Error::Config(format!("malformed shared segment handle {s:?}")));
        };
        let seg = Segment::open(pid as u32, fd as i32, layout)
            .map_err(|e| Error::setup(format!("opening rank {}'s shared segment through /proc", local_ranks[0]), e))?;
        seg.prefault(me_local);
        Ok(seg)
    }
}

/// Connects to every lower rank that needs TCP and accepts every higher one, two connections
/// per pair (data, then control). With `token`, each connection first passes the handshake; an
/// accepted one that fails it is closed unread and logged, and the wait goes on for the real peer.
fn connect_mesh(
    listener: &TcpListener,
    peers: &[Peer],
    rank: usize,
    wants_tcp: &dyn Fn(usize) -> bool,
    token: Option<&Token>,
    deadline: Instant,
) -> Result<Vec<Connected>> {
    let mut out = Vec::new();
    for p in (0..rank).filter(|&p| wants_tcp(p)) {
        let data = connect(&peers[p], p, rank, Stream::Data, token, deadline)?;
        let control = connect(&peers[p], p, rank, Stream::Control, token, deadline)?;
        out.push(Connected { peer: p, data, control });
    }
    let higher: Vec<usize> = (rank + 1..peers.len()).filter(|&p| wants_tcp(p)).collect();
    let mut expected: Vec<(usize, Stream)> =
        higher.iter().flat_map(|&p| [(p, Stream::Data), (p, Stream::Control)]).collect();
    let mut got: Vec<(usize, Stream, TcpStream)> = Vec::new();
    // Each accepted connection is greeted on a thread of its own (the token's handshake, then
    // the greeting), with the job's deadline as its patience: a greeting retransmitted over a
    // lossy link may take seconds, a connection given up on here would be one its rank
    // believes made, and a stranger that never speaks holds up nobody. The connections still
    // being greeted when this returns are shut down, which ends their threads.
    let (tx, rx) = std::sync::mpsc::channel::<(usize, usize, Stream, TcpStream)>();
    let mut greeting: Vec<Option<TcpStream>> = Vec::new();
    listener.set_nonblocking(true).map_err(|e| Error::setup("listener", e))?;
    let done = loop {
        if expected.is_empty() {
            break Ok(());
        }
        if Instant::now() >= deadline {
            let ranks: Vec<usize> = higher.iter().copied().filter(|p| expected.iter().any(|(q, _)| q == p)).collect();
            break Err(Error::setup(
                format!("waiting for TCP connections from ranks {ranks:?}"),
                std::io::ErrorKind::TimedOut.into(),
            ));
        }
        match listener.accept() {
            Ok((s, from_addr)) => {
                let Ok(handle) = s.try_clone() else { continue };
                let (i, tx, token) = (greeting.len(), tx.clone(), token.cloned());
                greeting.push(Some(handle));
                let greeter = std::thread::Builder::new().name("conflux-greet".into()).spawn(move || {
                    if let Some((from, kind, s)) = greet(s, from_addr, token.as_ref(), rank, deadline) {
                        let _ = tx.send((i, from, kind, s));
                    }
                });
                if let Err(e) = greeter {
                    break Err(Error::setup("starting a thread to greet a data connection", e));
                }
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => break Err(Error::setup("accepting data connections", e)),
        }
        if let Ok((i, from, kind, s)) = rx.recv_timeout(Duration::from_millis(1)) {
            greeting[i] = None;
            match expected.iter().position(|&e| e == (from, kind)) {
                Some(k) => {
                    expected.swap_remove(k);
                    got.push((from, kind, s));
                }
                None => tracing::warn!("rank {rank}: dropped a second {kind:?} connection greeting as rank {from}"),
            }
        }
    };
    for s in greeting.into_iter().flatten() {
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
    done?;
    for p in higher {
        let mut take = |kind: Stream| {
            let i = got.iter().position(|(q, k, _)| (*q, *k) == (p, kind)).expect("every expected connection came");
            got.swap_remove(i).2
        };
        let data = take(Stream::Data);
        out.push(Connected { peer: p, data, control: take(Stream::Control) });
    }
    Ok(out)
}

/// Opens one of the connections to lower rank `p`: the token's handshake, then the greeting.
fn connect(
    peer: &Peer,
    p: usize,
    rank: usize,
    kind: Stream,
    token: Option<&Token>,
    deadline: Instant,
) -> Result<TcpStream> {
    let mut s = TcpStream::connect_timeout(&peer.addr, left(deadline))
        .map_err(|e| Error::setup(format!("connecting to rank {p} at {}", peer.addr), e))?;
    if let Some(t) = token {
        // The job's deadline, not the handshake's: rank p answers only once it has made its
        // own connections to the ranks below it.
        auth::connect(&s, t, Purpose::Data, left(deadline)).map_err(|source| Error::Auth {
            context: format!("data connection to rank {p} at {}", peer.addr),
            source,
        })?;
    }
    let mut hello = [0u8; 16];
    hello[..8].copy_from_slice(&kind.magic().to_le_bytes());
    hello[8..].copy_from_slice(&(rank as u64).to_le_bytes());
    s.write_all(&hello).map_err(|e| Error::setup(format!("greeting rank {p}"), e))?;
    Ok(s)
}

/// Greets one accepted connection: the token's handshake, then the 16-byte greeting (magic,
/// rank), each given until `deadline`. The rank it comes from and which connection it opens,
/// or None to drop it.
fn greet(
    mut s: TcpStream,
    from_addr: SocketAddr,
    token: Option<&Token>,
    rank: usize,
    deadline: Instant,
) -> Option<(usize, Stream, TcpStream)> {
    s.set_nonblocking(false).ok()?;
    if let Some(t) = token {
        if let Err(e) = auth::accept(&s, t, Purpose::Data, left(deadline)) {
            tracing::warn!("rank {rank}: refused a data connection from {from_addr}: {e}");
            return None;
        }
    }
    s.set_read_timeout(Some(left(deadline))).ok()?;
    // read_exact never reads past the greeting: what follows belongs to the link.
    let mut hello = [0u8; 16];
    s.read_exact(&mut hello).ok()?;
    s.set_read_timeout(None).ok()?;
    let magic = u64::from_le_bytes(hello[..8].try_into().expect("8"));
    let from = u64::from_le_bytes(hello[8..].try_into().expect("8")) as usize;
    let kind = [Stream::Data, Stream::Control].into_iter().find(|k| k.magic() == magic)?;
    Some((from, kind, s))
}

#[cfg(test)]
mod tests;

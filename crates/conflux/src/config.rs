//! Every environment knob conflux reads, in one place. Each has a builder or option twin so
//! that a program can set it without touching the environment.

use std::time::Duration;

use crate::algo::{Algo, OpKind};
use crate::auth::Token;
use crate::error::{Error, Result};
use crate::transport::Streaming;

mod launcher;
mod options;
pub use launcher::{job_from_env, JobEnv};
pub use options::{parse_traffic_class, Options};

/// Which link type pairs of ranks use (`CONFLUX_TRANSPORT`, HCCL's set_transport).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    /// Shared memory between ranks of one host, TCP between hosts.
    Auto,
    /// Shared memory for every pair; an error when ranks are on different hosts.
    Shm,
    /// TCP for every pair, also within one host.
    Tcp,
}

impl TransportKind {
    pub fn parse(s: &str) -> Option<TransportKind> {
        match s.to_ascii_lowercase().as_str() {
            "auto" | "" => Some(TransportKind::Auto),
            "shm" => Some(TransportKind::Shm),
            "tcp" => Some(TransportKind::Tcp),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Auto => "auto",
            TransportKind::Shm => "shm",
            TransportKind::Tcp => "tcp",
        }
    }
}

/// Which algorithms collectives use (`CONFLUX_ALGO`): the cost model's choice (`auto`, the
/// default), one algorithm wherever it applies (`ring`), per operation
/// (`all_reduce:tree;broadcast:chain`), or both (`rd;all_to_all:pairwise`). An algorithm named
/// for one operation must serve it (else that operation's calls fail, naming why); one named
/// for all applies to the calls it has a schedule for (`select::implements_call`: not
/// broadcast for `direct`, nor all_to_all_v) and leaves the others to the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AlgoSpec {
    pub all: Option<Algo>,
    pub per_op: [Option<Algo>; 6],
}

impl AlgoSpec {
    pub fn parse(s: &str) -> std::result::Result<AlgoSpec, String> {
        let mut spec = AlgoSpec::default();
        let algo = |name: &str| -> std::result::Result<Option<Algo>, String> {
            if name.trim().eq_ignore_ascii_case("auto") {
                return Ok(None);
            }
            Algo::parse(name).map(Some).ok_or_else(|| {
                let names: Vec<&str> = Algo::ALL.iter().map(|a| a.name()).collect();
                format!("unknown algorithm {:?} (auto, {})", name.trim(), names.join(", "))
            })
        };
        for part in s.split([';', ',']).map(str::trim).filter(|p| !p.is_empty()) {
            match part.split_once(':') {
                Some((op, name)) => {
                    let op = OpKind::parse(op).ok_or_else(|| format!("unknown operation {:?}", op.trim()))?;
                    spec.per_op[op.index()] = algo(name)?;
                }
                None => spec.all = algo(part)?,
            }
        }
        Ok(spec)
    }

    /// The algorithm forced for `op`, if any: `strict` when named for `op` itself.
    pub fn forced(&self, op: OpKind) -> Option<(Algo, bool)> {
        self.per_op[op.index()].map(|a| (a, true)).or(self.all.map(|a| (a, false)))
    }
}

/// Tunables of one communicator. `Config::from_env()` reads the `CONFLUX_*` variables.
#[derive(Debug, Clone)]
pub struct Config {
    /// Deadline of every blocking wait (`CONFLUX_TIMEOUT_S`, default 600).
    pub timeout: Duration,
    /// Link type (`CONFLUX_TRANSPORT`).
    pub transport: TransportKind,
    /// Algorithms forced, per operation or for all (`CONFLUX_ALGO`).
    pub algo: AlgoSpec,
    /// The cost model's parameters, as `conflux tune` writes them (`CONFLUX_TUNE_FILE`; unset,
    /// the defaults measured on this project's machine). Rank 0's file is used by every rank.
    pub tune_file: Option<std::path::PathBuf>,
    /// Overrides host detection so tests can place ranks on different "nodes" (`CONFLUX_NODE_ID`).
    pub node_id: Option<String>,
    /// Bytes of each shared-memory ring between two ranks (`CONFLUX_SHM_RING`, default 1M).
    pub shm_ring_bytes: usize,
    /// Large all_to_all blocks between ranks of one host are read straight from the sender's
    /// memory, one copy instead of two through a ring (`CONFLUX_SINGLE_COPY`, default on; see
    /// transport/single_copy.rs). Every rank must agree.
    pub single_copy: bool,
    /// Whether a shared-memory sender writes pieces of 2 KiB and up into the ring with
    /// non-temporal stores (`CONFLUX_SHM_STREAM`: `auto`, the default, where it measures its
    /// copies running slow, as when the ranks' cores share no cache, and never on a host with
    /// more local ranks than cores; `on`; `off`; see transport/stream.rs). Each sender chooses
    /// for itself: the receiver cannot tell.
    pub shm_stream: Streaming,
    /// Bytes per chunk of the direct shared-segment algorithm (`CONFLUX_SHM_CHUNK`, default 256K).
    pub shm_chunk_bytes: usize,
    /// Largest piece a TCP link writes or reduces at once (`CONFLUX_TCP_CHUNK`, default 256K).
    pub tcp_chunk_bytes: usize,
    /// Chunks a TCP sender may have written and its peer not yet read (the window,
    /// `transport/window.rs`); also sizes the socket buffers (`CONFLUX_TCP_INFLIGHT`, default 8).
    pub tcp_inflight: usize,
    /// Explicit SO_SNDBUF/SO_RCVBUF, overriding chunk x inflight (`CONFLUX_SOCKET_BUF`).
    pub socket_buf_bytes: Option<usize>,
    /// How long a waiting rank spins before it blocks (`CONFLUX_SPIN_US`; default 50, or 30 when
    /// the host runs more local ranks than it has cores: measured at 4 and 8 ranks on 2 cores,
    /// 30 halves the 8-byte all_reduce time against 5, because a wake-up from sleep costs more
    /// than the spin, and moves large messages no slower).
    pub spin: Option<Duration>,
    /// Bytes a gradient bucket holds before the `Bucketer` launches it (`CONFLUX_BUCKET_MB`,
    /// default 25, as DDP's bucket_cap_mb).
    pub bucket_bytes: usize,
    /// Where each rank writes its flight recorder when a call times out or fails, besides
    /// stderr (`CONFLUX_DUMP_DIR`; unset, stderr only).
    pub dump_dir: Option<std::path::PathBuf>,
    /// Where each rank writes its trace of every operation (`CONFLUX_TRACE=DIR`: the files
    /// `DIR/rank-<r>.json` and `.bin`, read by `conflux trace report` and `merge`; see
    /// trace/). Unset, nothing is recorded.
    pub trace: Option<std::path::PathBuf>,
    /// Who this communicator is in the trace when it is a job of its own standing for a group
    /// of a larger one (each torch process group is its own conflux job): unset, its own ranks
    /// and name.
    pub trace_as: Option<TraceAs>,
    /// Follow every TCP message with a CRC32C of its payload, which the receiver checks
    /// (`CONFLUX_CHECKSUM=1`; off by default: TCP's own checksum catches most corruption, and
    /// this one costs a pass over the data on both sides). Each sender chooses for itself.
    pub checksum: bool,
    /// Floating-point reductions in a fixed order, bitwise identical whatever the algorithm,
    /// chunking or transport (`CONFLUX_DETERMINISTIC=1`, HCCL_DETERMINISTIC; see
    /// algo/ordered.rs for its cost). Every rank must set the same.
    pub deterministic: bool,
    /// The job's shared secret (`CONFLUX_JOB_TOKEN`): when set, every store and TCP data
    /// connection proves both ends hold it before anything else is read (see `auth`). Unset,
    /// connections are not authenticated, as before tokens existed.
    pub job_token: Option<Token>,
    /// The interface whose IPv4 address the data listeners bind to (`CONFLUX_SOCKET_IFNAME`,
    /// as NCCL_SOCKET_IFNAME); unset, the address this host uses to reach the store.
    pub socket_ifname: Option<String>,
    /// DSCP code point marked on every TCP data packet (`CONFLUX_TRAFFIC_CLASS`: 0-63 or a
    /// name, `ef`, `af41`, `cs3`, ...; see `sockopt::mark_traffic`), the TCP counterpart of
    /// HCCL's RoCE traffic class. Unset, packets keep the system's default (0).
    pub traffic_class: Option<u8>,
}

/// A communicator's identity in the trace, when not its own (see `Config::trace_as`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceAs {
    /// The name every member gives the group (e.g. torch's group name).
    pub name: String,
    /// The global rank of each member, in the communicator's rank order.
    pub ranks: Vec<usize>,
    /// The larger job's size.
    pub world_size: usize,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            timeout: Duration::from_secs(600),
            transport: TransportKind::Auto,
            algo: AlgoSpec::default(),
            tune_file: None,
            node_id: None,
            shm_ring_bytes: 1 << 20,
            single_copy: true,
            shm_stream: Streaming::Auto,
            shm_chunk_bytes: 256 << 10,
            tcp_chunk_bytes: 256 << 10,
            tcp_inflight: 8,
            socket_buf_bytes: None,
            spin: None,
            bucket_bytes: 25 << 20,
            dump_dir: None,
            trace: None,
            trace_as: None,
            checksum: false,
            deterministic: false,
            job_token: None,
            socket_ifname: None,
            traffic_class: None,
        }
    }
}

impl Config {
    /// Defaults overridden by whatever `CONFLUX_*` variables are set.
    pub fn from_env() -> Result<Config> {
        let mut c = Config::default();
        if let Some(v) = var("CONFLUX_TIMEOUT_S") {
            let secs: f64 = v.parse().map_err(|_| bad("CONFLUX_TIMEOUT_S", &v))?;
            if !(secs > 0.0 && secs.is_finite()) {
                return Err(bad("CONFLUX_TIMEOUT_S", &v));
            }
            c.timeout = Duration::from_secs_f64(secs);
        }
        if let Some(v) = var("CONFLUX_TRANSPORT") {
            c.transport = TransportKind::parse(&v).ok_or_else(|| bad("CONFLUX_TRANSPORT", &v))?;
        }
        if let Some(v) = var("CONFLUX_ALGO") {
            c.algo = AlgoSpec::parse(&v).map_err(|e| Error::Config(format!("CONFLUX_ALGO={v:?}: {e}")))?;
        }
        c.tune_file = var("CONFLUX_TUNE_FILE").map(Into::into);
        c.node_id = var("CONFLUX_NODE_ID");
        c.dump_dir = var("CONFLUX_DUMP_DIR").map(Into::into);
        c.trace = var("CONFLUX_TRACE").filter(|v| !v.is_empty()).map(Into::into);
        flag_var("CONFLUX_CHECKSUM", &mut c.checksum)?;
        flag_var("CONFLUX_DETERMINISTIC", &mut c.deterministic)?;
        flag_var("CONFLUX_SINGLE_COPY", &mut c.single_copy)?;
        size_var("CONFLUX_SHM_RING", &mut c.shm_ring_bytes)?;
        if let Some(v) = var("CONFLUX_SHM_STREAM") {
            c.shm_stream = Streaming::parse(&v.to_ascii_lowercase()).ok_or_else(|| bad("CONFLUX_SHM_STREAM", &v))?;
        }
        size_var("CONFLUX_SHM_CHUNK", &mut c.shm_chunk_bytes)?;
        size_var("CONFLUX_TCP_CHUNK", &mut c.tcp_chunk_bytes)?;
        size_var("CONFLUX_TCP_INFLIGHT", &mut c.tcp_inflight)?;
        if let Some(v) = var("CONFLUX_SOCKET_BUF") {
            c.socket_buf_bytes = Some(parse_size(&v).ok_or_else(|| bad("CONFLUX_SOCKET_BUF", &v))? as usize);
        }
        if let Some(v) = var("CONFLUX_BUCKET_MB") {
            let mb: f64 = v.parse().map_err(|_| bad("CONFLUX_BUCKET_MB", &v))?;
            if !(mb > 0.0 && mb <= 4096.0) {
                return Err(bad("CONFLUX_BUCKET_MB", &v));
            }
            c.bucket_bytes = (mb * (1 << 20) as f64) as usize;
        }
        if let Some(v) = var("CONFLUX_SPIN_US") {
            let us: u64 = v.parse().map_err(|_| bad("CONFLUX_SPIN_US", &v))?;
            c.spin = Some(Duration::from_micros(us));
        }
        c.job_token = job_token_from_env();
        c.socket_ifname = var("CONFLUX_SOCKET_IFNAME").map(|v| v.trim().to_string());
        if let Some(v) = var("CONFLUX_TRAFFIC_CLASS") {
            c.traffic_class = Some(parse_traffic_class(&v).ok_or_else(|| bad("CONFLUX_TRAFFIC_CLASS", &v))?);
        }
        c.validate()?;
        Ok(c)
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let check = |ok: bool, what: &str| {
            if ok {
                Ok(())
            } else {
                Err(Error::Config(what.to_string()))
            }
        };
        check(self.shm_ring_bytes >= 4096 && self.shm_ring_bytes <= 1 << 30, "shm ring must be 4K..1G")?;
        check(self.shm_chunk_bytes >= 4096 && self.shm_chunk_bytes <= 1 << 30, "shm chunk must be 4K..1G")?;
        check(self.tcp_chunk_bytes >= 4096 && self.tcp_chunk_bytes <= 1 << 30, "tcp chunk must be 4K..1G")?;
        check(self.tcp_inflight >= 1 && self.tcp_inflight <= 1024, "tcp inflight must be 1..1024")?;
        check(self.traffic_class.is_none_or(|tc| tc <= 63), "traffic class must be a DSCP code point, 0-63")?;
        check(!self.timeout.is_zero(), "timeout must be positive")
    }
}

/// The job token `CONFLUX_JOB_TOKEN` holds, if set and not empty (the launcher asks too).
pub fn job_token_from_env() -> Option<Token> {
    var("CONFLUX_JOB_TOKEN").map(Token::new)
}

/// How `conflux run` binds the ranks it starts to cores (`CONFLUX_BIND`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bind {
    /// Never: the kernel places the ranks, as torchrun leaves them.
    Off,
    /// Each rank to one core, consecutive ranks sharing one when there are more ranks.
    Core,
    /// As `Core` for a one-node job whose ranks outnumber the cores at most twice over, else as
    /// `Off` (the default).
    Auto,
}

/// `CONFLUX_BIND`: `auto` (or unset), `none` or `core`.
pub fn bind_from_env() -> Result<Bind> {
    match var("CONFLUX_BIND").as_deref() {
        None | Some("auto") => Ok(Bind::Auto),
        Some("none") => Ok(Bind::Off),
        Some("core") => Ok(Bind::Core),
        Some(v) => Err(bad("CONFLUX_BIND", v)),
    }
}

pub(crate) fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// A 0/1 variable (also true/false, on/off).
fn flag_var(name: &str, into: &mut bool) -> Result<()> {
    if let Some(v) = var(name) {
        *into = match v.to_ascii_lowercase().as_str() {
            "1" | "true" | "on" => true,
            "0" | "false" | "off" => false,
            _ => return Err(bad(name, &v)),
        };
    }
    Ok(())
}

fn size_var(name: &str, into: &mut usize) -> Result<()> {
    if let Some(v) = var(name) {
        *into = parse_size(&v).ok_or_else(|| bad(name, &v))? as usize;
    }
    Ok(())
}

fn bad(name: &str, value: &str) -> Error {
    Error::Config(format!("{name}={value:?} is not a valid value"))
}

/// Parses sizes the way nccl-tests does: `8`, `64K`, `16M`, `1G` (binary multiples).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (digits, mult) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 1u64 << 10),
        (i, 'm' | 'M') => (&s[..i], 1 << 20),
        (i, 'g' | 'G') => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    digits.trim().parse::<u64>().ok()?.checked_mul(mult)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_like_nccl_tests() {
        assert_eq!(parse_size("8"), Some(8));
        assert_eq!(parse_size("64K"), Some(65536));
        assert_eq!(parse_size("64M"), Some(64 << 20));
        assert_eq!(parse_size("1g"), Some(1 << 30));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("K"), None);
    }

    #[test]
    fn algorithm_specs_parse_for_all_and_per_operation() {
        let s = AlgoSpec::parse("all_reduce:tree; broadcast:chain").unwrap();
        assert_eq!(s.forced(OpKind::AllReduce), Some((Algo::Tree, true)));
        assert_eq!(s.forced(OpKind::Broadcast), Some((Algo::Chain, true)));
        assert_eq!(s.forced(OpKind::AllGather), None);
        let s = AlgoSpec::parse("rd;all_to_all:pairwise").unwrap();
        assert_eq!(s.forced(OpKind::AllGather), Some((Algo::Rd, false)));
        assert_eq!(s.forced(OpKind::AllToAll), Some((Algo::Pairwise, true)));
        assert_eq!(AlgoSpec::parse("auto").unwrap(), AlgoSpec::default());
        assert_eq!(AlgoSpec::parse("ring").unwrap().all, Some(Algo::Ring));
        assert!(AlgoSpec::parse("all_reduce:warp").unwrap_err().contains("warp"));
        assert!(AlgoSpec::parse("allreduce2:ring").unwrap_err().contains("operation"));
    }
}

//! The communicator: the ranks of one job, their links, and the collectives a user calls.
//!
//! The top layer of the library: communicators and their groups, each with two lanes (a
//! progress engine and a `LaneState`: transport, call context and planner, `lane.rs`), the
//! bootstrap through the store, and `ops.rs`, the one path every call takes into the
//! algorithm table. It may use every layer below (`algo/`, `transport/`, `store/`, `call/`,
//! `reduce/`); nothing below imports it. The fronts (the CLI, Python, torch) use only its
//! public API.

mod bootstrap;
mod buffer;
mod calibrate;
mod clock;
mod core;
mod engine;
mod fusion;
mod group;
mod health;
#[cfg(test)]
mod inproc;
mod lane;
mod netif;
mod ops;
mod planner;
mod recorder;
mod session;
mod shrink;
mod status;
mod traced;

use std::sync::Arc;
use std::time::{Duration, Instant};

pub use self::core::Priority;
pub use buffer::Buffer;
pub use engine::{Helper, WaitTracker, Work};
pub use fusion::Bucketer;
pub use health::{HealthOptions, KindReference, LinkHealth, LinkKind};
pub use status::RankStatus;

use self::core::{Core, HighBusy, Lane};
use crate::algo::coll::{Coll, VBlocks};
use crate::algo::{select, Algo, OpKind};
use crate::config::{Config, Options};
use crate::dtype::{DataType, Element, ReduceOp};
use crate::error::{Error, Result};
use crate::transport::{LinkError, Posted, PostedBuf};
use engine::Completer;
use lane::LaneState;
use ops::Plan;
use session::Session;
use traced::{Issue, PostedTrace};

/// Explicit construction: rank, size, store address and options.
#[derive(Debug, Clone)]
pub struct CommBuilder {
    rank: usize,
    size: usize,
    store: Option<String>,
    config: Config,
}

impl CommBuilder {
    /// A builder with default settings (not the environment's); `config` passes others.
    pub fn new(rank: usize, size: usize) -> CommBuilder {
        CommBuilder { rank, size, store: None, config: Config::default() }
    }
    /// The store, "host:port"; rank 0 serves it there. Not needed when size is 1.
    pub fn store(mut self, addr: impl Into<String>) -> CommBuilder {
        self.store = Some(addr.into());
        self
    }
    /// Every blocking wait's deadline (default 600 s).
    pub fn timeout(mut self, timeout: Duration) -> CommBuilder {
        self.config.timeout = timeout;
        self
    }
    /// Records every operation of this communicator (and the sub-groups made from it) to
    /// `dir`, as `CONFLUX_TRACE=dir` does (see `Config::trace`).
    pub fn trace(mut self, dir: impl Into<std::path::PathBuf>) -> CommBuilder {
        self.config.trace = Some(dir.into());
        self
    }
    /// All tunables at once (e.g. `Config::from_env()?`).
    pub fn config(mut self, config: Config) -> CommBuilder {
        self.config = config;
        self
    }
    /// Per-communicator settings over the config given so far (see [`Options`]).
    pub fn options(mut self, options: &Options) -> CommBuilder {
        self.config = options.apply(&self.config);
        self
    }
    pub fn build(self) -> Result<Communicator> {
        Communicator::init(self)
    }
}

/// A group of ranks that run collectives together: the whole job, or a sub-group made by
/// [`Communicator::new_group`] or [`Communicator::split`]. Dropping the last handle shuts it
/// down cleanly. Errors name global ranks (the job's), also in sub-groups.
pub struct Communicator {
    core: Arc<Core>,
    /// Which lane this handle's operations use (see [`Communicator::with_priority`]).
    lane: usize,
    /// The algorithm this handle's collectives must use (see [`Communicator::with_algo`]).
    algo: Option<Algo>,
    /// The deadline of this handle's calls, if not the communicator's (see `with_timeout`).
    timeout: Option<Duration>,
}

fn bytes<T: Element>(s: &[T]) -> &[u8] {
    bytemuck::cast_slice(s)
}
fn bytes_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    bytemuck::cast_slice_mut(s)
}
fn invalid(msg: String) -> Error {
    Error::InvalidArgument(msg)
}

impl Communicator {
    /// Joins the job its launcher started: torchrun or `conflux run` (RANK, WORLD_SIZE,
    /// MASTER_ADDR, MASTER_PORT), Slurm's srun, Open MPI's mpirun or a PMI launcher (see
    /// `config::job_from_env`), with the `CONFLUX_*` knobs.
    pub fn from_env() -> Result<Communicator> {
        Communicator::from_env_with(Config::from_env()?)
    }

    /// Like `from_env`, with the tunables given instead of read from `CONFLUX_*`.
    pub fn from_env_with(config: Config) -> Result<Communicator> {
        let job = crate::config::job_from_env()?;
        let mut b = CommBuilder::new(job.rank, job.size).config(config);
        if let Some(store) = job.store {
            b = b.store(store);
        }
        b.build()
    }

    pub fn builder(rank: usize, size: usize) -> CommBuilder {
        CommBuilder::new(rank, size)
    }

    fn init(b: CommBuilder) -> Result<Communicator> {
        let CommBuilder { rank, size, store, config } = b;
        config.validate()?;
        if size == 0 || rank >= size {
            return Err(invalid(format!("rank {rank} is not in a world of size {size}")));
        }
        let session = Arc::new(Session::open(rank, size, store, config.timeout, config.job_token.as_ref())?);
        let world: Arc<[usize]> = (0..size).collect();
        let core = Core::new(session, "conflux".into(), world, rank, config, true, None)?;
        Ok(Communicator { core: Arc::new(core), lane: 0, algo: None, timeout: None })
    }

    /// A handle on this same communicator whose operations run at `priority`. Operations of
    /// one priority run in the order they were issued, on every rank; a high-priority one is
    /// not held back by normal ones issued before it, and may finish first. Ranks must issue
    /// the operations of each priority in the same order.
    pub fn with_priority(&self, priority: Priority) -> Communicator {
        Communicator { core: self.core.clone(), lane: priority.lane(), ..*self }
    }

    /// A handle on this same communicator whose collectives use `algo` (None: the usual
    /// choice, from `CONFLUX_ALGO` or the cost model), as NCCL_ALGO does for one call. A
    /// collective the algorithm cannot serve (an operation it does not implement, a topology
    /// it does not support) fails with `InvalidArgument` naming why, on every rank, before
    /// anything is sent. Every rank must use the same algorithm for the same call.
    pub fn with_algo(&self, algo: Option<Algo>) -> Communicator {
        Communicator { core: self.core.clone(), algo, ..*self }
    }

    /// A handle on this same communicator whose calls each get `timeout` (None: the
    /// communicator's) to complete, as torch's per-call `opts.timeout`.
    pub fn with_timeout(&self, timeout: Option<Duration>) -> Communicator {
        Communicator { core: self.core.clone(), timeout, ..*self }
    }

    /// The algorithm this handle forces, if any.
    pub fn algo(&self) -> Option<Algo> {
        self.algo
    }

    /// The algorithm a call of `op` on `bytes` of `dtype` (as `select::Call` counts them)
    /// would use through this handle, with equal blocks and one piece: the forced one if it
    /// can serve, else the cost model's choice.
    pub fn algo_for(&self, op: OpKind, bytes: usize, dtype: DataType) -> Result<Algo> {
        let plan = self.plan();
        let call = select::Call { op, bytes, even: true, pieces: false, half: dtype.is_half() };
        select::choose(&self.core.model, &call, &self.core.topo, planner::forced(&plan, &call)).map_err(invalid)
    }

    /// Where this communicator's ranks are, as its algorithm choice sees them.
    pub fn topology(&self) -> &select::Topo {
        &self.core.topo
    }

    /// The cost model's parameters this communicator uses (rank 0's, on every rank).
    pub fn cost_model(&self) -> &select::Model {
        &self.core.model
    }

    /// Where `cost_model` came from: the defaults, rank 0's tuning file, or the defaults with
    /// TCP's bandwidth measured between the nodes (a sub-group's is its parent's).
    pub fn cost_model_source(&self) -> select::ModelSource {
        self.core.model_source
    }

    pub fn priority(&self) -> Priority {
        if self.lane == 0 {
            Priority::Normal
        } else {
            Priority::High
        }
    }

    fn lane(&self) -> &Lane {
        &self.core.lanes[self.lane]
    }

    /// What this handle's calls run with: its lane's plan and its forced algorithm.
    fn plan(&self) -> Plan {
        let base = self.lane().plan;
        Plan { call_algo: self.algo, timeout: self.timeout.unwrap_or(base.timeout), ..base }
    }

    /// The global rank (in the job) of each rank of this communicator.
    pub fn world_ranks(&self) -> &[usize] {
        &self.core.world
    }

    /// This rank's rank in this communicator.
    pub fn rank(&self) -> usize {
        self.core.rank
    }
    pub fn size(&self) -> usize {
        self.core.size()
    }
    /// This rank's index among the ranks of this communicator on its host.
    pub fn local_rank(&self) -> usize {
        self.core.local_rank
    }
    /// How many ranks of this communicator share this host (and its shared segment, unless
    /// CONFLUX_TRANSPORT=tcp).
    pub fn local_size(&self) -> usize {
        self.core.local_size
    }
    pub fn timeout(&self) -> Duration {
        self.core.config.timeout
    }
    /// The settings this communicator was built with.
    pub fn config(&self) -> &Config {
        &self.core.config
    }

    fn usable(&self) -> Result<()> {
        self.core.usable()
    }

    fn check_root(&self, root: usize, what: &str) -> Result<()> {
        if root >= self.size() {
            return Err(invalid(format!("{what} {root} is out of range for {} ranks", self.size())));
        }
        Ok(())
    }

    /// `what` (a buffer of `len` elements) must hold one block of `n` per rank.
    fn check_ranks_times(&self, what: &str, len: usize, n: usize) -> Result<()> {
        if len == n * self.size() {
            return Ok(());
        }
        Err(invalid(format!("{what} has {len} elements, expected {} ({} ranks x {n})", n * self.size(), self.size())))
    }

    fn check_peer(&self, peer: usize) -> Result<()> {
        self.check_root(peer, "peer")?;
        if peer == self.rank() {
            return Err(invalid(format!("rank {peer} cannot send to or receive from itself")));
        }
        Ok(())
    }

    fn blocking(&self, coll: Coll<'_>, dtype: DataType) -> Result<()> {
        self.usable()?;
        let lane = self.lane();
        let _busy = HighBusy::new(HighBusy::counter(&self.core, self.lane));
        let mut plan = self.plan();
        if let Some(ct) = &self.core.trace {
            plan.issue = Some(Issue::now(&ct.tracer, false));
        }
        lane.engine.run_inline(|t| ops::run(t, &plan, coll, dtype))
    }

    fn spawn<T: Send + 'static>(
        &self,
        what: String,
        job: impl FnOnce(&mut LaneState, &Plan) -> Result<T> + Send + 'static,
    ) -> Work<T> {
        let (work, done) = Work::new(what.clone());
        if let Err(e) = self.usable() {
            done.complete(Err(e));
            return work;
        }
        let mut plan = self.plan();
        let work = match &self.core.trace {
            Some(ct) => {
                let issue = Issue::now(&ct.tracer, true);
                plan.issue = Some(issue);
                work.traced(ct.tracer.clone(), &issue)
            }
            None => work,
        };
        // Not the core itself: a job holding the last reference would tear the communicator
        // down on its own engine thread, which then waits for itself (and says no goodbye).
        let busy = HighBusy::counter(&self.core, self.lane);
        let ticket = self.lane().engine.submit(
            what,
            Box::new(move |t| {
                let _busy = HighBusy::new(busy);
                done.complete(job(t, &plan))
            }),
        );
        work.driven_by(&self.lane().engine, Some(ticket))
    }

    // ---- all_reduce -------------------------------------------------------------------------

    /// Reduces `buf` across all ranks, in place: every rank ends with the same result.
    pub fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.blocking(Coll::AllReduce { input: None, out: &mut [bytes_mut(buf)], op }, T::DTYPE)
    }

    /// Out of place: `recv = reduce(send)`; both have the same length.
    pub fn all_reduce_into<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        if send.len() != recv.len() {
            return Err(invalid(format!("all_reduce: send has {} elements, recv {}", send.len(), recv.len())));
        }
        self.blocking(Coll::AllReduce { input: Some(bytes(send)), out: &mut [bytes_mut(recv)], op }, T::DTYPE)
    }

    /// Non-blocking all_reduce in place; the buffer comes back through the handle.
    pub fn all_reduce_async<B: Buffer>(&self, mut buf: B, op: ReduceOp) -> Work<B> {
        let dtype = <B::Elem as Element>::DTYPE;
        self.spawn(format!("all_reduce({dtype} x {})", buf.as_slice().len()), move |t, plan| {
            ops::run(t, plan, Coll::AllReduce { input: None, out: &mut [bytes_mut(buf.as_mut_slice())], op }, dtype)
                .map(|_| buf)
        })
    }

    // ---- broadcast and reduce ---------------------------------------------------------------

    /// Copies `root`'s buffer into every rank's.
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        self.check_root(root, "root")?;
        self.blocking(Coll::Broadcast { buf: bytes_mut(buf), root }, T::DTYPE)
    }

    pub fn broadcast_async<B: Buffer>(&self, mut buf: B, root: usize) -> Work<B> {
        let check = self.check_root(root, "root");
        let dtype = <B::Elem as Element>::DTYPE;
        self.spawn(format!("broadcast({dtype} x {})", buf.as_slice().len()), move |t, plan| {
            check?;
            ops::run(t, plan, Coll::Broadcast { buf: bytes_mut(buf.as_mut_slice()), root }, dtype).map(|_| buf)
        })
    }

    /// Reduces everyone's `buf` into the root's `buf`; other ranks' buffers stay unchanged.
    pub fn reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp, root: usize) -> Result<()> {
        self.check_root(root, "root")?;
        self.blocking(Coll::Reduce { input: None, buf: bytes_mut(buf), op, root }, T::DTYPE)
    }

    /// Out of place: the root's `recv` gets the reduction of every rank's `send`; `recv` is
    /// untouched elsewhere (but must have the same length, as in NCCL).
    pub fn reduce_into<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp, root: usize) -> Result<()> {
        self.check_root(root, "root")?;
        if send.len() != recv.len() {
            return Err(invalid(format!("reduce: send has {} elements, recv {}", send.len(), recv.len())));
        }
        self.blocking(Coll::Reduce { input: Some(bytes(send)), buf: bytes_mut(recv), op, root }, T::DTYPE)
    }

    pub fn reduce_async<B: Buffer>(&self, mut buf: B, op: ReduceOp, root: usize) -> Work<B> {
        let check = self.check_root(root, "root");
        let dtype = <B::Elem as Element>::DTYPE;
        self.spawn(format!("reduce({dtype} x {})", buf.as_slice().len()), move |t, plan| {
            check?;
            ops::run(t, plan, Coll::Reduce { input: None, buf: bytes_mut(buf.as_mut_slice()), op, root }, dtype)
                .map(|_| buf)
        })
    }

    // ---- all_gather and reduce_scatter ------------------------------------------------------

    /// `recv` (size x send.len()) gets every rank's `send`, in rank order.
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let n = send.len();
        self.check_ranks_times("all_gather: recv", recv.len(), n)?;
        recv[self.rank() * n..(self.rank() + 1) * n].copy_from_slice(send);
        self.all_gather_in_place(recv)
    }

    /// In place: this rank's block (`buf[rank*n..(rank+1)*n]`, n = len / size) is already there.
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        self.check_divisible("all_gather", buf.len())?;
        self.blocking(Coll::AllGather { buf: bytes_mut(buf) }, T::DTYPE)
    }

    /// Non-blocking in-place all_gather (see `all_gather_in_place`).
    pub fn all_gather_async<B: Buffer>(&self, mut buf: B) -> Work<B> {
        let len = buf.as_slice().len();
        let check = self.check_divisible("all_gather", len);
        let dtype = <B::Elem as Element>::DTYPE;
        self.spawn(format!("all_gather({dtype} x {len})"), move |t, plan| {
            check?;
            ops::run(t, plan, Coll::AllGather { buf: bytes_mut(buf.as_mut_slice()) }, dtype).map(|_| buf)
        })
    }

    /// `recv` (n elements) gets block `rank` of the reduction of every rank's `send` (size x n).
    pub fn reduce_scatter<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        let n = recv.len();
        self.check_ranks_times("reduce_scatter: send", send.len(), n)?;
        self.blocking(Coll::ReduceScatter { input: Some(bytes(send)), buf: bytes_mut(recv), op }, T::DTYPE)
    }

    /// In place: afterwards `buf[rank*n..(rank+1)*n]` holds this rank's reduced block; the other
    /// blocks hold partial results.
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.check_divisible("reduce_scatter", buf.len())?;
        self.blocking(Coll::ReduceScatter { input: None, buf: bytes_mut(buf), op }, T::DTYPE)
    }

    /// Non-blocking in-place reduce_scatter (see `reduce_scatter_in_place`).
    pub fn reduce_scatter_async<B: Buffer>(&self, mut buf: B, op: ReduceOp) -> Work<B> {
        let len = buf.as_slice().len();
        let check = self.check_divisible("reduce_scatter", len);
        let dtype = <B::Elem as Element>::DTYPE;
        self.spawn(format!("reduce_scatter({dtype} x {len})"), move |t, plan| {
            check?;
            ops::run(t, plan, Coll::ReduceScatter { input: None, buf: bytes_mut(buf.as_mut_slice()), op }, dtype)
                .map(|_| buf)
        })
    }

    fn check_divisible(&self, what: &str, len: usize) -> Result<()> {
        if !len.is_multiple_of(self.size()) {
            return Err(invalid(format!("{what}: {len} elements do not split into {} equal blocks", self.size())));
        }
        Ok(())
    }

    // ---- all_to_all -------------------------------------------------------------------------

    /// Block p of `send` goes to rank p, which stores it as block `rank` of its `recv`.
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        if send.len() != recv.len() {
            return Err(invalid(format!("all_to_all: send has {} elements, recv {}", send.len(), recv.len())));
        }
        self.check_divisible("all_to_all", send.len())?;
        self.blocking(Coll::AllToAll { send: bytes(send), recv: bytes_mut(recv), uneven: None }, T::DTYPE)
    }

    /// Uneven all_to_all: rank p gets `send_counts[p]` elements; `recv_counts[p]` come from rank p.
    pub fn all_to_all_v<T: Element>(
        &self,
        send: &[T],
        send_counts: &[usize],
        recv: &mut [T],
        recv_counts: &[usize],
    ) -> Result<()> {
        let uneven = Some(self.v_blocks::<T>(send.len(), send_counts, recv.len(), recv_counts)?);
        self.blocking(Coll::AllToAll { send: bytes(send), recv: bytes_mut(recv), uneven }, T::DTYPE)
    }

    /// Non-blocking all_to_all_v; both buffers come back through the handle.
    pub fn all_to_all_v_async<S: Buffer, R: Buffer<Elem = S::Elem>>(
        &self,
        send: S,
        send_counts: &[usize],
        mut recv: R,
        recv_counts: &[usize],
    ) -> Work<(S, R)> {
        let dtype = <S::Elem as Element>::DTYPE;
        let (sl, rl) = (send.as_slice().len(), recv.as_slice().len());
        let blocks = self.v_blocks::<S::Elem>(sl, send_counts, rl, recv_counts);
        self.spawn(format!("all_to_all_v({dtype} x {sl})"), move |t, plan| {
            let coll = Coll::AllToAll {
                send: bytes(send.as_slice()),
                recv: bytes_mut(recv.as_mut_slice()),
                uneven: Some(blocks?),
            };
            ops::run(t, plan, coll, dtype)?;
            Ok((send, recv))
        })
    }

    fn v_blocks<T: Element>(
        &self,
        send_len: usize,
        send_counts: &[usize],
        recv_len: usize,
        recv_counts: &[usize],
    ) -> Result<VBlocks> {
        let n = self.size();
        for (name, counts, len) in [("send", send_counts, send_len), ("recv", recv_counts, recv_len)] {
            if counts.len() != n {
                return Err(invalid(format!("all_to_all_v: {} {name} counts for {n} ranks", counts.len())));
            }
            let sum = counts.iter().try_fold(0usize, |a, &c| a.checked_add(c));
            if sum != Some(len) {
                return Err(invalid(format!("all_to_all_v: {name} counts add up to {sum:?}, the buffer has {len}")));
            }
        }
        if send_counts[self.rank()] != recv_counts[self.rank()] {
            return Err(invalid(format!(
                "all_to_all_v: this rank sends itself {} elements but expects {}",
                send_counts[self.rank()],
                recv_counts[self.rank()]
            )));
        }
        let es = T::DTYPE.size();
        Ok(VBlocks {
            send: crate::algo::blocks_of(send_counts.iter().map(|c| c * es)),
            recv: crate::algo::blocks_of(recv_counts.iter().map(|c| c * es)),
        })
    }

    // ---- point to point ---------------------------------------------------------------------

    /// Sends `buf` to `peer`; it is matched by the peer's `recv` with the same tag, in order.
    pub fn send<T: Element>(&self, buf: &[T], peer: usize, tag: u32) -> Result<()> {
        self.check_peer(peer)?;
        self.blocking(Coll::Send { data: bytes(buf), peer, tag }, T::DTYPE)
    }

    /// Receives the next message with `tag` from `peer`; its length must equal `buf`'s.
    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize, tag: u32) -> Result<()> {
        self.check_peer(peer)?;
        self.blocking(Coll::Recv { buf: bytes_mut(buf), peer, tag }, T::DTYPE)
    }

    /// Sends `buf` to `peer` in the background; the handle gives the buffer back once sent.
    /// Unlike collectives, posted sends and receives progress alongside later operations.
    pub fn send_async<B: Buffer>(&self, buf: B, peer: usize, tag: u32) -> Work<B> {
        let what =
            format!("send({} x {} to rank {peer}, tag {tag})", <B::Elem as Element>::DTYPE, buf.as_slice().len());
        self.post(what, buf, peer, tag, true)
    }

    /// Receives the next message with `tag` from `peer` into `buf` in the background.
    pub fn recv_async<B: Buffer>(&self, buf: B, peer: usize, tag: u32) -> Work<B> {
        let what =
            format!("recv({} x {} from rank {peer}, tag {tag})", <B::Elem as Element>::DTYPE, buf.as_slice().len());
        self.post(what, buf, peer, tag, false)
    }

    /// Receives the next message with `tag` from whichever rank sends one first (MPI's
    /// MPI_ANY_SOURCE; torch's `recv` without `src`); the handle gives the buffer back with
    /// that rank. Receives from any source match in the order they were posted.
    pub fn recv_any_async<B: Buffer>(&self, buf: B, tag: u32) -> Work<(B, usize)> {
        let what = format!("recv({} x {} from any rank, tag {tag})", <B::Elem as Element>::DTYPE, buf.as_slice().len());
        let (work, done) = Work::new(what.clone());
        if let Err(e) = self.usable().and_then(|_| self.check_peer_count()) {
            done.complete(Err(e));
            return work;
        }
        let deadline = Instant::now() + self.timeout();
        let (work, trace) = self.posted_trace(work, false, &buf);
        let posted = Box::new(PostedOwned { buf, done, what: what.clone(), make: |b, peer| (b, peer), trace });
        let ticket = self.lane().engine.submit(
            what,
            Box::new(move |t| {
                let peers = t.t.peers();
                t.post(Posted::recv_any(peers, u64::from(tag), deadline, posted))
            }),
        );
        work.driven_by(&self.lane().engine, Some(ticket))
    }

    fn check_peer_count(&self) -> Result<()> {
        if self.size() < 2 {
            return Err(invalid("a receive from any rank needs another rank".into()));
        }
        Ok(())
    }

    fn post<B: Buffer>(&self, what: String, buf: B, peer: usize, tag: u32, send: bool) -> Work<B> {
        let (work, done) = Work::new(what.clone());
        if let Err(e) = self.usable().and_then(|_| self.check_peer(peer)) {
            done.complete(Err(e));
            return work;
        }
        let deadline = Instant::now() + self.timeout();
        let (work, trace) = self.posted_trace(work, send, &buf);
        let posted = Box::new(PostedOwned { buf, done, what: what.clone(), make: |b, _| b, trace });
        let ticket = self.lane().engine.run_now_or_submit(
            what,
            Box::new(move |t| t.post(Posted::new(peer, u64::from(tag), send, deadline, posted))),
        );
        work.driven_by(&self.lane().engine, ticket)
    }

    /// A traced communicator's record of a send or receive about to be posted, and its handle
    /// made to record the caller's waits.
    fn posted_trace<T, B: Buffer>(&self, work: Work<T>, send: bool, buf: &B) -> (Work<T>, Option<PostedTrace>) {
        let Some(ct) = &self.core.trace else { return (work, None) };
        let issue = Issue::now(&ct.tracer, true);
        let trace = PostedTrace {
            tracer: ct.tracer.clone(),
            comm: ct.comm,
            lane: self.lane as u8,
            issue,
            send,
            dtype: <B::Elem as Element>::DTYPE,
            bytes: std::mem::size_of_val(buf.as_slice()),
        };
        (work.traced(ct.tracer.clone(), &issue), Some(trace))
    }

    /// Marks the start of the next step (an iteration of the training loop) in this rank's
    /// trace, so that `conflux trace report` can break each step down into computation and
    /// communication; returns the step's number, or None when the communicator is not traced.
    /// Every communicator of a rank shares one trace: mark steps through one of them.
    pub fn mark_step(&self) -> Option<u64> {
        self.core.trace.as_ref().map(|ct| ct.tracer.mark_step())
    }

    /// Returns once every rank has entered the barrier.
    pub fn barrier(&self) -> Result<()> {
        self.blocking(Coll::Barrier, DataType::U8)
    }

    pub fn barrier_async(&self) -> Work<()> {
        self.spawn("barrier".into(), move |t, plan| ops::run(t, plan, Coll::Barrier, DataType::U8))
    }

    // ---- life cycle -------------------------------------------------------------------------

    /// Stops every pending and future operation of this communicator (both priorities) on this
    /// rank within a time slice (20 ms); they fail with `Closed("aborted")` or a link error.
    /// The other ranks' operations fail with "aborted by rank r" (as with a rank that died,
    /// every communicator that has this rank fails there). Callable from any thread; never
    /// blocks. Sub-groups are separate communicators, aborted on their own.
    pub fn abort(&self) {
        self.core.abort();
    }

    /// Why this communicator can no longer be used, or None while it can: "aborted" (this
    /// rank's `abort`), the reason it was closed (shut down), or the failure that ended it.
    pub fn closed_reason(&self) -> Option<String> {
        self.core.usable().err().map(|e| match e {
            Error::Closed(why) => why,
            other => other.to_string(),
        })
    }

    /// Finishes what was issued, says goodbye to the other ranks and closes the links. Later
    /// calls fail with `Closed`. Dropping the last handle does the same. Shut sub-groups down
    /// before the communicator they came from: the job's goodbye lets rank 0 stop the store.
    pub fn shutdown(&self) -> Result<()> {
        self.core.shutdown()
    }
}

/// The buffer of a posted send or receive, the handle it completes, and how the handle's
/// value is made from the buffer and the peer it went to or came from.
struct PostedOwned<B: Buffer, R> {
    buf: B,
    done: Completer<R>,
    what: String,
    make: fn(B, usize) -> R,
    trace: Option<PostedTrace>,
}

impl<B: Buffer, R: Send> PostedBuf for PostedOwned<B, R> {
    fn bytes(&self) -> &[u8] {
        bytemuck::cast_slice(self.buf.as_slice())
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        bytemuck::cast_slice_mut(self.buf.as_mut_slice())
    }
    fn finish(self: Box<Self>, r: std::result::Result<usize, LinkError>) {
        let PostedOwned { buf, done, what, make, trace } = *self;
        if let Some(tr) = trace {
            tr.finished(r.as_ref().ok().copied());
        }
        done.complete(r.map(|peer| make(buf, peer)).map_err(|source| Error::Link { op: what, source }));
    }
}

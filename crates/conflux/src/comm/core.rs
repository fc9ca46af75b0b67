//! One communicator's machinery: its ranks, its lanes, and its life cycle. `Communicator`
//! handles point at a `Core`; the last handle to go shuts it down.
//!
//! A lane is a progress engine with links of its own. Every communicator has two: normal and
//! high priority. Each lane runs its operations strictly in issue order; the lanes run side by
//! side, so a high-priority operation never queues behind a normal one, and while one runs the
//! normal lane yields its core between chunks (`Transport::give_way`). Keeping the lanes' links
//! apart is what makes this safe: ranks may interleave the two lanes differently, and no
//! message of one can be taken for the other's.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::bootstrap::{self, Meeting};
use super::engine::Engine;
use super::lane::LaneState;
use super::ops::Plan;
use super::planner::Planner;
use super::recorder::Recorder;
use super::session::Session;
use super::traced::{self, CommTrace};
use crate::algo::select::{Model, ModelSource, Topo};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::trace::writer::{LaneTrace, Tracer};
use crate::transport::wait::{abort_reason, Waiter, Watch};
use crate::transport::{CallBoard, Transport};

/// How urgently an operation should run relative to others of its communicator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Priority {
    #[default]
    Normal,
    /// Runs beside, not after, normal operations issued earlier (e.g. the bucket the next
    /// forward pass needs first).
    High,
}

impl Priority {
    pub(crate) fn lane(self) -> usize {
        match self {
            Priority::Normal => 0,
            Priority::High => 1,
        }
    }
}

pub(crate) struct Lane {
    pub plan: Plan,
    pub engine: Arc<Engine>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

pub(crate) struct Core {
    pub session: Arc<Session>,
    /// Store keys of this communicator start with it; sub-groups extend it.
    pub prefix: String,
    /// The global rank of each rank of this communicator.
    pub world: Arc<[usize]>,
    pub rank: usize,
    pub local_rank: usize,
    pub local_size: usize,
    pub config: Config,
    pub lanes: Vec<Lane>,
    /// Operations running on the high-priority lane, for the normal lane to give way to.
    pub high_busy: Arc<AtomicUsize>,
    pub abort: Arc<AtomicBool>,
    /// Why the communicator is closed, once it is: read by every call, so a load, not a lock.
    pub closed: OnceLock<String>,
    /// Sub-groups made so far (the same count on every rank: making one is collective).
    pub groups: AtomicU64,
    /// Shrinks made so far (see shrink.rs).
    pub shrinks: AtomicU64,
    /// Where the ranks are and the cost model, as every lane's transport has them, and where
    /// the model came from.
    pub topo: Topo,
    pub model: Model,
    pub model_source: ModelSource,
    /// Its rank's tracer, when traced (`Config::trace`).
    pub trace: Option<CommTrace>,
    /// The call boards of this host's ranks (none without a shared segment), for `status`.
    pub board: Option<CallBoard>,
}

/// Registers the communicator `name` of global ranks `world` (this rank `rank`) with its
/// rank's tracer in `dir` and gives each lane its record buffer. The job's own communicator
/// (`root`) also puts the rank's clock on rank 0's.
fn open_trace(
    dir: &std::path::Path,
    session: &Session,
    (name, world, rank): (&str, &[usize], usize),
    topo: &Topo,
    lanes: &[Lane],
    config: &Config,
    root: bool,
) -> Result<CommTrace> {
    let host = bootstrap::node_id(config);
    let (name, world, world_size) = match &config.trace_as {
        Some(a) if a.ranks.len() == world.len() => (a.name.as_str(), &a.ranks[..], a.world_size),
        _ => (name, world, session.world_size),
    };
    let tracer = Tracer::open(dir, world[rank], world_size, &host)
        .map_err(|e| Error::setup(format!("opening the trace in {}", dir.display()), e))?;
    let comm = tracer.add_comm(name, world, rank, traced::link_of(topo));
    if root && !tracer.clock_known() {
        // On rank 0's host it is the same clock; elsewhere, measured through the store. A job
        // standing for a group (torch's) measures against the group's rank 0: only the first
        // job of the process, the whole one, sets the clock.
        let on_rank0_host = world[0] == 0 && topo.nodes.iter().any(|n| n.contains(&0) && n.contains(&rank));
        tracer.set_clock(traced::clock(session.store.as_ref().map(|(s, _)| s), on_rank0_host));
    }
    for (i, lane) in lanes.iter().enumerate() {
        lane.engine.lane_state().trace = Some(LaneTrace::new(tracer.clone(), comm, i as u8));
    }
    Ok(CommTrace { tracer, comm })
}

/// The cost model of a new communicator and where it came from: as `build` settled it (an
/// `inherited` one, or rank 0's tuning file or the defaults) with, when it spans nodes and rank
/// 0 had no file, TCP's bandwidth as measured now, by `deadline`.
fn settle_model(
    built: &mut bootstrap::Built,
    inherited: bool,
    store: &crate::store::StoreClient,
    prefix: &str,
    (rank, world): (usize, &[usize]),
    deadline: Instant,
) -> Result<(Model, ModelSource)> {
    if inherited || built.topo.nodes.len() < 2 || built.source == ModelSource::TuningFile {
        return Ok((built.model, built.source));
    }
    let t = &mut built.transport;
    built.model.tcp.gbps = super::calibrate::tcp_gbps(t, store, prefix, (&built.topo, world), rank, deadline)?;
    if rank == 0 {
        tracing::info!(tcp_gbps = built.model.tcp.gbps, "TCP between nodes measured for the cost model");
    }
    Ok((built.model, ModelSource::MeasuredTcp))
}

impl Core {
    /// Builds the lanes of the communicator whose ranks have global ranks `world`. A sub-group
    /// `inherit`s its parent's cost model (the same on all its ranks); a new job agrees on one
    /// and, when it spans nodes without a tuning file, measures its TCP links (`calibrate`).
    pub fn new(
        session: Arc<Session>,
        prefix: String,
        world: Arc<[usize]>,
        rank: usize,
        config: Config,
        root: bool,
        inherit: Option<(Model, ModelSource)>,
    ) -> Result<Core> {
        let deadline = Instant::now() + config.timeout;
        let size = world.len();
        let abort = Arc::new(AtomicBool::new(false));
        let high_busy = Arc::new(AtomicUsize::new(0));
        let mut lanes = Vec::new();
        let (mut local_rank, mut local_size, mut board) = (0, 1, None);
        let (mut topo, mut model, mut source) = (Topo::single(size, false), Model::default(), ModelSource::Defaults);
        for lane in 0..2 {
            let (mut transport, local_ranks, lane_topo) = match &session.store {
                None => {
                    let (world, abort) = (world.clone(), abort.clone());
                    let (pidfds, spin) = (Vec::new(), Duration::ZERO);
                    let watch = Watch {
                        host: None,
                        pidfds,
                        monitor: None,
                        world,
                        rank,
                        abort,
                        spin,
                        yield_while_spinning: false,
                    };
                    let waiter = Waiter::new(watch).map_err(|e| Error::setup("creating the waiter's eventfd", e))?;
                    (Transport::new(rank, 1, vec![None], waiter), vec![rank], Topo::single(1, false))
                }
                Some((store, store_addr)) => {
                    let meeting = Meeting {
                        store,
                        store_addr: *store_addr,
                        prefix: &format!("{prefix}/l{lane}"),
                        world: world.clone(),
                        channel: session.channel(),
                    };
                    let known = if lane == 0 { inherit } else { Some((model, source)) };
                    let mut built = bootstrap::build(&meeting, (rank, size), &config, abort.clone(), known)?;
                    if lane == 0 {
                        let inherited = inherit.is_some();
                        (model, source) =
                            settle_model(&mut built, inherited, store, &prefix, (rank, &world), deadline)?;
                    }
                    (built.transport, built.local_ranks, built.topo)
                }
            };
            transport.waiter.live.scope = Arc::from(prefix.as_str());
            if lane == 0 {
                board = transport.call_board();
                transport.give_way = Some(high_busy.clone());
                local_rank = local_ranks.iter().position(|&r| r == rank).unwrap_or(0);
                local_size = local_ranks.len();
                topo = lane_topo.clone();
            }
            let label = format!("communicator {prefix:?}, {} lane", if lane == 0 { "normal" } else { "high-priority" });
            let stem = format!("{prefix}-lane{lane}");
            let recorder = Arc::new(Recorder::new(world[rank], label, &stem, config.dump_dir.clone()));
            let state = LaneState::new(transport, Planner::new(lane_topo, model), recorder);
            let (engine, thread) = Engine::start(state, world[rank], lane)?;
            let deterministic = config.deterministic;
            let timeout = config.timeout;
            let plan = Plan { rank, size, timeout, algo: config.algo, call_algo: None, deterministic, issue: None };
            lanes.push(Lane { plan, engine, thread: Mutex::new(Some(thread)) });
        }
        tracing::info!(prefix, rank, size, local_size, "communicator ready");
        let trace = match &config.trace {
            Some(dir) => Some(open_trace(dir, &session, (&prefix, &world, rank), &topo, &lanes, &config, root)?),
            None => None,
        };
        session.opened();
        Ok(Core {
            trace,
            session,
            prefix,
            world,
            rank,
            local_rank,
            local_size,
            config,
            lanes,
            high_busy,
            abort,
            closed: OnceLock::new(),
            groups: AtomicU64::new(0),
            shrinks: AtomicU64::new(0),
            topo,
            model,
            model_source: source,
            board,
        })
    }

    pub fn size(&self) -> usize {
        self.world.len()
    }

    pub fn usable(&self) -> Result<()> {
        if let Some(why) = self.closed.get() {
            return Err(Error::Closed(why.clone()));
        }
        if self.abort.load(Ordering::Relaxed) {
            return Err(Error::Closed("aborted".into()));
        }
        Ok(())
    }

    pub fn abort(&self) {
        if !self.abort.swap(true, Ordering::SeqCst) {
            // The peers must not wait for this rank to their deadline. The store tells every
            // communicator of this rank; the report names this one, and only it fails (a
            // group's own abort, or torch aborting the groups a shrink_group left behind, must
            // not fail the others).
            let me = self.world[self.rank];
            self.session.report(me, &abort_reason(me, &self.prefix));
        }
        // An engine may be asleep on its doorbell or its sockets.
        for lane in &self.lanes {
            lane.engine.wake();
        }
    }

    /// Makes every lane disregard the store's failure reports that blame `ranks` (global).
    pub fn ignore_failures_of(&self, ranks: &[usize]) {
        for lane in &self.lanes {
            lane.engine.lane_state().t.waiter.live.ignored.extend_from_slice(ranks);
        }
    }

    pub fn shutdown(&self) -> Result<()> {
        if self.closed.set("shut down".into()).is_err() {
            return Ok(());
        }
        let timeout = self.config.timeout;
        let mut all_drained = true;
        for lane in &self.lanes {
            let drained = lane.engine.drain(timeout);
            lane.engine.stop();
            if let Some(th) = lane.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
                if drained {
                    let _ = th.join();
                }
            }
            let mut state = lane.engine.lane_state();
            if let Some(lt) = &mut state.trace {
                lt.flush();
            }
            let t = &mut state.t;
            t.finish_sockets();
            if let Some(m) = &mut t.waiter.live.monitor {
                m.goodbye();
            }
            all_drained &= drained;
        }
        if let Some(ct) = &self.trace {
            ct.tracer.flush();
        }
        // The process's goodbye comes with its session's last open communicator, which need
        // not be the one the session was opened for: torch's shrink_group destroys the group
        // it shrank and goes on with the shrunk one.
        if self.session.closed_one() {
            self.session.goodbye();
        }
        if all_drained {
            Ok(())
        } else {
            Err(Error::Closed(format!("operations still running after {timeout:?}")))
        }
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        // Dropped while the thread unwinds from a panic: the program will not finish its part,
        // so the peers must learn now (abort), not after they waited for it to the timeout.
        if std::thread::panicking() {
            self.abort();
        }
        let _ = self.shutdown();
    }
}

/// Counts an operation as running on the high-priority lane while it lives.
pub(crate) struct HighBusy(Option<Arc<AtomicUsize>>);

impl HighBusy {
    /// The counter a lane's operations count themselves in: the core's, for the high lane.
    pub fn counter(core: &Core, lane: usize) -> Option<Arc<AtomicUsize>> {
        (lane > 0).then(|| core.high_busy.clone())
    }

    pub fn new(counter: Option<Arc<AtomicUsize>>) -> HighBusy {
        if let Some(n) = &counter {
            n.fetch_add(1, Ordering::Relaxed);
        }
        HighBusy(counter)
    }
}

impl Drop for HighBusy {
    fn drop(&mut self) {
        if let Some(n) = &self.0 {
            n.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

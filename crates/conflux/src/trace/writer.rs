//! Writing a rank's trace: `Tracer`, one per rank and trace directory in a process, shared by
//! every communicator of that rank. Lanes record into their own `LaneTrace` (lane.rs);
//! callers' threads (waits, step marks) into the tracer's shared buffer.
//!
//! Memory stays bounded however long the job runs: records stream to `rank-<r>.bin` (64 bytes
//! each) in batches of at most `BATCH`, and a batch goes out at the latest `FLUSH_AGE` after
//! its first record, to the rank's writer thread (`sink.rs`), which writes every 500 ms or as
//! soon as 2 MiB wait; so a rank killed mid-job leaves all but its last second on disk.
//! Records are dropped only when 8 MiB of them wait for a disk that cannot keep up, or the
//! disk refuses them; the meta file counts those.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

pub use super::lane::LaneTrace;
use super::meta::{Clock, CommInfo, Meta, ThreadInfo, FORMAT, VERSION};
use super::record::{kind, Raw};
use super::sink::Sink;
pub use super::stamp::{blank, monotonic_ns, ns, thread_id};
use super::stamp::{THREADS, THREAD_COUNT};

/// Records a lane buffers before handing them to the writer thread (4 KiB: the buffer stays
/// in the lane's cache).
pub(super) const BATCH: usize = 64;
/// The most a buffered record waits for its batch to go out (checked as records arrive).
pub(super) const FLUSH_AGE: Duration = Duration::from_millis(100);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Every live tracer of the process, for `mark_step` and for communicators of one rank to
/// share one.
static TRACERS: Mutex<Vec<Weak<Tracer>>> = Mutex::new(Vec::new());

/// One rank's trace files.
pub struct Tracer {
    dir: PathBuf,
    rank: usize,
    bin: Sink,
    meta: Mutex<MetaState>,
    next_op: AtomicU64,
    next_step: AtomicU64,
    /// Records from callers' threads (waits, steps), shared by all of them.
    side: Mutex<Vec<Raw>>,
    unseen: UnseenWaits,
}

/// What `Tracer::sync_point` estimates a wait conflux cannot see from, in trace nanoseconds.
#[derive(Default)]
struct UnseenWaits {
    /// The last issue of an asynchronous operation awaited elsewhere (`awaited_elsewhere`).
    issued: AtomicU64,
    /// The latest end of an asynchronous operation.
    ended: AtomicU64,
    /// `issued` at the last sync point.
    synced: AtomicU64,
}

/// The operation number of a WAIT record that `sync_point` estimated: every asynchronous
/// operation issued before it.
pub const SYNC_OP: u64 = u64::MAX;

struct MetaState {
    meta: Meta,
    /// Threads the meta file lists.
    threads_written: usize,
}

impl Tracer {
    /// The tracer of global `rank` writing to `dir`: this process's, if a communicator
    /// already opened it, else a new one that empties `dir/rank-<rank>.*`.
    pub fn open(dir: &Path, rank: usize, world_size: usize, host: &str) -> std::io::Result<Arc<Tracer>> {
        let mut all = lock(&TRACERS);
        all.retain(|w| w.strong_count() > 0);
        if let Some(t) = all.iter().filter_map(Weak::upgrade).find(|t| t.dir == dir && t.rank == rank) {
            return Ok(t);
        }
        std::fs::create_dir_all(dir)?;
        let file = File::create(dir.join(format!("rank-{rank}.bin")))?;
        let meta = Meta {
            format: FORMAT.into(),
            version: VERSION,
            rank,
            world_size,
            pid: std::process::id(),
            host: host.into(),
            clock: Clock::unmeasured(),
            comms: Vec::new(),
            threads: Vec::new(),
            dropped: 0,
        };
        let mut started = Ok(());
        let t = Arc::new_cyclic(|me: &Weak<Tracer>| {
            let me = me.clone();
            let written = move || {
                if let Some(t) = me.upgrade() {
                    t.follow_threads();
                }
            };
            let bin = Sink::start(file, rank, written).unwrap_or_else(|e| {
                started = Err(e);
                Sink::stopped()
            });
            Tracer {
                dir: dir.to_path_buf(),
                rank,
                bin,
                meta: Mutex::new(MetaState { meta, threads_written: 0 }),
                next_op: AtomicU64::new(0),
                next_step: AtomicU64::new(0),
                side: Mutex::new(Vec::with_capacity(BATCH)),
                unseen: UnseenWaits::default(),
            }
        });
        started?;
        t.write_meta(&mut lock(&t.meta))?;
        all.push(Arc::downgrade(&t));
        Ok(t)
    }

    /// Registers a communicator; its records carry the number returned.
    pub fn add_comm(&self, name: &str, ranks: &[usize], rank: usize, link: &str) -> u16 {
        let mut m = lock(&self.meta);
        let id = m.meta.comms.len() as u16;
        let info = CommInfo { id, name: name.into(), ranks: ranks.to_vec(), rank, link: link.into() };
        m.meta.comms.push(info);
        self.rewrite_meta(&mut m);
        id
    }

    /// Whether a communicator already put this rank's clock on rank 0's.
    pub fn clock_known(&self) -> bool {
        lock(&self.meta).meta.clock.is_measured()
    }

    /// How this rank's clock relates to rank 0's.
    pub fn set_clock(&self, clock: Clock) {
        let mut m = lock(&self.meta);
        m.meta.clock = clock;
        self.rewrite_meta(&mut m);
    }

    /// A number for a new operation (what its WAIT record refers to).
    #[inline]
    pub fn next_op_id(&self) -> u64 {
        self.next_op.fetch_add(1, Ordering::Relaxed)
    }

    /// Marks the start of the next step on this rank; returns its number.
    pub fn mark_step(&self) -> u64 {
        let step = self.next_step.fetch_add(1, Ordering::Relaxed);
        let now = ns(Instant::now());
        let r = Raw { kind: kind::STEP, seq: step, thread: thread_id(), started: now, ..blank() };
        // A step mark sends out what waited: a reader sees every step but the last one whole.
        let mut side = lock(&self.side);
        side.push(r);
        self.send_side(&mut side);
        step
    }

    /// An asynchronous operation issued at `at` will be awaited where conflux cannot see (a
    /// torch future, waited in C++); the next `sync_point` estimates that wait.
    pub fn awaited_elsewhere(&self, at: u64) {
        self.unseen.issued.fetch_max(at, Ordering::Relaxed);
    }

    /// An asynchronous operation ended at `at`.
    #[inline]
    pub fn async_ended(&self, at: u64) {
        self.unseen.ended.fetch_max(at, Ordering::Relaxed);
    }

    /// Every operation `awaited_elsewhere` so far has been waited for (torch's DDP waits for
    /// its buckets' futures inside C++, before the optimizer steps). Records the estimated
    /// wait: from the last one's issue — after it, the caller had nothing left to overlap — to
    /// the latest end of an asynchronous operation. Nothing if no such operation was issued
    /// since the last sync point.
    pub fn sync_point(&self) {
        let issued = self.unseen.issued.load(Ordering::Relaxed);
        if issued == 0 || self.unseen.synced.swap(issued, Ordering::Relaxed) == issued {
            return;
        }
        let ended = self.unseen.ended.load(Ordering::Relaxed).max(issued);
        let r = Raw { kind: kind::WAIT, thread: thread_id(), id: SYNC_OP, issued, ended, ..blank() };
        self.side_record(r);
    }

    /// A caller thread's record (a wait).
    pub fn side_record(&self, r: Raw) {
        let mut side = lock(&self.side);
        side.push(r);
        let first = side[0].ended.max(side[0].started);
        if side.len() >= BATCH || r.ended.saturating_sub(first) > FLUSH_AGE.as_nanos() as u64 {
            self.send_side(&mut side);
        }
    }

    /// Hands records to the writer thread.
    pub(super) fn append(&self, recs: &[Raw]) {
        self.bin.send(recs);
    }

    /// Rewrites the meta file if threads were named since it was written (the writer thread
    /// calls this after each write).
    fn follow_threads(&self) {
        let mut m = lock(&self.meta);
        if THREAD_COUNT.load(Ordering::Acquire) != m.threads_written {
            self.rewrite_meta(&mut m);
        }
    }

    fn rewrite_meta(&self, m: &mut MetaState) {
        if let Err(e) = self.write_meta(m) {
            tracing::warn!("cannot write the trace's meta file in {}: {e}", self.dir.display());
        }
    }

    fn write_meta(&self, m: &mut MetaState) -> std::io::Result<()> {
        {
            let names = lock(&THREADS);
            m.meta.threads =
                names.iter().enumerate().map(|(i, n)| ThreadInfo { id: i as u32, name: n.clone() }).collect();
            m.threads_written = names.len();
        }
        m.meta.dropped = self.bin.dropped();
        let text = serde_json::to_string_pretty(&m.meta).map_err(std::io::Error::other)?;
        let path = self.dir.join(format!("rank-{}.json", self.rank));
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(tmp, path)
    }

    /// Writes out what callers' threads recorded and everything handed to the writer thread
    /// so far (at most a few seconds' wait: the program may exit without dropping the tracer).
    pub fn flush(&self) {
        let mut side = lock(&self.side);
        self.send_side(&mut side);
        drop(side);
        self.bin.drain(Duration::from_secs(5));
        self.rewrite_meta(&mut lock(&self.meta));
    }

    /// The side buffer's records, handed to the writer thread.
    fn send_side(&self, side: &mut Vec<Raw>) {
        self.append(side);
        side.clear();
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Marks the start of the next step on every rank this process traces (Python's
/// `conflux.mark_step()`); returns how many tracers marked it.
pub fn mark_step_everywhere() -> usize {
    let live = live_tracers();
    for t in &live {
        t.mark_step();
    }
    live.len()
}

/// `Tracer::sync_point` on every rank this process traces (conflux.torch's pre-step hook).
pub fn sync_point_everywhere() {
    for t in live_tracers() {
        t.sync_point();
    }
}

fn live_tracers() -> Vec<Arc<Tracer>> {
    lock(&TRACERS).iter().filter_map(Weak::upgrade).collect()
}

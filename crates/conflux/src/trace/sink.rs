//! The thread that writes a rank's records to its file, so that no operation ever waits for
//! the disk: lanes and callers hand it whole batches (a lock and a push), and it writes them
//! every `PERIOD`, when `WAKE_AT` records wait, or at once when asked to drain.
//!
//! Its wake-ups are what tracing costs most on a busy host: each one takes a core from a
//! rank. Measured at 2 ranks on 2 cores, 8-byte all_reduce back to back: writing 16 KiB
//! batches from the calling thread, 1.5-6x the untraced time (writes stalled); this thread
//! waking every 20 ms, 1.4-1.8x; every second, 1.0-1.17x. Hence the long period, with
//! `WAKE_AT` keeping the queue short when operations come fast (at a million a second, one
//! wake-up per 65 ms).
//!
//! Bounded: at most `MAX_QUEUED` records wait; past that, batches are dropped and counted
//! (the meta file says how many), rather than memory growing without end.

use std::fs::File;
use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::record::Raw;

/// How often the thread wakes to write what was queued.
const PERIOD: Duration = Duration::from_millis(500);
/// Records waiting that wake the thread before its period is up (2 MiB).
const WAKE_AT: usize = 1 << 15;
/// Records allowed to wait (8 MiB).
const MAX_QUEUED: usize = 1 << 17;

/// An empty buffer for `WAKE_AT` records and a batch more, its pages touched, so that the
/// first seconds of a trace do not pay page faults on the lanes' path (at 2 ranks, page
/// faults and a growing queue made the first 5000 records cost 200-240 ns each).
fn ready_buffer() -> Vec<Raw> {
    let mut v = vec![super::writer::blank(); WAKE_AT + 256];
    v.clear();
    v
}

struct Queue {
    /// Records waiting for the thread, which swaps this buffer for its empty one: both keep
    /// their memory, so a long job allocates and faults nothing in after the first seconds.
    records: Vec<Raw>,
    /// Records handed to the thread and not yet written (for `drain`).
    unwritten: usize,
    stop: bool,
    /// Someone waits in `drain`: write now.
    hurry: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    /// Wakes the thread (stop, hurry) and drainers (written).
    changed: Condvar,
    dropped: AtomicU64,
}

fn lock(s: &Shared) -> MutexGuard<'_, Queue> {
    s.queue.lock().unwrap_or_else(|p| p.into_inner())
}

pub(super) struct Sink {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Sink {
    /// Starts the thread writing to `file`, named after `rank`; it calls `written` after each
    /// write (the tracer's meta file follows new threads from there, off the lanes' path).
    pub fn start(mut file: File, rank: usize, written: impl Fn() + Send + 'static) -> std::io::Result<Sink> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue { records: ready_buffer(), unwritten: 0, stop: false, hurry: false }),
            changed: Condvar::new(),
            dropped: AtomicU64::new(0),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new().name(format!("conflux-r{rank}-trace")).spawn(move || {
            write_loop(&s, &mut file, &written);
        })?;
        Ok(Sink { shared, thread: Mutex::new(Some(thread)) })
    }

    /// A sink whose thread could not start: it keeps nothing.
    pub fn stopped() -> Sink {
        let queue = Queue { records: Vec::new(), unwritten: 0, stop: true, hurry: false };
        let shared = Arc::new(Shared { queue: Mutex::new(queue), changed: Condvar::new(), dropped: AtomicU64::new(0) });
        Sink { shared, thread: Mutex::new(None) }
    }

    /// Queues a copy of `batch` for the file, or drops it when too much is waiting already.
    /// (A copy: the caller's buffer stays in its cache. Handing over fresh buffers instead
    /// made an 8-byte all_reduce at 2 ranks 1.5x slower traced than untraced, against 1.1x.)
    pub fn send(&self, batch: &[Raw]) {
        if batch.is_empty() {
            return;
        }
        let mut q = lock(&self.shared);
        let before = q.records.len();
        if q.stop || before + batch.len() > MAX_QUEUED {
            self.shared.dropped.fetch_add(batch.len() as u64, Ordering::Relaxed);
            return;
        }
        q.records.extend_from_slice(batch);
        q.unwritten += batch.len();
        if before < WAKE_AT && before + batch.len() >= WAKE_AT {
            self.shared.changed.notify_all();
        }
    }

    /// Waits until everything queued so far is written, at most `timeout`.
    pub fn drain(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut q = lock(&self.shared);
        while q.unwritten > 0 && !q.stop {
            q.hurry = true;
            self.shared.changed.notify_all();
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            q = self.shared.changed.wait_timeout(q, left.min(PERIOD)).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// Records dropped: the queue was full, or the disk refused them.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        lock(&self.shared).stop = true;
        self.shared.changed.notify_all();
        if let Some(t) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
    }
}

fn write_loop(s: &Shared, file: &mut File, written: &dyn Fn()) {
    let mut warned = false;
    let mut out = ready_buffer();
    loop {
        let stop = {
            let mut q = lock(s);
            if q.records.len() < WAKE_AT && !q.stop && !q.hurry {
                q = s.changed.wait_timeout(q, PERIOD).unwrap_or_else(|p| p.into_inner()).0;
            }
            q.hurry = false;
            std::mem::swap(&mut q.records, &mut out);
            q.stop
        };
        if let Err(e) = file.write_all(bytemuck::cast_slice(&out)) {
            if !warned {
                tracing::warn!("cannot write the trace: {e}; its records are dropped");
                warned = true;
            }
            s.dropped.fetch_add(out.len() as u64, Ordering::Relaxed);
        }
        written();
        let mut q = lock(s);
        q.unwritten -= out.len();
        out.clear();
        s.changed.notify_all();
        if stop && q.records.is_empty() {
            return;
        }
    }
}

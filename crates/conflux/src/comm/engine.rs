//! The progress engine of one communicator (its "communication stream").
//!
//! Every operation takes a ticket when it is issued; operations run strictly in ticket order,
//! one at a time, each holding the transport. Asynchronous operations run on the engine's
//! thread; a blocking operation runs on its caller's thread once its ticket comes up, so a
//! small blocking collective pays no thread hand-off and its buffers never cross threads.
//! The engine thread sleeps on a condition variable when it has nothing to run.
//!
//! Between operations the engine thread drives posted sends and receives, holding the
//! transport, and may sleep inside it until a peer moves. A blocking operation whose turn has
//! come must not wait for that: the engine cuts its driving short as soon as the next ticket is
//! an inline one, and the caller wakes it (`SelfWake`) if it sleeps; the engine then leaves the
//! transport alone until that operation has finished, which itself drives the posted transfers
//! while it waits. Without this a send posted before a blocking receive (pipeline parallelism's
//! pattern) kept the receive off the transport for whole driving slices.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::lane::LaneState;
use super::recorder::Recorder;
use crate::error::{Error, Result};
use crate::trace::writer::Tracer;
use crate::transport::wait::SelfWake;

type Job = Box<dyn FnOnce(&mut LaneState) + Send>;

/// How long the engine drives posted transfers before looking at its queue again: the most a
/// newly issued operation waits for the transport while background transfers are pending.
const POSTED_SLICE: Duration = Duration::from_millis(1);

struct Queue {
    /// Tickets handed out so far.
    issued: u64,
    /// Tickets whose operation has finished.
    finished: u64,
    /// Asynchronous jobs, by ticket, waiting for their turn.
    jobs: VecDeque<(u64, Job)>,
    /// Set when the communicator shuts down: the thread leaves once the queue is empty.
    stopping: bool,
    /// Threads blocked on `turn` (inline callers awaiting their ticket, drain). Counting them
    /// lets a finishing operation skip the wake-up system call when nobody waits, which is
    /// most of the cost of a small blocking collective.
    turn_waiters: usize,
    /// The engine thread waits on `work` for an inline operation to finish.
    parked: bool,
}

impl Queue {
    /// The next operation to run is a queued job.
    fn job_is_next(&self) -> bool {
        self.jobs.front().is_some_and(|(t, _)| *t == self.finished)
    }

    /// The next operation to run was issued inline: its ticket is due and no job holds it.
    fn inline_is_next(&self) -> bool {
        self.finished < self.issued && !self.job_is_next()
    }
}

pub(crate) struct Engine {
    queue: Mutex<Queue>,
    /// Signalled when an operation finishes, for threads awaiting their turn.
    turn: Condvar,
    /// Signalled for the engine thread: a job was queued, one may now be next, or stop.
    work: Condvar,
    transport: Mutex<LaneState>,
    recorder: Arc<Recorder>,
    /// Wakes the engine thread when it sleeps inside the transport.
    waker: SelfWake,
    /// The engine thread is driving posted transfers (and may sleep inside the transport).
    driving: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks is a bug we cannot recover from meaningfully,
    // but the data (counters, the queue) stays consistent, so carry on rather than cascade.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Engine {
    /// Starts the engine of one lane (0 normal, 1 high priority) of global rank `rank`.
    pub fn start(transport: LaneState, rank: usize, lane: usize) -> Result<(Arc<Engine>, JoinHandle<()>)> {
        let engine = Arc::new(Engine {
            queue: Mutex::new(Queue {
                issued: 0,
                finished: 0,
                jobs: VecDeque::new(),
                stopping: false,
                turn_waiters: 0,
                parked: false,
            }),
            turn: Condvar::new(),
            work: Condvar::new(),
            recorder: transport.calls.recorder.clone(),
            waker: transport.t.waiter.self_wake(),
            driving: AtomicBool::new(false),
            transport: Mutex::new(transport),
        });
        let e = engine.clone();
        let thread = std::thread::Builder::new()
            .name(format!("conflux-r{rank}-lane{lane}"))
            .spawn(move || e.serve())
            .map_err(|err| Error::setup("starting the progress engine thread", err))?;
        Ok((engine, thread))
    }

    fn serve(&self) {
        let mut q = lock(&self.queue);
        loop {
            if q.job_is_next() {
                let (ticket, job) = q.jobs.pop_front().expect("front exists");
                drop(q);
                self.recorder.dequeued(ticket);
                job(&mut lock(&self.transport));
                q = lock(&self.queue);
                self.finished(&mut q);
                continue;
            }
            if q.inline_is_next() {
                // Its caller takes the transport; `finished` wakes this thread afterwards.
                q.parked = true;
                q = self.work.wait(q).unwrap_or_else(|p| p.into_inner());
                q.parked = false;
                continue;
            }
            // Posted sends and receives move while nothing else runs, until an operation is
            // due. The queue is locked again before the transport is let go: a thread that
            // posts meanwhile (`run_here_if_idle`) notifies under the queue's lock, so its
            // notice cannot fall between this look and the wait below.
            drop(q);
            let mut t = lock(&self.transport);
            if t.t.has_posted() {
                self.driving.store(true, Ordering::SeqCst);
                t.drive_posted(POSTED_SLICE, || {
                    let q = lock(&self.queue);
                    q.inline_is_next() || q.job_is_next()
                });
                self.driving.store(false, Ordering::SeqCst);
            }
            let busy = t.t.has_posted();
            q = lock(&self.queue);
            drop(t);
            if busy || q.job_is_next() {
                continue;
            }
            if q.stopping && q.jobs.is_empty() {
                return;
            }
            q = self.work.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Counts one finished operation and wakes whoever may be next.
    fn finished(&self, q: &mut Queue) {
        q.finished += 1;
        if q.turn_waiters > 0 {
            self.turn.notify_all();
        }
        if !q.jobs.is_empty() || q.parked {
            self.work.notify_one();
        }
    }

    /// Queues `job` (`what`, for the flight recorder) to run on the engine thread after
    /// everything issued before it; returns its ticket.
    pub fn submit(&self, what: String, job: Job) -> u64 {
        let mut q = lock(&self.queue);
        let t = q.issued;
        q.issued += 1;
        self.recorder.queued(t, what);
        q.jobs.push_back((t, job));
        self.work.notify_one();
        if self.driving.load(Ordering::SeqCst) {
            // It drives posted transfers and may sleep inside the transport until they move.
            self.waker.wake();
        }
        t
    }

    /// Runs `f` on this thread after everything issued before it.
    pub fn run_inline<R>(&self, f: impl FnOnce(&mut LaneState) -> R) -> R {
        let mut q = lock(&self.queue);
        let t = q.issued;
        q.issued += 1;
        while q.finished != t {
            q.turn_waiters += 1;
            q = self.turn.wait(q).unwrap_or_else(|p| p.into_inner());
            q.turn_waiters -= 1;
        }
        drop(q);
        let done = TicketDone { engine: self, wake_engine: false };
        let r = f(&mut self.take_transport());
        drop(done);
        r
    }

    /// Runs `job` at once on this thread when nothing else is pending, sparing the hand-off to
    /// the engine thread (posting a send or receive: two wake-ups on an oversubscribed host
    /// cost tens of microseconds), else queues it as `submit` does. Either way the engine
    /// thread drives whatever posted transfers the job leaves unfinished.
    /// Returns the job's ticket when it was queued, None when it ran here.
    pub fn run_now_or_submit(&self, what: String, job: Job) -> Option<u64> {
        match self.run_here_if_idle(move |t, _| job(t)) {
            Ok(()) => None,
            Err(f) => Some(self.submit(what, Box::new(move |t| f(t, 0)))),
        }
    }

    /// Runs queued jobs on this thread, in ticket order, up to and including ticket `mine`,
    /// until `done()` holds, while the next operation due is a queued job and the transport
    /// is free: a caller that waits right after issuing (torch's `async_op=True` then
    /// `wait()`, a pipeline stage's isend/irecv then wait) runs its own operation instead of
    /// waking the engine thread and being woken back, two wake-ups that cost tens of
    /// microseconds on an oversubscribed host. Never a later ticket: one issued after the
    /// awaited operation may need a peer that first needs this wait to return. Stops at an
    /// inline operation's turn (its caller runs it) and leaves the rest to the engine thread,
    /// which finds the queue moved on when it wakes.
    pub fn help_until(&self, mine: u64, done: impl Fn() -> bool) {
        while !done() {
            let mut q = lock(&self.queue);
            if !q.job_is_next() || q.jobs.front().is_some_and(|(t, _)| *t > mine) {
                return;
            }
            let mut t = match self.transport.try_lock() {
                Ok(t) => t,
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => return,
            };
            let (ticket, job) = q.jobs.pop_front().expect("front exists");
            drop(q);
            self.recorder.dequeued(ticket);
            // Finishes the ticket also if the job panics, so that the operations after it run.
            let finished = TicketDone { engine: self, wake_engine: false };
            job(&mut t);
            let posted = t.t.has_posted();
            drop(t);
            drop(finished);
            if posted {
                // Posted transfers the job left: the engine thread drives them.
                self.work.notify_one();
            }
        }
    }

    /// Drives posted transfers on this thread until `done()`, as MPI_Wait progresses its
    /// request, instead of sleeping until the engine thread has finished the transfer and woken
    /// this one. Only while nothing else is issued: it returns at once when operations are
    /// pending or the engine thread holds the transport, and gives up when another operation
    /// is issued (within one driving slice), which the engine thread must be free to run (a
    /// peer may need it before it sends what this thread waits for).
    pub fn drive_until(&self, done: impl Fn() -> bool) {
        let _ = self.run_here_if_idle(|t, mine| {
            let give_up = || done() || lock(&self.queue).issued > mine + 1;
            while t.t.has_posted() && !give_up() {
                t.drive_posted(POSTED_SLICE, give_up);
            }
        });
    }

    /// Runs `f` (with its ticket) on this thread if nothing is issued and unfinished and the
    /// transport is free, else hands it back. Never waits for the transport: the engine thread
    /// may hold it, or this very thread (a completion callback that posts). The engine thread
    /// is woken for posted transfers `f` leaves pending.
    fn run_here_if_idle<F: FnOnce(&mut LaneState, u64)>(&self, f: F) -> std::result::Result<(), F> {
        let mut q = lock(&self.queue);
        if q.finished != q.issued {
            return Err(f);
        }
        let mut t = match self.transport.try_lock() {
            Ok(t) => t,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Err(f),
        };
        let mine = q.issued;
        q.issued += 1;
        drop(q);
        let mut done = TicketDone { engine: self, wake_engine: true };
        f(&mut t, mine);
        done.wake_engine = t.t.has_posted();
        drop(t);
        Ok(())
    }

    /// The transport, for the inline operation whose turn it is.
    fn take_transport(&self) -> MutexGuard<'_, LaneState> {
        match self.transport.try_lock() {
            Ok(t) => t,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                // The engine thread is driving posted transfers and sees our turn between passes;
                // if it sleeps, it would see it only at the end of its slice.
                self.waker.wake();
                lock(&self.transport)
            }
        }
    }

    /// Waits until every operation issued so far has finished, up to `timeout`.
    pub fn drain(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut q = lock(&self.queue);
        while q.finished != q.issued {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            q.turn_waiters += 1;
            q = self.turn.wait_timeout(q, left).unwrap_or_else(|p| p.into_inner()).0;
            q.turn_waiters -= 1;
        }
        true
    }

    /// Lets the thread leave once its queue is empty.
    pub fn stop(&self) {
        lock(&self.queue).stopping = true;
        self.work.notify_all();
    }

    /// Wakes the engine thread if it sleeps inside the transport (abort).
    pub fn wake(&self) {
        self.waker.wake();
    }

    /// The lane's state (its transport), for setup and teardown work outside any operation.
    pub fn lane_state(&self) -> MutexGuard<'_, LaneState> {
        lock(&self.transport)
    }
}

/// Finishes an inline operation's ticket when dropped, also if the operation panicked, so that
/// the operations after it still run.
struct TicketDone<'a> {
    engine: &'a Engine,
    /// Notify the engine thread: posted transfers are left for it to drive.
    wake_engine: bool,
}

impl Drop for TicketDone<'_> {
    fn drop(&mut self) {
        let mut q = lock(&self.engine.queue);
        self.engine.finished(&mut q);
        if self.wake_engine {
            self.engine.work.notify_one();
        }
    }
}

/// A Work's ticket when its operation was not queued (it ran on the issuing thread).
const RAN_AT_ISSUE: u64 = u64::MAX;

/// The completion of one asynchronous operation, carrying its result.
pub struct Work<T> {
    state: Slot<T>,
    what: String,
    /// The engine that runs the operation and its ticket there (`RAN_AT_ISSUE`: none), so
    /// that `wait` can run it (`Engine::help_until`), or drive a posted send or receive
    /// (`Engine::drive_until`), on the waiting thread. A plain u64, not an Option: the handle
    /// stays small enough to travel in `wait_timeout`'s error.
    driver: Option<(Weak<Engine>, u64)>,
    /// A traced operation's tracer, number there and issue time: the caller's waits are
    /// recorded. Boxed: untraced, a Work stays small.
    trace: Option<Box<Traced>>,
}

/// The engine's end of a `Work`. Dropped without completing (its job panicked, or never ran
/// because the communicator went away), it completes the Work with an error, so no waiter
/// waits forever.
pub(crate) struct Completer<T>(Option<Slot<T>>);

/// Where a result waits for its Work: set once, with a condition variable to wake the waiter.
type Slot<T> = Arc<(Mutex<Done<T>>, Condvar)>;

/// A callback run once when an operation completes (see [`Work::on_complete`]).
type Callback = Box<dyn FnOnce() + Send>;

struct Done<T> {
    result: Option<Result<T>>,
    /// Set while the result is not.
    callback: Option<Callback>,
}

fn complete<T>(state: Slot<T>, r: Result<T>) {
    let callback = {
        let mut g = lock(&state.0);
        g.result = Some(r);
        g.callback.take()
    };
    state.1.notify_all();
    if let Some(f) = callback {
        f();
    }
}

impl<T> Completer<T> {
    pub fn complete(mut self, r: Result<T>) {
        if let Some(state) = self.0.take() {
            complete(state, r);
        }
    }
}

impl<T> Drop for Completer<T> {
    fn drop(&mut self) {
        if let Some(state) = self.0.take() {
            complete(state, Err(Error::Closed("the operation was dropped before it completed".into())));
        }
    }
}

impl<T> Work<T> {
    pub(crate) fn new(what: String) -> (Work<T>, Completer<T>) {
        let state = Arc::new((Mutex::new(Done { result: None, callback: None }), Condvar::new()));
        (Work { state: state.clone(), what, driver: None, trace: None }, Completer(Some(state)))
    }

    /// Lets `wait` run the operation (queued with `ticket`), or drive the transfer, on
    /// `engine`'s transport itself (see `Engine::help_until`, `Engine::drive_until`).
    pub(crate) fn driven_by(mut self, engine: &Arc<Engine>, ticket: Option<u64>) -> Work<T> {
        self.driver = Some((Arc::downgrade(engine), ticket.unwrap_or(RAN_AT_ISSUE)));
        self
    }

    /// Records the caller's waits on this operation, number `id` in `tracer`'s trace.
    pub(crate) fn traced(mut self, tracer: Arc<Tracer>, issue: &super::traced::Issue) -> Work<T> {
        self.trace = Some(Box::new(Traced { tracer, id: issue.id, issued: issue.at }));
        self
    }

    /// Says that the caller will wait for this operation where conflux cannot see it (a torch
    /// future waited in C++, as DDP does): a traced communicator then estimates that wait at
    /// the next sync point (`conflux::trace::sync_point_everywhere`). Nothing when untraced.
    pub fn awaited_elsewhere(&self) {
        if let Some(t) = &self.trace {
            t.tracer.awaited_elsewhere(crate::trace::writer::ns(t.issued));
        }
    }

    /// A handle that records, in a traced communicator's trace, waits for this operation made
    /// where conflux cannot see them (a C++ backend's own Work objects); None when untraced.
    pub fn wait_tracker(&self) -> Option<WaitTracker> {
        self.trace.as_ref().map(|t| WaitTracker { tracer: t.tracer.clone(), id: t.id, issued: t.issued })
    }

    /// A handle that runs this operation on a thread that waits for it elsewhere (a C++
    /// backend's own Work objects), as `wait` does; None for one already settled at issue.
    pub fn helper(&self) -> Option<Helper> {
        let queued = |t: u64| (t != RAN_AT_ISSUE).then_some(t);
        self.driver.as_ref().map(|(engine, ticket)| Helper { engine: engine.clone(), ticket: queued(*ticket) })
    }

    /// What the operation is, as errors name it.
    pub fn what(&self) -> &str {
        &self.what
    }

    /// True once the operation has finished, successfully or not.
    pub fn is_completed(&self) -> bool {
        lock(&self.state.0).result.is_some()
    }

    /// Runs `f` once the operation has finished (at once if it has), on the thread that
    /// completes it: the progress engine, or a thread that is posting, waiting or running a
    /// blocking operation on this communicator, with the communicator's transport held. So `f`
    /// must be short, must not block, and must not take a lock its caller may hold around
    /// communicator calls; hand real work to another thread. A later call replaces an earlier,
    /// not yet run, `f`.
    pub fn on_complete(&self, f: impl FnOnce() + Send + 'static) {
        let mut g = lock(&self.state.0);
        if g.result.is_some() {
            drop(g);
            f();
        } else {
            g.callback = Some(Box::new(f));
        }
    }

    /// Waits for the operation and returns its result. The operation's own deadline bounds this.
    pub fn wait(self) -> Result<T> {
        let _wait = WaitTrace::begin(&self.trace, self.trace.is_some() && self.is_completed());
        if let Some(h) = self.helper().filter(|_| !self.is_completed()) {
            h.help_until(|| self.is_completed());
        }
        let (m, cv) = &*self.state;
        let mut g = lock(m);
        loop {
            if let Some(r) = g.result.take() {
                return r;
            }
            g = cv.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Waits at most `timeout`. On timeout the handle comes back (the operation goes on) with
    /// an [`Error::WaitTimeout`].
    pub fn wait_timeout(self, timeout: Duration) -> std::result::Result<Result<T>, (Work<T>, Error)> {
        let deadline = Instant::now() + timeout;
        {
            let _wait = WaitTrace::begin(&self.trace, self.trace.is_some() && self.is_completed());
            let (m, cv) = &*self.state;
            let mut g = lock(m);
            loop {
                if let Some(r) = g.result.take() {
                    return Ok(r);
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                g = cv.wait_timeout(g, left).unwrap_or_else(|p| p.into_inner()).0;
            }
        }
        let err = Error::WaitTimeout { op: self.what.clone(), secs: timeout.as_secs_f64() };
        Err((self, err))
    }
}

/// Runs an issued operation on the thread that waits for it (see [`Work::helper`]). Holds
/// the engine weakly: once the communicator is gone, it does nothing.
pub struct Helper {
    engine: Weak<Engine>,
    /// The operation's ticket, if it was queued.
    ticket: Option<u64>,
}

impl Helper {
    /// Until `done()`: runs the queued operations up to the awaited one on this thread, then
    /// drives posted sends and receives, as [`Work::wait`] does before it sleeps.
    pub fn help_until(&self, done: impl Fn() -> bool) {
        if let Some(engine) = self.engine.upgrade() {
            if let Some(mine) = self.ticket {
                engine.help_until(mine, &done);
            }
            engine.drive_until(done);
        }
    }
}

/// A traced operation, for its Work.
struct Traced {
    tracer: Arc<Tracer>,
    id: u64,
    issued: Instant,
}

/// Records waits for one traced operation that its caller made elsewhere (see
/// [`Work::wait_tracker`]): each as `Work::wait` records its own.
pub struct WaitTracker {
    tracer: Arc<Tracer>,
    id: u64,
    issued: Instant,
}

impl WaitTracker {
    /// The caller was blocked on the operation for `blocked`, until now.
    pub fn waited(&self, blocked: Duration) {
        let now = Instant::now();
        super::traced::waited(&self.tracer, self.id, now.checked_sub(blocked).unwrap_or(now));
    }

    /// The caller will wait where nothing records it (a future waited in C++): see
    /// [`Work::awaited_elsewhere`].
    pub fn awaited_elsewhere(&self) {
        self.tracer.awaited_elsewhere(crate::trace::writer::ns(self.issued));
    }
}

/// Records, when dropped, that the caller waited for a traced operation since it was made.
struct WaitTrace<'a>(Option<(&'a Tracer, u64, Instant)>);

impl<'a> WaitTrace<'a> {
    /// Nothing is recorded for an operation already `done`: its wait blocked nobody (torch's
    /// layer collects every result that way, from whichever thread completes its Work).
    fn begin(trace: &'a Option<Box<Traced>>, done: bool) -> WaitTrace<'a> {
        WaitTrace(trace.as_ref().filter(|_| !done).map(|t| (&*t.tracer, t.id, Instant::now())))
    }
}

impl Drop for WaitTrace<'_> {
    fn drop(&mut self) {
        if let Some((tracer, id, began)) = self.0 {
            super::traced::waited(tracer, id, began);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn on_complete_runs_once_whenever_it_is_registered() {
        let runs = Arc::new(AtomicUsize::new(0));
        let count = |runs: &Arc<AtomicUsize>| {
            let runs = runs.clone();
            move || {
                runs.fetch_add(1, Ordering::SeqCst);
            }
        };
        let (before, done) = Work::<u8>::new("before".into());
        before.on_complete(count(&runs));
        assert_eq!(runs.load(Ordering::SeqCst), 0);
        done.complete(Ok(7));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        before.on_complete(count(&runs));
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        assert_eq!(before.wait().unwrap(), 7);

        let (dropped, done) = Work::<u8>::new("dropped".into());
        dropped.on_complete(count(&runs));
        drop(done);
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        assert!(matches!(dropped.wait(), Err(Error::Closed(_))));
    }

    /// A buffer that remembers the last thread that wrote into it.
    struct Marked {
        data: Vec<f32>,
        by: Option<std::thread::ThreadId>,
    }

    impl crate::Buffer for Marked {
        type Elem = f32;
        fn as_slice(&self) -> &[f32] {
            &self.data
        }
        fn as_mut_slice(&mut self) -> &mut [f32] {
            self.by = Some(std::thread::current().id());
            &mut self.data
        }
    }

    /// A wait right after an issue runs the operation on the waiting thread when the engine
    /// thread has not taken it yet (`Engine::help_until`): over many tries, some operations
    /// run on the waiter's thread, which never happens without the help. Results stay right.
    #[test]
    fn a_wait_runs_a_queued_operation_on_the_waiting_thread() {
        let comm = crate::Communicator::builder(0, 1).build().unwrap();
        let me = std::thread::current().id();
        let mut here = 0;
        for i in 0..500 {
            let buf = Marked { data: vec![i as f32; 4], by: None };
            let done = comm.all_reduce_async(buf, crate::ReduceOp::Sum).wait().unwrap();
            assert_eq!(done.data, vec![i as f32; 4]);
            here += usize::from(done.by == Some(me));
        }
        assert!(here > 0, "no operation of 500 ran on the thread that waited for it");
    }
}

//! Asynchronous operations as Python sees them: a handle to wait on, and a callback run when
//! the operation completes, whether or not anyone waits (torch's futures need that).
//!
//! The callback must run with the GIL, and the progress engine must never wait for the GIL
//! (a Python thread holds it for up to the 5 ms switch interval). So whoever completes the
//! operation only hands the callback on (`Done`): to the Python thread that is inside a call on
//! this Work, issuing or waiting on it, which runs it on its way out with the GIL it takes back
//! anyway; or, when there is none, to one notifier thread, which takes the GIL and runs the
//! callbacks in the order their operations completed.
//!
//! The first way matters on a busy host. An isend that completes while it is issued, or an
//! irecv that completes while its thread waits, used to wake the notifier, which then waited
//! for the GIL while the issuing thread wanted it back: two thread hand-offs per operation,
//! 30-100 us of a torch batch_isend_irecv of 8 bytes that the library does in 3.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use pyo3::prelude::*;

use crate::errors::py_err;

/// What a Work's outcome keeps of its value: the buffers are Python's, so only the rank a
/// receive from any source matched.
type Source = Option<usize>;

/// A conflux Work, with its value reduced to what Python needs of it.
trait Pending: Send {
    fn is_completed(&self) -> bool;
    fn wait(self: Box<Self>) -> conflux::Result<Source>;
    /// `Err` gives the handle back: the wait timed out, the operation goes on.
    fn wait_for(self: Box<Self>, d: Duration) -> Result<conflux::Result<Source>, (Box<dyn Pending>, conflux::Error)>;
}

struct Held<T> {
    work: conflux::Work<T>,
    source: fn(&T) -> Source,
}

impl<T: Send + 'static> Pending for Held<T> {
    fn is_completed(&self) -> bool {
        self.work.is_completed()
    }
    fn wait(self: Box<Self>) -> conflux::Result<Source> {
        let source = self.source;
        self.work.wait().map(|v| source(&v))
    }
    fn wait_for(self: Box<Self>, d: Duration) -> Result<conflux::Result<Source>, (Box<dyn Pending>, conflux::Error)> {
        let source = self.source;
        match self.work.wait_timeout(d) {
            Ok(r) => Ok(r.map(|v| source(&v))),
            Err((work, e)) => Err((Box::new(Held { work, source }), e)),
        }
    }
}

/// Where a Work stands. Its outcome is kept, so that the completion callback and the user can
/// both wait and both see the same error.
enum State {
    Pending(Box<dyn Pending>),
    /// A thread is waiting on the operation; others wait for it to record the outcome.
    Waiting,
    Done(conflux::Result<Source>),
}

/// Who runs a Work's callback: a Python thread that is inside a call on the Work when the
/// operation completes (it "holds" the Work), else the notifier thread. The states:
/// `FREE` (nobody holds it), `HELD`, `DUE` (completed while held: the holder runs it on its
/// way out) and `GONE` (run, or handed to the notifier). Only the completion moves `FREE` to
/// `GONE` and `HELD` to `DUE`; only the holder moves `HELD` or `DUE` on, so exactly one of
/// them runs the callback, once.
struct Done {
    state: AtomicU8,
    callback: Mutex<Option<Py<PyAny>>>,
}

const FREE: u8 = 0;
const HELD: u8 = 1;
const DUE: u8 = 2;
const GONE: u8 = 3;

impl Done {
    /// Held by the thread that is issuing the operation.
    fn issued(callback: Py<PyAny>) -> Arc<Done> {
        Arc::new(Done { state: AtomicU8::new(HELD), callback: Mutex::new(Some(callback)) })
    }

    fn cas(&self, from: u8, to: u8) -> bool {
        self.state.compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    fn take(&self) -> Option<Py<PyAny>> {
        self.callback.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// The operation completed (any thread, without the GIL: see the module doc). Only a
    /// holder changes the state meanwhile, between `FREE` and `HELD`, so a retry settles it.
    fn completed(&self) {
        loop {
            match self.state.load(Ordering::Acquire) {
                HELD if self.cas(HELD, DUE) => return,
                FREE if self.cas(FREE, GONE) => {
                    if let Some(cb) = self.take() {
                        // The notifier lives as long as the process; a send cannot fail.
                        let _ = notifier().send(cb);
                    }
                    return;
                }
                HELD | FREE => continue,
                _ => {
                    debug_assert!(false, "a Work completed twice");
                    return;
                }
            }
        }
    }

    /// A Python thread begins a call on the Work; true if it holds it now.
    fn hold(&self) -> bool {
        self.cas(FREE, HELD)
    }

    /// The holder leaves its call, with the GIL: runs the callback if the operation completed
    /// meanwhile.
    fn release(&self, py: Python<'_>) {
        if self.cas(HELD, FREE) {
            return;
        }
        // DUE: nobody else touches the state now.
        self.state.store(GONE, Ordering::Release);
        if let Some(cb) = self.take() {
            if let Err(e) = cb.call0(py) {
                e.print(py);
            }
        }
    }
}

/// The handle of one asynchronous operation.
#[pyclass(module = "conflux._native", frozen)]
pub struct Work {
    state: Mutex<State>,
    changed: Condvar,
    what: String,
    done: Option<Arc<Done>>,
}

impl Work {
    /// Wraps `w`, just issued on this thread; `done`, if given, is called with no arguments
    /// once `w` completes: before this returns if it already has.
    pub fn new<T: Send + 'static>(py: Python<'_>, w: conflux::Work<T>, done: Option<Py<PyAny>>) -> Work {
        Work::keeping(py, w, |_| None, done)
    }

    /// Wraps the Work of a receive from any source, which keeps the rank it matched.
    pub fn with_source<B: Send + 'static>(
        py: Python<'_>,
        w: conflux::Work<(B, usize)>,
        done: Option<Py<PyAny>>,
    ) -> Work {
        Work::keeping(py, w, |v| Some(v.1), done)
    }

    fn keeping<T: Send + 'static>(
        py: Python<'_>,
        w: conflux::Work<T>,
        source: fn(&T) -> Source,
        done: Option<Py<PyAny>>,
    ) -> Work {
        let what = w.what().to_string();
        let done = done.map(Done::issued);
        if let Some(d) = &done {
            let d = d.clone();
            w.on_complete(move || d.completed());
        }
        let held = Box::new(Held { work: w, source });
        let work = Work { state: Mutex::new(State::Pending(held)), changed: Condvar::new(), what, done };
        if let Some(d) = &work.done {
            d.release(py);
        }
        work
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The outcome, waiting at most `timeout`; the GIL must be released.
    fn outcome(&self, timeout: Option<Duration>) -> conflux::Result<Source> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut g = self.lock();
        loop {
            match std::mem::replace(&mut *g, State::Waiting) {
                State::Done(r) => {
                    *g = State::Done(r.clone());
                    return r;
                }
                State::Waiting => {
                    let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                    if left.is_some_and(|l| l.is_zero()) {
                        return Err(self.timed_out(timeout));
                    }
                    g = match left {
                        None => self.changed.wait(g).unwrap_or_else(|p| p.into_inner()),
                        Some(l) => self.changed.wait_timeout(g, l).unwrap_or_else(|p| p.into_inner()).0,
                    };
                }
                State::Pending(p) => {
                    drop(g);
                    let r = match deadline {
                        None => Ok(p.wait()),
                        Some(d) => p.wait_for(d.saturating_duration_since(Instant::now())),
                    };
                    g = self.lock();
                    let timed_out = r.is_err();
                    *g = match r {
                        Ok(r) => State::Done(r),
                        Err((p, _)) => State::Pending(p),
                    };
                    self.changed.notify_all();
                    if timed_out {
                        return Err(self.timed_out(timeout));
                    }
                }
            }
        }
    }

    fn timed_out(&self, timeout: Option<Duration>) -> conflux::Error {
        conflux::Error::WaitTimeout { op: self.what.clone(), secs: timeout.unwrap_or_default().as_secs_f64() }
    }
}

#[pymethods]
impl Work {
    /// Waits for the operation (at most `timeout` seconds, if given) and raises its error, as
    /// often as it is asked. A timed-out wait leaves the operation running.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        // A timeout too large for a Duration (inf) or NaN waits without one, as None does.
        let timeout = timeout.and_then(|s| Duration::try_from_secs_f64(s.max(0.0)).ok());
        let held = self.done.as_ref().filter(|d| d.hold());
        let outcome = py.detach(|| self.outcome(timeout));
        if let Some(d) = held {
            d.release(py);
        }
        outcome.map(|_| true).map_err(py_err)
    }

    fn is_completed(&self) -> bool {
        match &*self.lock() {
            State::Pending(p) => p.is_completed(),
            State::Waiting => false,
            State::Done(_) => true,
        }
    }

    /// The rank a receive from any source matched (in the communicator's numbering), once it
    /// has completed; None for other operations.
    #[getter]
    fn source(&self) -> Option<usize> {
        match &*self.lock() {
            State::Done(Ok(s)) => *s,
            _ => None,
        }
    }

    #[getter]
    fn what(&self) -> &str {
        &self.what
    }

    fn __repr__(&self) -> String {
        format!("<conflux Work {}{}>", self.what, if self.is_completed() { " (completed)" } else { "" })
    }
}

/// The sender to the notifier thread, started on first use.
fn notifier() -> Sender<Py<PyAny>> {
    static TX: OnceLock<Mutex<Sender<Py<PyAny>>>> = OnceLock::new();
    let tx = TX.get_or_init(|| {
        let (tx, rx) = channel();
        std::thread::Builder::new()
            .name("conflux-notify".into())
            .spawn(move || notify(rx))
            .expect("cannot start the conflux notifier thread");
        Mutex::new(tx)
    });
    tx.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Runs callbacks as they come, all that are queued under one taking of the GIL.
fn notify(rx: Receiver<Py<PyAny>>) {
    while let Ok(first) = rx.recv() {
        Python::attach(|py| {
            for cb in std::iter::once(first).chain(rx.try_iter()) {
                if let Err(e) = cb.call0(py) {
                    e.print(py);
                }
            }
        });
    }
}

//! Asynchronous operations as Python sees them: a handle to wait on, and a callback run when
//! the operation completes, whether or not anyone waits (torch's futures need that). Which
//! thread runs the callback is `callback.rs`'s business.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pyo3::prelude::*;

use crate::callback::Callback;
use crate::errors::py_err;

/// What a Work's outcome keeps of its value: the buffers are Python's, so only the rank a
/// receive from any source matched.
type Source = Option<usize>;

/// A conflux Work, with its value reduced to what Python needs of it.
trait Pending: Send {
    fn is_completed(&self) -> bool;
    fn awaited_elsewhere(&self);
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
    fn awaited_elsewhere(&self) {
        self.work.awaited_elsewhere()
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

/// The handle of one asynchronous operation.
#[pyclass(module = "conflux._native", frozen)]
pub struct Work {
    state: Mutex<State>,
    changed: Condvar,
    what: String,
    callback: Option<Arc<Callback>>,
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
        let callback = done.map(Callback::issued);
        if let Some(c) = &callback {
            let c = c.clone();
            w.on_complete(move || c.completed());
        }
        let held = Box::new(Held { work: w, source });
        let work = Work { state: Mutex::new(State::Pending(held)), changed: Condvar::new(), what, callback };
        // Completed while it was issued: its callback is this thread's to run.
        if let Some(c) = work.callback.as_ref().filter(|c| c.release()) {
            c.run_or_await(py);
        }
        work
    }

    /// The operation has completed (its callback may still be to run).
    fn operation_over(&self) -> bool {
        match &*self.lock() {
            State::Pending(p) => p.is_completed(),
            State::Waiting => false,
            State::Done(_) => true,
        }
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
        let held = Holding::new(self.callback.as_ref());
        let outcome = py.detach(|| self.outcome(timeout));
        let due = held.leave();
        // Once it has completed, the callback has run when wait() returns (callback.rs).
        let completed = !matches!(outcome, Err(conflux::Error::WaitTimeout { .. }));
        if let Some(c) = self.callback.as_ref().filter(|_| due || completed) {
            c.run_or_await(py);
        }
        outcome.map(|_| true).map_err(py_err)
    }

    /// Says the caller will wait for this operation where conflux cannot see (a torch future,
    /// as DDP waits), so that a trace estimates the wait at the next `sync_point()`.
    fn awaited_elsewhere(&self) {
        if let State::Pending(p) = &*self.lock() {
            p.awaited_elsewhere();
        }
    }

    /// Whether the operation has completed and its callback has run: the Python API's
    /// reduce_scatter copies its result out in the callback, which this runs if nobody has.
    fn is_completed(&self, py: Python<'_>) -> bool {
        self.operation_over() && self.callback.as_ref().is_none_or(|c| c.try_finish(py))
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
        format!("<conflux Work {}{}>", self.what, if self.operation_over() { " (completed)" } else { "" })
    }
}

/// A wait's hold on its Work's callback (`Callback::hold`), let go by `leave`, or by the drop
/// should the wait unwind: a callback that fell due is then handed to the notifier.
struct Holding<'a>(Option<&'a Arc<Callback>>);

impl<'a> Holding<'a> {
    fn new(c: Option<&'a Arc<Callback>>) -> Self {
        Holding(c.filter(|c| c.hold()))
    }

    /// Whether the operation completed while held.
    fn leave(mut self) -> bool {
        self.0.take().is_some_and(|c| c.release())
    }
}

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.0.take().filter(|c| c.release()) {
            c.queue();
        }
    }
}

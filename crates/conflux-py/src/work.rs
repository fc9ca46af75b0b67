//! Asynchronous operations as Python sees them: a handle to wait on, and a callback run when
//! the operation completes, whether or not anyone waits (torch's futures need that).
//!
//! The callback must run with the GIL, and the progress engine must never wait for the GIL
//! (a Python thread holds it for up to the 5 ms switch interval). So the engine only hands the
//! callback to one notifier thread, which takes the GIL and runs the callbacks in the order
//! their operations completed.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use pyo3::prelude::*;

use crate::errors::py_err;

/// A conflux Work whose result the Python side does not need (buffers are Python's).
trait Pending: Send {
    fn is_completed(&self) -> bool;
    fn wait(self: Box<Self>) -> conflux::Result<()>;
    /// `Err` gives the handle back: the wait timed out, the operation goes on.
    fn wait_for(self: Box<Self>, d: Duration) -> Result<conflux::Result<()>, (Box<dyn Pending>, conflux::Error)>;
}

impl<T: Send + 'static> Pending for conflux::Work<T> {
    fn is_completed(&self) -> bool {
        conflux::Work::is_completed(self)
    }
    fn wait(self: Box<Self>) -> conflux::Result<()> {
        conflux::Work::wait(*self).map(drop)
    }
    fn wait_for(self: Box<Self>, d: Duration) -> Result<conflux::Result<()>, (Box<dyn Pending>, conflux::Error)> {
        match self.wait_timeout(d) {
            Ok(r) => Ok(r.map(drop)),
            Err((w, e)) => Err((Box::new(w), e)),
        }
    }
}

/// The handle of one asynchronous operation.
#[pyclass(module = "conflux._native", frozen)]
pub struct Work {
    /// Taken by the first successful wait.
    inner: Mutex<Option<Box<dyn Pending>>>,
    what: String,
}

impl Work {
    /// Wraps `w`; `done`, if given, is called with no arguments once `w` completes.
    pub fn new<T: Send + 'static>(w: conflux::Work<T>, done: Option<Py<PyAny>>) -> Work {
        let what = w.what().to_string();
        if let Some(cb) = done {
            let tx = notifier();
            w.on_complete(move || {
                // The notifier lives as long as the process; a send cannot fail.
                let _ = tx.send(cb);
            });
        }
        Work { inner: Mutex::new(Some(Box::new(w))), what }
    }

    fn take(&self) -> Option<Box<dyn Pending>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

#[pymethods]
impl Work {
    /// Waits for the operation (at most `timeout` seconds, if given) and raises its error.
    /// Waiting again after success returns at once.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let Some(pending) = self.take() else { return Ok(true) };
        let outcome = py.detach(|| match timeout {
            None => Ok(pending.wait()),
            Some(s) => pending.wait_for(Duration::from_secs_f64(s.max(0.0))),
        });
        match outcome {
            Ok(r) => r.map(|_| true).map_err(py_err),
            Err((pending, e)) => {
                *self.inner.lock().unwrap_or_else(|p| p.into_inner()) = Some(pending);
                Err(py_err(e))
            }
        }
    }

    fn is_completed(&self) -> bool {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.as_ref().is_none_or(|p| p.is_completed())
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

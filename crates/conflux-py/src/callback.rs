//! Who runs an asynchronous operation's Python callback, and on which thread.
//!
//! The callback needs the GIL, and whoever completes an operation (the progress engine, or a
//! thread posting or waiting on this communicator, with its transport held) must never wait
//! for the GIL: a Python thread holds it for up to the 5 ms switch interval. So completion
//! only hands the callback on:
//! - to the Python thread that is inside a call on the Work at that moment, issuing it or
//!   waiting on it (it "holds" the Work), which runs it on its way out with the GIL it takes
//!   back anyway;
//! - else to one notifier thread, which takes the GIL and runs the callbacks handed to it in
//!   the order their operations completed. (Callbacks run by holders are not in that order.)
//!
//! The first way matters on a busy host. An isend that completes while it is issued, or an
//! irecv that completes while its thread waits, used to wake the notifier, which then waited
//! for the GIL while the issuing thread wanted it back: two thread hand-offs per operation,
//! 30-100 us of a torch batch_isend_irecv of 8 bytes that the library does in 3.
//!
//! And a wait that returns has seen the callback finish, whichever thread ran it: a waiter runs
//! it itself if nobody has yet, and waits (GIL released) while another thread is running it.
//! The Python API's reduce_scatter copies its result out in its callback, so this is what
//! makes the result visible after wait().

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::ThreadId;

use pyo3::prelude::*;

/// Nobody holds the Work: a completion hands the callback to the notifier.
const FREE: u8 = 0;
/// A Python thread is in a call on the Work.
const HELD: u8 = 1;
/// Completed while held: the holder runs the callback on its way out.
const DUE: u8 = 2;
/// Completed, and the callback handed to the notifier (or due and taken up by the holder).
const GONE: u8 = 3;

/// One operation's callback. Only the completion moves `FREE` to `GONE` and `HELD` to `DUE`;
/// only the holder moves `HELD` to `FREE` and `DUE` to `GONE`. Whoever then runs the callback
/// takes it out of `slot` first, so it runs once even when a waiter and the notifier both try.
pub struct Callback {
    state: AtomicU8,
    slot: Mutex<Slot>,
    finished: Condvar,
}

struct Slot {
    callback: Option<Py<PyAny>>,
    /// The thread that has taken the callback out and is running it.
    running: Option<ThreadId>,
}

impl Callback {
    /// The callback of an operation being issued: held by the issuing thread.
    pub fn issued(callback: Py<PyAny>) -> Arc<Callback> {
        // Started here, on a Python thread, rather than at the first completion, which may be
        // on the engine thread with the transport held.
        drop(notifier());
        Arc::new(Callback {
            state: AtomicU8::new(HELD),
            slot: Mutex::new(Slot { callback: Some(callback), running: None }),
            finished: Condvar::new(),
        })
    }

    fn slot(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The operation completed. Any thread, without the GIL; never blocks.
    pub fn completed(self: &Arc<Self>) {
        let mut now = self.state.load(Ordering::Acquire);
        loop {
            let to = match now {
                HELD => DUE,
                FREE => GONE,
                _ => {
                    debug_assert!(false, "an operation completed twice");
                    return;
                }
            };
            match self.state.compare_exchange(now, to, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) if to == GONE => return self.queue(),
                Ok(_) => return,
                // A holder came or went between the load and the exchange.
                Err(seen) => now = seen,
            }
        }
    }

    /// Hands the callback to the notifier thread.
    pub fn queue(self: &Arc<Self>) {
        // The notifier lives as long as the process; a send cannot fail.
        let _ = notifier().send(self.clone());
    }

    /// A Python thread begins a call on the Work: whether it holds the Work now.
    pub fn hold(&self) -> bool {
        self.state.compare_exchange(FREE, HELD, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    /// The holder leaves its call: whether the operation completed meanwhile (the callback is
    /// then the holder's to run).
    pub fn release(&self) -> bool {
        match self.state.compare_exchange(HELD, FREE, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => false,
            Err(_) => {
                // DUE: nobody but the holder changes it now.
                self.state.store(GONE, Ordering::Release);
                true
            }
        }
    }

    /// For a thread that knows the operation is complete: runs the callback here unless
    /// another thread has, and waits (GIL released) while another thread is running it. The
    /// callback itself may wait on its Work (torch.py's does): that returns at once.
    pub fn run_or_await(&self, py: Python<'_>) {
        if self.try_finish(py) {
            return;
        }
        py.detach(|| {
            let mut slot = self.slot();
            while slot.running.is_some() {
                slot = self.finished.wait(slot).unwrap_or_else(|p| p.into_inner());
            }
        });
    }

    /// For a thread with the GIL that found the operation complete (`Work.is_completed`, the
    /// notifier, `run_or_await`): runs the callback here if nobody has yet; false while another
    /// thread is running it.
    pub fn try_finish(&self, py: Python<'_>) -> bool {
        let me = std::thread::current().id();
        // Taken with the GIL held: no thread holds `slot` while it waits for the GIL.
        let mut slot = self.slot();
        if let Some(cb) = slot.callback.take() {
            slot.running = Some(me);
            drop(slot);
            self.run(py, cb);
            return true;
        }
        slot.running.is_none_or(|t| t == me)
    }

    fn run(&self, py: Python<'_>, cb: Py<PyAny>) {
        // Its errors are not the operation's: reported, as an unraisable exception would be.
        if let Err(e) = cb.call0(py) {
            e.print(py);
        }
        drop(cb);
        self.slot().running = None;
        self.finished.notify_all();
    }
}

/// The sender to the notifier thread, started on first use.
fn notifier() -> Sender<Arc<Callback>> {
    static TX: OnceLock<Mutex<Sender<Arc<Callback>>>> = OnceLock::new();
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
fn notify(rx: Receiver<Arc<Callback>>) {
    while let Ok(first) = rx.recv() {
        Python::attach(|py| {
            for c in std::iter::once(first).chain(rx.try_iter()) {
                // Another thread may have taken it meanwhile (a waiter): then it is theirs.
                let _ = c.try_finish(py);
            }
        });
    }
}

//! What one lane of a communicator holds while it runs an operation: its links (the
//! transport), its call context (sequence numbers, the flight recorder), its planner, and a
//! staging buffer kept between calls. The lane's engine owns one and lends it to each
//! operation in turn.

use std::sync::Arc;
use std::time::Duration;

use super::clock::CoarseClock;
use super::planner::Planner;
use super::recorder::{CallLog, Recorder};
use crate::trace::writer::LaneTrace;
use crate::transport::{Posted, Transport};

/// The calls a lane has made: numbered alike on every rank (the tags of their messages),
/// recorded for the dump a failure prints.
pub(crate) struct CallContext {
    /// Collectives run so far.
    pub seq: u64,
    /// The last calls and their state.
    pub log: CallLog,
    /// Dumps `log` and the queue of asynchronous operations when the lane first fails.
    pub recorder: Arc<Recorder>,
}

impl CallContext {
    /// Dumps the flight recorder if `t` failed since the last look (its first failure only,
    /// and not an abort), before the failure is told to anyone: every rank then says where it
    /// was, the failed call still open (`Transport::settle_failure`).
    #[inline]
    pub fn record_failure(&self, t: &mut Transport) {
        t.settle_failure(|e, w| self.recorder.dump(&self.log, &e.to_string(), &w.peers_calls()));
    }
}

pub(crate) struct LaneState {
    pub t: Transport,
    pub calls: CallContext,
    pub planner: Planner,
    /// Kept between calls for algorithms that stage a message in one buffer, so its pages
    /// are faulted in once, not every call.
    pub staging: Vec<u8>,
    /// This lane's trace records, when the communicator is traced.
    pub trace: Option<LaneTrace>,
    /// When each untraced call starts, cheaply (see clock.rs).
    pub clock: CoarseClock,
}

impl LaneState {
    pub fn new(t: Transport, planner: Planner, recorder: Arc<Recorder>) -> LaneState {
        let calls = CallContext { seq: 0, log: CallLog::default(), recorder };
        LaneState { t, calls, planner, staging: Vec::new(), trace: None, clock: CoarseClock::new() }
    }

    /// See `CallContext::record_failure`.
    pub fn record_failure(&mut self) {
        self.calls.record_failure(&mut self.t);
    }

    /// Posts a background send or receive (see `Transport::post`).
    pub fn post(&mut self, p: Posted) {
        self.t.post(p);
        self.record_failure();
    }

    /// Drives posted transfers for up to `slice` (the engine's idle work, see
    /// `Transport::drive_posted`).
    pub fn drive_posted(&mut self, slice: Duration, give_up: impl Fn() -> bool) {
        self.t.drive_posted(slice, give_up);
        self.record_failure();
    }
}

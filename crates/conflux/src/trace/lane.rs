//! `LaneTrace`: one lane's records, in a small buffer the lane owns (no lock, no allocation
//! per call), handed to the rank's writer thread a batch at a time.

use std::sync::Arc;

use super::record::{flag, Raw};
use super::writer::{Tracer, BATCH, FLUSH_AGE};

/// The records of one lane of one communicator.
pub struct LaneTrace {
    tracer: Arc<Tracer>,
    pub comm: u16,
    pub lane: u8,
    buf: Vec<Raw>,
}

impl LaneTrace {
    pub fn new(tracer: Arc<Tracer>, comm: u16, lane: u8) -> LaneTrace {
        LaneTrace { tracer, comm, lane, buf: Vec::with_capacity(BATCH) }
    }

    pub fn tracer(&self) -> &Arc<Tracer> {
        &self.tracer
    }

    /// Records an operation that ended (`r.ended` set).
    #[inline]
    pub fn push(&mut self, mut r: Raw) {
        r.comm = self.comm;
        r.lane = self.lane;
        if r.flags & flag::ASYNC != 0 {
            self.tracer.async_ended(r.ended);
        }
        self.buf.push(r);
        let age = r.ended.saturating_sub(self.buf[0].ended);
        if self.buf.len() >= BATCH || age > FLUSH_AGE.as_nanos() as u64 {
            self.flush();
        }
    }

    /// Hands the buffered records to the writer thread.
    pub fn flush(&mut self) {
        self.tracer.append(&self.buf);
        self.buf.clear();
    }
}

impl Drop for LaneTrace {
    fn drop(&mut self) {
        self.flush();
    }
}

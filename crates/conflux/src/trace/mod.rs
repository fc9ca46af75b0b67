//! Tracing: every operation of every communicator and lane, recorded by each rank with the
//! times it was issued, started and ended, the caller's waits on asynchronous ones and step
//! boundaries — so that a reader can say how much of a step was communication, what each
//! collective cost, and which rank the others kept waiting for (`conflux trace report`,
//! `conflux trace merge`).
//!
//! Turned on with `CONFLUX_TRACE=DIR` (`Config::trace`). Each rank writes two files:
//! `DIR/rank-<r>.json` (`meta.rs`: its communicators, threads and clock offset) and
//! `DIR/rank-<r>.bin` (`record.rs`: 64-byte records, stamped by `stamp.rs`, buffered by each
//! lane in `lane.rs`, collected by `writer.rs` and written by one thread per rank, `sink.rs`).
//! A leaf below `comm/`: it knows the names of operations and algorithms (`call/`) and
//! nothing else of the library.

mod lane;
pub mod meta;
pub mod read;
pub mod record;
mod sink;
mod stamp;
pub mod writer;

pub use read::{read_dir, Loaded, OpRecord, RankTrace, ReadError, StepMark, WaitRecord};
pub use record::Op;
pub use writer::{mark_step_everywhere, sync_point_everywhere, SYNC_OP};

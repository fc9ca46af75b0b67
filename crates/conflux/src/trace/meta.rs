//! `rank-<r>.json`: what a rank's records refer to — its communicators and threads by number —
//! and how its clock relates to rank 0's. Rewritten whole (to a temporary file, then renamed)
//! whenever it changes, so a reader never sees half of it.

use serde::{Deserialize, Serialize};

/// The format's name and version, checked by the reader.
pub const FORMAT: &str = "conflux-trace";
pub const VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Meta {
    pub format: String,
    pub version: u32,
    /// Global rank (in the job).
    pub rank: usize,
    pub world_size: usize,
    pub pid: u32,
    /// This rank's host, as the communicator's topology names hosts.
    pub host: String,
    pub clock: Clock,
    pub comms: Vec<CommInfo>,
    /// The threads that recorded anything, numbered per process: a process that runs several
    /// ranks (tests do) lists the same threads in each rank's file.
    pub threads: Vec<ThreadInfo>,
    /// Records that could not be written (the disk refused them).
    pub dropped: u64,
}

/// How to put this rank's times on rank 0's clock: add `offset_ns`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Clock {
    pub offset_ns: i64,
    /// The offset is right to within this (half the fastest round trip to the store).
    pub uncertainty_ns: u64,
    /// `"same host"` (one monotonic clock, offset 0), `"store ping-pong"` (measured), or
    /// `"unmeasured"` (no store: a job of one rank).
    pub method: String,
}

impl Clock {
    pub fn same_host() -> Clock {
        Clock { offset_ns: 0, uncertainty_ns: 0, method: "same host".into() }
    }

    /// Not measured (yet, or no store to measure through): taken as rank 0's.
    pub fn unmeasured() -> Clock {
        Clock { offset_ns: 0, uncertainty_ns: 0, method: "unmeasured".into() }
    }

    pub fn is_measured(&self) -> bool {
        self.method != "unmeasured"
    }
}

/// A communicator this rank belongs to.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CommInfo {
    /// The number records carry.
    pub id: u16,
    /// Its name, the same on every member (`conflux`, `conflux/g1` …).
    pub name: String,
    /// The global rank of each of its ranks.
    pub ranks: Vec<usize>,
    /// This rank's rank in it.
    pub rank: usize,
    /// Its links: `"shm"`, `"tcp"`, `"shm+tcp"` (nodes joined by TCP), or `"self"`.
    pub link: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ThreadInfo {
    pub id: u32,
    pub name: String,
}

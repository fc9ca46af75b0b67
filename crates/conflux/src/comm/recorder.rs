//! The flight recorder: the last operations of one lane of a communicator and where each is —
//! queued, started, completed, failed — so that when a call times out or fails, every rank
//! says where it was (the role of NCCL's flight recorder in torch, TORCH_NCCL_TRACE_BUFFER_SIZE).
//!
//! The engine records asynchronous operations as they are queued; `ops::run` records every
//! call as it starts and ends; the lane dumps the record the first time its transport fails
//! (`LaneState::record_failure`), before the failed call is marked ended, to
//! stderr and, with `CONFLUX_DUMP_DIR`, to a file per rank and lane. Recording a blocking call
//! takes no lock and no allocation.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

use crate::call::Fingerprint;
use crate::dtype::DataType;

/// Operations kept, newest last.
const KEEP: usize = 64;

/// What a call is.
#[derive(Debug, Clone, Copy)]
pub(crate) enum What {
    /// Collective call number `seq` (the same number on every rank).
    Coll { seq: u64, call: Fingerprint },
    /// A point-to-point transfer.
    P2p { send: bool, peer: usize, tag: u32, dtype: DataType, count: usize },
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    Started,
    Completed,
    Failed,
}

#[derive(Clone, Copy)]
struct Entry {
    id: u64,
    what: What,
    state: State,
    /// When it was recorded.
    since: Instant,
}

/// The calls a lane ran, owned by its transport, so recording a call takes no lock and no
/// clock read of its own: a call is stamped with the instant its deadline was computed from
/// (and not at its end: the dump says how long ago each call started instead). A ring of
/// plain values, entry `id` at `id % KEEP`: recording overwrites the oldest in place, with
/// nothing to drop (a queue of entries that could own a string took 8 ns of an 8-byte call's
/// 72 at 1 rank).
#[derive(Default)]
pub(crate) struct CallLog {
    entries: Vec<Entry>,
    /// Entries ever recorded: the next one's id.
    next: u64,
}

/// An asynchronous operation waiting for its turn, by its engine ticket.
struct Queued {
    ticket: u64,
    what: String,
    since: Instant,
}

/// A started entry, for its end.
#[derive(Clone, Copy)]
pub(crate) struct Mark(u64);

impl CallLog {
    /// Call `what` started at `since`.
    #[inline]
    pub fn started(&mut self, what: What, since: Instant) -> Mark {
        let id = self.next;
        self.next += 1;
        let e = Entry { id, what, state: State::Started, since };
        match self.entries.get_mut(id as usize % KEEP) {
            Some(slot) => *slot = e,
            None => self.entries.push(e),
        }
        Mark(id)
    }

    #[inline]
    pub fn ended(&mut self, mark: Mark, ok: bool) {
        if let Some(e) = self.entries.get_mut(mark.0 as usize % KEEP).filter(|e| e.id == mark.0) {
            e.state = if ok { State::Completed } else { State::Failed };
        }
    }

    /// The entries, oldest first.
    fn in_order(&self) -> impl Iterator<Item = &Entry> {
        // Once the ring is full, the oldest entry is the one the next call overwrites.
        let oldest = if self.entries.len() == KEEP { self.next as usize % KEEP } else { 0 };
        self.entries[oldest..].iter().chain(&self.entries[..oldest])
    }
}

/// The lane's queue of asynchronous operations (shared with its engine) and who is recording,
/// for the dump's heading and file name.
pub(crate) struct Recorder {
    queued: Mutex<VecDeque<Queued>>,
    rank: usize,
    label: String,
    /// The dump file's name, without the directory.
    file: String,
    dump_dir: Option<PathBuf>,
}

impl Recorder {
    /// `rank` is global; `label` names the communicator and lane, `stem` does so in the dump
    /// file's name.
    pub fn new(rank: usize, label: String, stem: &str, dump_dir: Option<PathBuf>) -> Recorder {
        let stem: String = stem.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
        let file = format!("conflux-rank{rank}-{stem}.txt");
        Recorder { queued: Mutex::new(VecDeque::new()), rank, label, file, dump_dir }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Queued>> {
        self.queued.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An asynchronous operation was queued behind `ticket` others.
    pub fn queued(&self, ticket: u64, what: String) {
        let mut q = self.lock();
        if q.len() == KEEP {
            q.pop_front();
        }
        q.push_back(Queued { ticket, what, since: Instant::now() });
    }

    /// The queued operation `ticket` leaves the queue to run (its call records itself).
    pub fn dequeued(&self, ticket: u64) {
        self.lock().retain(|q| q.ticket != ticket);
    }

    /// The record as text — `calls`, then what waits in the queue — for a failure described
    /// by `why`; `peers` says where the other ranks were, as far as this rank can see.
    pub fn render(&self, calls: &CallLog, why: &str, peers: &str) -> String {
        let queued = self.lock();
        let now = Instant::now();
        let ago = |since: Instant| now.saturating_duration_since(since).as_secs_f64();
        let mut s = format!(
            "conflux flight recorder: rank {}, {}, last {} operations (newest last), at: {why}\n",
            self.rank,
            self.label,
            calls.entries.len() + queued.len()
        );
        for e in calls.in_order() {
            let what = match e.what {
                What::Coll { seq, call } => format!("#{seq} {call}"),
                What::P2p { send: true, peer, tag, dtype, count } => {
                    format!("send({dtype} x {count} to rank {peer}, tag {tag})")
                }
                What::P2p { send: false, peer, tag, dtype, count } => {
                    format!("recv({dtype} x {count} from rank {peer}, tag {tag})")
                }
            };
            let state = match e.state {
                State::Completed => format!("completed (started {:.3} s ago)", ago(e.since)),
                State::Failed => format!("failed (started {:.3} s ago)", ago(e.since)),
                State::Started => format!("started {:.3} s ago, not finished", ago(e.since)),
            };
            let _ = writeln!(s, "  {what:<60} {state}");
        }
        for q in queued.iter() {
            let _ = writeln!(s, "  {:<60} queued {:.3} s ago", q.what, ago(q.since));
        }
        s + peers
    }

    /// Writes the record to stderr and, if a dump directory is set, to a file in it.
    pub fn dump(&self, calls: &CallLog, why: &str, peers: &str) {
        let text = self.render(calls, why, peers);
        eprint!("{text}");
        let Some(dir) = &self.dump_dir else { return };
        let path = dir.join(&self.file);
        if let Err(e) = std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&path, &text)) {
            tracing::warn!("cannot write the flight recorder to {}: {e}", path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_operations_in_order_with_their_state() {
        let r = Recorder::new(3, "communicator \"x\"".into(), "x/l0", None);
        let mut log = CallLog::default();
        let call = Fingerprint::NONE;
        for seq in 1..=KEEP as u64 + 4 {
            let m = log.started(What::Coll { seq, call }, Instant::now());
            log.ended(m, true);
        }
        r.queued(7, "all_gather(float x 8)".into());
        let failed =
            log.started(What::P2p { send: true, peer: 1, tag: 4, dtype: DataType::F32, count: 2 }, Instant::now());
        log.ended(failed, false);
        let running = log.started(What::Coll { seq: 100, call }, Instant::now());
        r.queued(8, "barrier".into());
        r.dequeued(7);
        let text = r.render(&log, "timed out", "  local rank 1 last entered #9\n");
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("conflux flight recorder: rank 3"), "{text}");
        // Heading, the last KEEP calls, the queued barrier, the peers' line.
        assert_eq!(lines.len(), 1 + KEEP + 1 + 1, "{text}");
        assert!(!text.contains("#6 ") && text.contains("#7 "), "the oldest calls are dropped:\n{text}");
        assert!(
            lines[KEEP - 1].contains("send(float x 2 to rank 1, tag 4)") && lines[KEEP - 1].contains("failed"),
            "{text}"
        );
        assert!(lines[KEEP].contains("#100") && lines[KEEP].contains("not finished"), "{text}");
        assert!(lines[KEEP + 1].contains("barrier") && lines[KEEP + 1].contains("queued"), "{text}");
        assert!(!text.contains("all_gather"), "a dequeued operation is gone:\n{text}");
        log.ended(running, true);
        assert!(r.render(&log, "", "").lines().nth(KEEP).unwrap().contains("completed"));
        assert_eq!(r.file, "conflux-rank3-x_l0.txt");
    }
}

//! Reading a trace directory back: every rank's meta file and records, with times put on
//! rank 0's clock. The trace report and the Chrome trace merge (the CLI) start here.

use std::path::{Path, PathBuf};

use super::meta::{Meta, FORMAT, VERSION};
use super::record::{algo_of, dtype_of, flag, kind, Op, Raw, NO_PEER, RECORD_SIZE};
use crate::call::Algo;
use crate::dtype::DataType;

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The directory or a file in it could not be read.
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// The directory holds no rank's trace.
    #[error("no conflux trace in {0} (expected rank-<r>.json and rank-<r>.bin, written with CONFLUX_TRACE={0})")]
    Empty(PathBuf),
}

/// One operation on one rank. Times are nanoseconds on rank 0's clock; the writer sets all
/// three, also for an operation that failed (its `ended` is when it failed).
#[derive(Debug, Clone, PartialEq)]
pub struct OpRecord {
    /// Its number on this rank (what `WaitRecord::op` refers to).
    pub id: u64,
    pub op: Op,
    pub dtype: Option<DataType>,
    pub algo: Option<Algo>,
    /// Index into `Meta::comms` of the communicator, by its id.
    pub comm: u16,
    pub lane: u8,
    pub seq: u64,
    pub bytes: u64,
    /// The point-to-point peer (rank in the communicator).
    pub peer: Option<u32>,
    /// The thread that issued it (`Meta::threads`).
    pub thread: u32,
    pub is_async: bool,
    pub failed: bool,
    pub issued: i64,
    pub started: i64,
    pub ended: i64,
}

/// A caller blocked waiting for asynchronous operation `op`.
#[derive(Debug, Clone, PartialEq)]
pub struct WaitRecord {
    pub op: u64,
    pub thread: u32,
    pub began: i64,
    pub ended: i64,
}

/// The start of step `step` (`mark_step`), on `thread`.
#[derive(Debug, Clone, PartialEq)]
pub struct StepMark {
    pub step: u64,
    pub thread: u32,
    pub at: i64,
}

/// What one rank recorded.
#[derive(Debug, Clone)]
pub struct RankTrace {
    pub meta: Meta,
    /// In the order they ended, per lane (lanes interleave).
    pub ops: Vec<OpRecord>,
    pub waits: Vec<WaitRecord>,
    /// In time order.
    pub steps: Vec<StepMark>,
    /// Bytes at the end of the record file that did not make a whole record (a rank killed
    /// while writing), and records of a kind this reader does not know.
    pub skipped: u64,
}

impl RankTrace {
    /// The communicator an operation ran on.
    pub fn comm(&self, id: u16) -> Option<&super::meta::CommInfo> {
        self.meta.comms.iter().find(|c| c.id == id)
    }

    pub fn thread_name(&self, id: u32) -> String {
        self.meta.threads.iter().find(|t| t.id == id).map_or_else(|| format!("thread {id}"), |t| t.name.clone())
    }
}

/// What a trace directory held: every usable rank, by global rank, and what was wrong with
/// the rest — after a crash, the point is to see what the surviving ranks recorded, so one
/// damaged or missing file does not hide the others.
#[derive(Debug)]
pub struct Loaded {
    pub ranks: Vec<RankTrace>,
    /// One line per file left out or rank missing.
    pub problems: Vec<String>,
}

/// Every usable rank's trace in `dir`. An error only when the directory cannot be listed or
/// holds no usable rank.
pub fn read_dir(dir: &Path) -> Result<Loaded, ReadError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ReadError::Io { path, source }
    };
    let mut metas = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let path = entry.map_err(io(dir))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("rank-") && name.ends_with(".json") {
            metas.push(path);
        }
    }
    metas.sort();
    let (mut ranks, mut problems) = (Vec::<RankTrace>::new(), Vec::new());
    for path in metas {
        let meta = match read_meta(&path) {
            Ok(m) => m,
            Err(e) => {
                problems.push(format!("{}: left out: {e}", path.display()));
                continue;
            }
        };
        if ranks.iter().any(|r| r.meta.rank == meta.rank) {
            problems.push(format!("{}: left out: a second file of rank {}", path.display(), meta.rank));
            continue;
        }
        let bin = path.with_extension("bin");
        let bytes = std::fs::read(&bin).unwrap_or_else(|e| {
            problems.push(format!("{}: {e}; rank {} has no records", bin.display(), meta.rank));
            Vec::new()
        });
        ranks.push(decode(meta, &bytes));
    }
    if ranks.is_empty() {
        return Err(ReadError::Empty(dir.to_path_buf()));
    }
    ranks.sort_by_key(|r| r.meta.rank);
    let world = ranks.iter().map(|r| r.meta.world_size).max().unwrap_or(0);
    let missing: Vec<String> =
        (0..world).filter(|w| !ranks.iter().any(|r| r.meta.rank == *w)).map(|w| w.to_string()).collect();
    if !missing.is_empty() {
        problems.push(format!("no trace of rank {} (of {world}): its collectives are incomplete", missing.join(", ")));
    }
    Ok(Loaded { ranks, problems })
}

fn read_meta(path: &Path) -> Result<Meta, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let meta: Meta = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    if meta.format != FORMAT || meta.version != VERSION {
        return Err(format!(
            "format {:?} version {}, expected {FORMAT:?} version {VERSION}",
            meta.format, meta.version
        ));
    }
    Ok(meta)
}

/// A rank's records from its file's bytes.
pub fn decode(meta: Meta, bytes: &[u8]) -> RankTrace {
    let whole = bytes.len() / RECORD_SIZE * RECORD_SIZE;
    let mut skipped = (bytes.len() - whole) as u64;
    let off = meta.clock.offset_ns;
    let at = |t: u64| (t as i64).saturating_add(off);
    let (mut ops, mut waits, mut steps) = (Vec::new(), Vec::new(), Vec::new());
    for chunk in bytes[..whole].chunks_exact(RECORD_SIZE) {
        let r: Raw = bytemuck::pod_read_unaligned(chunk);
        match (r.kind, Op::from_code(r.op)) {
            (kind::OP, Some(op)) => ops.push(OpRecord {
                id: r.id,
                op,
                dtype: dtype_of(r.dtype),
                algo: algo_of(r.algo),
                comm: r.comm,
                lane: r.lane,
                seq: r.seq,
                bytes: r.bytes,
                peer: (r.peer != NO_PEER).then_some(r.peer),
                thread: r.thread,
                is_async: r.flags & flag::ASYNC != 0,
                failed: r.flags & flag::FAILED != 0,
                issued: at(r.issued),
                started: at(r.started),
                ended: at(r.ended),
            }),
            (kind::WAIT, _) => {
                waits.push(WaitRecord { op: r.id, thread: r.thread, began: at(r.issued), ended: at(r.ended) })
            }
            (kind::STEP, _) => steps.push(StepMark { step: r.seq, thread: r.thread, at: at(r.started) }),
            _ => skipped += RECORD_SIZE as u64,
        }
    }
    steps.sort_by_key(|s| s.at);
    RankTrace { meta, ops, waits, steps, skipped }
}

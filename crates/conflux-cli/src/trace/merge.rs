//! `conflux trace merge`: every rank's records as one Chrome trace-event file. One process
//! per rank; in it, track 0 holds the steps, a track per caller thread holds its blocking
//! operations and its waits for asynchronous ones, and a track per engine lane holds the
//! asynchronous collectives it ran. Those spans nest or are disjoint on each track by
//! construction (a blocked thread issues nothing, a lane runs one collective at a time), which
//! "X" events need. Asynchronous sends and receives may overlap one another, so they are
//! async ("b"/"e") events instead.

use std::collections::{BTreeSet, HashMap};
use std::io::Write;

use conflux::trace::{OpRecord, RankTrace};
use serde_json::{json, Value};

use super::analyze::{comm_of, instances, waits_for_peers};

/// Track of the steps.
pub const STEPS_TID: u64 = 0;

/// Track of a caller thread.
pub fn thread_tid(thread: u32) -> u64 {
    1 + u64::from(thread)
}

/// Track of an engine lane.
pub fn lane_tid(comm: u16, lane: u8) -> u64 {
    10_000 + u64::from(comm) * 2 + u64::from(lane)
}

/// The earliest time anywhere in the trace: the zero of every event's `ts`.
fn origin(ranks: &[RankTrace]) -> i64 {
    let ops = ranks.iter().flat_map(|r| r.ops.iter().flat_map(|o| [o.issued, o.started, o.ended]));
    let waits = ranks.iter().flat_map(|r| r.waits.iter().map(|w| w.began));
    let steps = ranks.iter().flat_map(|r| r.steps.iter().map(|s| s.at));
    ops.chain(waits).chain(steps).min().unwrap_or(0)
}

/// The last time a rank recorded anything: where its open step ends.
fn last_time(r: &RankTrace) -> i64 {
    let ops = r.ops.iter().flat_map(|o| [o.issued, o.started, o.ended]);
    let waits = r.waits.iter().map(|w| w.ended);
    let steps = r.steps.iter().map(|s| s.at);
    ops.chain(waits).chain(steps).max().unwrap_or(0)
}

fn meta(pid: usize, tid: u64, name: &str, args: Value) -> Value {
    json!({"ph": "M", "pid": pid, "tid": tid, "name": name, "args": args})
}

/// Events written one at a time as they are made: a long trace's events never sit in memory
/// as one JSON tree. The first write error is kept and reported at the end.
struct Events<'a> {
    out: &'a mut dyn Write,
    count: usize,
    error: Option<std::io::Error>,
}

impl Events<'_> {
    fn push(&mut self, e: Value) {
        if self.error.is_some() {
            return;
        }
        let sep: &[u8] = if self.count == 0 { b"\n" } else { b",\n" };
        self.count += 1;
        if let Err(err) =
            self.out.write_all(sep).and_then(|()| serde_json::to_writer(&mut *self.out, &e).map_err(Into::into))
        {
            self.error = Some(err);
        }
    }

    fn extend(&mut self, es: impl IntoIterator<Item = Value>) {
        for e in es {
            self.push(e);
        }
    }
}

/// Writes the trace-event JSON of `ranks` to `out`.
pub fn write_chrome_trace(ranks: &[RankTrace], out: &mut dyn Write) -> std::io::Result<()> {
    let inst = instances(ranks);
    let wait = waits_for_peers(ranks, &inst);
    let t0 = origin(ranks);
    let us = |t: i64| (t - t0) as f64 / 1e3;
    let dur = |a: i64, b: i64| (b - a).max(0) as f64 / 1e3;
    out.write_all(b"{\"traceEvents\": [")?;
    let mut ev = Events { out, count: 0, error: None };
    for (ri, r) in ranks.iter().enumerate() {
        let pid = r.meta.rank;
        let pname = format!("rank {} ({}, pid {})", pid, r.meta.host, r.meta.pid);
        ev.push(meta(pid, 0, "process_name", json!({ "name": pname })));
        ev.push(meta(pid, 0, "process_sort_index", json!({ "sort_index": pid })));
        ev.push(meta(pid, STEPS_TID, "thread_name", json!({"name": "steps"})));
        let mut threads = BTreeSet::new();
        let mut lanes = BTreeSet::new();
        for (oi, o) in r.ops.iter().enumerate() {
            let (comm, _, link) = comm_of(r, o.comm);
            let mut args = json!({
                "id": o.id, "comm": comm, "seq": o.seq, "lane": o.lane, "bytes": o.bytes,
                "dtype": o.dtype.map_or("-", |d| d.name()), "algo": o.algo.map_or("-", |a| a.name()),
                "link": link, "started_us": us(o.started), "wait_for_peers_us": wait[ri][oi] as f64 / 1e3,
                "failed": o.failed,
            });
            if let Some(p) = o.peer {
                args["peer"] = json!(p);
            }
            let name = o.op.name();
            if !o.is_async {
                threads.insert(o.thread);
                let tid = thread_tid(o.thread);
                ev.push(json!({"ph": "X", "pid": pid, "tid": tid, "name": name, "cat": "op",
                    "ts": us(o.issued), "dur": dur(o.issued, o.ended), "args": args}));
                continue;
            }
            args["issued_us"] = json!(us(o.issued));
            lanes.insert((o.comm, o.lane, comm));
            let tid = lane_tid(o.comm, o.lane);
            if o.op.is_collective() {
                ev.push(json!({"ph": "X", "pid": pid, "tid": tid, "name": name, "cat": "op",
                    "ts": us(o.started), "dur": dur(o.started, o.ended), "args": args}));
            } else {
                ev.extend(p2p(pid, tid, o, us(o.started), us(o.ended.max(o.started)), args));
            }
        }
        let names: HashMap<u64, &str> = r.ops.iter().map(|o| (o.id, o.op.name())).collect();
        for w in &r.waits {
            threads.insert(w.thread);
            // A sync point's wait is the estimate for every asynchronous operation awaited
            // where conflux could not see (torch's DDP).
            let name = match names.get(&w.op) {
                Some(n) => *n,
                None if w.op == conflux::trace::SYNC_OP => "asynchronous operations (estimated)",
                None => "op",
            };
            ev.push(json!({"ph": "X", "pid": pid, "tid": thread_tid(w.thread), "name": format!("wait {name}"),
                "cat": "wait", "ts": us(w.began), "dur": dur(w.began, w.ended), "args": {"op_id": w.op}}));
        }
        let end = last_time(r);
        for (i, m) in r.steps.iter().enumerate() {
            let to = r.steps.get(i + 1).map_or(end, |n| n.at);
            ev.push(json!({"ph": "X", "pid": pid, "tid": STEPS_TID, "name": format!("step {}", m.step),
                "cat": "step", "ts": us(m.at), "dur": dur(m.at, to), "args": {"open": i + 1 == r.steps.len()}}));
        }
        for t in threads {
            ev.push(meta(pid, thread_tid(t), "thread_name", json!({ "name": r.thread_name(t) })));
        }
        for (comm, lane, name) in lanes {
            let which = if lane == 0 { "normal" } else { "high" };
            ev.push(meta(
                pid,
                lane_tid(comm, lane),
                "thread_name",
                json!({ "name": format!("engine {name} {which} lane") }),
            ));
        }
    }
    let clock: Vec<Value> = ranks
        .iter()
        .map(|r| {
            let c = &r.meta.clock;
            json!({"rank": r.meta.rank, "offset_ns": c.offset_ns, "uncertainty_ns": c.uncertainty_ns, "method": c.method})
        })
        .collect();
    if let Some(e) = ev.error {
        return Err(e);
    }
    let other = json!({"clock": clock, "origin_ns": t0});
    write!(ev.out, "\n], \"displayTimeUnit\": \"ms\", \"otherData\": {other}}}\n")?;
    ev.out.flush()
}

/// The trace-event JSON of `ranks` as a string (for tests and small traces).
pub fn chrome_trace(ranks: &[RankTrace]) -> String {
    let mut out = Vec::new();
    write_chrome_trace(ranks, &mut out).expect("writing to memory");
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

/// An asynchronous send or receive as a begin/end pair, keyed by rank and op id so that
/// overlapping ones stay apart.
fn p2p(pid: usize, tid: u64, o: &OpRecord, ts: f64, end: f64, args: Value) -> [Value; 2] {
    let id = ((pid as u64) << 32).wrapping_add(o.id);
    let name = o.op.name();
    [
        json!({"ph": "b", "cat": "p2p", "id": id, "pid": pid, "tid": tid, "name": name, "ts": ts, "args": args}),
        json!({"ph": "e", "cat": "p2p", "id": id, "pid": pid, "tid": tid, "name": name, "ts": end}),
    ]
}

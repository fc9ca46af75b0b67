//! `conflux trace` on synthetic traces: the numbers worked out by hand, the merged trace's
//! shape, the drawing's well-formedness, and damaged directories.

use std::collections::{BTreeMap, HashMap};

use conflux::trace::Op;
use serde_json::Value;

use super::fixture::{all_reduce, mark, ms, push, rank, straggling, wait};
use super::{load, merge, report, svg, Analysis};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-6
}

#[test]
fn a_late_rank_is_the_straggler_and_the_others_wait_for_it() {
    let an = Analysis::of(straggling(20));
    assert!(an.instances.iter().all(|i| i.complete));
    let s = an.straggler.clone().expect("a straggler");
    assert_eq!((s.rank, s.collectives), (2, 20));
    assert!(close(s.last_fraction, 1.0) && close(s.late_ms_median, 3.0) && close(s.late_ms_p99, 3.0), "{s:?}");

    for (rank, sum) in &an.steps.per_rank {
        let m = sum.median;
        let (share, waiting, transfer) = if *rank == 2 { (0.1, 0.0, 1.0) } else { (0.4, 3.0, 1.0) };
        assert_eq!(sum.count, 20);
        assert!(close(m.step_ms, 10.0) && close(m.comm_share, share), "rank {rank}: {m:?}");
        assert!(close(m.waiting_ms, waiting) && close(m.transfer_ms, transfer), "rank {rank}: {m:?}");
        assert!(close(m.compute_ms, 10.0 - waiting - transfer) && close(m.overlapped_ms, 0.0));
    }
    let all = an.steps.all;
    assert_eq!(all.count, 80);
    assert!(close(all.median.comm_share, 0.4) && close(all.comm_share_worst, 0.4) && close(all.step_ms_worst, 10.0));

    assert_eq!(an.ops.len(), 1);
    let row = &an.ops[0];
    assert_eq!(
        (row.op, row.bytes_class, row.algo.as_str(), row.link.as_str(), row.count),
        ("all_reduce", 1024, "ring", "shm", 80)
    );
    assert!(close(row.p50_us, 4000.0));
    // 1000 B in 4 ms; all_reduce's bus factor at 4 ranks is 2·3/4.
    assert!(close(row.algbw_gbps, 1000.0 / 4e6) && close(row.busbw_gbps, 1000.0 / 4e6 * 1.5));

    let text = report::text(&an);
    assert!(text.contains("straggler: rank 2 arrived last at 100% of 20 collectives, 3.00 ms late (median)"), "{text}");
    let j: Value = serde_json::from_str(&report::json(&an).to_string()).unwrap();
    assert_eq!(j["ranks"], 4);
    assert_eq!(j["straggler"]["rank"], 2);
    assert_eq!(j["steps"]["count"], 80);
    assert_eq!(j["steps"]["per_rank"].as_array().unwrap().len(), 4);
    for key in [
        "op",
        "bytes_class",
        "algo",
        "link",
        "count",
        "total_ms",
        "mean_us",
        "p50_us",
        "p99_us",
        "algbw_gbps",
        "busbw_gbps",
    ] {
        assert!(j["ops"][0].get(key).is_some(), "{key}");
    }
    assert_eq!(j["clock"][3]["method"], "same host");
    let step_keys = ["count", "step_ms", "step_ms_worst", "compute_ms", "exposed_ms", "waiting_ms", "transfer_ms"];
    for key in step_keys.into_iter().chain(["overlapped_ms", "comm_share", "comm_share_worst"]) {
        assert!(j["steps"].get(key).is_some() && j["steps"]["per_rank"][2].get(key).is_some(), "{key}");
    }
    assert_eq!(j["steps"]["per_rank"][2]["rank"], 2);
    for key in ["rank", "last_fraction", "late_ms_median", "late_ms_p99", "collectives"] {
        assert!(j["straggler"].get(key).is_some(), "{key}");
    }
    assert_eq!((j["skipped_bytes"].as_u64(), j["dropped"].as_u64()), (Some(0), Some(0)));
}

/// Two ranks, one 10 ms step: an async all_reduce runs 1–4 ms while they compute (hidden), a
/// second runs 6–9.5 ms and they wait for it from 8 ms (1.5 ms exposed, 2 ms overlapped).
#[test]
fn async_communication_behind_compute_is_overlapped_not_exposed() {
    let ranks: Vec<_> = (0..2)
        .map(|ri| {
            let mut r = rank(ri, 2);
            mark(&mut r, 0, 0);
            all_reduce(&mut r, 0, true, ms(1.0), ms(1.0), ms(4.0));
            let id = all_reduce(&mut r, 1, true, ms(6.0), ms(6.0), ms(9.5));
            wait(&mut r, id, ms(8.0), ms(9.5));
            mark(&mut r, 1, ms(10.0));
            r
        })
        .collect();
    let an = Analysis::of(ranks);
    for (_, sum) in &an.steps.per_rank {
        let m = sum.median;
        assert!(close(m.overlapped_ms, 5.0) && close(m.exposed_ms, 1.5) && close(m.waiting_ms, 0.0), "{m:?}");
        assert!(close(m.compute_ms, 8.5) && close(m.comm_share, 0.15), "{m:?}");
    }
}

#[test]
fn without_steps_the_report_says_to_mark_them() {
    let mut r = rank(0, 1);
    all_reduce(&mut r, 0, false, 0, 0, ms(1.0));
    let an = Analysis::of(vec![r]);
    assert!(report::text(&an).contains("mark_step"));
    let j = report::json(&an);
    assert_eq!(j["steps"]["count"], 0);
    assert!(j["straggler"].is_null());
    assert!(svg::draw(&an).starts_with("<svg"));
}

/// Every kind of record: blocking and async collectives, waits, overlapping async sends and
/// receives, a failed op, steps.
fn busy() -> Vec<super::RankTrace> {
    let mut ranks = straggling(3);
    for r in &mut ranks {
        let base = ms(40.0);
        let id = all_reduce(r, 100, true, base, base + ms(0.5), base + ms(2.0));
        wait(r, id, base + ms(1.0), base + ms(2.0));
        push(r, Op::Send, 0, true, base, base + ms(0.1), base + ms(3.0));
        push(r, Op::Recv, 0, true, base, base + ms(0.2), base + ms(2.5));
        push(r, Op::Barrier, 101, false, base + ms(3.0), base + ms(3.0), base + ms(3.5));
        let f =
            push(r, Op::Coll(conflux::OpKind::Broadcast), 102, false, base + ms(4.0), base + ms(4.0), base + ms(4.2));
        r.ops[f as usize].failed = true;
    }
    ranks
}

#[test]
fn merge_has_every_rank_and_op_once_and_spans_nest_per_track() {
    let ranks = busy();
    let ops: usize = ranks.iter().map(|r| r.ops.len()).sum();
    let j: Value = serde_json::from_str(&merge::chrome_trace(&ranks)).expect("JSON");
    let ev = j["traceEvents"].as_array().unwrap();
    let named: Vec<u64> =
        ev.iter().filter(|e| e["name"] == "process_name").map(|e| e["pid"].as_u64().unwrap()).collect();
    assert_eq!(named, vec![0, 1, 2, 3]);
    let mut seen: HashMap<(u64, u64), usize> = HashMap::new();
    for e in ev.iter().filter(|e| e["cat"] == "op" || (e["cat"] == "p2p" && e["ph"] == "b")) {
        *seen.entry((e["pid"].as_u64().unwrap(), e["args"]["id"].as_u64().unwrap())).or_default() += 1;
    }
    assert_eq!(seen.len(), ops);
    assert!(seen.values().all(|&n| n == 1));
    let mut tracks: BTreeMap<(u64, u64), Vec<(f64, f64)>> = BTreeMap::new();
    for e in ev.iter().filter(|e| e["ph"] == "X") {
        let (ts, dur) = (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap());
        assert!(ts >= 0.0 && dur >= 0.0);
        tracks.entry((e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap())).or_default().push((ts, ts + dur));
    }
    assert!(tracks.keys().any(|&(_, tid)| tid == merge::STEPS_TID));
    for (track, mut spans) in tracks {
        spans.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
        let mut open: Vec<f64> = Vec::new();
        for (a, b) in spans {
            while open.last().is_some_and(|&end| end <= a + 1e-6) {
                open.pop();
            }
            assert!(open.last().is_none_or(|&end| b <= end + 1e-6), "track {track:?}: [{a}, {b}] crosses a span");
            open.push(b);
        }
    }
    assert_eq!(j["otherData"]["clock"].as_array().unwrap().len(), 4);
}

/// Tags balance: every `<x ...>` is closed by `</x>`, in order.
fn balanced(xml: &str) -> bool {
    let mut stack = Vec::new();
    for piece in xml.split('<').skip(1) {
        let tag = &piece[..piece.find('>').unwrap_or(piece.len())];
        let name = tag.trim_start_matches('/').split_whitespace().next().unwrap_or("").trim_end_matches('/');
        if tag.starts_with('/') {
            if stack.pop() != Some(name) {
                return false;
            }
        } else if !tag.ends_with('/') {
            stack.push(name);
        }
    }
    stack.is_empty()
}

#[test]
fn the_svg_is_well_formed_with_a_band_per_rank() {
    let an = Analysis::of(busy());
    let s = svg::draw(&an);
    assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
    assert!(balanced(&s), "{s}");
    assert_eq!(s.matches(r#"class="band""#).count(), 4);
    assert!(!s.contains("node<1>"));
    let an = Analysis::of(straggling(6));
    assert!(svg::draw(&an).contains("steps 1-3"));
}

#[test]
fn empty_missing_and_damaged_directories() {
    let base = std::env::temp_dir().join(format!("conflux-trace-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    assert!(load::load(&base.join("missing")).unwrap_err().contains("cannot read"));
    std::fs::create_dir_all(&base).unwrap();
    assert!(load::load(&base).unwrap_err().contains("no conflux trace"));

    // Rank 0 whole; rank 1 killed mid-write (its file cut inside a record); rank 2's meta
    // garbage; rank 3 never wrote anything.
    let ranks = straggling(2);
    for r in &ranks[..2] {
        let raws: Vec<_> = r
            .ops
            .iter()
            .map(|o| conflux::trace::record::Raw {
                kind: conflux::trace::record::kind::OP,
                op: o.op.code(),
                seq: o.seq,
                id: o.id,
                bytes: o.bytes,
                issued: o.issued as u64,
                started: o.started as u64,
                ended: o.ended as u64,
                ..conflux::trace::writer::blank()
            })
            .collect();
        let mut bytes: Vec<u8> = raws.iter().flat_map(raw_bytes).collect();
        if r.meta.rank == 1 {
            bytes.truncate(64 + 30);
        }
        std::fs::write(base.join(format!("rank-{}.bin", r.meta.rank)), bytes).unwrap();
        std::fs::write(base.join(format!("rank-{}.json", r.meta.rank)), serde_json::to_string(&r.meta).unwrap())
            .unwrap();
    }
    std::fs::write(base.join("rank-2.json"), "{\"format\": ").unwrap();
    let (loaded, warnings) = load::load(&base).expect("ranks 0 and 1");
    assert_eq!(loaded.iter().map(|r| r.ops.len()).collect::<Vec<_>>(), vec![2, 1]);
    assert_eq!(loaded[1].skipped, 30);
    assert!(
        warnings.iter().any(|w| w.contains("rank-2.json"))
            && warnings.iter().any(|w| w.contains("no trace of rank 2, 3"))
    );
    let an = Analysis::of(loaded);
    assert!(an.straggler.is_none() && an.instances.iter().all(|i| !i.complete));
    assert!(report::text(&an).contains("all_reduce"));
    std::fs::remove_dir_all(&base).unwrap();
}

/// A record's 64 bytes (little-endian fields in declaration order, as `Raw` lays them out).
fn raw_bytes(r: &conflux::trace::record::Raw) -> Vec<u8> {
    let mut b = vec![r.kind, r.op, r.dtype, r.algo, r.lane, r.flags];
    b.extend(r.comm.to_le_bytes());
    b.extend(r.thread.to_le_bytes());
    b.extend(r.peer.to_le_bytes());
    for v in [r.seq, r.id, r.bytes, r.issued, r.started, r.ended] {
        b.extend(v.to_le_bytes());
    }
    b
}

//! Every row of the algorithm table against an independent reference, at 1 to 17 ranks in
//! one process, over counts that leave blocks uneven, span several chunks and wrap the rings.

use super::{topo_of, with_ranks};
use crate::algo::coll::{Coll, VBlocks};
use crate::algo::select::{self, Call};
use crate::algo::table::{Needs, Row, TABLE};
use crate::algo::{even_blocks, OpKind};
use crate::comm::lane::LaneState;
use crate::comm::ops::{self, Plan};
use crate::dtype::{DataType, ReduceOp};
use crate::error::Error;

/// Element counts: none, one, a few, and more than a chunk (8 KiB of i32 is 2048) and a ring.
const COUNTS: [usize; 5] = [0, 1, 7, 1027, 5003];

/// The value rank `rank` contributes at index `i` of call `salt`: small integers, so that f32
/// sums over 17 ranks are exact.
fn val(rank: usize, i: usize, salt: usize) -> i64 {
    ((rank * 31 + i * 7 + salt * 13) % 97) as i64 - 48
}

/// The kernels and reduce ops each row is run with: f32 sum and avg, i32 max, f16 sum (its
/// sums of these values, at most 17 x 48, are integers f16 holds exactly).
const KINDS: [(DataType, ReduceOp); 4] = [
    (DataType::F32, ReduceOp::Sum),
    (DataType::I32, ReduceOp::Max),
    (DataType::F16, ReduceOp::Sum),
    (DataType::F32, ReduceOp::Avg),
];

fn enc(d: DataType, v: impl IntoIterator<Item = i64>) -> Vec<u8> {
    match d {
        DataType::F32 => v.into_iter().flat_map(|x| (x as f32).to_ne_bytes()).collect(),
        DataType::F16 => v.into_iter().flat_map(|x| half::f16::from_f32(x as f32).to_ne_bytes()).collect(),
        _ => v.into_iter().flat_map(|x| (x as i32).to_ne_bytes()).collect(),
    }
}

fn dec(d: DataType, b: &[u8]) -> Vec<f64> {
    let word = |c: &[u8]| <[u8; 4]>::try_from(c).expect("4 bytes");
    match d {
        DataType::F32 => b.chunks(4).map(|c| f64::from(f32::from_ne_bytes(word(c)))).collect(),
        DataType::F16 => b.chunks(2).map(|c| f64::from(half::f16::from_ne_bytes([c[0], c[1]]).to_f32())).collect(),
        _ => b.chunks(4).map(|c| f64::from(i32::from_ne_bytes(word(c)))).collect(),
    }
}

/// The reduction over all `n` ranks of index `i` of call `salt`.
fn folded(n: usize, i: usize, salt: usize, op: ReduceOp) -> f64 {
    let all = (0..n).map(|r| val(r, i, salt));
    match op {
        ReduceOp::Max => all.max().expect("at least one rank") as f64,
        ReduceOp::Avg => all.sum::<i64>() as f64 / n as f64,
        _ => all.sum::<i64>() as f64,
    }
}

/// Whether `got` is the reference `want`: exactly, but for Avg, whose division may round.
fn same(got: f64, want: f64, op: ReduceOp) -> bool {
    got == want || (op == ReduceOp::Avg && (got - want).abs() <= 1e-6 * want.abs().max(1.0))
}

/// One call of `row` at this rank: its error, or what differs from the reference, if anything.
/// `salt` numbers the call (the same on every rank) and picks its root and form.
fn check(
    st: &mut LaneState,
    plan: &Plan,
    row: &Row,
    count: usize,
    (d, op): (DataType, ReduceOp),
    salt: usize,
) -> Result<Option<String>, Error> {
    let (n, me) = (plan.size, plan.rank);
    let plan = Plan { call_algo: Some(row.algo), ..*plan };
    let mine = |range: std::ops::Range<usize>| enc(d, range.map(|i| val(me, i, salt)));
    let with_input = salt % 2 == 1;
    let root = salt % n;
    let es = d.size();
    let got_want = |got: Vec<f64>, want: Vec<f64>| {
        let differs = |i: usize| match (got.get(i), want.get(i)) {
            (Some(&g), Some(&w)) => !same(g, w, op),
            _ => true,
        };
        let at = (0..got.len().max(want.len())).find(|&i| differs(i))?;
        Some(format!("element {at} of {} is {:?}, want {:?}", want.len(), got.get(at), want.get(at)))
    };
    let run = |st: &mut LaneState, coll: Coll<'_>| ops::run(st, &plan, coll, d);
    let r = match row.op() {
        OpKind::AllReduce => {
            let input = mine(0..count);
            let mut buf = if with_input { vec![0; input.len()] } else { input.clone() };
            let want: Vec<f64> = (0..count).map(|i| folded(n, i, salt, op)).collect();
            // Rows that take pieces get three uneven ones in place.
            let r = if row.pieces && !with_input {
                let (a, rest) = buf.split_at_mut(count / 3 * es);
                let (b, c) = rest.split_at_mut(count / 5 * es);
                run(st, Coll::AllReduce { input: None, out: &mut [a, b, c], op })
            } else {
                let input = with_input.then_some(&input[..]);
                run(st, Coll::AllReduce { input, out: &mut [&mut buf[..]], op })
            };
            r.map(|()| got_want(dec(d, &buf), want))
        }
        OpKind::Broadcast => {
            let mut buf = mine(0..count);
            let want = (0..count).map(|i| val(root, i, salt) as f64).collect();
            run(st, Coll::Broadcast { buf: &mut buf, root }).map(|()| got_want(dec(d, &buf), want))
        }
        OpKind::Reduce => {
            let input = mine(0..count);
            let mut buf = if with_input { vec![0; input.len()] } else { input.clone() };
            let before = dec(d, &buf);
            let want = if me == root { (0..count).map(|i| folded(n, i, salt, op)).collect() } else { before };
            let input = with_input.then_some(&input[..]);
            run(st, Coll::Reduce { input, buf: &mut buf, op, root }).map(|()| got_want(dec(d, &buf), want))
        }
        OpKind::AllGather => {
            let blocks = even_blocks(count, n, 1);
            let mut buf = vec![0u8; count * es];
            let own = blocks[me].clone();
            buf[own.start * es..own.end * es].copy_from_slice(&mine(own));
            let owner = |i: usize| blocks.iter().position(|b| b.contains(&i)).expect("covered");
            let want = (0..count).map(|i| val(owner(i), i, salt) as f64).collect();
            run(st, Coll::AllGather { buf: &mut buf }).map(|()| got_want(dec(d, &buf), want))
        }
        OpKind::ReduceScatter => {
            let own = even_blocks(count, n, 1)[me].clone();
            let input = mine(0..count);
            let want = own.clone().map(|i| folded(n, i, salt, op)).collect();
            if with_input {
                let mut buf = vec![0u8; own.len() * es];
                let r = run(st, Coll::ReduceScatter { input: Some(&input), buf: &mut buf, op });
                r.map(|()| got_want(dec(d, &buf), want))
            } else {
                let mut buf = input;
                let r = run(st, Coll::ReduceScatter { input: None, buf: &mut buf, op });
                r.map(|()| got_want(dec(d, &buf[own.start * es..own.end * es]), want))
            }
        }
        OpKind::AllToAll => {
            // Uneven blocks where the row takes them (all_to_all_v): rank a sends rank b
            // len(a, b) elements, which is not len(b, a).
            let even = !row.uneven || salt.is_multiple_of(2);
            // Large counts (`single_copy_blocks_match_the_reference`) keep most blocks large.
            let len = |a: usize, b: usize| match (even, count >= SINGLE_COPY_COUNT) {
                (true, _) => count,
                (false, false) => (a * 3 + b * 5 + count) % 7,
                (false, true) => count / (1 + (a + 2 * b) % 3) + (a * 3 + b * 5) % 7,
            };
            let sent = |a: usize, b: usize| (0..len(a, b)).map(move |j| val(a, b * 100_000 + j, salt));
            let send = enc(d, (0..n).flat_map(|b| sent(me, b)));
            let want: Vec<f64> = (0..n).flat_map(|a| sent(a, me)).map(|v| v as f64).collect();
            let mut recv = vec![0u8; want.len() * es];
            let uneven = (!even).then(|| VBlocks {
                send: crate::algo::blocks_of((0..n).map(|b| len(me, b) * es)),
                recv: crate::algo::blocks_of((0..n).map(|a| len(a, me) * es)),
            });
            let coll = Coll::AllToAll { send: &send, recv: &mut recv, uneven };
            run(st, coll).map(|()| got_want(dec(d, &recv), want))
        }
    };
    r.map(|diff| diff.map(|diff| format!("rank {me}: {diff}")))
}

/// Runs every row that serves at `n` ranks over every count and kind; returns the failures.
fn check_rows(n: usize) -> Vec<String> {
    let topo = topo_of(n);
    let results = with_ranks(n, &topo, None, |st, plan| {
        let mut failures = Vec::new();
        let mut salt = 0;
        for row in TABLE {
            for count in COUNTS {
                for kind in KINDS {
                    salt += 1;
                    let call =
                        Call { op: row.op(), bytes: count * kind.0.size(), even: true, pieces: false, half: false };
                    let served = select::serves(row.algo, &call, &topo).is_ok();
                    let what = format!("{} {} of {count} {} at {n} ranks", row.algo, row.op(), kind.0);
                    match check(st, plan, row, count, kind, salt) {
                        Ok(None) if served => {}
                        // Refused alike on every rank, before any message, with a typed error.
                        Err(Error::InvalidArgument(_)) if !served => {}
                        // A wrong result leaves the ranks in step: go on to the next call.
                        Ok(Some(diff)) => failures.push(format!("{what}: {diff}")),
                        // An unexpected error: the ranks may no longer call alike, so stop
                        // rather than wait on each other.
                        r => {
                            failures.push(format!("{what}: served {served}, but {r:?}"));
                            return failures;
                        }
                    }
                }
            }
        }
        failures
    });
    results.into_iter().flatten().collect()
}

fn check_sizes(sizes: std::ops::RangeInclusive<usize>) {
    let failures: Vec<String> = sizes.flat_map(check_rows).collect();
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn every_row_matches_the_reference_at_1_to_6_ranks() {
    check_sizes(1..=6);
}

#[test]
fn every_row_matches_the_reference_at_7_to_12_ranks() {
    check_sizes(7..=12);
}

#[test]
fn every_row_matches_the_reference_at_13_to_17_ranks() {
    check_sizes(13..=17);
}

/// The harness can fail: a rank whose data differs from what the reference expects is caught.
#[test]
fn a_wrong_contribution_is_caught() {
    let topo = topo_of(3);
    let row = TABLE.iter().find(|r| r.op() == OpKind::AllReduce).expect("an all_reduce row");
    let results = with_ranks(3, &topo, Some(row.algo), |st, plan| {
        let mut buf = enc(DataType::F32, (0..5).map(|i| val(plan.rank, i, 0) + i64::from(plan.rank == 2)));
        ops::run(st, plan, Coll::AllReduce { input: None, out: &mut [&mut buf[..]], op: ReduceOp::Sum }, DataType::F32)
            .expect("the call itself goes through");
        dec(DataType::F32, &buf) == (0..5).map(|i| folded(3, i, 0, ReduceOp::Sum)).collect::<Vec<f64>>()
    });
    assert_eq!(results, vec![false; 3]);
}

/// Deterministic mode (`CONFLUX_DETERMINISTIC=1`): floating-point reductions take the ordered
/// schedule (`algo/ordered.rs`) whatever is forced; they must still be right.
#[test]
fn ordered_reductions_match_the_reference() {
    let reductions = [OpKind::AllReduce, OpKind::Reduce, OpKind::ReduceScatter];
    for n in [1, 2, 3, 5, 8] {
        let topo = topo_of(n);
        let failures = with_ranks(n, &topo, None, |st, plan| {
            let plan = Plan { deterministic: true, ..*plan };
            let mut failures = Vec::new();
            let rows = TABLE.iter().filter(|r| reductions.contains(&r.op()) && r.needs == Needs::Any);
            for (salt, (row, count)) in rows.flat_map(|r| COUNTS.map(|c| (r, c))).enumerate() {
                match check(st, &plan, row, count, (DataType::F32, ReduceOp::Sum), salt) {
                    Ok(None) => {}
                    r => failures.push(format!("ordered {} of {count} at {n} ranks: {r:?}", row.op())),
                }
            }
            failures
        });
        let failures: Vec<String> = failures.into_iter().flatten().collect();
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}

/// f32 elements in a block that pairwise all_to_all moves by single copy (128 KiB and more).
const SINGLE_COPY_COUNT: usize = crate::algo::by_ref::SINGLE_COPY_FROM / 4 + 100;

/// Pairwise all_to_all and all_to_all_v with blocks large enough to go by single copy (the
/// reader takes them from the sender's memory, `algo/by_ref.rs`), at 2 to 5 ranks:
/// against the reference, and again with every read refused, as a kernel that forbids them
/// would (the blocks then come through the rings). Uneven calls mix large blocks with small
/// ones, which take the ring.
#[test]
fn single_copy_blocks_match_the_reference() {
    use crate::algo::Algo;
    use crate::transport::single_copy::REFUSE_FOR_TEST;
    use std::sync::atomic::Ordering;
    let served = [(Algo::Pairwise, OpKind::AllToAll)];
    let rows: Vec<&Row> = TABLE.iter().filter(|r| served.contains(&(r.algo, r.op()))).collect();
    assert_eq!(rows.len(), 1);
    let calls = [(2, SINGLE_COPY_COUNT), (3, SINGLE_COPY_COUNT), (4, 3 * SINGLE_COPY_COUNT), (5, 40_000)];
    for refuse in [false, true] {
        REFUSE_FOR_TEST.store(refuse, Ordering::SeqCst);
        for n in 2..=5 {
            let failures = with_ranks(n, &topo_of(n), None, |st, plan| {
                let mut failures = Vec::new();
                for (row, (salt, count)) in rows.iter().flat_map(|r| calls.map(|c| (r, c))) {
                    for kind in [(DataType::F32, ReduceOp::Sum), (DataType::I32, ReduceOp::Sum)] {
                        if let r @ (Ok(Some(_)) | Err(_)) = check(st, plan, row, count, kind, salt) {
                            let what = format!("{} {count} x {} at {n} ranks", row.op(), kind.0);
                            failures.push(format!("{what}, refused {refuse}: {r:?}"));
                        }
                    }
                }
                failures
            });
            let failures: Vec<String> = failures.into_iter().flatten().collect();
            assert!(failures.is_empty(), "{}", failures.join("\n"));
        }
    }
    REFUSE_FOR_TEST.store(false, Ordering::SeqCst);
}

//! `conflux-check SCENARIO`: a rank program that runs collectives and checks every result
//! against an independently computed reference. Start it under `conflux run -n N` (or with
//! torchrun's variables set by hand). It exits 0 only when every check passed; the tests use
//! it, and it is a quick way to validate an installation.

mod abort;
mod algos;
mod calls;
mod cut;
mod fusion;
mod groups;
mod ordered;
mod shrink;
mod stuck;
mod trace;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use conflux::with_dtype;
use conflux::{Communicator, DataType, Error, ReduceOp};
use conflux_cli::verify::{self, Num};

const SMALL_COUNTS: [usize; 4] = [0, 1, 7, 1000];
const LARGE: usize = 1_048_579;

struct Checker {
    comm: Communicator,
    passed: usize,
    failed: Vec<String>,
}

impl Checker {
    fn expect(&mut self, what: &str, wrong: Option<(usize, f64, f64)>) {
        match wrong {
            None => self.passed += 1,
            Some((i, got, want)) => self.failed.push(format!("{what}: element {i} is {got}, expected {want}")),
        }
    }
    /// An op the dtype lacks is an InvalidArgument on every rank, and the ranks stay in step.
    fn rejects<T: Num>(&mut self, op: ReduceOp, count: usize) {
        let mut buf = vec![T::from_f64(1.0); count];
        match self.comm.all_reduce(&mut buf, op) {
            Err(Error::InvalidArgument(_)) => self.passed += 1,
            other => self.failed.push(format!("all_reduce({}, {op}) gave {other:?}, not InvalidArgument", T::DTYPE)),
        }
    }
    fn ok(&mut self, what: &str, r: Result<(), Error>) -> bool {
        self.ok_value(what, r).is_some()
    }
    fn ok_value<T>(&mut self, what: &str, r: Result<T, Error>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.failed.push(format!("{what}: {e}"));
                None
            }
        }
    }

    /// Every collective, in place and out of place, for one dtype, op and count.
    fn collectives<T: Num>(&mut self, op: ReduceOp, count: usize) {
        let (n, r) = (self.comm.size(), self.comm.rank());
        let d = T::DTYPE;
        let tag = |name: &str| format!("{name}({d}, count={count}, {op}, n={n})");
        let mine = |count: usize| {
            let mut v = vec![T::from_f64(0.0); count];
            verify::fill(&mut v, op, r, 0);
            v
        };
        let want = |i: usize| verify::reduced(d, op, n, i);

        // all_reduce, in place and out of place.
        let mut buf = mine(count);
        if self.ok(&tag("all_reduce"), self.comm.all_reduce(&mut buf, op)) {
            self.expect(&tag("all_reduce"), verify::first_wrong(&buf, want));
        }
        let send = mine(count);
        let mut out = vec![T::from_f64(0.0); count];
        if self.ok(&tag("all_reduce_into"), self.comm.all_reduce_into(&send, &mut out, op)) {
            self.expect(&tag("all_reduce_into"), verify::first_wrong(&out, want));
            self.expect(&tag("all_reduce_into keeps send"), verify::first_wrong(&send, |i| verify::input(d, op, r, i)));
        }

        // reduce to every root in turn (cheap counts) or to the last rank.
        let roots: Vec<usize> = if count <= 7 { (0..n).collect() } else { vec![n - 1] };
        for root in roots {
            let mut buf = mine(count);
            if self.ok(&tag("reduce"), self.comm.reduce(&mut buf, op, root)) {
                if r == root {
                    self.expect(&tag("reduce at root"), verify::first_wrong(&buf, want));
                } else {
                    self.expect(
                        &tag("reduce leaves non-root"),
                        verify::first_wrong(&buf, |i| verify::input(d, op, r, i)),
                    );
                }
            }
        }

        // reduce out of place, to rank 0: the root's recv gets the result; every send, and the
        // other ranks' recv, stay as they were (a leaf sends straight from its send buffer).
        let send = mine(count);
        let mut out = vec![T::from_f64(3.0); count];
        if self.ok(&tag("reduce_into"), self.comm.reduce_into(&send, &mut out, op, 0)) {
            if r == 0 {
                self.expect(&tag("reduce_into at root"), verify::first_wrong(&out, want));
            } else {
                self.expect(&tag("reduce_into leaves recv"), verify::first_wrong(&out, |_| 3.0));
            }
            self.expect(&tag("reduce_into keeps send"), verify::first_wrong(&send, |i| verify::input(d, op, r, i)));
        }

        // reduce_scatter: every rank contributes n blocks of `count`.
        let send = mine(count * n);
        let mut out = vec![T::from_f64(0.0); count];
        if self.ok(&tag("reduce_scatter"), self.comm.reduce_scatter(&send, &mut out, op)) {
            self.expect(
                &tag("reduce_scatter"),
                verify::first_wrong(&out, |i| verify::reduced(d, op, n, r * count + i)),
            );
        }
        let mut buf = mine(count * n);
        if self.ok(&tag("reduce_scatter_in_place"), self.comm.reduce_scatter_in_place(&mut buf, op)) {
            let block = &buf[r * count..(r + 1) * count];
            self.expect(
                &tag("reduce_scatter_in_place"),
                verify::first_wrong(block, |i| verify::reduced(d, op, n, r * count + i)),
            );
        }
    }

    /// Collectives without a reduction, for one dtype and count.
    fn movement<T: Num>(&mut self, count: usize) {
        let (n, r) = (self.comm.size(), self.comm.rank());
        let d = T::DTYPE;
        let op = ReduceOp::Sum;
        let tag = |name: &str| format!("{name}({d}, count={count}, n={n})");
        // The value rank `src` holds at element i.
        let val = |src: usize, i: usize| verify::input(d, op, src, i);
        let of = |src: usize, base: usize, len: usize| {
            let mut v = vec![T::from_f64(0.0); len];
            verify::fill(&mut v, op, src, base);
            v
        };

        let roots: Vec<usize> = if count <= 7 { (0..n).collect() } else { vec![0, n - 1] };
        for root in roots {
            let mut buf = if r == root { of(r, 0, count) } else { vec![T::from_f64(0.0); count] };
            if self.ok(&tag("broadcast"), self.comm.broadcast(&mut buf, root)) {
                self.expect(&format!("{} root={root}", tag("broadcast")), verify::first_wrong(&buf, |i| val(root, i)));
            }
        }

        let send = of(r, 0, count);
        let mut out = vec![T::from_f64(0.0); count * n];
        if self.ok(&tag("all_gather"), self.comm.all_gather(&send, &mut out)) {
            self.expect(&tag("all_gather"), verify::first_wrong(&out, |i| val(i / count.max(1), i % count.max(1))));
        }
        let mut buf = vec![T::from_f64(0.0); count * n];
        buf[r * count..(r + 1) * count].copy_from_slice(&send);
        if self.ok(&tag("all_gather_in_place"), self.comm.all_gather_in_place(&mut buf)) {
            self.expect(
                &tag("all_gather_in_place"),
                verify::first_wrong(&buf, |i| val(i / count.max(1), i % count.max(1))),
            );
        }

        // all_to_all: rank r's block p holds input(r, p*count + i); rank p receives it as block r.
        let send = of(r, 0, count * n);
        let mut out = vec![T::from_f64(0.0); count * n];
        if self.ok(&tag("all_to_all"), self.comm.all_to_all(&send, &mut out)) {
            let c = count.max(1);
            self.expect(&tag("all_to_all"), verify::first_wrong(&out, |i| val(i / c, r * count + i % c)));
        }

        // all_to_all_v: rank s sends (s + p) % 3 * count/2 + p elements to rank p.
        let amount = |s: usize, p: usize| (s + p) % 3 * (count / 2) + p;
        let send_counts: Vec<usize> = (0..n).map(|p| amount(r, p)).collect();
        let recv_counts: Vec<usize> = (0..n).map(|s| amount(s, r)).collect();
        let send = of(r, 0, send_counts.iter().sum());
        let mut out = vec![T::from_f64(0.0); recv_counts.iter().sum()];
        if self.ok(&tag("all_to_all_v"), self.comm.all_to_all_v(&send, &send_counts, &mut out, &recv_counts)) {
            // Element j of the block from s is element (offset of block r in s's send) + j of s's input.
            let mut expect = Vec::with_capacity(out.len());
            for s in 0..n {
                let off: usize = (0..r).map(|p| amount(s, p)).sum();
                expect.extend((0..amount(s, r)).map(|j| val(s, off + j)));
            }
            self.expect(&tag("all_to_all_v"), verify::first_wrong(&out, |i| expect[i]));
        }
    }
}

fn scenario_colls(comm: Communicator, quick: bool) -> Checker {
    let mut c = Checker { comm, passed: 0, failed: Vec::new() };
    let dtypes: Vec<DataType> =
        if quick { vec![DataType::F32, DataType::BF16, DataType::I8] } else { DataType::ALL.to_vec() };
    for &d in &dtypes {
        for &count in &SMALL_COUNTS {
            for op in ReduceOp::ALL {
                if op.accepts(d) {
                    with_dtype!(d, T => c.collectives::<T>(op, count));
                } else {
                    with_dtype!(d, T => c.rejects::<T>(op, count));
                }
            }
            with_dtype!(d, T => c.movement::<T>(count));
        }
    }
    // One large, odd count through every algorithm's chunking, for a few types.
    c.collectives::<f32>(ReduceOp::Sum, LARGE);
    c.movement::<f32>(LARGE);
    if !quick {
        c.collectives::<half::bf16>(ReduceOp::Avg, LARGE);
        c.collectives::<i32>(ReduceOp::Max, LARGE);
    }
    let r = c.comm.barrier();
    c.ok("barrier", r);
    c
}

/// Async operations complete in issue order and carry their own buffers.
fn scenario_async(comm: Communicator) -> Checker {
    let mut c = Checker { comm, passed: 0, failed: Vec::new() };
    let (n, r) = (c.comm.size(), c.comm.rank());
    let k = 16;
    let mut works = Vec::new();
    for j in 0..k {
        let len = 1000 + j * 4099;
        let v: Vec<f32> = (0..len).map(|i| (r * j + i % 7) as f32).collect();
        works.push((j, len, c.comm.all_reduce_async(v, ReduceOp::Sum)));
    }
    // A blocking call issued after them runs after them.
    let mut b = vec![r as i64; 5];
    let br = c.comm.all_reduce(&mut b, ReduceOp::Sum);
    c.ok("blocking all_reduce after async ones", br);
    let total: i64 = (0..n as i64).sum();
    c.expect("blocking after async", verify::first_wrong(&b, |_| total as f64));
    for (j, _, w) in &works {
        if !w.is_completed() {
            c.failed.push(format!("async all_reduce #{j} not completed although a later blocking call returned"));
        }
    }
    for (j, len, w) in works {
        match w.wait() {
            Ok(v) => {
                let want = |i: usize| ((0..n).map(|q| q * j).sum::<usize>() + n * (i % 7)) as f64;
                assert_eq!(v.len(), len);
                c.expect(&format!("async all_reduce #{j}"), verify::first_wrong(&v, want));
            }
            Err(e) => c.failed.push(format!("async all_reduce #{j}: {e}")),
        }
    }
    // Overlap: a large async all_reduce runs while this thread computes.
    let big: Vec<f32> = vec![1.0; 4 << 20];
    let w = c.comm.all_reduce_async(big, ReduceOp::Sum);
    let spin = Instant::now();
    let mut x = 0u64;
    while spin.elapsed() < Duration::from_millis(20) {
        x = x.wrapping_mul(31).wrapping_add(7);
    }
    std::hint::black_box(x);
    match w.wait() {
        Ok(v) => c.expect("async overlap", verify::first_wrong(&v, |_| n as f64)),
        Err(e) => c.failed.push(format!("async overlap: {e}")),
    }
    let bw = c.comm.barrier_async().wait();
    c.ok("barrier_async", bw);
    c
}

/// Tagged send/recv: out-of-order tags, a two-stage pipeline, every pair.
fn scenario_p2p(comm: Communicator) -> Checker {
    let mut c = Checker { comm, passed: 0, failed: Vec::new() };
    let (n, r) = (c.comm.size(), c.comm.rank());
    if n < 2 {
        return c;
    }
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    // Send tags 1 then 2 (2 is large, larger than a ring); receive 2 then 1.
    let small: Vec<i32> = vec![r as i32; 10];
    let large: Vec<f64> = (0..(3 << 20) / 8).map(|i| (r * 1000 + i) as f64).collect();
    let w1 = c.comm.send_async(small, right, 1);
    let w2 = c.comm.send_async(large, right, 2);
    let mut got_large = vec![0f64; (3 << 20) / 8];
    let mut got_small = vec![0i32; 10];
    let e = c.comm.recv(&mut got_large, left, 2);
    if c.ok("recv tag 2", e) {
        c.expect("recv tag 2", verify::first_wrong(&got_large, |i| (left * 1000 + i) as f64));
    }
    let e = c.comm.recv(&mut got_small, left, 1);
    if c.ok("recv tag 1", e) {
        c.expect("recv tag 1", verify::first_wrong(&got_small, |_| left as f64));
    }
    let e = w1.wait().map(|_| ());
    c.ok("send tag 1", e);
    let e = w2.wait().map(|_| ());
    c.ok("send tag 2", e);
    // Every ordered pair, one message each, with a collective in between the sends.
    for d in 1..n {
        let to = (r + d) % n;
        let from = (r + n - d) % n;
        let w = c.comm.send_async(vec![(r * n + to) as u8; 3], to, 7);
        let mut buf = vec![0u8; 3];
        let e = c.comm.recv(&mut buf, from, 7);
        if c.ok("pairwise recv", e) {
            c.expect("pairwise recv", verify::first_wrong(&buf, |_| ((from * n + r) % 256) as f64));
        }
        let e = w.wait().map(|_| ());
        c.ok("pairwise send", e);
    }
    // A pipeline: rank 0 produces, every later stage adds its rank and forwards.
    let mut act = vec![0f32; 4096];
    for step in 0..5 {
        if r == 0 {
            act.iter_mut().enumerate().for_each(|(i, a)| *a = (i + step) as f32);
        } else {
            let e = c.comm.recv(&mut act, r - 1, 100 + step as u32);
            c.ok("pipeline recv", e);
            act.iter_mut().for_each(|a| *a += r as f32);
        }
        if r + 1 < n {
            let e = c.comm.send(&act, r + 1, 100 + step as u32);
            c.ok("pipeline send", e);
        } else {
            let added: usize = (1..n).sum();
            c.expect("pipeline output", verify::first_wrong(&act, |i| (i + step + added) as f64));
        }
    }
    any_source(&mut c);
    wait_beside_a_collective(&mut c);
    post_from_a_callback(&mut c);
    c
}

/// A completion callback may post: rank 0 answers a receive with a send from the receive's
/// callback, which the engine thread runs (rank 0 does not wait for the receive, and rank 1
/// sends only once the callback is set), holding the transport as it does.
fn post_from_a_callback(c: &mut Checker) {
    let r = c.comm.rank();
    if r == 0 {
        let (tx, rx) = std::sync::mpsc::channel();
        let handle = c.comm.with_algo(c.comm.algo());
        let w = c.comm.recv_async(vec![0i32; 8], 1, 21);
        w.on_complete(move || {
            let _ = tx.send(handle.send_async(vec![5i32; 8], 1, 22));
        });
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(sent) => {
                c.ok("send posted from a callback", sent.wait().map(|_| ()));
            }
            Err(_) => c.failed.push("the receive's callback never posted its send".into()),
        }
        if let Some(got) = c.ok_value("receive with a callback", w.wait()) {
            c.expect("receive with a callback", verify::first_wrong(&got, |_| 1.0));
        }
    } else if r == 1 {
        std::thread::sleep(Duration::from_millis(20));
        let sent = c.comm.send_async(vec![1i32; 8], 0, 21).wait().map(|_| ());
        c.ok("send answered from a callback", sent);
        if let Some(got) = c.ok_value("answer sent from a callback", c.comm.recv_async(vec![0i32; 8], 0, 22).wait()) {
            c.expect("answer sent from a callback", verify::first_wrong(&got, |_| 5.0));
        }
    }
}

/// A thread waiting for a posted receive drives it itself, but must not keep a collective
/// that another thread issues meanwhile from running: here rank 1 sends only after that
/// collective, so holding it back would hang rank 0 until its deadline. Rank 1 then leaves at
/// once: its last two messages may reach rank 0 together with the end of its stream.
fn wait_beside_a_collective(c: &mut Checker) {
    let (r, n) = (c.comm.rank(), c.comm.size());
    let comm = &c.comm;
    let (got, sum) = std::thread::scope(|s| {
        let waiter = (r == 0).then(|| s.spawn(|| comm.recv_async(vec![0i32; 64], 1, 11).wait()));
        if r == 0 {
            // Let the waiting thread start driving first.
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut v = vec![1i32; 5];
        let sum = comm.all_reduce(&mut v, ReduceOp::Sum).map(|_| v);
        if r == 1 {
            let sent = comm.send_async(vec![7i32; 64], 0, 11).wait().map(|_| ());
            return (Some(sent.map(|_| vec![7i32; 64])), sum);
        }
        (waiter.map(|w| w.join().expect("the waiting thread panicked")), sum)
    });
    if let Ok(v) = &sum {
        c.expect("all_reduce beside a waiting receive", verify::first_wrong(v, |_| n as f64));
    }
    c.ok("all_reduce beside a waiting receive", sum.map(|_| ()));
    if let Some(got) = got {
        if let Ok(v) = &got {
            c.expect("receive waited for beside an all_reduce", verify::first_wrong(v, |_| 7.0));
        }
        c.ok("receive waited for beside an all_reduce", got.map(|_| ()));
    }
}

/// Receives from any source: every other rank sends rank 0 a tag-5 message, then a tag-9 one
/// a little later the higher its rank; rank 0's receives of tag 9 from any rank must each
/// match one sender exactly once (setting the tag-5 messages aside), then its receives of
/// tag 5 from each rank find those.
fn any_source(c: &mut Checker) {
    let (r, n) = (c.comm.rank(), c.comm.size());
    if r != 0 {
        let w5 = c.comm.send_async(vec![r as i64; 2000], 0, 5);
        std::thread::sleep(Duration::from_millis(3 * r as u64));
        let w9 = c.comm.send_async(vec![10 * r as i64; 7], 0, 9);
        for w in [w5, w9] {
            let e = w.wait().map(|_| ());
            c.ok("send to an any-source receive", e);
        }
        return;
    }
    let works: Vec<_> = (1..n).map(|_| c.comm.recv_any_async(vec![0i64; 7], 9)).collect();
    let mut seen = Vec::new();
    for w in works {
        match w.wait() {
            Ok((buf, from)) => {
                c.expect("recv from any rank", verify::first_wrong(&buf, |_| (10 * from) as f64));
                seen.push(from);
            }
            Err(e) => c.failed.push(format!("recv from any rank: {e}")),
        }
    }
    seen.sort_unstable();
    if seen != (1..n).collect::<Vec<_>>() {
        c.failed.push(format!("receives from any rank matched senders {seen:?}"));
    }
    for from in 1..n {
        let mut buf = vec![0i64; 2000];
        let e = c.comm.recv(&mut buf, from, 5);
        if c.ok("recv of a message set aside", e) {
            c.expect("recv of a message set aside", verify::first_wrong(&buf, |_| from as f64));
        }
    }
}

/// Bad arguments get typed errors and leave the communicator usable.
fn scenario_errors(comm: Communicator) -> Checker {
    let mut c = Checker { comm, passed: 0, failed: Vec::new() };
    let n = c.comm.size();
    let mut buf = vec![0f32; 8];
    let mut small = vec![0f32; 3];
    let comm = &c.comm;
    let mut results = vec![
        ("broadcast root out of range", comm.broadcast(&mut buf, n)),
        ("reduce root out of range", comm.reduce(&mut buf, ReduceOp::Sum, n + 5)),
        ("all_reduce_into lengths", comm.all_reduce_into(&buf, &mut small, ReduceOp::Sum)),
        ("all_gather lengths", comm.all_gather(&buf, &mut small)),
        ("send to self", comm.send(&buf, comm.rank(), 0)),
        ("recv peer out of range", comm.recv(&mut buf, n, 0)),
        ("all_to_all_v counts", comm.all_to_all_v(&buf, &vec![1; n], &mut small, &vec![1; n])),
    ];
    if n > 1 {
        results.push(("reduce_scatter lengths", comm.reduce_scatter(&buf, &mut small, ReduceOp::Sum)));
    }
    for (what, r) in results {
        match r {
            Err(Error::InvalidArgument(_)) => c.passed += 1,
            other => c.failed.push(format!("{what}: expected InvalidArgument, got {other:?}")),
        }
    }
    // Still usable.
    let mut v = vec![1i32; 4];
    let e = c.comm.all_reduce(&mut v, ReduceOp::Sum);
    if c.ok("all_reduce after bad calls", e) {
        c.expect("all_reduce after bad calls", verify::first_wrong(&v, |_| n as f64));
    }
    // Closed communicators refuse work with a typed error.
    let e = c.comm.shutdown();
    c.ok("shutdown", e);
    match c.comm.all_reduce(&mut v, ReduceOp::Sum) {
        Err(Error::Closed(_)) => c.passed += 1,
        other => c.failed.push(format!("all_reduce after shutdown: expected Closed, got {other:?}")),
    }
    c
}

/// Rank `victim` kills itself with SIGKILL in the middle of a stream of collectives; every
/// other rank must fail within 5 s with an error that names it.
/// Rank `victim` SIGKILLs itself mid-all_reduce; the others must fail within 5 s naming it.
/// With `in_group`, the all_reduces run in a group of every rank but 0, in reverse order (so
/// group and global ranks differ), while rank 0 waits in a barrier of the whole job.
fn scenario_kill(comm: Communicator, victim: usize, in_group: bool) -> ExitCode {
    let r = comm.rank();
    let group = if in_group {
        let members: Vec<usize> = (1..comm.size()).rev().collect();
        match comm.new_group(&members) {
            Ok(g) => g,
            Err(e) => {
                println!("rank {r}: new_group failed: {e}");
                return ExitCode::from(1);
            }
        }
    } else {
        None
    };
    let comm = match (&group, in_group) {
        (Some(g), _) => g,
        (None, true) => {
            let t = Instant::now();
            let e = comm.barrier().expect_err("a barrier nobody else enters cannot complete");
            judge_failure(r, victim, t, e)
        }
        (None, false) => &comm,
    };
    let r = comm.world_ranks()[comm.rank()];
    let mut buf = vec![1f32; 1 << 18];
    let mut last_ok = Instant::now();
    for i in 0.. {
        if r == victim && i == 20 {
            println!("rank {r}: killing myself with SIGKILL");
            let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
        }
        match comm.all_reduce(&mut buf, ReduceOp::Sum) {
            Ok(()) => {
                buf.iter_mut().for_each(|x| *x = 1.0);
                last_ok = Instant::now();
            }
            Err(e) => judge_failure(r, victim, last_ok, e),
        }
    }
    unreachable!()
}

/// Exits 0 if `e` names the victim within 5 s of `since`, else 1. Without a goodbye to the
/// store: leave like a crashed job would.
fn judge_failure(r: usize, victim: usize, since: Instant, e: Error) -> ! {
    let secs = since.elapsed().as_secs_f64();
    println!("rank {r}: failed after {secs:.2}s: {e}");
    if e.peer() == Some(victim) && secs < 5.0 {
        println!("rank {r}: DETECTED rank {victim}");
        std::process::exit(0);
    }
    std::process::exit(1);
}

/// `rounds` all_reduces of `len` elements before a fault is staged; the buffer, or the exit
/// code of a rank whose warm-up failed (it says so).
pub(crate) fn warm_up(comm: &Communicator, len: usize, rounds: usize) -> Result<Vec<f32>, ExitCode> {
    let mut buf = vec![1f32; len];
    for _ in 0..rounds {
        if let Err(e) = comm.all_reduce(&mut buf, ReduceOp::Sum) {
            println!("rank {}: an all_reduce before the fault failed: {e}", comm.rank());
            return Err(ExitCode::from(1));
        }
    }
    Ok(buf)
}

/// Rank `victim` runs a few collectives, then shuts its communicator down and returns while
/// the others enter one more all_reduce, or (`send`) send it `elems` floats, more than its
/// socket buffers hold: they must fail naming it within seconds, not at the timeout.
fn scenario_leave(comm: Communicator, victim: usize, elems: usize, send: bool) -> ExitCode {
    let r = comm.rank();
    let mut buf = match warm_up(&comm, if send { 1000 } else { elems }, 5) {
        Ok(b) => b,
        Err(code) => return code,
    };
    if r == victim {
        println!("rank {r}: leaving");
        return match comm.shutdown() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                println!("rank {r}: shutdown failed: {e}");
                ExitCode::from(1)
            }
        };
    }
    let t = Instant::now();
    let result = if send {
        buf.resize(elems, 1.0);
        comm.send(&buf, victim, 1)
    } else {
        comm.all_reduce(&mut buf, ReduceOp::Sum)
    };
    match result {
        Ok(()) => {
            println!("rank {r}: an operation without rank {victim} succeeded");
            ExitCode::from(1)
        }
        Err(e) => judge_failure(r, victim, t, e),
    }
}

/// Rank 0 sends `bytes` to rank 1, which starts receiving only after `delay_ms`; rank 0 says
/// how long its blocking send took (SENT-IN), rank 1 whether every byte arrived (RECEIVED-OK).
/// With a TCP window smaller than the message, the send cannot return before rank 1 reads.
fn scenario_window(comm: Communicator, bytes: usize, delay_ms: u64) -> ExitCode {
    let r = comm.rank();
    let n = bytes / 4;
    let result = match r {
        0 => {
            let msg = pattern(n, 11);
            let t = Instant::now();
            comm.send(&msg, 1, 5).map(|()| format!("SENT-IN {:.3}", t.elapsed().as_secs_f64()))
        }
        1 => {
            std::thread::sleep(Duration::from_millis(delay_ms));
            let mut got = vec![0i32; n];
            comm.recv(&mut got, 0, 5).map(|()| {
                let wrong = wrong_elements(&got, 11);
                if wrong == 0 {
                    "RECEIVED-OK".to_string()
                } else {
                    format!("{wrong} of {n} elements wrong")
                }
            })
        }
        _ => Ok("idle".to_string()),
    };
    // Both ranks leave together: rank 0 must not shut down while its last bytes are in flight.
    report(r, result.and_then(|what| comm.barrier().map(|()| what)))
}

/// Rank 0 sends `bytes` to rank 1 and shuts down at once. Over a slow link its goodbye, which
/// goes through the store, reaches rank 1 long before the message's last bytes do; rank 1 must
/// still receive all of them, exactly, and only then see rank 0 gone.
fn scenario_send_and_leave(comm: Communicator, bytes: usize) -> ExitCode {
    let r = comm.rank();
    let n = bytes / 4;
    let result = match r {
        0 => {
            let msg = pattern(n, 7);
            comm.send(&msg, 1, 7).and_then(|()| comm.shutdown()).map(|()| "sent and left".to_string())
        }
        1 => {
            let mut got = vec![0i32; n];
            let t = Instant::now();
            comm.recv(&mut got, 0, 7).map(|()| {
                let wrong = wrong_elements(&got, 7);
                let ok = if wrong == 0 { " LAST-BYTES-OK" } else { "" };
                format!("received {bytes} B in {:.2}s, {wrong} wrong{ok}", t.elapsed().as_secs_f64())
            })
        }
        _ => Ok("idle".to_string()),
    };
    report(r, result)
}

/// `n` elements that differ from their neighbours and from other scenarios' (by `turn`), so
/// that a byte lost, doubled or moved shows.
fn pattern(n: usize, turn: u32) -> Vec<i32> {
    (0..n).map(|i| (i as i32).wrapping_mul(-1_640_531_535).rotate_left(turn)).collect()
}

/// How many elements of `got` differ from `pattern(got.len(), turn)`.
fn wrong_elements(got: &[i32], turn: u32) -> usize {
    got.iter().zip(pattern(got.len(), turn)).filter(|(g, w)| *g != w).count()
}

/// Prints what rank `r` did, or how it failed, and exits accordingly.
fn report(r: usize, result: conflux::Result<String>) -> ExitCode {
    match result {
        Ok(what) => {
            println!("rank {r}: {what}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("rank {r}: failed: {e}");
            ExitCode::from(1)
        }
    }
}

/// Rank 1 calls all_reduce with one element more than the others: nobody may hang or
/// compute a wrong answer; every rank gets an error within the timeout.
fn scenario_mismatch(comm: Communicator) -> ExitCode {
    let r = comm.rank();
    let len = if r == 1 { 1001 } else { 1000 };
    let mut buf = vec![1f32; len];
    let t = Instant::now();
    match comm.all_reduce(&mut buf, ReduceOp::Sum) {
        Ok(()) => {
            println!("rank {r}: all_reduce with mismatched lengths succeeded");
            ExitCode::from(1)
        }
        Err(e) => {
            println!("rank {r}: MISMATCH-ERROR after {:.2}s: {e}", t.elapsed().as_secs_f64());
            // Returning shuts down: rank 0 keeps the store up until every rank said goodbye,
            // also a rank still setting up when the others already failed.
            ExitCode::SUCCESS
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let scenario = args.first().map(String::as_str).unwrap_or("colls");
    // Warnings (a refused connection, say) reach stderr, where tests look for them.
    conflux_cli::init_logging();
    let comm = match Communicator::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("conflux-check: cannot create the communicator: {e}");
            return ExitCode::from(2);
        }
    };
    let (rank, size) = (comm.rank(), comm.size());
    let t = Instant::now();
    let checker = match scenario {
        "colls" => scenario_colls(comm, false),
        "quick" => scenario_colls(comm, true),
        "async" => scenario_async(comm),
        "p2p" => scenario_p2p(comm),
        "errors" => scenario_errors(comm),
        "kill" => {
            let victim = args.get(1).and_then(|v| v.parse().ok()).unwrap_or(size - 1);
            return scenario_kill(comm, victim, args.get(2).is_some_and(|a| a == "group"));
        }
        "mismatch" => return scenario_mismatch(comm),
        "abort" => {
            let victim = args.get(1).and_then(|v| v.parse().ok()).unwrap_or(size - 1);
            return abort::scenario_abort(comm, victim);
        }
        "cut" => {
            let victim = args.get(1).and_then(|v| v.parse().ok()).unwrap_or(size - 1);
            return cut::scenario_cut(comm, victim);
        }
        "shrink" => {
            let victim = args.get(1).and_then(|v| v.parse().ok()).unwrap_or(size - 1);
            return shrink::scenario_shrink(comm, victim);
        }
        "stuck" => {
            let victim = args.get(1).and_then(|v| v.parse().ok()).unwrap_or(size - 1);
            return stuck::scenario_stuck(comm, victim);
        }
        "calls" => return calls::scenario_calls(comm, args.get(1).map_or("op", String::as_str)),
        "leave" => {
            let victim = args.get(1).and_then(|v| v.parse().ok()).unwrap_or(size - 1);
            let elems = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(1000);
            return scenario_leave(comm, victim, elems, args.get(3).is_some_and(|m| m == "send"));
        }
        "send-and-leave" => {
            let bytes = args.get(1).and_then(|v| v.parse().ok()).unwrap_or(256 << 10);
            return scenario_send_and_leave(comm, bytes);
        }
        "window" => {
            let bytes = args.get(1).and_then(|v| v.parse().ok()).unwrap_or(1 << 20);
            return scenario_window(comm, bytes, args.get(2).and_then(|v| v.parse().ok()).unwrap_or(1000));
        }
        "groups" => groups::scenario_groups(comm),
        "ordered" => ordered::scenario_ordered(comm),
        "algos" | "algos-quick" => {
            let must: Vec<conflux::Algo> =
                args.get(1).map_or(vec![], |a| a.split(',').filter_map(conflux::Algo::parse).collect());
            algos::scenario_algos(comm, scenario == "algos-quick", &must)
        }
        "group-mismatch" => return groups::scenario_group_mismatch(comm),
        "trace-steps" => trace::scenario_steps(comm, &args),
        "trace-overlap" => trace::scenario_overlap(comm, &args),
        "trace-kill" => return trace::scenario_kill(comm, &args),
        "fusion" => {
            // Bitwise agreement is promised where every rank reduces in rank order: the direct
            // shared-segment algorithm, used when all ranks share one host and ring is not forced.
            let ring = |k: &str, v: &str| std::env::var(k).is_ok_and(|x| x.eq_ignore_ascii_case(v));
            let bitwise =
                comm.local_size() == comm.size() && !ring("CONFLUX_TRANSPORT", "tcp") && !ring("CONFLUX_ALGO", "ring");
            fusion::scenario_fusion(comm, bitwise)
        }
        "priority" => {
            let elems = args.get(1).and_then(|v| v.parse().ok()).unwrap_or(64 << 20);
            fusion::scenario_priority(comm, elems)
        }
        other => {
            eprintln!(
                "conflux-check: unknown scenario {other:?} (colls, quick, algos|algos-quick [MUST,SERVE], async, p2p, errors, kill [RANK [group]], leave [RANK [ELEMS [send]]], send-and-leave [BYTES], window [BYTES DELAY_MS], mismatch, calls [op|root|dtype|redop|count|algo], stuck [RANK], abort [RANK], cut [RANK], ordered, shrink [RANK], \
                 groups, group-mismatch, fusion, priority [ELEMS], trace-steps [SLOW SLOW_MS BASE_MS STEPS ELEMS], trace-overlap [STEPS ELEMS MS], trace-kill [RANK AFTER])"
            );
            return ExitCode::from(2);
        }
    };
    let secs = t.elapsed().as_secs_f64();
    for f in checker.failed.iter().take(20) {
        println!("rank {rank}: FAIL {f}");
    }
    println!(
        "rank {rank}/{size}: {scenario}: {} passed, {} failed in {secs:.2}s",
        checker.passed,
        checker.failed.len()
    );
    let failed = !checker.failed.is_empty();
    drop(checker);
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

//! Sub-communicators: memberships of every shape, splits, nested groups, overlapping groups
//! with operations in flight on several at once, and mismatched creation.

use std::process::ExitCode;
use std::time::Instant;

use conflux::{Communicator, Error, ReduceOp};
use conflux_cli::verify;

use super::Checker;

/// A deterministic pseudo-random generator every rank runs with the same seed, so all agree
/// on the memberships without talking.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// Memberships for a world of `n`: everyone, halves, evens, a reversed list, singletons and
/// random subsets in random order.
fn memberships(n: usize) -> Vec<Vec<usize>> {
    let mut lists = vec![(0..n).collect::<Vec<_>>(), (0..n).rev().collect(), vec![n - 1], (0..n).step_by(2).collect()];
    if n > 1 {
        lists.push((n / 2..n).collect());
        lists.push((1..n).step_by(2).collect());
    }
    let mut rng = Lcg(n as u64 * 7919);
    for _ in 0..4 {
        let mut pick: Vec<usize> = (0..n).filter(|_| rng.next().is_multiple_of(2)).collect();
        if pick.is_empty() {
            pick.push((rng.next() as usize) % n);
        }
        for i in (1..pick.len()).rev() {
            pick.swap(i, (rng.next() as usize) % (i + 1));
        }
        lists.push(pick);
    }
    lists
}

impl Checker {
    /// Checks that `g` is the group of world ranks `want` (in order) and that its collectives
    /// reduce over exactly those ranks.
    fn check_group(&mut self, what: &str, g: &Communicator, want: &[usize]) {
        let me = self.comm.world_ranks()[self.comm.rank()];
        if g.world_ranks() != want || g.size() != want.len() || want.get(g.rank()) != Some(&me) {
            self.failed.push(format!(
                "{what}: group is rank {} of {:?}, expected world rank {me} in {want:?}",
                g.rank(),
                g.world_ranks()
            ));
            return;
        }
        self.passed += 1;
        // A sub-group prices links as its parent does (across nodes: the parent's measured
        // TCP rate), so that its ranks choose alike without measuring again.
        if g.cost_model() != self.comm.cost_model() || g.cost_model_source() != self.comm.cost_model_source() {
            self.failed.push(format!("{what}: cost model {:?} differs from the parent's", g.cost_model()));
        }
        let mut v: Vec<i64> = (0..33).map(|i| (me * 1000 + i) as i64).collect();
        let r = g.all_reduce(&mut v, ReduceOp::Sum);
        if self.ok(&format!("{what}: all_reduce"), r) {
            let base: usize = want.iter().map(|w| w * 1000).sum();
            self.expect(&format!("{what}: all_reduce"), verify::first_wrong(&v, |i| (base + i * want.len()) as f64));
        }
        let root = want.len() - 1;
        let mut b = vec![me as f32; 1000];
        let r = g.broadcast(&mut b, root);
        if self.ok(&format!("{what}: broadcast"), r) {
            self.expect(&format!("{what}: broadcast"), verify::first_wrong(&b, |_| want[root] as f64));
        }
    }

    fn expect_member(
        &mut self,
        what: &str,
        got: Result<Option<Communicator>, Error>,
        member: bool,
    ) -> Option<Communicator> {
        match (got, member) {
            (Ok(Some(g)), true) => Some(g),
            (Ok(None), false) => {
                self.passed += 1;
                None
            }
            (Ok(g), _) => {
                self.failed.push(format!("{what}: membership is {}, expected {member}", g.is_some()));
                None
            }
            (Err(e), _) => {
                self.failed.push(format!("{what}: {e}"));
                None
            }
        }
    }
}

pub fn scenario_groups(comm: Communicator) -> Checker {
    let mut c = Checker { comm, passed: 0, failed: Vec::new() };
    let (n, me) = (c.comm.size(), c.comm.rank());

    // new_group with every shape of membership.
    for list in memberships(n) {
        let what = format!("new_group({list:?})");
        let g = c.comm.new_group(&list);
        if let Some(g) = c.expect_member(&what, g, list.contains(&me)) {
            c.check_group(&what, &g, &list);
        }
    }

    // Bad lists, the same on every rank: a typed error everywhere, and no group.
    for bad in [vec![n], vec![0, 0], vec![]] {
        match c.comm.new_group(&bad) {
            Err(Error::InvalidArgument(_)) => c.passed += 1,
            other => c
                .failed
                .push(format!("new_group({bad:?}): expected InvalidArgument, got {:?}", other.map(|g| g.is_some()))),
        }
    }

    // split: three colors, ordered by descending key, one rank opting out.
    let color = |r: usize| (r != n / 2 || n < 3).then_some((r % 3) as u32);
    let g = c.comm.split(color(me), -(me as i64));
    let mut want: Vec<usize> = (0..n).filter(|&r| color(r) == color(me)).collect();
    want.reverse();
    let split = c.expect_member("split", g, color(me).is_some());
    if let Some(g) = &split {
        c.check_group("split", g, &want);
        // Nested: the first half of the split group, made from the group itself.
        let half: Vec<usize> = (0..g.size().div_ceil(2)).collect();
        let nested = g.new_group(&half);
        let want_nested: Vec<usize> = half.iter().map(|&i| want[i]).collect();
        if let Some(ng) = c.expect_member("nested new_group", nested, half.contains(&g.rank())) {
            c.check_group("nested new_group", &ng, &want_nested);
        }
    }

    // Overlapping groups in flight: the world reversed and the ranks of equal parity, with
    // asynchronous operations interleaved differently on each rank; each group keeps its own
    // issue order, so none waits for the other.
    let all: Vec<usize> = (0..n).rev().collect();
    let a = c.comm.new_group(&all);
    let b = c.comm.split(Some((me % 2) as u32), me as i64);
    let (Ok(Some(a)), Ok(Some(b))) = (a, b) else {
        c.failed.push("overlapping groups: creation failed".into());
        return c;
    };
    let parity: Vec<usize> = (0..n).filter(|r| r % 2 == me % 2).collect();
    let mut works = Vec::new();
    let mut issued = [0usize; 2];
    for j in 0..12usize {
        // Even ranks issue on a first, odd ranks on b first: a different interleaving per rank.
        let on_a = (j + me) % 2 == 0;
        let (g, members) = if on_a { (&a, &all) } else { (&b, &parity) };
        // Inputs depend on the operation's place in its own group's order.
        let k = issued[usize::from(on_a)];
        issued[usize::from(on_a)] += 1;
        let v: Vec<f64> = (0..4097).map(|i| (me * 10 + k + i) as f64).collect();
        let want: Vec<f64> = (0..4097).map(|i| members.iter().map(|&r| (r * 10 + k + i) as f64).sum()).collect();
        works.push((j, on_a, want, g.all_reduce_async(v, ReduceOp::Sum)));
        if j == 5 {
            // And the parent in the middle of it all.
            let mut w = vec![1i32; 10];
            let r = c.comm.all_reduce(&mut w, ReduceOp::Sum);
            if c.ok("parent all_reduce among group operations", r) {
                c.expect("parent all_reduce among group operations", verify::first_wrong(&w, |_| n as f64));
            }
        }
    }
    let t = Instant::now();
    for (j, on_a, want, w) in works {
        let what = format!("overlapping op #{j} on {}", if on_a { "the reversed world" } else { "the parity group" });
        match w.wait() {
            Ok(v) => c.expect(&what, verify::first_wrong(&v, |i| want[i])),
            Err(e) => c.failed.push(format!("{what}: {e} after {:.1}s", t.elapsed().as_secs_f64())),
        }
    }
    drop((a, b, split));

    // A group whose last handle goes while its operation is in flight: the drop waits for the
    // operation, which completes, and the group says its goodbye (no rank sees a death).
    match c.comm.new_group(&(0..n).collect::<Vec<_>>()) {
        Ok(Some(g)) => {
            let w = g.all_reduce_async(vec![1i64; 1 << 16], ReduceOp::Sum);
            drop(g);
            // Dropping the last handle finishes what was issued on this thread, which is also
            // where the group's goodbye is said; an operation that kept the group alive would
            // tear it down on its own engine thread instead, stuck, and the goodbye never sent.
            if !w.is_completed() {
                c.failed.push("dropping a group returned before its operation completed".into());
            }
            match w.wait() {
                Ok(v) => c.expect("an operation outliving its group's handle", verify::first_wrong(&v, |_| n as f64)),
                Err(e) => c.failed.push(format!("an operation outliving its group's handle: {e}")),
            }
        }
        other => c.failed.push(format!("a world-sized group: {:?}", other.err())),
    }
    let r = c.comm.barrier();
    c.ok("barrier after a group dropped in flight", r);
    c
}

/// Rank 0 asks for a different group than the others: every rank must fail, naming both calls.
pub fn scenario_group_mismatch(comm: Communicator) -> ExitCode {
    let (n, r) = (comm.size(), comm.rank());
    let list: Vec<usize> = if r == 0 { (0..n).collect() } else { (0..n - 1).collect() };
    let t = Instant::now();
    match comm.new_group(&list) {
        Err(e @ Error::Mismatch(_)) => {
            println!("rank {r}: GROUP-MISMATCH after {:.2}s: {e}", t.elapsed().as_secs_f64());
        }
        other => {
            println!("rank {r}: new_group with different lists returned {:?}", other.map(|g| g.is_some()));
            return ExitCode::from(1);
        }
    }
    // A split where the others make a group: also a mismatch, and the communicator goes on.
    let g =
        if r == 0 { comm.split(Some(0), 0).map(|g| g.is_some()) } else { comm.new_group(&[0]).map(|g| g.is_some()) };
    match g {
        Err(e @ Error::Mismatch(_)) => println!("rank {r}: SPLIT-MISMATCH: {e}"),
        other => {
            println!("rank {r}: split against new_group returned {other:?}");
            return ExitCode::from(1);
        }
    }
    let mut v = vec![1.0f32; 8];
    match comm.all_reduce(&mut v, ReduceOp::Sum) {
        Ok(()) if v.iter().all(|&x| x == n as f32) => ExitCode::SUCCESS,
        other => {
            println!("rank {r}: all_reduce after the mismatch: {other:?} {v:?}");
            ExitCode::from(1)
        }
    }
}

//! Sub-communicators, fusion and priorities, as real multi-process jobs.

mod common;

use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(120);

/// Memberships of every shape, splits, nested and overlapping groups, for world sizes 1 to 8.
#[test]
fn groups_and_splits_every_world_size() {
    for n in 1..=8 {
        run_checks(n, "groups", "auto", "30", LIMIT);
    }
}

#[test]
fn groups_over_tcp() {
    run_checks(4, "groups", "tcp", "30", LIMIT);
}

/// Different rank lists, or a split against a new_group: every rank fails with the same
/// message naming both calls, and the parent communicator goes on working.
#[test]
fn mismatched_group_creation_fails_on_every_rank() {
    let n = 3;
    let out = run_job(n, &["group-mismatch"], &[("CONFLUX_TIMEOUT_S", "20")], LIMIT);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    for tag in ["GROUP-MISMATCH", "SPLIT-MISMATCH"] {
        let lines: Vec<&str> = t.lines().filter(|l| l.contains(tag)).collect();
        assert_eq!(lines.len(), n, "every rank reports {tag}:\n{t}");
        let msg = |l: &str| l.split("ranks disagree: ").nth(1).unwrap_or("").to_string();
        assert!(lines.iter().all(|l| msg(l) == msg(lines[0])), "ranks tell the same story:\n{t}");
    }
    assert!(t.contains("rank 0 called new_group([0, 1, 2]), rank 1 called new_group([0, 1])"), "{t}");
    assert!(t.contains("rank 0 called split(color=0, key=0), rank 1 called new_group([0])"), "{t}");
}

/// Coalesced all_reduce against an exact reference; the Bucketer bitwise equal to per-tensor
/// all_reduce where the reduction order is the same (one host's shared segment), and equal to
/// rounding over TCP's ring.
#[test]
fn fusion_matches_per_tensor_all_reduce() {
    run_checks(4, "fusion", "auto", "30", LIMIT);
    run_checks(8, "fusion", "shm", "30", LIMIT);
    run_checks(3, "fusion", "tcp", "30", LIMIT);
    let ring = run_job(4, &["fusion"], &[("CONFLUX_ALGO", "ring"), ("CONFLUX_TIMEOUT_S", "30")], LIMIT);
    assert_all_passed(&ring, 4);
}

/// A small high-priority all_reduce overtakes a 256 MiB normal one issued before it; normal
/// operations keep their issue order; all results are right.
#[test]
fn high_priority_overtakes_a_large_transfer() {
    run_checks(2, "priority", "shm", "60", LIMIT);
    run_checks(2, "priority", "tcp", "60", LIMIT);
}

/// The README's example (groups, fusion and priorities included) runs as a real job.
#[test]
fn readme_example_runs() {
    // `cargo test` builds the examples next to the binaries it tests.
    let bin_dir = std::path::Path::new(CONFLUX).parent().unwrap();
    let example = bin_dir.join("examples/quickstart");
    assert!(example.exists(), "{} was not built", example.display());
    for n in [1, 4] {
        let child = std::process::Command::new(CONFLUX)
            .args(["run", "-n", &n.to_string(), "--"])
            .arg(&example)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let (out, _) = wait_output(child, LIMIT);
        let t = text(&out);
        assert!(out.status.success(), "{t}");
        assert_eq!(t.lines().filter(|l| l.contains(": ok (")).count(), n, "{t}");
    }
}

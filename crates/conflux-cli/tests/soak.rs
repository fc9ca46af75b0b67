//! `conflux soak` as users run it: real ranks, random collectives, every result checked.

mod common;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(60);

/// `conflux soak -n 3 --seconds S ARGS` with extra environment.
fn soak(seconds: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(CONFLUX);
    // Small buffers: this is the debug build, whose reference checks are slow.
    cmd.args(["soak", "-n", "3", "--seconds", seconds, "--max-bytes", "64K"]).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.env("CONFLUX_TIMEOUT_S", "20");
    wait_output(cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap(), LIMIT).0
}

/// The number after `key` on the report line that starts with `key`.
fn number(t: &str, key: &str) -> u64 {
    let line = t.lines().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("no {key:?} line:\n{t}"));
    line[key.len()..].split_whitespace().next().unwrap().parse().unwrap()
}

fn assert_clean_soak(out: &Output) {
    let t = text(out);
    assert!(out.status.success(), "soak failed ({}):\n{t}", out.status);
    assert!(number(&t, "ops total:") >= 100, "too few calls ran:\n{t}");
    assert!(number(&t, "checked:") > 0, "nothing was checked:\n{t}");
    assert_eq!(number(&t, "wrong:"), 0, "{t}");
    for r in 0..3 {
        assert!(t.contains(&format!("rss rank {r}: start ")), "rank {r}'s RSS is missing:\n{t}");
    }
    // Every kind of call ran at least once.
    let ops = t.lines().find(|l| l.starts_with("ops (calls")).unwrap();
    for kind in ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "all_to_all_v"] {
        let n: u64 = ops.split(&format!(" {kind} ")).nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
        assert!(n > 0, "no {kind} ran:\n{t}");
    }
    assert!(t.contains("result: PASS"), "{t}");
}

#[test]
fn soak_over_shared_memory() {
    assert_clean_soak(&soak("4", &[], &[]));
}

#[test]
fn soak_over_tcp() {
    assert_clean_soak(&soak("4", &[], &[("CONFLUX_TRANSPORT", "tcp")]));
}

/// One damaged element on one rank: the checker counts it and the job fails.
#[test]
fn a_corrupted_result_is_caught() {
    let out = soak("2", &["--seed", "42"], &[("CONFLUX_SOAK_CORRUPT", "1")]);
    let t = text(&out);
    assert!(!out.status.success(), "soak passed despite a corrupted result:\n{t}");
    assert_eq!(number(&t, "wrong:"), 1, "{t}");
    assert!(t.contains("result: FAIL (1 wrong results)"), "{t}");
    assert!(t.contains("rank 2: wrong result: "), "the damaged rank says where:\n{t}");
}

/// Bad options get a clear message and a failing exit, not a panic or a hang.
#[test]
fn bad_options_are_refused() {
    for (args, msg) in
        [(&["--max-bytes", "lots"][..], "bad --max-bytes"), (&["--seconds", "0"][..], "--seconds must be")]
    {
        let mut cmd = Command::new(CONFLUX);
        cmd.args(["soak", "-n", "2"]).args(args);
        let out = wait_output(cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap(), LIMIT).0;
        let t = text(&out);
        assert!(!out.status.success() && t.contains(msg), "{args:?}:\n{t}");
        assert!(!t.contains("panicked"), "{t}");
    }
}

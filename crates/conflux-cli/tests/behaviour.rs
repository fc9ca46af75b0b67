//! Async issue order, tagged point-to-point, bad arguments, dead peers and mismatched calls,
//! each over both link types.

mod common;

use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(120);

fn job(n: usize, scenario: &str, transport: &str) {
    run_checks(n, scenario, transport, "30", LIMIT);
}

#[test]
fn async_in_issue_order() {
    for t in ["shm", "tcp"] {
        job(3, "async", t);
    }
}

#[test]
fn point_to_point_tags_and_pipeline() {
    for (n, t) in [(2, "shm"), (3, "shm"), (3, "tcp"), (4, "tcp")] {
        job(n, "p2p", t);
    }
}

#[test]
fn bad_arguments_are_typed_errors() {
    job(1, "errors", "auto");
    job(3, "errors", "shm");
    job(2, "errors", "tcp");
}

/// A rank SIGKILLed mid-collective: every other rank fails within 5 s naming it, and no
/// shared memory is left behind.
fn killed_rank(transport: &str, mode: &str) {
    let before = shm_entries();
    let (n, victim) = (4, 2);
    let children = spawn_ranks(n, &["kill", &victim.to_string(), mode], |_| {
        vec![("CONFLUX_TRANSPORT".into(), transport.into()), ("CONFLUX_TIMEOUT_S".into(), "60".into())]
    });
    for (r, child) in children.into_iter().enumerate() {
        let (out, _) = wait_output(child, Duration::from_secs(60));
        let t = text(&out);
        if r == victim {
            assert!(!out.status.success(), "the victim should have died:\n{t}");
        } else {
            assert!(out.status.success(), "rank {r} did not detect the dead rank in time:\n{t}");
            assert!(t.contains(&format!("DETECTED rank {victim}")), "rank {r}:\n{t}");
        }
    }
    assert_eq!(shm_entries(), before, "/dev/shm changed");
}

/// A rank that shuts down cleanly and returns while the others wait for it in a collective:
/// they fail within 5 s naming it (its goodbye reaches them through the store), including
/// when it is rank 0, which serves the store and waits for everyone's goodbye.
fn left_rank(transport: &str, victim: usize, elems: usize, how: &str) {
    let n = 3;
    let children = spawn_ranks(n, &["leave", &victim.to_string(), &elems.to_string(), how], |_| {
        vec![("CONFLUX_TRANSPORT".into(), transport.into()), ("CONFLUX_TIMEOUT_S".into(), "60".into())]
    });
    for (r, child) in children.into_iter().enumerate() {
        let (out, took) = wait_output(child, Duration::from_secs(60));
        let t = text(&out);
        assert!(out.status.success(), "rank {r} (victim {victim}, {transport}) after {took:?}:\n{t}");
        if r != victim {
            assert!(t.contains(&format!("DETECTED rank {victim}")), "rank {r}:\n{t}");
        }
    }
}

#[test]
fn a_rank_that_leaves_early_is_named_not_waited_for() {
    for transport in ["shm", "tcp"] {
        left_rank(transport, 1, 1000, "all_reduce");
        left_rank(transport, 0, 1000, "all_reduce");
    }
}

/// The others are stuck sending the leaver 16 MiB, more than its socket buffers hold, while
/// its process lingers (rank 0 waits for the others' goodbyes) and they receive nothing from
/// it: the end of its TCP stream, not the timeout, must tell them.
#[test]
fn a_rank_that_leaves_while_others_send_it_megabytes_is_named() {
    left_rank("tcp", 0, 4 << 20, "send");
    left_rank("tcp", 1, 4 << 20, "send");
    left_rank("tcp", 0, 4 << 20, "all_reduce");
}

#[test]
fn killed_rank_shm() {
    killed_rank("shm", "");
}

#[test]
fn killed_rank_tcp() {
    killed_rank("tcp", "");
}

/// The same inside a group whose ranks are numbered differently from the job's: members and
/// the non-member waiting elsewhere all name the dead rank by its global rank.
#[test]
fn killed_rank_in_a_group() {
    killed_rank("shm", "group");
    killed_rank("tcp", "group");
}

/// Mismatched lengths: an error on every rank well before the timeout, never a hang.
fn mismatch(transport: &str, algo: &str) {
    let n = 3;
    let children = spawn_ranks(n, &["mismatch"], |_| {
        vec![
            ("CONFLUX_TRANSPORT".into(), transport.into()),
            ("CONFLUX_ALGO".into(), algo.into()),
            ("CONFLUX_TIMEOUT_S".into(), "30".into()),
        ]
    });
    for (r, child) in children.into_iter().enumerate() {
        let (out, took) = wait_output(child, Duration::from_secs(60));
        let t = text(&out);
        assert!(out.status.success() && t.contains("MISMATCH-ERROR"), "rank {r}:\n{t}");
        assert!(took < Duration::from_secs(20), "rank {r} took {took:?}:\n{t}");
    }
}

#[test]
fn mismatched_lengths_shm_direct() {
    mismatch("shm", "auto");
}

#[test]
fn mismatched_lengths_ring() {
    mismatch("tcp", "ring");
    mismatch("shm", "ring");
}

/// Rank 1 makes another call than the others, differing in one respect: every rank fails
/// within seconds (in that call, or the next if its own part could finish), and its error
/// shows the odd call.
#[test]
fn mismatched_calls_fail_every_rank_showing_both() {
    let kinds = [
        ("op", "broadcast(float x 1000, root=1)"),
        ("root", "root="),
        ("dtype", "all_reduce(int32 x 1000, sum)"),
        ("redop", "all_reduce(float x 1000, max)"),
        ("count", "all_reduce(float x 999, sum)"),
        ("inline", "all_reduce(float x 13, sum)"),
        ("inline_bound", "all_reduce(float x 83, sum)"),
        ("gather", "all_gather(float x 21"),
        ("gather_bound", "all_gather(float x 249"),
        ("alltoall", "all_to_all(float x 18"),
        ("alltoall_bound", "all_to_all(float x 84"),
        ("alltoall_algo", "by pairwise"),
        ("scatter", "reduce_scatter(float x 903"),
        ("algo", "by ring"),
    ];
    for transport in ["shm", "tcp"] {
        // Over TCP the direct side cannot serve at all: that is an InvalidArgument, not a mismatch.
        for (kind, odd_call) in kinds.into_iter().filter(|&(k, _)| !(k == "alltoall_algo" && transport == "tcp")) {
            for (t, ctx) in mismatch_reports(3, kind, transport) {
                assert!(t.contains(odd_call), "the error does not show {odd_call:?}: {ctx}");
            }
        }
    }
}

/// The same at two ranks over shared memory, where a rank that sent the peer its message of
/// the call and finds nothing unread from it skips the peer's call board on leaving
/// (`Link::spares_board`): ranks that disagree on a broadcast's root (each only sends), and
/// a broadcast against an all_reduce (direct rounds, no message), must still fail both ranks,
/// and with two roots one of them in the call itself, not only when the next call meets the
/// other's message (both skipping the board would leave that to the next call).
#[test]
fn mismatched_calls_at_two_ranks_fail_both() {
    for (kind, odd_call) in [("root", "root="), ("op", "broadcast(float x 1000, root=1)"), ("count", "x 999")] {
        for _ in 0..if kind == "root" { 5 } else { 1 } {
            let reports = mismatch_reports(2, kind, "shm");
            for (t, ctx) in &reports {
                assert!(t.contains(odd_call), "the error does not show {odd_call:?}: {ctx}");
            }
            if kind == "root" {
                let ctx: Vec<&str> = reports.iter().map(|(_, c)| c.as_str()).collect();
                assert!(reports.iter().any(|(t, _)| t.contains("in the call")), "{ctx:?}");
            }
        }
    }
}

/// Runs `conflux-check calls KIND` on `n` ranks over `transport`: every rank must report the
/// mismatch, within 20 s. Returns each rank's output, and it with its context for messages.
fn mismatch_reports(n: usize, kind: &str, transport: &str) -> Vec<(String, String)> {
    let children = spawn_ranks(n, &["calls", kind], |_| {
        vec![("CONFLUX_TRANSPORT".into(), transport.into()), ("CONFLUX_TIMEOUT_S".into(), "30".into())]
    });
    let mut reports = Vec::new();
    for (r, child) in children.into_iter().enumerate() {
        let (out, took) = wait_output(child, Duration::from_secs(60));
        let t = text(&out);
        let ctx = format!("rank {r}, {kind} over {transport}, after {took:?}:\n{t}");
        assert!(out.status.success() && t.contains("CALL-MISMATCH"), "{ctx}");
        assert!(took < Duration::from_secs(20), "{ctx}");
        reports.push((t, ctx));
    }
    reports
}

/// A mismatched call whose message a posted point-to-point receive reads aside first: the
/// collective that takes it from there must still compare the calls. Unchecked, over TCP
/// (which has no call board to fall back on) rank 1 reduced rank 0's max data as its sum and
/// both ranks went on without a word.
#[test]
fn a_mismatched_message_read_aside_by_a_posted_receive_still_fails_the_call() {
    for transport in ["shm", "tcp"] {
        for (t, ctx) in mismatch_reports(2, "stashed", transport) {
            assert!(t.contains("max") && t.contains("sum"), "the error does not show both calls: {ctx}");
        }
    }
}

/// A rank stopped by SIGSTOP (alive, silent): the others fail at their 2 s deadline naming it,
/// each dumping its flight recorder (the call it waits in, and where its local peers are) to
/// stderr and to CONFLUX_DUMP_DIR.
#[test]
fn a_stopped_rank_is_named_at_the_deadline_with_flight_recorders() {
    for transport in ["shm", "tcp"] {
        let dir = std::env::temp_dir().join(format!("conflux-dump-{}-{transport}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (n, victim) = (3, 2);
        let mut children = spawn_ranks(n, &["stuck", &victim.to_string()], |_| {
            vec![
                ("CONFLUX_TRANSPORT".into(), transport.into()),
                ("CONFLUX_TIMEOUT_S".into(), "2".into()),
                ("CONFLUX_DUMP_DIR".into(), dir.display().to_string()),
            ]
        });
        let mut stopped = children.remove(victim);
        for (r, child) in children.into_iter().enumerate() {
            let (out, took) = wait_output(child, Duration::from_secs(60));
            let (t, err) = (text(&out), String::from_utf8_lossy(&out.stderr).into_owned());
            let ctx = format!("rank {r} over {transport} after {took:?}:\n{t}");
            assert!(out.status.success() && t.contains("STUCK-DETECTED"), "{ctx}");
            assert!(t.contains(&format!("waiting for rank(s) [{victim}]")), "{ctx}");
            assert!(err.contains("conflux flight recorder") && err.contains("#6 all_reduce"), "{ctx}");
            assert!(err.contains("not finished") && err.contains("#5 all_reduce(float x 1000, sum)"), "{ctx}");
            if transport == "shm" {
                assert!(err.contains(&format!("local rank {victim} last entered #5")), "{ctx}");
            }
            let file = dir.join(format!("conflux-rank{r}-conflux-lane0.txt"));
            let dumped = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}\n{ctx}", file.display()));
            assert!(dumped.contains("#6 all_reduce"), "{dumped}");
        }
        let _ = stopped.kill();
        let _ = stopped.wait();
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// abort() from another thread ends the pending operation at once and every later one without
/// waiting; the other ranks fail naming the abort, long before their 30 s deadline.
#[test]
fn abort_unblocks_this_rank_and_is_named_on_the_others() {
    for transport in ["shm", "tcp"] {
        for victim in [0, 1] {
            let children = spawn_ranks(3, &["abort", &victim.to_string()], |_| {
                vec![("CONFLUX_TRANSPORT".into(), transport.into()), ("CONFLUX_TIMEOUT_S".into(), "30".into())]
            });
            for (r, child) in children.into_iter().enumerate() {
                let (out, took) = wait_output(child, Duration::from_secs(60));
                let t = text(&out);
                let ctx = format!("rank {r} (victim {victim}, {transport}) after {took:?}:\n{t}");
                assert!(out.status.success(), "{ctx}");
                assert!(took < Duration::from_secs(10), "{ctx}");
                if r == victim {
                    assert!(t.contains("ABORT-UNBLOCKED") && t.contains("FUTURE-FAILED"), "{ctx}");
                } else {
                    assert!(t.contains("PEER-SAW-ABORT") && t.contains(&format!("aborted by rank {victim}")), "{ctx}");
                }
            }
        }
    }
}

/// 4 ranks, one SIGKILLed mid-all_reduce: the 3 survivors shrink to a communicator of
/// themselves (order kept, renumbered) and complete 100 more collectives correctly.
#[test]
fn survivors_shrink_and_go_on() {
    for transport in ["shm", "tcp"] {
        let victim = 2;
        let children = spawn_ranks(4, &["shrink", &victim.to_string()], |_| {
            vec![("CONFLUX_TRANSPORT".into(), transport.into()), ("CONFLUX_TIMEOUT_S".into(), "30".into())]
        });
        for (r, child) in children.into_iter().enumerate() {
            let (out, took) = wait_output(child, Duration::from_secs(60));
            let t = text(&out);
            if r == victim {
                assert!(!out.status.success(), "the victim should have died:\n{t}");
                continue;
            }
            let ctx = format!("rank {r} over {transport} after {took:?}:\n{t}");
            let new_rank = if r < victim { r } else { r - 1 };
            let done = format!("SHRUNK to 3 ranks [0, 1, 3] as rank {new_rank}: 100 collectives correct");
            assert!(out.status.success() && t.contains(&done), "{ctx}");
        }
    }
}

/// `conflux run` stops the job within 5 s of a rank's death and names that rank.
#[test]
fn launcher_names_the_dead_rank() {
    let child = std::process::Command::new(CONFLUX)
        .args(["run", "-n", "3", "--", CHECK, "kill", "1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (out, took) = wait_output(child, Duration::from_secs(60));
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(t.contains("rank 1"), "the launcher should name rank 1:\n{t}");
    assert!(took < Duration::from_secs(10), "took {took:?}:\n{t}");
}

/// `conflux bench` stops within 5 s of one of its ranks being SIGKILLed, and names it.
#[test]
fn bench_names_the_killed_rank() {
    let child = std::process::Command::new(CONFLUX)
        .args(["bench", "all_reduce", "-n", "3", "-b", "16M", "-e", "16M", "--iters", "100000"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let victim = find_rank_process(child.id(), 1, Duration::from_secs(30));
    // Let the ranks get into the timed loop before the kill.
    std::thread::sleep(Duration::from_millis(500));
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(victim as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    let killed_at = std::time::Instant::now();
    let (out, _) = wait_output(child, Duration::from_secs(60));
    let took = killed_at.elapsed();
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(t.contains("rank 1"), "bench should name rank 1:\n{t}");
    assert!(took < Duration::from_secs(5), "took {took:?}:\n{t}");
}

/// The pid of the child of `parent` whose environment has RANK=`rank`.
fn find_rank_process(parent: u32, rank: usize, limit: Duration) -> u32 {
    let want = format!("RANK={rank}");
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        for e in std::fs::read_dir("/proc").unwrap().filter_map(|e| e.ok()) {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // Field 4 of stat, after the parenthesised command name, is the parent pid.
            let ppid =
                stat.rsplit(')').next().and_then(|r| r.split_whitespace().nth(1)).and_then(|p| p.parse::<u32>().ok());
            if ppid != Some(parent) {
                continue;
            }
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            if env.split(|&b| b == 0).any(|kv| kv == want.as_bytes()) {
                return pid;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("no rank {rank} process under {parent}");
}

/// `CONFLUX_BIND=core`: every rank on one CPU, consecutive ranks in blocks, and collectives
/// still right (the ranks then judge their node's cores from all their CPUs together).
#[test]
fn bound_ranks_sit_on_one_core_each_in_blocks_and_still_agree() {
    let mut cmd = std::process::Command::new(CONFLUX);
    cmd.args(["run", "-n", "4", "--", "sh", "-c", "grep Cpus_allowed_list /proc/self/status"]);
    let child = cmd.env("CONFLUX_BIND", "core").stdout(std::process::Stdio::piped()).spawn().unwrap();
    let (out, _) = wait_output(child, LIMIT);
    assert!(out.status.success(), "{}", text(&out));
    let mut cpus: Vec<(usize, usize)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            // "[RANK]: Cpus_allowed_list:\tCPU": one CPU, no range or list.
            let rank = l[1..l.find(']').unwrap()].parse().unwrap();
            let cpu = l.rsplit('\t').next().unwrap().trim().parse().unwrap_or_else(|_| panic!("not one CPU: {l}"));
            (rank, cpu)
        })
        .collect();
    cpus.sort();
    assert_eq!(cpus.len(), 4, "{}", text(&out));
    assert!(cpus.windows(2).all(|w| w[0].1 <= w[1].1), "not in blocks: {cpus:?}");
    if std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2 {
        assert_ne!(cpus[0].1, cpus[3].1, "all on one CPU: {cpus:?}");
    }
    let out = run_job(4, &["quick"], &[("CONFLUX_BIND", "core"), ("CONFLUX_TIMEOUT_S", "60")], LIMIT);
    assert_all_passed(&out, 4);
}

/// CONFLUX_TCP_INFLIGHT is a real window: a sender has at most `inflight x chunk` bytes
/// written and not yet read by its peer. Rank 1 reads a 1 MiB message only after 1 s. With a
/// 64 KiB window rank 0's send must wait for that; with a 4 MiB window it returns at once, as
/// the socket buffers (4 MiB asked, twice that granted) take the whole message, so what held
/// the first send was the window and not the kernel. Every byte must arrive in both.
#[test]
fn the_tcp_window_holds_a_sender_until_its_peer_reads() {
    let sent_in = |inflight: &str| -> f64 {
        let env = [
            ("CONFLUX_TRANSPORT", "tcp"),
            ("CONFLUX_TCP_CHUNK", "16384"),
            ("CONFLUX_TCP_INFLIGHT", inflight),
            ("CONFLUX_SOCKET_BUF", "4194304"),
        ];
        let out = run_job(2, &["window", "1048576", "1000"], &env, LIMIT);
        let t = text(&out);
        assert!(out.status.success() && t.contains("RECEIVED-OK"), "inflight {inflight}:\n{t}");
        let secs = t.split("SENT-IN ").nth(1).and_then(|s| s.split_whitespace().next()).and_then(|s| s.parse().ok());
        secs.unwrap_or_else(|| panic!("no SENT-IN in:\n{t}"))
    };
    let held = sent_in("4");
    let free = sent_in("256");
    assert!(held >= 0.7, "a 64 KiB window let a 1 MiB send finish in {held:.3}s, before its peer read");
    assert!(free < 0.5, "a 4 MiB window held a 1 MiB send for {free:.3}s");
}

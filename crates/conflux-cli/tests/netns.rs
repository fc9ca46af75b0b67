//! Jobs across "hosts" that are network namespaces with their own addresses, built by
//! scripts/netns-cluster: shared memory inside a node, TCP over a veth and a bridge between
//! nodes, optionally rate-limited (tc tbf) and lossy (nftables). Needs root; without it each
//! test says it was skipped, unless CONFLUX_REQUIRE_NETNS=1 makes that a failure.
//!
//! Every invocation of the script has its own namespaces and network stacks, so these tests
//! run in parallel threads without clashing.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

const CHECK: &str = env!("CARGO_BIN_EXE_conflux-check");
const CONFLUX: &str = env!("CARGO_BIN_EXE_conflux");

/// Past this the script gets SIGTERM (its trap removes the namespaces), then SIGKILL.
const LIMIT: Duration = Duration::from_secs(120);

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/netns-cluster")
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

/// Whether the netns tests can run here: root, and `tools` installed. When they cannot, says
/// so and returns false, or panics when CONFLUX_REQUIRE_NETNS=1 (CI) demands they run.
fn netns_available(tools: &[&str]) -> bool {
    let required = std::env::var("CONFLUX_REQUIRE_NETNS").is_ok_and(|v| v == "1");
    let missing = if !rustix::process::geteuid().is_root() {
        "root for network namespaces".to_string()
    } else if let Some(t) = tools.iter().find(|t| !on_path(t)) {
        format!("'{t}' installed")
    } else {
        return true;
    };
    assert!(!required, "CONFLUX_REQUIRE_NETNS=1 but this test needs {missing}");
    println!("skipped: needs {missing}");
    false
}

/// Runs `scripts/netns-cluster --nodes N --nproc P EXTRA... -- CMD...` with this build's
/// binaries (`conflux` for --nproc; CMD's first word `conflux`/`conflux-check` means the same
/// binaries too) and returns its output, which it also prints. Fails the test if it does not
/// finish within LIMIT.
fn cluster(nodes: usize, nproc: usize, extra: &[&str], cmd: &[&str]) -> Output {
    cluster_with(nodes, nproc, extra, cmd, &[])
}

/// `cluster` with `env` added to every node's launcher (and so to its ranks).
fn cluster_with(nodes: usize, nproc: usize, extra: &[&str], cmd: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd: Vec<&str> = cmd.to_vec();
    match cmd.first() {
        Some(&"conflux") => cmd[0] = CONFLUX,
        Some(&"conflux-check") => cmd[0] = CHECK,
        _ => {}
    }
    let mut child = Command::new("bash")
        .arg(script())
        .args(["--nodes", &nodes.to_string(), "--nproc", &nproc.to_string(), "--conflux", CONFLUX])
        .args(extra)
        .arg("--")
        .args(&cmd)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting scripts/netns-cluster");
    // Drained by threads so that a chatty job cannot block on a full pipe.
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let out_t = drain(Box::new(child.stdout.take().unwrap()));
    let err_t = drain(Box::new(child.stderr.take().unwrap()));
    let start = Instant::now();
    let mut timed_out = false;
    let status: ExitStatus = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        let waited = start.elapsed();
        if waited > LIMIT && !timed_out {
            timed_out = true;
            let pid = rustix::process::Pid::from_child(&child);
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        } else if waited > LIMIT + Duration::from_secs(20) {
            let _ = child.kill();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = Output { status, stdout: out_t.join().unwrap(), stderr: err_t.join().unwrap() };
    let t = text(&out);
    println!("{t}");
    assert!(!timed_out, "netns-cluster --nodes {nodes} --nproc {nproc} {extra:?} timed out after {LIMIT:?}:\n{t}");
    out
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Asserts a `conflux bench --check` job succeeded on `nodes` x `nproc` ranks, showed every op
/// in `ops`, and had no wrong element in any row.
fn assert_bench_ok(out: &Output, nodes: usize, nproc: usize, ops: &[&str]) {
    let t = text(out);
    assert!(out.status.success(), "job failed ({}):\n{t}", out.status);
    let header = format!("# conflux bench: {} ranks ({nproc} on this host)", nodes * nproc);
    assert!(t.contains(&header), "expected {header:?}:\n{t}");
    for op in ops {
        assert!(t.lines().any(|l| l.ends_with(&format!("# {op}"))), "no {op} table:\n{t}");
    }
    let rows: Vec<&str> = t
        .lines()
        .filter_map(|l| l.strip_prefix("[node 0] [0]:"))
        .filter(|l| l.split_whitespace().next().is_some_and(|w| w.parse::<u64>().is_ok()))
        .collect();
    assert!(!rows.is_empty(), "no result rows:\n{t}");
    for r in rows {
        assert_eq!(r.split_whitespace().last(), Some("0"), "wrong elements in {r:?}:\n{t}");
    }
}

const ALL: &[&str] = &["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "reduce", "sendrecv"];
const BENCH_ALL: &[&str] = &["conflux", "bench", "all", "-b", "8", "-e", "256K", "-f", "8", "--check"];

#[test]
fn two_nodes_of_two() {
    if netns_available(&["ip"]) {
        assert_bench_ok(&cluster(2, 2, &[], BENCH_ALL), 2, 2, ALL);
    }
}

#[test]
fn four_nodes_of_one() {
    if netns_available(&["ip"]) {
        assert_bench_ok(&cluster(4, 1, &[], BENCH_ALL), 4, 1, ALL);
    }
}

/// 5% of each node's packets dropped each way on a 200mbit link: TCP retransmits, the results
/// must still be exact.
#[test]
fn lossy_slow_link() {
    if netns_available(&["ip", "tc", "nft"]) {
        let cmd = ["conflux", "bench", "all_reduce", "-b", "8", "-e", "1M", "-f", "16", "--check"];
        let out = cluster(2, 1, &["--drop", "5", "--rate", "200mbit"], &cmd);
        assert_bench_ok(&out, 2, 1, &["all_reduce"]);
    }
}

/// Every algorithm forced on every collective it serves, against the reference, across
/// network namespaces: the hierarchical all_reduce must serve (several pipelined segments
/// included), and each node's summaries must all pass.
fn assert_algos_ok(nodes: usize, nproc: usize) {
    let out = cluster(nodes, nproc, &[], &["conflux-check", "algos-quick", "hier"]);
    let t = text(&out);
    assert!(out.status.success(), "job failed ({}):\n{t}", out.status);
    let summaries: Vec<&str> = t.lines().filter(|l| l.contains(": algos-quick: ")).collect();
    assert_eq!(summaries.len(), nodes * nproc, "one summary per rank:\n{t}");
    assert!(summaries.iter().all(|s| s.contains(", 0 failed")), "a rank failed checks:\n{t}");
    let hier = t.lines().find(|l| l.contains("algos: hier: ")).unwrap_or_else(|| panic!("no hier line:\n{t}"));
    assert!(!hier.contains("algos: hier: 0 checks"), "hier served nothing:\n{t}");
}

#[test]
fn every_algorithm_on_two_nodes_of_two() {
    if netns_available(&["ip"]) {
        assert_algos_ok(2, 2);
    }
}

#[test]
fn every_algorithm_on_four_nodes_of_one() {
    if netns_available(&["ip"]) {
        assert_algos_ok(4, 1);
    }
}

/// Three nodes of one rank, node 2's link throttled to 50mbit and the others unshaped:
/// `conflux doctor` must flag exactly the two pairs that involve node 2 (rank 2) and fail.
/// Threshold 0.25: the throttled pairs come out ~100x below the others, while the 2-core
/// machine's scheduling can stretch a healthy pair's latency past 2x, never 4x.
#[test]
fn doctor_flags_exactly_the_throttled_nodes_pairs() {
    if netns_available(&["ip", "tc"]) {
        let cmd = ["conflux", "doctor", "--bytes", "256K", "--iters", "5", "--threshold", "0.25"];
        let out = cluster(3, 1, &["--rate-node", "2=50mbit"], &cmd);
        let t = text(&out);
        assert!(!out.status.success(), "doctor passed a throttled node:\n{t}");
        assert!(t.contains("exited with status 3"), "rank 0 did not report unhealthy links:\n{t}");
        let flagged: Vec<(usize, usize)> = t
            .lines()
            .filter_map(|l| l.split("SLOW: ranks ").nth(1))
            .map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                (w[0].parse().unwrap(), w[2].parse().unwrap())
            })
            .collect();
        assert_eq!(flagged, [(0, 2), (1, 2)], "wrong pairs flagged:\n{t}");
        assert!(t.contains("2 of 3 links flagged"), "no verdict:\n{t}");
    }
}

/// A rank that sends its last message and leaves at once, over a 2 Mbit/s link: its goodbye
/// (through the store) overtakes the message's last second of bytes, and the receiver must
/// take the goodbye as a clue only, receiving every byte before the stream's end.
#[test]
fn a_last_message_outlives_its_senders_goodbye() {
    if !netns_available(&["ip", "tc"]) {
        return;
    }
    let out = cluster(2, 1, &["--rate", "2mbit"], &["conflux-check", "send-and-leave", "262144"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.lines().any(|l| l.starts_with("[node 1]") && l.contains("LAST-BYTES-OK")), "{t}");
}

/// A host whose link goes down mid-collective (3 nodes x 1 rank, node 1 cut): the ranks on
/// the other hosts fail naming rank 1 within the keep-alive window (about 11 s), not at their
/// 60 s deadline.
#[test]
fn a_cut_link_is_named_within_the_keep_alive_window() {
    if !netns_available(&["ip"]) {
        return;
    }
    let out = cluster(3, 1, &[], &["conflux-check", "cut", "1"]);
    let t = text(&out);
    for node in [0, 2] {
        let line = t
            .lines()
            .find(|l| l.starts_with(&format!("[node {node}]")) && l.contains("CUT-DETECTED"))
            .unwrap_or_else(|| panic!("node {node} did not report:\n{t}"));
        let secs: f64 =
            line.split("after ").nth(1).and_then(|s| s.split('s').next()).and_then(|s| s.parse().ok()).unwrap();
        assert!(secs < 30.0, "node {node} took {secs}s:\n{t}");
        assert!(line.contains("rank 1"), "node {node} did not name rank 1:\n{t}");
    }
    assert!(out.status.success(), "{t}");
}

/// Nodes that share a job token (and name their data interface) run a job over TCP between
/// namespaces; a node holding another token is refused by the store, by name, and the job fails
/// instead of hanging.
#[test]
fn a_token_shared_across_nodes_and_a_node_with_another() {
    if !netns_available(&["ip"]) {
        return;
    }
    let env = [("CONFLUX_JOB_TOKEN", "netns-job"), ("CONFLUX_SOCKET_IFNAME", "eth0"), ("CONFLUX_DEBUG", "debug")];
    let out = cluster_with(2, 2, &[], &["conflux-check", "quick"], &env);
    let t = text(&out);
    assert!(out.status.success(), "job failed ({}):\n{t}", out.status);
    assert_eq!(t.lines().filter(|l| l.contains(" passed, 0 failed")).count(), 4, "every rank passed:\n{t}");
    // One listener per rank and communicator (the scenario makes more than one); the log's
    // colours stripped.
    let mut pieces = t.split('\x1b');
    let head = pieces.next().unwrap_or_default().to_string();
    // Every piece after an escape begins with its "[...m" code.
    let plain = pieces.fold(head, |acc, p| acc + p.split_once('m').map_or(p, |(_, rest)| rest));
    let bound: Vec<&str> = plain.lines().filter(|l| l.contains("data listener bound")).collect();
    for r in 0..4 {
        assert!(bound.iter().any(|l| l.contains(&format!("rank={r} "))), "rank {r} logged no listener:\n{plain}");
    }
    assert!(bound.iter().all(|l| l.contains("addr=10.77.0.") && l.contains("authenticated=true")), "{bound:?}");

    let other = format!("[ \"$NODE_RANK\" = 1 ] && export CONFLUX_JOB_TOKEN=another; exec {CHECK} quick");
    let env = [("CONFLUX_JOB_TOKEN", "netns-job"), ("CONFLUX_TIMEOUT_S", "10")];
    let out = cluster_with(2, 1, &[], &["bash", "-c", &other], &env);
    let t = text(&out);
    assert!(!out.status.success(), "a node with another token joined:\n{t}");
    assert!(t.lines().any(|l| l.starts_with("[node 1]") && l.contains("authentication failed")), "{t}");
    assert!(t.contains("store: refused the connection from 10.77.0.2:"), "node 0 logs the stranger:\n{t}");
}

/// A job that spans nodes prices TCP at its slowest node's link, measured when the communicator
/// is made: 3 nodes at 200mbit but node 2 at 50mbit (6.25 MB/s), so the model's rate is node
/// 2's, within the measurement's noise; rank 0's tuning file, when it has one, replaces the
/// measurement on every rank; and sub-groups across nodes keep the model they were made under.
#[test]
fn the_cost_model_prices_tcp_at_the_slowest_nodes_link() {
    if !netns_available(&["ip", "tc"]) {
        return;
    }
    let shaping = ["--rate", "200mbit", "--rate-node", "2=50mbit"];
    let out = cluster(3, 1, &shaping, &["conflux", "bench", "all_reduce", "-b", "8", "-e", "8", "--check"]);
    assert_bench_ok(&out, 3, 1, &["all_reduce"]);
    let t = text(&out);
    let line = t.lines().find(|l| l.contains("# cost model (")).unwrap_or_else(|| panic!("no cost model line:\n{t}"));
    assert!(line.contains("measured between the nodes"), "{line}");
    let gbps: f64 = line
        .split("tcp ")
        .nth(1)
        .and_then(|s| s.split(" us ").nth(1))
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no tcp rate in {line:?}"));
    // Measured 0.0033-0.0059 in 9 runs: a fresh connection's slow start through tbf's queue
    // costs the short measurement up to half the rate; the others' links carry 0.025.
    assert!((0.002..0.0075).contains(&gbps), "measured {gbps} GB/s where node 2's link carries 0.00625:\n{t}");

    // Only rank 0's tuning file counts, here where the others name a file their host lacks:
    // every rank takes rank 0's parameters and none measures (a rank measuring alone would wait
    // for its peers' probes), and sub-groups, whose first rank is another, read no file at all.
    let file = std::env::temp_dir().join(format!("conflux-netns-tune-{}.txt", std::process::id()));
    std::fs::write(&file, "tcp_gbps = 0.125\n").unwrap();
    let only_rank0 = |cmd: String| {
        let f = file.display();
        format!("export CONFLUX_TUNE_FILE={f}; [ \"$RANK\" = 0 ] || export CONFLUX_TUNE_FILE={f}.absent; exec {cmd}")
    };
    let env = [("CONFLUX_TIMEOUT_S", "30")];
    let bench = only_rank0(format!("{CONFLUX} bench all_reduce -b 8 -e 64K -f 8 --check"));
    let out = cluster_with(2, 2, &[], &["bash", "-c", &bench], &env);
    assert_bench_ok(&out, 2, 2, &["all_reduce"]);
    let t = text(&out);
    assert!(t.contains("# cost model (rank 0's CONFLUX_TUNE_FILE): shm 1 us 4 GB/s, tcp 40 us 0.125 GB/s"), "{t}");
    let out = cluster_with(2, 2, &[], &["bash", "-c", &only_rank0(format!("{CHECK} groups"))], &env);
    let _ = std::fs::remove_file(&file);
    let t = text(&out);
    assert!(out.status.success(), "job failed ({}):\n{t}", out.status);
    assert_eq!(t.lines().filter(|l| l.contains(" passed, 0 failed")).count(), 4, "every rank passed:\n{t}");

    let out = cluster(2, 2, &["--rate", "200mbit"], &["conflux-check", "groups"]);
    let t = text(&out);
    assert!(out.status.success(), "job failed ({}):\n{t}", out.status);
    assert_eq!(t.lines().filter(|l| l.contains(" passed, 0 failed")).count(), 4, "every rank passed:\n{t}");
}

/// Ranks on other hosts put their clocks on rank 0's through the store: network namespaces
/// share one kernel clock, so the offset each measures must be zero within the uncertainty
/// it reports; and the report reads the job.
#[test]
fn trace_clocks_across_hosts_agree_within_their_uncertainty() {
    if !netns_available(&["ip"]) {
        return;
    }
    let dir = std::env::temp_dir().join(format!("conflux-trace-netns-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_str().unwrap();
    let out = cluster_with(2, 1, &[], &["conflux-check", "trace-overlap", "4", "4096", "5"], &[("CONFLUX_TRACE", d)]);
    assert!(out.status.success(), "job failed:\n{}", text(&out));
    for r in 0..2 {
        let meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join(format!("rank-{r}.json"))).unwrap()).unwrap();
        let clock = &meta["clock"];
        let (offset, within) = (clock["offset_ns"].as_i64().unwrap(), clock["uncertainty_ns"].as_i64().unwrap());
        println!("rank {r}: clock {clock}");
        let method = if r == 0 { "same host" } else { "store ping-pong" };
        assert_eq!(clock["method"], method, "rank {r}: {meta:#}");
        assert!(offset.abs() <= within, "rank {r}: offset {offset} ns, uncertainty {within} ns");
        if r == 1 {
            assert!(within > 0 && within < 5_000_000, "rank 1: uncertainty {within} ns");
        }
    }
    let rep = Command::new(CONFLUX).args(["trace", "report", d]).output().unwrap();
    assert!(rep.status.success(), "{}", text(&rep));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `cmd` in a namespace of its own (only loopback) whose nftables count, on output, all
/// TCP bytes, the bytes marked DSCP af41 and the bytes with socket priority 4 (af41's class
/// selector); returns those three byte counts.
fn tcp_bytes_by_mark(tag: &str, env: &[(&str, &str)], cmd: &[&str]) -> [u64; 3] {
    let ns = format!("cfxdscp-{}-{tag}", std::process::id());
    let sh = |args: &[&str], stdin: Option<&str>| {
        let mut c = Command::new(args[0]);
        c.args(&args[1..]).stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = c.spawn().unwrap_or_else(|e| panic!("{args:?}: {e}"));
        if let Some(s) = stdin {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
        }
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{args:?} failed:\n{}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    sh(&["ip", "netns", "add", &ns], None);
    let run = std::panic::catch_unwind(|| {
        sh(&["ip", "-n", &ns, "link", "set", "lo", "up"], None);
        let rules = "table inet cfx {
            counter tcp_all { }
            counter af41 { }
            counter prio4 { }
            chain out {
                type filter hook output priority 0;
                meta l4proto tcp counter name \"tcp_all\"
                ip dscp af41 counter name \"af41\"
                meta priority 0:4 counter name \"prio4\"
            }
        }\n";
        sh(&["ip", "netns", "exec", &ns, "nft", "-f", "-"], Some(rules));
        let mut args = vec!["ip", "netns", "exec", &ns, "env"];
        let pairs: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        args.extend(pairs.iter().map(String::as_str));
        args.extend_from_slice(cmd);
        sh(&args, None);
        let listing = sh(&["ip", "netns", "exec", &ns, "nft", "list", "counters"], None);
        // "counter tcp_all {\n packets 12 bytes 3456\n }" per counter, in the order made.
        let bytes = |name: &str| -> u64 {
            let at = listing.find(&format!("counter {name} ")).unwrap_or_else(|| panic!("no {name}:\n{listing}"));
            let rest = &listing[at..];
            let b = rest.split_whitespace().skip_while(|w| *w != "bytes").nth(1).expect("a byte count");
            b.parse().expect("a number")
        };
        [bytes("tcp_all"), bytes("af41"), bytes("prio4")]
    });
    let _ = Command::new("ip").args(["netns", "del", &ns]).status();
    run.unwrap_or_else(|p| std::panic::resume_unwind(p))
}

#[test]
fn a_traffic_class_marks_every_data_packet() {
    if !netns_available(&["ip", "nft"]) {
        return;
    }
    let job =
        [CONFLUX, "run", "-n", "2", "--", CONFLUX, "bench", "all_reduce", "-b", "4M", "-e", "4M", "-n", "5", "--check"];
    let tcp = ("CONFLUX_TRANSPORT", "tcp");
    let [all, dscp, prio] = tcp_bytes_by_mark("on", &[tcp, ("CONFLUX_TRAFFIC_CLASS", "af41")], &job);
    // 2 ranks x (5 timed + warm-up) all_reduces of 4 MiB, each sending 4 MiB over TCP, and
    // little else (the store, the handshakes).
    assert!(all > 40 << 20, "only {all} TCP bytes went out");
    assert!(dscp as f64 >= 0.99 * all as f64, "{dscp} of {all} TCP bytes were marked af41");
    assert!(prio as f64 >= 0.99 * all as f64, "{prio} of {all} TCP bytes had socket priority 4");
    let [all, dscp, prio] = tcp_bytes_by_mark("off", &[tcp], &job);
    assert!(all > 40 << 20 && dscp == 0 && prio == 0, "unmarked job: {dscp} and {prio} of {all} bytes marked");
}

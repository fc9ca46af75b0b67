//! `conflux bench --algo all --report-auto` as a user runs it: every algorithm of every
//! collective side by side, each result checked, the auto report, the CSV and the plot.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{text, wait_output, CONFLUX};

fn temp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("conflux-bench-test-{}-{name}", std::process::id()))
}

/// Runs `conflux <args>` (CONFLUX_ALGO unset, a 60 s collective deadline) to success within
/// `limit`, and returns what it printed.
fn bench_ok(args: &[&str], limit: Duration) -> String {
    let mut cmd = Command::new(CONFLUX);
    cmd.args(args).env("CONFLUX_TIMEOUT_S", "60").env_remove("CONFLUX_ALGO");
    let out = wait_output(cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap(), limit).0;
    let t = text(&out);
    assert!(out.status.success(), "bench failed ({}):\n{t}", out.status);
    t
}

/// The algorithms `--algo all` must run for each operation at 3 ranks on one host.
const ALGOS: &[(&str, &[&str])] = &[
    ("all_reduce", &["ring", "direct", "tree", "rd", "rabenseifner"]),
    ("all_gather", &["ring", "direct", "rd", "bruck"]),
    ("reduce_scatter", &["ring", "direct", "rd"]),
    ("broadcast", &["tree", "chain", "scatter_allgather"]),
    ("all_to_all", &["pairwise", "direct", "bruck"]),
    ("reduce", &["ring", "tree", "chain"]),
];
const SIZES: [usize; 4] = [8, 128, 2048, 32768];
const ROUNDS: usize = 3;

#[test]
fn every_algorithm_side_by_side_with_the_auto_report_csv_and_plot() {
    let (csv, svg) = (temp("out.csv"), temp("out.svg"));
    let args = [
        "bench",
        "all",
        "-n",
        "3",
        "-b",
        "8",
        "-e",
        "32K",
        "-f",
        "16",
        "--iters",
        "4",
        "--algo",
        "all",
        "--report-auto",
        "--rounds",
        "3",
        "--min-ms",
        "1",
        "--check",
        "--csv",
    ];
    let (csv_arg, svg_arg) = (csv.to_str().unwrap(), svg.to_str().unwrap());
    let t = bench_ok(&[&args[..], &[csv_arg, "--plot", svg_arg]].concat(), Duration::from_secs(240));

    // One CSV row per operation, size and algorithm (auto included), each checked, each with
    // one time per round.
    let csv_text = std::fs::read_to_string(&csv).unwrap();
    let rows: Vec<Vec<&str>> = csv_text.lines().skip(1).map(|l| l.split(',').collect()).collect();
    for (op, algos) in ALGOS {
        for bytes in SIZES {
            for algo in algos.iter().chain(&["auto"]) {
                let row = rows
                    .iter()
                    .find(|r| r[0] == *op && r[1] == *algo && r[3] == bytes.to_string())
                    .unwrap_or_else(|| panic!("no CSV row for {op} {algo} {bytes} B:\n{csv_text}"));
                assert_eq!(row[11], "0", "{op} {algo} {bytes} B has wrong elements:\n{t}");
                // --rounds, or (where auto's ratio was undecided) more blocks of it, up to the
                // default cap of 4 x --rounds; every algorithm of a size alike.
                let rounds: Vec<f64> = row[12].split(' ').map(|x| x.parse().unwrap()).collect();
                let auto_row = rows.iter().find(|r| r[0] == *op && r[1] == "auto" && r[3] == bytes.to_string());
                let auto_rounds = auto_row.map_or(0, |r| r[12].split(' ').count());
                assert!(
                    rounds.len() == auto_rounds && rounds.len().is_multiple_of(ROUNDS) && rounds.len() <= 4 * ROUNDS,
                    "{op} {algo} {bytes} B: {} rounds, auto {auto_rounds}: {:?}",
                    rounds.len(),
                    row[12]
                );
                assert!(rounds.iter().all(|us| *us > 0.0), "{op} {algo} {bytes} B: {:?}", row[12]);
                if *algo == "auto" {
                    assert!(algos.contains(&row[2]), "auto chose {:?} for {op}, not one of {algos:?}", row[2]);
                } else {
                    assert_eq!(row[2], *algo, "forced {algo} for {op} was served by {:?}", row[2]);
                }
            }
        }
    }
    assert!(rows.iter().any(|r| r[0] == "sendrecv"), "no sendrecv rows:\n{csv_text}");

    // The report: a line per operation with algorithms and size, with two ratios, the rounds
    // and the run ratio's interval (under 6 rounds: from the lowest to the highest), then a
    // summary.
    let report: Vec<&str> = t.lines().skip_while(|l| !l.starts_with("# auto against the best")).collect();
    let lines: Vec<&str> = report.iter().copied().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(lines.len(), ALGOS.len() * SIZES.len(), "report lines:\n{}", report.join("\n"));
    for l in &lines {
        let f: Vec<&str> = l.split_whitespace().collect();
        let (run, choice): (f64, f64) = (f[6].parse().unwrap(), f[7].parse().unwrap());
        let rounds: usize = f[8].parse().unwrap();
        assert!(rounds.is_multiple_of(ROUNDS) && (ROUNDS..=4 * ROUNDS).contains(&rounds), "rounds in {l:?}");
        let (lo, hi) = f[9].split_once('-').unwrap_or_else(|| panic!("no interval in {l:?}"));
        let (lo, hi): (f64, f64) = (lo.parse().unwrap(), hi.parse().unwrap());
        assert!(run > 0.0 && choice >= run && lo <= run && run <= hi, "ratios in {l:?}");
    }
    // The summary counts the sizes compared (sendrecv has no algorithms to compare).
    let compared = format!("of {} sizes below", ALGOS.len() * SIZES.len());
    assert!(
        report.iter().any(|l| l.starts_with("# lowest run ratio") && l.contains(&compared)),
        "no summary of {compared:?}:\n{}",
        report.join("\n")
    );

    // The plot: one panel per operation, a line per algorithm.
    let doc = std::fs::read_to_string(&svg).unwrap();
    assert!(doc.starts_with("<svg") || doc.starts_with("<?xml"), "not an SVG: {}", &doc[..doc.len().min(80)]);
    for (op, algos) in ALGOS {
        assert!(doc.contains(op), "the plot has no {op} panel");
        for a in *algos {
            assert!(doc.contains(a), "the plot has no {a} line");
        }
    }
    let _ = std::fs::remove_file(csv);
    let _ = std::fs::remove_file(svg);
}

/// An algorithm list that leaves some operation nothing to run (ring has no all_to_all and no
/// sendrecv) skips that operation and measures the others.
#[test]
fn an_algorithm_list_that_serves_only_some_operations_measures_those() {
    let args = ["bench", "all", "-n", "2", "-e", "64", "--iters", "2", "--algo", "ring", "--check"];
    let t = bench_ok(&args, Duration::from_secs(120));
    let rows = |op: &str| {
        t.lines()
            .skip_while(|l| *l != format!("# {op}"))
            .skip(1)
            .take_while(|l| !l.starts_with("# ") || l.starts_with("#  "))
            .filter(|l| !l.starts_with('#') && l.split_whitespace().nth(5) == Some("ring"))
            .count()
    };
    // Sizes 8 and 32 B (a factor of 4 up to 64) wherever ring serves, none where it does not.
    for op in ["all_reduce", "all_gather", "reduce_scatter", "reduce"] {
        assert_eq!(rows(op), 2, "{op}:\n{t}");
    }
    assert_eq!(rows("all_to_all"), 0, "{t}");
    assert_eq!(rows("sendrecv"), 0, "{t}");
}

/// `--inplace` times all_reduce on one buffer, as torch.distributed calls it, and every
/// algorithm's in-place result checks out (world size 3: not a power of two).
#[test]
fn in_place_all_reduce_is_checked_for_every_algorithm() {
    let args = ["bench", "all_reduce", "-n", "3", "-e", "64K", "-f", "32", "--iters", "3", "--algo", "all"];
    let t = bench_ok(&[&args[..], &["--inplace", "--check", "-d", "bf16"]].concat(), Duration::from_secs(120));
    assert!(t.contains("all_reduce in place"), "{t}");
    let rows: Vec<&str> = t.lines().filter(|l| !l.starts_with('#') && l.split_whitespace().count() == 10).collect();
    // 8 B, 256 B, 8 KiB (direct's small path) and the 64 K cap not reached: 3 sizes, each
    // with every all_reduce algorithm on one host and auto.
    assert_eq!(rows.len(), 3 * 6, "{t}");
    for r in rows {
        assert_eq!(r.split_whitespace().last(), Some("0"), "wrong elements: {r}\n{t}");
    }
}

/// `--latency` times each call alone between barriers (OSU's way); the header says so and
/// every algorithm's result still checks out.
#[test]
fn latency_mode_times_calls_alone_and_checks_every_algorithm() {
    let args = ["bench", "reduce", "-n", "3", "-e", "2K", "-f", "16", "--iters", "3", "--algo", "all"];
    let svg = temp("latency.svg");
    let plot = ["--latency", "--check", "--plot", svg.to_str().unwrap()];
    let t = bench_ok(&[&args[..], &plot[..]].concat(), Duration::from_secs(120));
    assert!(t.contains("latency: each call timed alone between barriers"), "{t}");
    let doc = std::fs::read_to_string(&svg).unwrap();
    let _ = std::fs::remove_file(&svg);
    assert!(doc.contains("each call timed alone (--latency)"), "the plot does not say how it was timed");
    let rows: Vec<&str> = t.lines().filter(|l| !l.starts_with('#') && l.split_whitespace().count() == 10).collect();
    // 8 B, 128 B and 2 KiB, each with ring, tree, chain and auto.
    assert_eq!(rows.len(), 3 * 4, "{t}");
    for r in rows {
        assert_eq!(r.split_whitespace().last(), Some("0"), "wrong elements: {r}\n{t}");
    }
}

/// Runs `conflux <args> --check` with `var=value` set, to success, and returns its result rows
/// (the lines that start with a size), each with no wrong element.
fn checked_rows(args: &[&str], (var, value): (&str, &str)) -> (Vec<String>, String) {
    let mut cmd = Command::new(CONFLUX);
    cmd.args(args).arg("--check");
    cmd.env("CONFLUX_TIMEOUT_S", "60").env(var, value).env_remove("CONFLUX_ALGO");
    let out =
        wait_output(cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap(), Duration::from_secs(120)).0;
    let t = text(&out);
    assert!(out.status.success(), "{var}={value}: bench failed ({}):\n{t}", out.status);
    let rows: Vec<String> =
        t.lines().filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit())).map(String::from).collect();
    assert!(rows.iter().all(|r| r.split_whitespace().last() == Some("0")), "{var}={value}: wrong elements:\n{t}");
    (rows, t)
}

/// Large pairwise all_to_all between processes of one host: each block of 128 KiB or more is
/// read from the sender's memory (single copy), checked element by element; and the same
/// through the rings with `CONFLUX_SINGLE_COPY=0`. Both ends of every pair must agree, so a
/// rank that took the other way would fail the call, not pass it.
#[test]
fn large_all_to_all_by_single_copy_and_through_the_rings_is_checked() {
    let args = ["bench", "all_to_all", "-n", "3", "-b", "512K", "-e", "4M", "-f", "8", "--iters", "3"];
    for single in ["1", "0"] {
        let (rows, t) =
            checked_rows(&[&args[..], &["--algo", "pairwise,auto"]].concat(), ("CONFLUX_SINGLE_COPY", single));
        assert_eq!(rows.len(), 4, "two sizes, pairwise and auto:\n{t}");
    }
}

/// Ring and chain collectives between processes of one host, their pieces of 2 KiB and more
/// written into the rings with non-temporal stores (`CONFLUX_SHM_STREAM=on`), and the same with
/// ordinary ones: every element checked, with a root that is not rank 0.
#[test]
fn streamed_and_plain_ring_pieces_are_checked() {
    let args = ["bench", "all", "-n", "3", "-b", "4K", "-e", "2M", "-f", "8", "--iters", "3", "--root", "2"];
    for stream in ["on", "off"] {
        let (rows, t) = checked_rows(&[&args[..], &["--algo", "ring,chain"]].concat(), ("CONFLUX_SHM_STREAM", stream));
        // all_reduce, all_gather, reduce_scatter by ring, broadcast by chain, reduce by both;
        // no row for all_to_all, which neither implements.
        assert_eq!(rows.len(), 6 * 4, "four sizes of six rows:\n{t}");
    }
}

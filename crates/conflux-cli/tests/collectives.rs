//! Every collective x dtype x op, counts {0, 1, 7, 1000, 1048579}, in place and out of place,
//! checked against an exact reference, for world sizes 1, 2, 3, 4, 8 over each link type.

mod common;

use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(240);

fn colls(n: usize, transport: &str, scenario: &str) {
    run_checks(n, scenario, transport, "60", LIMIT);
}

#[test]
fn world_1() {
    colls(1, "auto", "colls");
}

#[test]
fn world_2_shm() {
    colls(2, "shm", "colls");
}

#[test]
fn world_2_tcp() {
    colls(2, "tcp", "colls");
}

#[test]
fn world_3_shm() {
    colls(3, "shm", "colls");
}

#[test]
fn world_3_tcp() {
    colls(3, "tcp", "colls");
}

#[test]
fn world_4_shm() {
    colls(4, "shm", "colls");
}

#[test]
fn world_4_tcp() {
    colls(4, "tcp", "colls");
}

#[test]
fn world_8_shm() {
    colls(8, "shm", "colls");
}

#[test]
fn world_8_tcp() {
    colls(8, "tcp", "colls");
}

/// The ring algorithms over shared memory, which the direct algorithm otherwise serves.
#[test]
fn world_4_shm_ring() {
    let out = run_job(4, &["colls"], &[("CONFLUX_TRANSPORT", "shm"), ("CONFLUX_ALGO", "ring")], LIMIT);
    assert_all_passed(&out, 4);
}

/// An algorithm forced for every operation serves the calls it has a schedule for and leaves
/// the rest to the model: direct and bruck leave all_to_all_v (uneven blocks), broadcast and
/// reduce, and every call still passes.
#[test]
fn world_4_shm_one_algorithm_for_all() {
    for algo in ["direct", "bruck"] {
        let out = run_job(4, &["colls"], &[("CONFLUX_TRANSPORT", "shm"), ("CONFLUX_ALGO", algo)], LIMIT);
        assert_all_passed(&out, 4);
    }
}

/// Two "nodes" of two ranks: shared memory inside each, TCP between them, started as a
/// multi-node job (one `conflux run` per node).
#[test]
fn two_nodes_of_two() {
    let port = free_port().to_string();
    let nodes: Vec<_> = (0..2)
        .map(|node| {
            std::process::Command::new(CONFLUX)
                .args(["run", "-n", "2", "--nnodes", "2", "--node-rank", &node.to_string()])
                .args(["--master-addr", "127.0.0.1", "--master-port", &port, "--", CHECK, "colls"])
                .env("CONFLUX_NODE_ID", format!("node{node}"))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in nodes {
        let (out, _) = wait_output(child, LIMIT);
        assert_all_passed(&out, 2);
    }
}

/// With CONFLUX_CHECKSUM=1 every TCP message carries a CRC32C the receiver checks: every
/// collective and the tagged point-to-point transfers still give the reference results, and
/// a job where only some ranks checksum works too (each sender chooses for itself).
#[test]
fn checksummed_tcp_links() {
    for scenario in ["quick", "p2p"] {
        let env = [("CONFLUX_TRANSPORT", "tcp"), ("CONFLUX_TIMEOUT_S", "60"), ("CONFLUX_CHECKSUM", "1")];
        assert_all_passed(&run_job(3, &[scenario], &env, Duration::from_secs(120)), 3);
    }
    let children = spawn_ranks(3, &["quick"], |r| {
        let on = if r == 1 { "1" } else { "0" };
        vec![("CONFLUX_TRANSPORT".into(), "tcp".into()), ("CONFLUX_CHECKSUM".into(), on.into())]
    });
    for (r, child) in children.into_iter().enumerate() {
        let (out, _) = wait_output(child, Duration::from_secs(120));
        let t = text(&out);
        assert!(out.status.success() && t.contains(", 0 failed"), "rank {r}:\n{t}");
    }
}

/// CONFLUX_DETERMINISTIC=1: f32, f64 and bf16 reductions equal the rank-order sum bit for bit,
/// whatever algorithm is forced, and every rank's results hash the same over shared memory,
/// over TCP and across two "nodes" (loopback, their own node ids).
#[test]
fn deterministic_reductions_are_bitwise_the_same_everywhere() {
    let hashes = |out: &std::process::Output| -> Vec<String> {
        let t = text(out);
        let mut h: Vec<String> = t
            .lines()
            .filter(|l| l.contains("ORDERED-HASH"))
            .map(|l| l.trim_start_matches(|c| c != 'r').to_string())
            .collect();
        h.sort();
        h
    };
    let n = 4;
    let mut seen = Vec::new();
    for transport in ["shm", "tcp"] {
        let env = [("CONFLUX_TRANSPORT", transport), ("CONFLUX_DETERMINISTIC", "1")];
        let out = run_job(n, &["ordered"], &env, LIMIT);
        assert_all_passed(&out, n);
        seen.push((transport, hashes(&out)));
    }
    let children = spawn_ranks(n, &["ordered"], |r| {
        vec![("CONFLUX_DETERMINISTIC".into(), "1".into()), ("CONFLUX_NODE_ID".into(), format!("node{}", r / 2))]
    });
    let outs: Vec<std::process::Output> = children.into_iter().map(|c| wait_output(c, LIMIT).0).collect();
    let mut mixed: Vec<String> = Vec::new();
    for o in &outs {
        let t = text(o);
        assert!(o.status.success() && t.contains(", 0 failed"), "{t}");
        mixed.extend(hashes(o));
    }
    mixed.sort();
    seen.push(("2 nodes", mixed));
    assert_eq!(seen[0].1.len(), n, "{seen:?}");
    for (what, h) in &seen[1..] {
        assert_eq!(h, &seen[0].1, "{what} differs from shm");
    }
}

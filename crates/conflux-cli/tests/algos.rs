//! Every algorithm forced on every collective it implements (`conflux-check algos`), for world
//! sizes 1-9 over shared memory, over TCP, and across nodes (the hierarchical all_reduce):
//! counts 0, 1, 7, 3N+1, 1000 and 70001 against the exact reference.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(240);

#[test]
fn every_algorithm_at_world_sizes_1_to_9_over_shared_memory() {
    for n in 1..=9 {
        // The direct algorithm needs a shared host, which one rank alone does not set up.
        let must = if n > 1 { "direct" } else { "" };
        let out = run_job(n, &["algos", must], &[("CONFLUX_TIMEOUT_S", "60")], LIMIT);
        assert_all_passed(&out, n);
    }
}

#[test]
fn every_algorithm_over_tcp() {
    for n in [2, 3, 5] {
        let env = [("CONFLUX_TIMEOUT_S", "60"), ("CONFLUX_TRANSPORT", "tcp")];
        assert_all_passed(&run_job(n, &["algos-quick"], &env, LIMIT), n);
    }
}

/// `nodes` launchers on loopback, each with its own node id: shared memory within a node,
/// TCP across, as on separate hosts (scripts/netns-cluster gives them separate addresses too).
fn nodes_job(nodes: usize, per_node: usize, args: &[&str]) {
    let port = free_port().to_string();
    let children: Vec<_> = (0..nodes)
        .map(|i| {
            Command::new(CONFLUX)
                .args(["run", "-n", &per_node.to_string(), "--nnodes", &nodes.to_string()])
                .args(["--node-rank", &i.to_string(), "--master-port", &port, "--", CHECK])
                .args(args)
                .env("CONFLUX_NODE_ID", format!("node{i}"))
                .env("CONFLUX_TIMEOUT_S", "60")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        assert_all_passed(&wait_output(child, LIMIT).0, per_node);
    }
}

#[test]
fn every_algorithm_across_two_nodes_of_two_including_hier() {
    nodes_job(2, 2, &["algos", "hier"]);
}

#[test]
fn every_algorithm_across_three_nodes_of_two_and_two_of_three() {
    nodes_job(3, 2, &["algos-quick", "hier"]);
    nodes_job(2, 3, &["algos-quick", "hier"]);
}

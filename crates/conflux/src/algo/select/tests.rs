use super::*;

fn call(op: OpKind, bytes: usize) -> Call {
    Call { op, bytes, even: true, pieces: false, half: false }
}

fn tcp_only(size: usize, per_node: usize) -> Topo {
    let nodes = (0..size / per_node).map(|k| (k * per_node..(k + 1) * per_node).collect()).collect();
    Topo { size, nodes, one_segment: false, local_tcp: false, load: 1.0 }
}

/// Latency-bound links (large α, fast bytes): the log-step algorithms win small messages,
/// the ring's 2(N-1) steps lose.
#[test]
fn small_messages_on_slow_latency_pick_log_step_algorithms() {
    let m = Model { tcp: LinkCost { alpha_us: 50.0, gbps: 10.0 }, ..Model::default() };
    let topo = tcp_only(8, 1);
    assert_eq!(choose(&m, &call(OpKind::AllReduce, 8), &topo, None), Ok(Algo::Rd));
    assert_eq!(choose(&m, &call(OpKind::AllGather, 64), &topo, None).map(|a| a != Algo::Ring), Ok(true));
    assert_eq!(choose(&m, &call(OpKind::Broadcast, 8), &topo, None), Ok(Algo::Tree));
    assert_eq!(choose(&m, &call(OpKind::AllToAll, 64), &tcp_only(32, 1), None), Ok(Algo::Bruck));
}

/// Bandwidth-bound (tiny α): large messages go to the algorithms that move the fewest bytes.
#[test]
fn large_messages_on_fast_latency_pick_bandwidth_optimal_algorithms() {
    let m = Model { tcp: LinkCost { alpha_us: 0.01, gbps: 1.0 }, ..Model::default() };
    let topo = tcp_only(8, 1);
    let big = 64 << 20;
    let ar = choose(&m, &call(OpKind::AllReduce, big), &topo, None).unwrap();
    assert!(matches!(ar, Algo::Ring | Algo::Rabenseifner), "{ar}");
    // At a power of two, recursive doubling moves as few bytes as the ring in fewer steps;
    // elsewhere its fold costs a whole extra message.
    assert_eq!(choose(&m, &call(OpKind::AllGather, big), &tcp_only(6, 1), None), Ok(Algo::Ring));
    assert_eq!(choose(&m, &call(OpKind::Broadcast, big), &topo, None).map(|a| a != Algo::Tree), Ok(true));
    assert_eq!(choose(&m, &call(OpKind::AllToAll, big), &topo, None), Ok(Algo::Pairwise));
}

#[test]
fn two_nodes_with_slow_links_pick_hier_for_large_all_reduce() {
    let m = Model { tcp: LinkCost { alpha_us: 30.0, gbps: 0.25 }, ..Model::default() };
    let topo = tcp_only(4, 2);
    assert_eq!(choose(&m, &call(OpKind::AllReduce, 16 << 20), &topo, None), Ok(Algo::Hier));
}

/// Recursive doubling's (halving's) steps inside a node are shared memory's: at 2 nodes x 2
/// ranks on a 2 Gbit/s link (the bandwidth a communicator measures there), rd keeps
/// all_gather and reduce_scatter through 32 KiB and yields to the ring once they spill.
#[test]
fn two_nodes_of_two_keep_recursive_doubling_until_it_spills() {
    let m = Model { tcp: LinkCost { alpha_us: 40.0, gbps: 0.25 }, ..Model::default() };
    let topo = tcp_only(4, 2);
    for op in [OpKind::AllGather, OpKind::ReduceScatter] {
        for bytes in [8, 8 << 10, 32 << 10] {
            assert_eq!(choose(&m, &call(op, bytes), &topo, None), Ok(Algo::Rd), "{op} {bytes}");
        }
        assert_eq!(choose(&m, &call(op, 128 << 10), &topo, None), Ok(Algo::Ring), "{op} 128 KiB");
    }
}

#[test]
fn one_host_with_shared_memory_picks_direct_all_reduce() {
    let topo = Topo::single(4, true);
    for bytes in [8, 16 << 20] {
        assert_eq!(choose(&Model::default(), &call(OpKind::AllReduce, bytes), &topo, None), Ok(Algo::Direct));
    }
}

#[test]
fn forcing_an_algorithm_that_cannot_serve_is_an_error_naming_why() {
    let topo = Topo::single(4, false);
    let m = Model::default();
    let e = choose(&m, &call(OpKind::AllReduce, 8), &topo, Some(Algo::Direct)).unwrap_err();
    assert!(e.contains("direct") && e.contains("one host"), "{e}");
    let e = choose(&m, &call(OpKind::AllReduce, 8), &topo, Some(Algo::Hier)).unwrap_err();
    assert!(e.contains("two nodes"), "{e}");
    let e = choose(&m, &call(OpKind::Broadcast, 8), &topo, Some(Algo::Rd)).unwrap_err();
    assert!(e.contains("does not implement broadcast"), "{e}");
    let uneven = Call { even: false, ..call(OpKind::AllToAll, 8) };
    assert!(choose(&m, &uneven, &topo, Some(Algo::Bruck)).is_err());
    assert_eq!(choose(&m, &uneven, &topo, None), Ok(Algo::Pairwise));
    let pieces = Call { pieces: true, ..call(OpKind::AllReduce, 8) };
    assert_eq!(choose(&m, &pieces, &topo, None), Ok(Algo::Ring));
    assert_eq!(choose(&m, &call(OpKind::AllReduce, 8), &topo, Some(Algo::Tree)), Ok(Algo::Tree));
}

#[test]
fn every_operation_has_an_algorithm_on_every_topology() {
    for size in 1..=9 {
        for topo in [Topo::single(size, true), Topo::single(size, false), tcp_only(size, 1)] {
            for op in OpKind::ALL {
                for bytes in [0, 8, 1 << 20] {
                    assert!(choose(&Model::default(), &call(op, bytes), &topo, None).is_ok(), "{op} {size}");
                }
            }
        }
    }
}

#[test]
fn tuning_files_round_trip_and_reject_nonsense() {
    let m = Model { sync_us: 3.25, tcp: LinkCost { alpha_us: 17.0, gbps: 0.5 }, ..Model::default() };
    assert_eq!(Model::from_text(&m.to_text()), Ok(m));
    assert_eq!(Model::from_text("# only a comment\n\nsync_us = 2 # trailing\n").unwrap().sync_us, 2.0);
    assert!(Model::from_text("sync_us = -1").is_err());
    assert!(Model::from_text("speed = 3").is_err());
    assert!(Model::from_text("sync_us 3").is_err());
}

/// Oversubscribed, back-to-back broadcasts pipeline: a broadcast's ranks each wait once in
/// the tree or the chain, and the tree's shorter path keeps it ahead. A reduce's chain waits
/// at each of its N - 1 steps, the tree's root log2 N times. With a core per rank every step
/// waits, and the tree's log2 N steps beat the chain's N - 1.
#[test]
fn oversubscribed_rooted_operations_count_the_busiest_ranks_waits() {
    let m = Model::default();
    let over = Topo { load: 4.0, ..Topo::single(8, true) };
    assert_eq!(choose(&m, &call(OpKind::Reduce, 8), &over, None), Ok(Algo::Tree));
    assert_eq!(choose(&m, &call(OpKind::Broadcast, 8), &over, None), Ok(Algo::Tree));
    let roomy = Topo::single(8, true);
    assert_eq!(choose(&m, &call(OpKind::Reduce, 8), &roomy, None), Ok(Algo::Tree));
    assert_eq!(choose(&m, &call(OpKind::Broadcast, 8), &roomy, None), Ok(Algo::Tree));
}

/// The latency factor grows with ranks per core, from 1 to `oversub` at 4 per core (half-way
/// at 2 per core), and no further.
#[test]
fn crowding_scales_the_latency_factor() {
    let m = Model::default();
    let at = |load: f64, size: usize| Topo { load, ..Topo::single(size, true) };
    assert_eq!(m.latency_factor(&at(1.0, 2)), 1.0);
    assert_eq!(m.latency_factor(&at(0.5, 1)), 1.0);
    assert_eq!(m.latency_factor(&at(2.0, 4)), 1.0 + (m.oversub - 1.0) / 2.0);
    assert_eq!(m.latency_factor(&at(4.0, 8)), m.oversub);
    assert_eq!(m.latency_factor(&at(8.0, 16)), m.oversub);
}

/// Oversubscribed, a reduce's small and mid-sized messages go down the binomial tree (the
/// chain's N - 1 hops cost more than the tree's log2 N levels; measured at 3, 4 and 8 ranks
/// on 2 cores, 8 B - 2 KiB: the tree in 0.5-0.9x the chain's time), and the pipelined chain
/// takes the large ones.
#[test]
fn oversubscribed_reduce_is_tree_then_chain_by_size() {
    let m = Model::default();
    let eight = Topo { load: 4.0, ..Topo::single(8, true) };
    let four = Topo { load: 2.0, ..Topo::single(4, true) };
    let pick = |topo: &Topo, bytes: usize| choose(&m, &call(OpKind::Reduce, bytes), topo, None).unwrap();
    for bytes in [8, 128, 2048] {
        assert_eq!(pick(&eight, bytes), Algo::Tree, "{bytes} B at 8 ranks");
        assert_eq!(pick(&four, bytes), Algo::Tree, "{bytes} B at 4 ranks");
    }
    assert_eq!(pick(&eight, 128 << 10), Algo::Tree);
    assert_eq!(pick(&eight, 32 << 20), Algo::Chain);
    assert_eq!(pick(&four, 128 << 10), Algo::Tree);
    assert_eq!(pick(&four, 32 << 20), Algo::Chain);
}

/// On one host, recursive doubling and halving beat the ring while the working set stays in
/// cache (measured at 4 ranks, 128 KiB: rd 43 us, ring 86 us) and lose once it spills
/// (8 ranks at 512 KiB and up, 4 ranks at 2 MiB and up).
#[test]
fn recursive_doubling_yields_to_the_ring_when_the_working_set_spills() {
    let m = Model::default();
    let four = Topo { load: 2.0, ..Topo::single(4, true) };
    let eight = Topo { load: 4.0, ..Topo::single(8, true) };
    let faster = |op, bytes, topo: &Topo| {
        let time = |a| predict(&m, a, &call(op, bytes), topo).unwrap();
        if time(Algo::Rd) < time(Algo::Ring) {
            Algo::Rd
        } else {
            Algo::Ring
        }
    };
    for op in [OpKind::AllGather, OpKind::ReduceScatter] {
        assert_eq!(faster(op, 128 << 10, &four), Algo::Rd, "{op}");
        assert_eq!(faster(op, 2 << 20, &four), Algo::Ring, "{op}");
        assert_eq!(faster(op, 128 << 10, &eight), Algo::Rd, "{op}");
        assert_eq!(faster(op, 512 << 10, &eight), Algo::Ring, "{op}");
    }
    // Over loopback TCP rd keeps up with the ring to 32 MiB in all (4 ranks: 0.55-0.8x its
    // time to 1 MiB, even at 2-4 MiB, 1.15-1.25x at 8 MiB), and auto takes it for all_gather
    // and reduce_scatter of 128 KiB - 4 MiB, where it took Bruck and the ring at 0.6-0.84 of rd.
    let loopback = Topo { local_tcp: true, ..Topo::single(4, false) };
    for op in [OpKind::AllGather, OpKind::ReduceScatter] {
        for bytes in [128 << 10, 1 << 20, 4 << 20] {
            assert_eq!(choose(&m, &call(op, bytes), &loopback, None), Ok(Algo::Rd), "{op} {bytes}");
        }
        assert_eq!(faster(op, 8 << 20, &loopback), Algo::Ring, "{op}");
    }
}

/// With a shared segment the direct all_gather and reduce_scatter write each block once for
/// all readers, and win at every size from 4 ranks up (measured, 8 ranks on 2 cores: 8 B
/// all_gather 6-14 us against rd's 16-25, 8 MiB 4.1 ms against the ring's 6.0); at 2 ranks
/// direct wins the small sizes and ties from 512 KiB for reduce_scatter, while all_gather's
/// and all_to_all's single exchange goes through the ring from 16 and 8 KiB.
#[test]
fn direct_serves_all_gather_and_reduce_scatter_on_one_host() {
    let m = Model::default();
    for (n, load) in [(4, 2.0), (8, 4.0)] {
        let topo = Topo { load, ..Topo::single(n, true) };
        for op in [OpKind::AllGather, OpKind::ReduceScatter] {
            for bytes in [8, 2 << 10, 128 << 10, 8 << 20, 64 << 20] {
                assert_eq!(choose(&m, &call(op, bytes), &topo, None), Ok(Algo::Direct), "{op} {bytes} at {n}");
            }
        }
    }
    // all_to_all: direct while a call takes at most four windows, 1 MiB (two from 5 ranks; at
    // 2 ranks, up to 4 KiB), then pairwise; uneven blocks (all_to_all_v) it cannot serve.
    for (n, load) in [(2, 1.0), (4, 2.0), (8, 4.0)] {
        let topo = Topo { load, ..Topo::single(n, true) };
        let pick = |bytes| choose(&m, &call(OpKind::AllToAll, bytes), &topo, None);
        assert_eq!(pick(8), Ok(Algo::Direct), "{n}");
        assert_eq!(pick(4 << 10), Ok(Algo::Direct), "{n}");
        let mid = if n == 2 { Algo::Pairwise } else { Algo::Direct };
        assert_eq!(pick(128 << 10), Ok(mid), "{n}");
        assert_eq!(pick(1 << 20), Ok(if n == 4 { Algo::Direct } else { Algo::Pairwise }), "{n}");
        assert_eq!(pick(2 << 20), Ok(Algo::Pairwise), "{n}");
        assert_eq!(pick(8 << 20), Ok(Algo::Pairwise), "{n}");
        let uneven = Call { even: false, ..call(OpKind::AllToAll, 8) };
        assert_ne!(choose(&m, &uneven, &topo, None), Ok(Algo::Direct));
        assert!(choose(&m, &uneven, &topo, Some(Algo::Direct)).unwrap_err().contains("equal blocks"));
    }
    let two = Topo::single(2, true);
    assert_eq!(choose(&m, &call(OpKind::AllGather, 64), &two, None), Ok(Algo::Direct));
    assert_eq!(choose(&m, &call(OpKind::AllGather, 32 << 10), &two, None), Ok(Algo::Ring));
    // At 2 ranks direct's reduce_scatter beats the ring's single exchange to 8 KiB (measured,
    // 512 B - 8 KiB: 1.1-1.35x the ring's busbw), and the ring, which copies nothing, beats it
    // from 16 KiB (1.3-2.1x).
    for bytes in [64, 512, 4 << 10] {
        assert_eq!(choose(&m, &call(OpKind::ReduceScatter, bytes), &two, None), Ok(Algo::Direct), "{bytes}");
    }
    for bytes in [16 << 10, 512 << 10, 8 << 20] {
        assert_eq!(choose(&m, &call(OpKind::ReduceScatter, bytes), &two, None), Ok(Algo::Ring), "{bytes}");
    }
    assert_eq!(choose(&m, &call(OpKind::ReduceScatter, 64), &two, Some(Algo::Direct)), Ok(Algo::Direct));
    // all_reduce at 2 ranks: direct to 4 KiB; then rd's one exchange to 128 KiB (measured, 8-32
    // KiB: direct took 1.2-1.4x rd's time, the ring 1.0-1.2x), and the ring's two past it
    // (past 2 MiB, direct at 0.56-0.83 of the best, in place and out of place). Coalesced
    // pieces, which rd cannot take, go through the ring.
    let all_reduce = |bytes| choose(&m, &call(OpKind::AllReduce, bytes), &two, None);
    for (bytes, algo) in [(8, Algo::Direct), (4 << 10, Algo::Direct), (8 << 10, Algo::Rd), (128 << 10, Algo::Rd)] {
        assert_eq!(all_reduce(bytes), Ok(algo), "{bytes}");
    }
    for bytes in [512 << 10, 4 << 20, 64 << 20] {
        assert_eq!(all_reduce(bytes), Ok(Algo::Ring), "{bytes}");
    }
    let pieces = Call { pieces: true, ..call(OpKind::AllReduce, 32 << 10) };
    assert_eq!(choose(&m, &pieces, &two, None), Ok(Algo::Ring));
    // bf16 reduces at a quarter of f32's rate: the ring, which reduces half the message, keeps
    // it (measured, 8-128 KiB: rd at 0.70-0.93 of the ring).
    let bf16 = Call { half: true, ..call(OpKind::AllReduce, 32 << 10) };
    assert_eq!(choose(&m, &bf16, &two, None), Ok(Algo::Ring));
    // Over TCP rd keeps it to 512 KiB (measured, loopback: the ring 1.1-1.2x rd's time at
    // 256-512 KiB; rd 1.27x the ring's at 1 MiB in place).
    let tcp = Topo { local_tcp: true, ..Topo::single(2, false) };
    for (bytes, algo) in [(8, Algo::Rd), (512 << 10, Algo::Rd), (1 << 20, Algo::Ring), (64 << 20, Algo::Ring)] {
        assert_eq!(choose(&m, &call(OpKind::AllReduce, bytes), &tcp, None), Ok(algo), "tcp {bytes}");
    }
    for op in [OpKind::AllGather, OpKind::ReduceScatter] {
        // Without a segment (TCP on one host), direct cannot serve.
        let tcp = Topo { local_tcp: true, ..Topo::single(4, false) };
        assert_ne!(choose(&m, &call(op, 64), &tcp, None), Ok(Algo::Direct), "{op}");
    }
}

/// Oversubscribed, a symmetric collective's bytes cost ranks-per-core times more (every rank
/// does the same work, in turns); and the direct all_reduce's small path is priced as one
/// memory-bound pass over its N slots.
#[test]
fn oversubscribed_symmetric_bytes_scale_with_ranks_per_core() {
    let m = Model::default();
    let eight = Topo { load: 4.0, ..Topo::single(8, true) };
    let alone = Topo { load: 1.0, ..eight.clone() };
    // With α = 0 only the byte terms are left.
    let no_alpha = Model { shm: LinkCost { alpha_us: 0.0, ..m.shm }, ..m };
    let bytes_of = |op: OpKind, algo: Algo, topo: &Topo| predict(&no_alpha, algo, &call(op, 1 << 20), topo).unwrap();
    let ring = |topo: &Topo| bytes_of(OpKind::AllGather, Algo::Ring, topo);
    assert!((ring(&eight) / ring(&alone) - 4.0).abs() < 1e-9);
    // Measured on 2 cores: direct beats rabenseifner up to 32 KiB at 8 ranks and loses from
    // 128 KiB, where each rank's share of the N-slot pass reaches 16 KiB.
    let pick = |topo: &Topo, bytes: usize| choose(&m, &call(OpKind::AllReduce, bytes), topo, None).unwrap();
    assert_eq!(pick(&eight, 32 << 10), Algo::Direct);
    assert_eq!(pick(&eight, 128 << 10), Algo::Rabenseifner);
}

/// f16 and bf16 cost more to reduce than f32, which moves all_reduce away from direct, the
/// algorithm that reduces most (all N slots on every rank).
#[test]
fn half_types_move_away_from_the_algorithm_that_reduces_most() {
    let m = Model::default();
    // (At 2 ranks direct keeps only what fits 4 KiB, for f32 and bf16 alike.)
    let (two, four) = (Topo::single(2, true), Topo { load: 2.0, ..Topo::single(4, true) });
    let f32_call = call(OpKind::AllReduce, 32 << 10);
    let bf16_call = Call { half: true, ..f32_call };
    assert_eq!(choose(&m, &f32_call, &four, None), Ok(Algo::Direct));
    assert_ne!(choose(&m, &bf16_call, &four, None), Ok(Algo::Direct));
    // A rooted reduce's hops reduce pairwise as they receive, cheaper per half byte: at 2 ranks
    // a bf16 reduce of 32 KiB stays on the tree's one hop (the ring's split reduction measured
    // 0.79-0.81 of it).
    let reduce = Call { half: true, ..call(OpKind::Reduce, 32 << 10) };
    assert_eq!(choose(&m, &reduce, &two, None), Ok(Algo::Tree));
    // Moving bytes costs the same whatever they hold.
    let gather = call(OpKind::AllGather, 32 << 10);
    assert_eq!(predict(&m, Algo::Ring, &gather, &two), predict(&m, Algo::Ring, &Call { half: true, ..gather }, &two));
}

/// On one host a rooted operation's bytes are hops of one copy each. Oversubscribed, the tree
/// and the chain do the same work (every byte crosses N - 1 links), so the chain's per-chunk
/// handoffs decide for the tree up to the size where the tree's whole-message forwarding
/// spills the cache; with a core per rank the pipelined schedules take large messages.
#[test]
fn one_host_rooted_operations_are_bound_by_their_work_when_oversubscribed() {
    let m = Model::default();
    let four = Topo { load: 2.0, ..Topo::single(4, true) };
    let eight = Topo { load: 4.0, ..Topo::single(8, true) };
    let pick = |op: OpKind, topo: &Topo, bytes: usize| choose(&m, &call(op, bytes), topo, None).unwrap();
    for topo in [&four, &eight] {
        for op in [OpKind::Broadcast, OpKind::Reduce] {
            assert_eq!(pick(op, topo, 2 << 20), Algo::Tree, "{op} at {}", topo.size);
            assert_eq!(pick(op, topo, 8 << 20), Algo::Tree, "{op} at {}", topo.size);
            assert_eq!(pick(op, topo, 32 << 20), Algo::Chain, "{op} at {}", topo.size);
        }
    }
    // With α = 0: at 4 ranks on 2 cores both broadcasts cost their work, 3 hops' copies.
    let no_alpha = Model { shm: LinkCost { alpha_us: 0.0, ..m.shm }, ..m };
    let bytes = 2 << 20;
    let hop = bytes as f64 * 1e-3 / m.copy_gbps;
    for algo in [Algo::Tree, Algo::Chain] {
        let t = predict(&no_alpha, algo, &call(OpKind::Broadcast, bytes), &four).unwrap();
        assert!((t / hop - 3.0).abs() < 1e-9, "{algo}: {t} us, {} hops", t / hop);
    }
    // Two ranks: a broadcast is one hop.
    let t = predict(&no_alpha, Algo::Tree, &call(OpKind::Broadcast, bytes), &Topo::single(2, true)).unwrap();
    assert!((t / hop - 1.0).abs() < 1e-9);
    // A core per rank: the tree's levels one after another lose to the pipelines (the chain's
    // ranks copy a chunk in and on; scatter + all-gather moves 3 (N-1)/N of the message).
    let roomy = Topo::single(8, true);
    assert_ne!(pick(OpKind::Broadcast, &roomy, 2 << 20), Algo::Tree);
    assert_eq!(pick(OpKind::Broadcast, &roomy, 8), Algo::Tree);
}

/// Pairwise all_to_all overlaps its exchanges through shared memory but pays each one's
/// system calls over TCP, where Bruck's log2(N) steps win small messages.
#[test]
fn small_all_to_all_over_tcp_counts_every_pairwise_exchange() {
    let m = Model::default();
    let small = call(OpKind::AllToAll, 2 << 10);
    assert_eq!(choose(&m, &small, &tcp_only(4, 2), None), Ok(Algo::Bruck));
    let local_tcp = Topo { local_tcp: true, ..Topo::single(4, false) };
    assert_eq!(choose(&m, &small, &local_tcp, None), Ok(Algo::Bruck));
    // On one host the segment's transpose takes small ones (see direct_serves_...).
    assert_eq!(choose(&m, &small, &Topo::single(4, true), None), Ok(Algo::Direct));
    // From tens of KiB, Bruck's extra bytes cost more than the exchanges it saves.
    assert_eq!(choose(&m, &call(OpKind::AllToAll, 32 << 10), &tcp_only(4, 2), None), Ok(Algo::Pairwise));
}

/// The form of a call decides what a global choice applies to: uneven all_to_all blocks and
/// coalesced pieces have no schedule in some algorithms, which leave them to the model.
#[test]
fn implements_call_follows_the_form_of_the_call() {
    let uneven = Call { even: false, ..call(OpKind::AllToAll, 64) };
    assert!(implements_call(Algo::Pairwise, &uneven));
    assert!(!implements_call(Algo::Direct, &uneven) && !implements_call(Algo::Bruck, &uneven));
    assert!(implements_call(Algo::Direct, &call(OpKind::AllToAll, 64)));
    let pieces = Call { pieces: true, ..call(OpKind::AllReduce, 64) };
    assert!(implements_call(Algo::Ring, &pieces) && implements_call(Algo::Direct, &pieces));
    assert!(!implements_call(Algo::Tree, &pieces));
    assert!(!implements_call(Algo::Direct, &call(OpKind::Broadcast, 64)));
}

/// The table and the cost model agree: every row has a cost wherever it serves (on one host,
/// across nodes, oversubscribed; several sizes), and no (algorithm, operation) without a row
/// is ever priced. A row added without its cost arm in `predict`, or an arm left behind by a
/// removed row, fails here.
#[test]
fn every_row_of_the_table_is_priced_and_nothing_else_is() {
    let topos = [
        Topo::single(4, true),
        Topo { load: 4.0, ..Topo::single(8, true) },
        tcp_only(4, 2),
        tcp_only(6, 3),
        Topo::single(2, true),
    ];
    let m = Model::default();
    for &algo in &Algo::ALL {
        for op in OpKind::ALL {
            let row = super::table::find(algo, op);
            let mut priced = false;
            for topo in &topos {
                for bytes in [8, 4 << 10, 64 << 10, 1 << 20, 32 << 20] {
                    let c = call(op, bytes);
                    let p = predict(&m, algo, &c, topo);
                    assert!(row.is_some() || p.is_none(), "{algo} {op} has no row but a cost");
                    if let Some(t) = p {
                        assert!(t.is_finite() && t > 0.0, "{algo} {op} at {bytes} B costs {t}");
                    }
                    priced |= p.is_some();
                }
            }
            assert!(row.is_none() || priced, "{algo} {op} has a row but no cost anywhere");
        }
    }
    for row in super::table::TABLE {
        assert!(Algo::ALL.contains(&row.algo), "{} is not listed in Algo::ALL", row.algo);
    }
    for algo in Algo::ALL {
        assert!(super::table::TABLE.iter().any(|r| r.algo == algo), "{algo} has no row");
        assert_eq!(Algo::parse(algo.name()), Some(algo));
    }
}

/// Over loopback TCP with 2 ranks per core, a rooted operation is bound by its work, as on
/// shared memory: the tree keeps large broadcasts, where pricing the chain's pipelined path
/// alone had taken them at 0.77-0.80 of the tree (4 ranks, 1-8 MiB). At 3 ranks on 2 cores the
/// path still decides and the chain keeps them (it was 1.15-1.2x faster at 2-16 MiB).
#[test]
fn loopback_tcp_rooted_operations_are_bound_by_their_work_from_two_ranks_per_core() {
    let m = Model::default();
    let pick = |n: usize, load: f64, bytes: usize| {
        let topo = Topo { local_tcp: true, load, ..Topo::single(n, false) };
        choose(&m, &call(OpKind::Broadcast, bytes), &topo, None).unwrap()
    };
    for bytes in [1 << 20, 8 << 20] {
        assert_eq!(pick(4, 2.0, bytes), Algo::Tree, "{bytes}");
        assert_eq!(pick(3, 1.5, bytes), Algo::Chain, "{bytes}");
    }
}

//! The TCP mesh's handshake over real loopback sockets.

use super::*;

fn peer(l: &TcpListener) -> Peer {
    Peer { node: "n".into(), pid: 0, addr: l.local_addr().unwrap(), cpus: vec![0] }
}

#[test]
fn strangers_are_refused_and_the_real_peer_still_gets_through() {
    let (l0, l1) = (TcpListener::bind("127.0.0.1:0").unwrap(), TcpListener::bind("127.0.0.1:0").unwrap());
    let peers = vec![peer(&l0), peer(&l1)];
    let token = Token::new("job");
    let deadline = Instant::now() + Duration::from_secs(20);

    // Queued before the real rank 1, so rank 0 must get past both to find it.
    let forger = TcpStream::connect(peers[0].addr).unwrap();
    let mut hello = HELLO_MAGIC.to_le_bytes().to_vec();
    hello.extend(1u64.to_le_bytes());
    (&forger).write_all(&hello).unwrap();
    forger.shutdown(std::net::Shutdown::Write).unwrap();
    let (addr0, wrong) = (peers[0].addr, Token::new("guess"));
    let guesser = std::thread::spawn(move || {
        let s = TcpStream::connect(addr0).unwrap();
        auth::connect(&s, &wrong, Purpose::Data, Duration::from_secs(20))
    });
    std::thread::sleep(Duration::from_millis(50));

    let (p1, t1) = (peers.clone(), token.clone());
    let rank1 = std::thread::spawn(move || connect_mesh(&l1, &p1, 1, &|_| true, Some(&t1), deadline).unwrap());
    let mut at0 = connect_mesh(&l0, &peers, 0, &|_| true, Some(&token), deadline).unwrap();
    let mut at1 = rank1.join().unwrap();
    assert!(matches!(guesser.join().unwrap(), Err(auth::AuthError::Closed(_))));
    let mut rest = Vec::new();
    forger.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = (&forger).read_to_end(&mut rest);
    assert!(!rest.starts_with(&HELLO_MAGIC.to_le_bytes()), "the forger got nothing but the challenge");

    let ((p, mut s0), (q, mut s1)) = (at0.pop().unwrap(), at1.pop().unwrap());
    assert_eq!((p, q), (1, 0));
    s1.write_all(b"ping").unwrap();
    let mut b = [0u8; 4];
    s0.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"ping", "rank 0 kept the real rank 1's connection");
}

/// Ranks bound to one CPU each still make a node of all their CPUs: 4 ranks on CPUs 0, 0, 1, 1
/// are 2 per core, as unbound ranks that all see CPUs 0-1 are.
#[test]
fn a_nodes_cores_are_its_ranks_cpus_together() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let on = |cpus: Vec<usize>| Peer { cpus, ..peer(&l) };
    let bound: Vec<Peer> = [0, 0, 1, 1].into_iter().map(|c| on(vec![c])).collect();
    let free: Vec<Peer> = (0..4).map(|_| on(vec![0, 1])).collect();
    for peers in [&bound, &free] {
        assert_eq!(node_cores(peers, &[0, 1, 2, 3]), 2);
        assert_eq!(topology(peers, true, false).load, 2.0);
    }
    assert_eq!(topology(&bound[..2], true, false).load, 2.0, "two ranks on CPU 0 alone");
    let decoded = Peer::decode(&on(vec![0, 3, 17]).encode()).unwrap();
    assert_eq!(decoded.cpus, [0, 3, 17]);
}

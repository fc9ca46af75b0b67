//! The TCP mesh's handshake over real loopback sockets.

use super::*;

/// What rank `r` sends first on a data connection.
fn greeting(r: u64) -> Vec<u8> {
    [HELLO_MAGIC.to_le_bytes(), r.to_le_bytes()].concat()
}

/// Rank `r`'s control connection to `addr`, greeted (the in-flight window's credits).
fn control(addr: SocketAddr, r: u64) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&[CONTROL_MAGIC.to_le_bytes(), r.to_le_bytes()].concat()).unwrap();
    s
}

fn ranks(got: &[Connected]) -> Vec<usize> {
    got.iter().map(|c| c.peer).collect()
}

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
    let hello = greeting(1);
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

    let (mut c0, mut c1) = (at0.pop().unwrap(), at1.pop().unwrap());
    assert_eq!((c0.peer, c1.peer), (1, 0));
    for (from, to, msg) in [(&mut c1.data, &mut c0.data, b"data"), (&mut c1.control, &mut c0.control, b"ctrl")] {
        from.write_all(msg).unwrap();
        let mut b = [0u8; 4];
        to.read_exact(&mut b).unwrap();
        assert_eq!(&b, msg, "rank 0 kept the real rank 1's connections, each in its place");
    }
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

/// A stranger that connects first and never speaks holds up nobody (waiting on it in turn
/// would take the handshake timeout, 10 s), and a greeting that arrives in pieces is taken
/// whole and no further.
#[test]
fn a_silent_stranger_and_a_greeting_in_pieces() {
    let l0 = TcpListener::bind("127.0.0.1:0").unwrap();
    let me = peer(&l0);
    let peers = vec![me.clone(), me.clone(), me];
    let _silent = TcpStream::connect(peers[0].addr).unwrap();
    let addr = peers[0].addr;
    let pieces = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        let hello = greeting(2);
        s.write_all(&hello[..5]).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        s.write_all(&hello[5..]).unwrap();
        s.write_all(b"link").unwrap();
        s
    });
    let other = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        let hello = greeting(1);
        s.write_all(&hello).unwrap();
        (s, control(addr, 1))
    });
    let _control2 = control(addr, 2);
    let t = Instant::now();
    let mut got = connect_mesh(&l0, &peers, 0, &|_| true, None, t + auth::HANDSHAKE_TIMEOUT * 2).unwrap();
    assert!(t.elapsed() < auth::HANDSHAKE_TIMEOUT / 2, "the silent stranger held rank 0 up for {:?}", t.elapsed());
    let (_s2, _s1) = (pieces.join().unwrap(), other.join().unwrap());
    got.sort_by_key(|c| c.peer);
    assert_eq!(ranks(&got), [1, 2]);
    let mut b = [0u8; 4];
    got[1].data.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    got[1].data.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"link", "the bytes after rank 2's greeting stay on its link");
}

/// A greeting slower than the token handshake's patience (a retransmitted segment on a lossy
/// link) is still taken: a connection rank 0 gave up on would be one rank 1 believes made, and
/// both would wait for each other until the deadline.
#[test]
fn a_greeting_slower_than_the_handshake_timeout() {
    let l0 = TcpListener::bind("127.0.0.1:0").unwrap();
    let peers = vec![peer(&l0), peer(&l0)];
    let addr = peers[0].addr;
    let slow = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        let hello = greeting(1);
        s.write_all(&hello[..8]).unwrap();
        std::thread::sleep(auth::HANDSHAKE_TIMEOUT + Duration::from_millis(500));
        s.write_all(&hello[8..]).unwrap();
        (s, control(addr, 1))
    });
    let deadline = Instant::now() + auth::HANDSHAKE_TIMEOUT * 2;
    let got = connect_mesh(&l0, &peers, 0, &|_| true, None, deadline).unwrap();
    let _s = slow.join().unwrap();
    assert_eq!(ranks(&got), [1]);
}

/// With a job token too, a stranger that connects first and never answers the challenge holds
/// up nobody: the real rank 1's handshake runs beside it.
#[test]
fn a_silent_stranger_holds_up_no_handshake() {
    let (l0, l1) = (TcpListener::bind("127.0.0.1:0").unwrap(), TcpListener::bind("127.0.0.1:0").unwrap());
    let peers = vec![peer(&l0), peer(&l1)];
    let token = Token::new("job");
    let _silent = TcpStream::connect(peers[0].addr).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let t = Instant::now();
    let deadline = t + auth::HANDSHAKE_TIMEOUT * 2;
    let (p1, t1) = (peers.clone(), token.clone());
    let rank1 = std::thread::spawn(move || connect_mesh(&l1, &p1, 1, &|_| true, Some(&t1), deadline).unwrap());
    let at0 = connect_mesh(&l0, &peers, 0, &|_| true, Some(&token), deadline).unwrap();
    let at1 = rank1.join().unwrap();
    assert!(t.elapsed() < auth::HANDSHAKE_TIMEOUT / 2, "the silent stranger held rank 0 up for {:?}", t.elapsed());
    assert_eq!((at0.len(), at0[0].peer, at1[0].peer), (1, 1, 0));
}

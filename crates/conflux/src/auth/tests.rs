//! The handshake over real loopback sockets.

use super::*;
use std::net::TcpListener;
use std::time::Instant;

const T: Duration = Duration::from_secs(5);

/// A connected pair: (accepted side, connecting side).
fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (a, _) = l.accept().unwrap();
    (a, c)
}

/// Runs `accept` with `acc` and `connect` with `con` at once; returns both results.
fn handshake(acc: (&Token, Purpose), con: (&Token, Purpose)) -> (Result<(), AuthError>, Result<(), AuthError>) {
    let (a, c) = pair();
    let (tok, purpose) = (acc.0.clone(), acc.1);
    let acceptor = std::thread::spawn(move || {
        let r = accept(&a, &tok, purpose, T);
        drop(a); // a rejected connector must see the close, as the store's does
        r
    });
    let rc = connect(&c, con.0, con.1, T);
    (acceptor.join().unwrap(), rc)
}

#[test]
fn the_same_token_passes_both_ways_and_leaves_the_stream_usable() {
    let t = Token::new("s3cret");
    let (a, c) = pair();
    c.set_read_timeout(Some(Duration::from_secs(7))).unwrap();
    let t2 = t.clone();
    let acceptor = std::thread::spawn(move || {
        accept(&a, &t2, Purpose::Data, T).unwrap();
        (&a).write_all(b"after").unwrap();
        a.read_timeout().unwrap()
    });
    connect(&c, &t, Purpose::Data, T).unwrap();
    let mut b = [0u8; 5];
    (&c).read_exact(&mut b).unwrap();
    assert_eq!(&b, b"after", "nothing of the handshake is left in the stream");
    assert_eq!(acceptor.join().unwrap(), None, "the acceptor's timeouts are restored");
    assert_eq!(c.read_timeout().unwrap(), Some(Duration::from_secs(7)), "the connector's too");
}

#[test]
fn a_wrong_token_is_rejected_by_the_acceptor_and_the_connector_hears_so() {
    let (ra, rc) = handshake((&Token::new("right"), Purpose::Store), (&Token::new("wrong"), Purpose::Store));
    assert_eq!(ra, Err(AuthError::WrongProof("connecting side")));
    assert_eq!(rc, Err(AuthError::Closed("accepting side")));
    assert!(rc.unwrap_err().to_string().starts_with("authentication failed"));
}

#[test]
fn a_proof_for_one_purpose_is_not_valid_for_the_other() {
    let t = Token::new("same");
    let (ra, _) = handshake((&t, Purpose::Store), (&t, Purpose::Data));
    assert_eq!(ra, Err(AuthError::WrongProof("connecting side")));
}

#[test]
fn the_connector_rejects_an_acceptor_that_cannot_prove_the_token() {
    let (a, c) = pair();
    let impostor = std::thread::spawn(move || {
        let mut hello = MAGIC.to_vec();
        hello.extend_from_slice(&[7u8; NONCE]);
        (&a).write_all(&hello).unwrap();
        let mut answer = [0u8; NONCE + TAG];
        (&a).read_exact(&mut answer).unwrap();
        // Echoing the connector's own proof back is the obvious reflection attempt.
        (&a).write_all(&answer[NONCE..]).unwrap();
        a
    });
    assert_eq!(connect(&c, &Token::new("t"), Purpose::Store, T), Err(AuthError::WrongProof("accepting side")));
    drop(impostor.join().unwrap());
}

#[test]
fn a_peer_that_speaks_something_else_or_nothing_fails_within_the_timeout() {
    let (a, c) = pair();
    (&a).write_all(&[5, 0, 0, 0, 64, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]).unwrap();
    (&a).write_all(&[0u8; 16]).unwrap();
    assert_eq!(connect(&c, &Token::new("t"), Purpose::Store, T), Err(AuthError::NotAHandshake("accepting side")));

    let (a, _c) = pair();
    let t0 = Instant::now();
    let r = accept(&a, &Token::new("t"), Purpose::Store, Duration::from_millis(200));
    assert_eq!(r, Err(AuthError::Timeout("connecting side", 0.2)));
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
}

#[test]
fn generated_tokens_are_fresh_hex_and_never_printed() {
    let (a, b) = (Token::generate().unwrap(), Token::generate().unwrap());
    assert_eq!(a.expose().len(), 64);
    assert!(a.expose().bytes().all(|c| c.is_ascii_hexdigit()));
    assert_ne!(a, b);
    assert!(!format!("{a:?}").contains(a.expose()));
}

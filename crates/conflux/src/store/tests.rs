//! The store over real loopback sockets.

use super::*;
use crate::auth::{AuthError, Token};
use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn serve() -> (StoreServer, String) {
    let s = StoreServer::bind("127.0.0.1:0".parse().unwrap(), None).unwrap();
    let a = s.local_addr().to_string();
    (s, a)
}

const T: Duration = Duration::from_secs(5);

#[test]
fn set_get_wait_add() {
    let (_s, addr) = serve();
    let c = StoreClient::connect(&addr, T, None).unwrap();
    c.set("a", b"hello").unwrap();
    assert_eq!(c.get("a", T).unwrap(), b"hello");
    c.wait(&["a"], T).unwrap();
    assert_eq!(c.add("n", 5).unwrap(), 5);
    assert_eq!(c.add("n", -7).unwrap(), -2);
    c.set("a", b"").unwrap();
    assert_eq!(c.get("a", T).unwrap(), b"");
}

#[test]
fn get_blocks_until_another_client_sets() {
    let (_s, addr) = serve();
    let c = StoreClient::connect(&addr, T, None).unwrap();
    let a2 = addr.clone();
    let setter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        StoreClient::connect(&a2, T, None).unwrap().set("late", b"x").unwrap();
    });
    assert_eq!(c.get("late", T).unwrap(), b"x");
    setter.join().unwrap();
}

#[test]
fn missing_keys_time_out_and_are_named() {
    let (_s, addr) = serve();
    let c = StoreClient::connect(&addr, T, None).unwrap();
    c.set("there", b"1").unwrap();
    let t0 = Instant::now();
    let e = c.wait(&["there", "absent"], Duration::from_millis(200)).unwrap_err();
    assert!(t0.elapsed() >= Duration::from_millis(200));
    assert_eq!(e, StoreError::Timeout { keys: vec!["absent".into()], secs: 0.2 });
    assert!(matches!(c.get("nope", Duration::from_millis(50)), Err(StoreError::Timeout { .. })));
    // The connection is still usable after a timeout.
    assert_eq!(c.get("there", T).unwrap(), b"1");
}

#[test]
fn connect_fails_with_a_deadline_when_nobody_serves() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let e = StoreClient::connect(&format!("127.0.0.1:{port}"), Duration::from_millis(300), None).err().unwrap();
    assert!(matches!(e, StoreError::Connection { .. }), "{e}");
}

fn next_event(m: &mut Monitor) -> Event {
    let deadline = Instant::now() + T;
    loop {
        if let Some(e) = m.try_event() {
            return e;
        }
        assert!(Instant::now() < deadline, "no event");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn monitors_hear_of_deaths_failures_and_leaving_ranks() {
    let (s, addr) = serve();
    let c = StoreClient::connect(&addr, T, None).unwrap();
    let mut m0 = c.monitor(0, 0, T).unwrap();
    let m1 = c.monitor(1, 0, T).unwrap();
    let mut m2 = c.monitor(2, 0, T).unwrap();
    m2.goodbye();
    drop(m2);
    assert_eq!(next_event(&mut m0), Event::RankLeft { rank: 2 });
    drop(m1);
    assert_eq!(next_event(&mut m0), Event::RankDied { rank: 1 }, "a goodbye is not a death");
    let mut m3 = c.monitor(3, 0, T).unwrap();
    // Late monitors hear of what happened before them.
    assert_eq!(next_event(&mut m3), Event::RankLeft { rank: 2 });
    assert_eq!(next_event(&mut m3), Event::RankDied { rank: 1 });
    m3.report_failure(1, "gone");
    assert_eq!(next_event(&mut m0), Event::Failure { culprit: 1, reporter: 3, reason: "gone".into() });
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(m0.try_event(), None);
    m3.goodbye();
    assert_eq!(next_event(&mut m0), Event::RankLeft { rank: 3 });
    m0.goodbye();
    assert_eq!(s.wait_goodbyes(4, T), 4);
    drop(s);
    assert_eq!(next_event(&mut m0), Event::StoreLost);
}

#[test]
fn channels_of_one_rank_each_hear_events_and_die_once() {
    let (s, addr) = serve();
    let c = StoreClient::connect(&addr, T, None).unwrap();
    let mut watcher = c.monitor(0, 0, T).unwrap();
    let mut watcher_group = c.monitor(0, 7, T).unwrap();
    let mut main1 = c.monitor(1, 0, T).unwrap();
    let mut lane1 = c.monitor(1, 3, T).unwrap();
    lane1.report_failure(2, "lost rank 2");
    let failure = Event::Failure { culprit: 2, reporter: 1, reason: "lost rank 2".into() };
    assert_eq!(next_event(&mut watcher), failure);
    assert_eq!(next_event(&mut watcher_group), failure);
    assert_eq!(next_event(&mut main1), failure, "the reporter's other channels hear it too");
    // A channel that says goodbye and closes is not a death; the rank's last line closing is.
    lane1.goodbye();
    drop(lane1);
    drop(main1);
    assert_eq!(next_event(&mut watcher), Event::RankDied { rank: 1 });
    assert_eq!(next_event(&mut watcher_group), Event::RankDied { rank: 1 });
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(watcher.try_event(), None, "one death is reported once");
    watcher_group.goodbye();
    watcher.goodbye();
    assert_eq!(s.wait_goodbyes(2, T), 2);
}

#[test]
fn garbage_and_oversized_frames_close_only_that_connection() {
    let (_s, addr) = serve();
    let mut raw = TcpStream::connect(&addr).unwrap();
    raw.write_all(&u32::MAX.to_le_bytes()).unwrap();
    let mut raw2 = TcpStream::connect(&addr).unwrap();
    raw2.write_all(&[3, 0, 0, 0, 99, 1, 2]).unwrap();
    for r in [&mut raw, &mut raw2] {
        r.set_read_timeout(Some(T)).unwrap();
        let mut b = [0u8; 1];
        assert_eq!(std::io::Read::read(r, &mut b).unwrap_or(0), 0, "closed");
    }
    let c = StoreClient::connect(&addr, T, None).unwrap();
    c.set("k", b"v").unwrap();
    assert_eq!(c.get("k", T).unwrap(), b"v");
}

mod fuzz {
    //! Whatever a connection sends, the server neither panics nor stops serving the others,
    //! and the decoders only ever return errors.
    use super::*;
    use crate::store::wire::{split_frame, Dec};
    use proptest::prelude::*;
    use std::io::Read;

    /// Frames of every request kind with random fields, and raw noise.
    fn frames() -> impl Strategy<Value = Vec<u8>> {
        let field = prop_oneof![
            any::<u64>().prop_map(|v| v.to_le_bytes().to_vec()),
            prop::collection::vec(any::<u8>(), 0..40).prop_map(|b| {
                let mut f = (b.len() as u32).to_le_bytes().to_vec();
                f.extend(b);
                f
            }),
            any::<u32>().prop_map(|v| v.to_le_bytes().to_vec()),
        ];
        let framed = (0u8..90, prop::collection::vec(field, 0..4)).prop_map(|(kind, fields)| {
            let body: Vec<u8> = std::iter::once(kind).chain(fields.concat()).collect();
            let mut f = (body.len() as u32).to_le_bytes().to_vec();
            f.extend(body);
            f
        });
        prop::collection::vec(prop_oneof![framed, prop::collection::vec(any::<u8>(), 0..32)], 0..6)
            .prop_map(|v| v.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        #[test]
        fn a_connection_sending_anything_does_not_harm_the_others(bytes in frames()) {
            let (_s, addr) = serve();
            let good = StoreClient::connect(&addr, T, None).unwrap();
            good.set("k", b"v").unwrap();
            let mut bad = TcpStream::connect(&addr).unwrap();
            let _ = bad.write_all(&bytes);
            let _ = bad.shutdown(std::net::Shutdown::Write);
            // Whatever it answers, the server finishes with this connection in bounded time.
            bad.set_read_timeout(Some(T)).unwrap();
            let mut sink = Vec::new();
            let _ = bad.read_to_end(&mut sink);
            prop_assert_eq!(good.get("k", T).unwrap(), b"v".to_vec());
            prop_assert_eq!(StoreClient::connect(&addr, T, None).unwrap().add("n", 2).unwrap(), 2);
        }

        #[test]
        fn decoders_return_errors_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            let mut buf = bytes;
            while let Ok(Some(body)) = split_frame(&mut buf) {
                if let Ok(mut d) = Dec::new(&body) {
                    let _ = (d.u64(), d.bytes(), d.str(), d.u64());
                }
            }
        }
    }
}

fn serve_with(token: &str) -> (StoreServer, String) {
    let s = StoreServer::bind("127.0.0.1:0".parse().unwrap(), Some(Token::new(token))).unwrap();
    let a = s.local_addr().to_string();
    (s, a)
}

#[test]
fn with_a_token_the_right_clients_and_their_monitors_are_served() {
    let (s, addr) = serve_with("job-1");
    let c = StoreClient::connect(&addr, T, Some(Token::new("job-1"))).unwrap();
    c.set("a", b"1").unwrap();
    assert_eq!(c.get("a", T).unwrap(), b"1");
    let mut m0 = c.monitor(0, 0, T).unwrap();
    let m1 = c.monitor(1, 0, T).unwrap();
    drop(m1);
    assert_eq!(next_event(&mut m0), Event::RankDied { rank: 1 });
    m0.goodbye();
    assert_eq!(s.wait_goodbyes(2, T), 2);
}

#[test]
fn a_wrong_token_or_none_is_refused_with_an_authentication_error() {
    let (_s, addr) = serve_with("job-1");
    let e = StoreClient::connect(&addr, T, Some(Token::new("job-2"))).err().unwrap();
    assert!(matches!(e, StoreError::Auth { source: AuthError::Closed(_), .. }), "{e}");
    assert!(e.to_string().contains("authentication failed"), "{e}");
    // A client without a token connects, but its first request hears the challenge.
    let c = StoreClient::connect(&addr, T, None).unwrap();
    let e = c.set("k", b"v").unwrap_err();
    assert!(matches!(e, StoreError::Auth { source: AuthError::Required(_), .. }), "{e}");
    let ok = StoreClient::connect(&addr, T, Some(Token::new("job-1"))).unwrap();
    assert!(matches!(ok.get("k", Duration::from_millis(100)), Err(StoreError::Timeout { .. })), "k was not set");
}

#[test]
fn a_client_with_a_token_does_not_trust_a_store_without_one() {
    let (_s, addr) = serve();
    let t0 = Instant::now();
    let e = StoreClient::connect(&addr, Duration::from_millis(300), Some(Token::new("t"))).err().unwrap();
    assert!(matches!(e, StoreError::Auth { source: AuthError::Timeout(..), .. }), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
}

#[test]
fn an_unauthenticated_request_is_never_acted_on() {
    let (_s, addr) = serve_with("job-1");
    // A well-formed SET, longer than the handshake's answer so the server reads it as one.
    let set = wire::Enc::new(wire::kind::SET).bytes(b"evil").bytes(&[b'x'; 100]).finish();
    let mut raw = TcpStream::connect(&addr).unwrap();
    raw.write_all(&set).unwrap();
    raw.set_read_timeout(Some(T)).unwrap();
    let mut got = Vec::new();
    std::io::Read::read_to_end(&mut raw, &mut got).unwrap();
    assert_eq!(got.len(), 40, "only the challenge, then the close: no reply to the SET");
    assert_eq!(got[..8], crate::auth::MAGIC);
    let c = StoreClient::connect(&addr, T, Some(Token::new("job-1"))).unwrap();
    assert!(matches!(c.get("evil", Duration::from_millis(100)), Err(StoreError::Timeout { .. })));
}

/// A request whose answer comes too late leaves the connection out of step: the next request
/// fails, naming the first failure, instead of taking the late answer as its own.
#[test]
fn a_late_answer_is_never_taken_for_the_next_requests() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (first_failed, wait_first) = std::sync::mpsc::channel::<()>();
    let fake = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let _request = wire::read_frame(&mut conn).unwrap();
        wait_first.recv().unwrap();
        // The answer to the first get, after the client gave up on it.
        wire::write_frame(&mut conn, &wire::Enc::new(wire::kind::VALUE).bytes(b"first").finish()).unwrap();
        let _ = wire::read_frame(&mut conn);
        conn
    });
    let c = StoreClient::connect(&addr, T, None).unwrap();
    let e = c.get("a", Duration::ZERO).unwrap_err();
    assert!(e.to_string().contains("no complete answer within"), "{e}");
    first_failed.send(()).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let second = c.get("b", Duration::ZERO);
    assert!(
        matches!(&second, Err(StoreError::Connection { detail, .. }) if detail.contains("earlier request failed")),
        "{second:?}"
    );
    drop(c);
    fake.join().unwrap();
}

//! The job token and the listeners' addresses, with real rank processes and real sockets:
//! jobs with a token work, a rank with the wrong one is refused by name, strangers' bytes are
//! never acted on, and nothing listens on the wildcard address.

mod common;

use common::*;
use conflux::auth::{Token, MAGIC};
use conflux::store::{StoreClient, StoreError};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(120);
const TOKEN: &str = "a-test-token-0123456789";

#[test]
fn a_job_with_a_token_works_over_shm_and_tcp() {
    for transport in ["shm", "tcp"] {
        let env = [("CONFLUX_JOB_TOKEN", TOKEN), ("CONFLUX_TRANSPORT", transport), ("CONFLUX_TIMEOUT_S", "60")];
        assert_all_passed(&run_job(3, &["quick"], &env, LIMIT), 3);
    }
}

#[test]
fn the_launcher_gives_every_rank_one_fresh_token_unless_the_user_set_one() {
    let tokens = |env: &[(&str, &str)]| -> Vec<String> {
        let mut cmd = Command::new(CONFLUX);
        cmd.args(["run", "-n", "2", "--no-prefix", "--", "sh", "-c", "echo token=$CONFLUX_JOB_TOKEN"]);
        cmd.env_remove("CONFLUX_JOB_TOKEN").envs(env.iter().copied());
        let out = wait_output(cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap(), LIMIT).0;
        assert!(out.status.success(), "{}", text(&out));
        text(&out).lines().filter_map(|l| l.strip_prefix("token=")).map(String::from).collect()
    };
    let (a, b) = (tokens(&[]), tokens(&[]));
    assert_eq!(a.len(), 2);
    assert_eq!(a[0], a[1], "both ranks of a job share its token");
    assert!(a[0].len() == 64 && a[0].bytes().all(|c| c.is_ascii_hexdigit()), "{a:?}");
    assert_ne!(a[0], b[0], "each job gets its own");
    assert_eq!(tokens(&[("CONFLUX_JOB_TOKEN", TOKEN)]), vec![TOKEN, TOKEN]);
}

/// Starts rank `r` of `n` of `conflux-check quick` on the store at `addr`:`port`.
fn rank(r: usize, n: usize, addr: &str, port: u16, env: &[(&str, &str)]) -> Child {
    Command::new(CHECK)
        .arg("quick")
        .envs([("RANK", r.to_string()), ("WORLD_SIZE", n.to_string()), ("LOCAL_RANK", r.to_string())])
        .envs([("LOCAL_WORLD_SIZE", n.to_string()), ("MASTER_ADDR", addr.into()), ("MASTER_PORT", port.to_string())])
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Runs ranks with the given tokens (index 0 is rank 0, which serves the store); returns
/// each rank's output. Every rank must end, none may hang.
fn ranks_with_tokens(tokens: &[&str]) -> Vec<(bool, String)> {
    let port = free_port();
    let env = |t| [("CONFLUX_JOB_TOKEN", t), ("CONFLUX_TIMEOUT_S", "5"), ("CONFLUX_TRANSPORT", "tcp")];
    let children: Vec<Child> =
        tokens.iter().enumerate().map(|(r, t)| rank(r, tokens.len(), "127.0.0.1", port, &env(t))).collect();
    children
        .into_iter()
        .map(|c| {
            let (out, took) = wait_output(c, Duration::from_secs(60));
            assert!(took < Duration::from_secs(30), "a rank took {took:?} to fail:\n{}", text(&out));
            (out.status.success(), text(&out))
        })
        .collect()
}

#[test]
fn a_rank_with_the_wrong_token_fails_to_join_and_names_authentication() {
    let outs = ranks_with_tokens(&[TOKEN, TOKEN, "not-the-job-token"]);
    let (ok, wrong) = &outs[2];
    assert!(!ok, "the stranger joined:\n{wrong}");
    assert!(wrong.contains("cannot create the communicator") && wrong.contains("authentication failed"), "{wrong}");
    for (ok, t) in &outs[..2] {
        assert!(!ok, "a rank finished a job that is missing a rank:\n{t}");
        assert!(
            t.contains("cannot create the communicator") && t.contains("rank/2"),
            "fails naming the missing rank:\n{t}"
        );
    }
    assert!(
        outs[0].1.contains("store: refused the connection from 127.0.0.1:"),
        "rank 0 logs the refusal:\n{}",
        outs[0].1
    );
}

#[test]
fn ranks_refuse_a_store_that_holds_another_token() {
    let outs = ranks_with_tokens(&["the-store-is-an-impostor", TOKEN]);
    let (ok, t) = &outs[1];
    assert!(!ok && t.contains("authentication failed"), "rank 1 must refuse the store:\n{t}");
}

/// Connects to the store at `addr` as soon as it listens.
fn connect_when_up(addr: SocketAddr) -> TcpStream {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            Ok(s) => return s,
            Err(e) => assert!(Instant::now() < deadline, "the store at {addr} never listened: {e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `bytes` without authenticating; returns all the store sent back before it closed.
fn unauthenticated(addr: SocketAddr, bytes: &[u8]) -> (SocketAddr, Vec<u8>) {
    let mut s = connect_when_up(addr);
    let me = s.local_addr().unwrap();
    s.write_all(bytes).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).expect("the store closes the connection, it does not leave it hanging");
    (me, got)
}

/// A store frame: u32 length, kind, then length-prefixed byte strings (see store/mod.rs).
fn frame(kind: u8, fields: &[&[u8]]) -> Vec<u8> {
    let mut body = vec![kind];
    for f in fields {
        body.extend((f.len() as u32).to_le_bytes());
        body.extend_from_slice(f);
    }
    let mut out = (body.len() as u32).to_le_bytes().to_vec();
    out.extend(body);
    out
}

#[test]
fn unauthenticated_store_clients_are_closed_unheard_and_the_job_completes() {
    let port = free_port();
    let env = [("CONFLUX_JOB_TOKEN", TOKEN), ("CONFLUX_TIMEOUT_S", "60")];
    let rank0 = rank(0, 2, "127.0.0.1", port, &env);
    let store: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();

    // A forged address for rank 1, which would break the job if the store took it; longer than
    // the handshake's answer, so the store reads it as one and closes at once.
    let key = "conflux/l0/rank/1";
    let forged = frame(1, &[key.as_bytes(), b"a-forged-node-name-long-enough\n1\n127.0.0.1:9\n1"]);
    assert!(forged.len() > 64);
    let (forger, got) = unauthenticated(store, &forged);
    assert_eq!(got.len(), 40, "the challenge and nothing else, no reply to the SET: {got:?}");
    assert_eq!(got[..8], MAGIC);
    let (garbler, got) = unauthenticated(store, &[0xff; 200]);
    assert_eq!(got.len(), 40);

    let legit = StoreClient::connect(&store.to_string(), Duration::from_secs(10), Some(Token::new(TOKEN))).unwrap();
    match legit.get(key, Duration::from_millis(200)) {
        Err(StoreError::Timeout { .. }) => {}
        other => panic!("the forged SET was acted on: {other:?}"),
    }
    drop(legit);

    let rank1 = rank(1, 2, "127.0.0.1", port, &env);
    let (o0, o1) = (wait_output(rank0, LIMIT).0, wait_output(rank1, LIMIT).0);
    for (r, o) in [(0, &o0), (1, &o1)] {
        assert!(o.status.success() && text(o).contains(", 0 failed"), "rank {r}:\n{}", text(o));
    }
    for peer in [forger, garbler] {
        assert!(text(&o0).contains(&format!("refused the connection from {peer}")), "{peer}:\n{}", text(&o0));
    }
}

/// The TCP listeners process `pid` holds, from /proc: its socket inodes matched against its
/// network namespace's table of listening sockets.
fn listeners(pid: u32) -> Vec<SocketAddr> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok()).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|l| l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']').map(String::from))
        .collect();
    let mut out = Vec::new();
    for (table, v4) in [("tcp", true), ("tcp6", false)] {
        let t = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for row in t.lines().skip(1) {
            let f: Vec<&str> = row.split_whitespace().collect();
            if f.len() > 9 && f[3] == "0A" && inodes.iter().any(|i| i == f[9]) {
                out.push(parse_proc_addr(f[1], v4));
            }
        }
    }
    out
}

fn parse_proc_addr(s: &str, v4: bool) -> SocketAddr {
    let (ip, port) = s.split_once(':').unwrap();
    let port = u16::from_str_radix(port, 16).unwrap();
    let ip: IpAddr = if v4 {
        u32::from_str_radix(ip, 16).unwrap().to_le_bytes().into()
    } else {
        let mut b = [0u8; 16];
        for (i, w) in b.chunks_mut(4).enumerate() {
            w.copy_from_slice(&u32::from_str_radix(&ip[i * 8..i * 8 + 8], 16).unwrap().to_le_bytes());
        }
        b.into()
    };
    SocketAddr::new(ip, port)
}

/// This host's first non-loopback interface with an IPv4 address, from `ip -4 -o addr`.
fn outside_interface() -> Option<(String, IpAddr)> {
    let out = Command::new("ip").args(["-4", "-o", "addr"]).output().ok()?;
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let ip = f.get(3)?.split('/').next()?.parse().ok()?;
        (f.get(1)? != &"lo").then(|| (f[1].to_string(), ip))
    })
}

/// Starts rank 0 of 2 with `env`, waits until it has its two listeners (the store's and its
/// data listener), checks them against `store` and `data_ip`, then runs rank 1 to completion.
fn check_bound(master: IpAddr, env: &[(&str, &str)], data_ip: IpAddr) {
    let port = conflux_cli::launch::free_port(&master.to_string()).unwrap();
    let mut env = env.to_vec();
    env.extend([("CONFLUX_TRANSPORT", "tcp"), ("CONFLUX_TIMEOUT_S", "60"), ("CONFLUX_JOB_TOKEN", TOKEN)]);
    let rank0 = rank(0, 2, &master.to_string(), port, &env);
    let deadline = Instant::now() + Duration::from_secs(30);
    let bound = loop {
        let l = listeners(rank0.id());
        if l.len() >= 2 || Instant::now() > deadline {
            break l;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(bound.len(), 2, "expected the store's and one data listener: {bound:?}");
    assert!(bound.contains(&SocketAddr::new(master, port)), "the store binds MASTER_ADDR: {bound:?}");
    assert!(bound.iter().any(|a| a.ip() == data_ip && a.port() != port), "data listener on {data_ip}: {bound:?}");
    assert!(bound.iter().all(|a| !a.ip().is_unspecified()), "nothing on the wildcard: {bound:?}");
    let rank1 = rank(1, 2, &master.to_string(), port, &env);
    for (r, c) in [(0, rank0), (1, rank1)] {
        let o = wait_output(c, LIMIT).0;
        assert!(o.status.success() && text(&o).contains(", 0 failed"), "rank {r}:\n{}", text(&o));
    }
}

#[test]
fn listeners_bind_the_store_address_and_the_data_interface_never_the_wildcard() {
    let lo: IpAddr = [127, 0, 0, 1].into();
    check_bound(lo, &[], lo);
    match outside_interface() {
        Some((name, ip)) => {
            check_bound(lo, &[("CONFLUX_SOCKET_IFNAME", &name)], ip);
            check_bound(ip, &[], ip);
        }
        None => {
            println!("no non-loopback IPv4 interface: CONFLUX_SOCKET_IFNAME checked on lo only");
            check_bound(lo, &[("CONFLUX_SOCKET_IFNAME", "lo")], lo);
        }
    }
}

#[test]
fn an_unknown_socket_interface_is_a_clear_error() {
    let outs = {
        let port = free_port();
        let env = [("CONFLUX_SOCKET_IFNAME", "nosuchif0"), ("CONFLUX_TIMEOUT_S", "5")];
        let c: Vec<Child> = (0..2).map(|r| rank(r, 2, "127.0.0.1", port, &env)).collect();
        c.into_iter().map(|c| text(&wait_output(c, Duration::from_secs(60)).0)).collect::<Vec<_>>()
    };
    for t in outs {
        assert!(t.contains("CONFLUX_SOCKET_IFNAME=\"nosuchif0\"") && t.contains("does not exist"), "{t}");
    }
}

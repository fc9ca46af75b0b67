//! `conflux tune` writes a tuning file the library reads back, and a bad tuning file fails
//! every rank of a job with a message naming it.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{text, wait_output, CONFLUX};
use conflux::algo::select::Model;

fn temp(name: &str) -> std::path::PathBuf {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    std::env::temp_dir().join(format!("conflux-tune-test-{}-{nanos}-{name}", std::process::id()))
}

fn conflux(args: &[&str], env: &[(&str, &std::path::Path)]) -> std::process::Output {
    let mut cmd = Command::new(CONFLUX);
    cmd.args(args).env("CONFLUX_TIMEOUT_S", "20").env_remove("CONFLUX_TUNE_FILE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    wait_output(cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap(), Duration::from_secs(60)).0
}

#[test]
fn tune_writes_a_file_the_library_reads() {
    let path = temp("good.txt");
    let out = conflux(&["tune", "-n", "2", "--out", path.to_str().unwrap()], &[]);
    let t = text(&out);
    assert!(out.status.success(), "tune failed ({}):\n{t}", out.status);
    assert!(t.contains("CONFLUX_TUNE_FILE="), "no usage hint:\n{t}");
    let file = std::fs::read_to_string(&path).unwrap();
    assert!(file.starts_with("# conflux tune"), "no header:\n{file}");
    let m = Model::from_text(&file).unwrap_or_else(|e| panic!("{e}:\n{file}"));
    let values =
        [m.shm.alpha_us, m.shm.gbps, m.tcp.alpha_us, m.tcp.gbps, m.sync_us, m.reduce_gbps, m.copy_gbps, m.oversub];
    assert!(values.iter().all(|v| v.is_finite() && *v > 0.0), "{m:?}");
    // Measured, not the defaults: reduce and copy rates are never exactly the defaults.
    assert_ne!((m.reduce_gbps, m.copy_gbps), (Model::default().reduce_gbps, Model::default().copy_gbps));
    // TCP's bandwidth is measured; its α stays the model's fitted per-step cost, and says so.
    assert_eq!(m.tcp.alpha_us, Model::default().tcp.alpha_us, "{file}");
    assert!(file.contains("tcp_alpha_us is the default"), "{file}");

    let bench = ["bench", "all_reduce", "-n", "2", "-b", "8", "-e", "8", "--check"];
    let out = conflux(&bench, &[("CONFLUX_TUNE_FILE", &path)]);
    assert!(out.status.success(), "bench with the tuning file failed ({}):\n{}", out.status, text(&out));
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_bad_tuning_file_fails_every_rank_naming_it() {
    let path = temp("bad.txt");
    std::fs::write(&path, "speed = fast\n").unwrap();
    let out = conflux(&["bench", "all_reduce", "-n", "2", "-b", "8", "-e", "8"], &[("CONFLUX_TUNE_FILE", &path)]);
    let t = text(&out);
    assert!(!out.status.success(), "bench accepted a bad tuning file:\n{t}");
    assert!(t.contains(path.to_str().unwrap()), "the error does not name the file:\n{t}");
    let _ = std::fs::remove_file(&path);
}

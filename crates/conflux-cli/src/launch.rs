//! Starting the ranks of one node of a job, the way torchrun does, and stopping them all
//! when one fails.
//!
//! Each rank gets torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
//! GROUP_RANK, NODE_RANK, ROLE_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID) so that
//! programs written for torchrun run unchanged. Ranks die with the launcher (PDEATHSIG).
//!
//! The job token (`CONFLUX_JOB_TOKEN`, see `conflux::auth`): a one-node job without one gets a
//! fresh random token, so its store and links refuse strangers with no setup at all. Nodes of
//! a multi-node job cannot agree on a random token by themselves, so there the user sets the
//! same one on every node; unset, the job runs unauthenticated, as torchrun's does, after a
//! warning (refusing would break every multi-node script written for torchrun).
//!
//! Binding (`CONFLUX_BIND`, `binding`): `core` binds each rank to one core, consecutive local
//! ranks sharing one when there are more ranks than cores (0-1 on the first of 2 cores, 2-3 on
//! the second); `none` leaves placement to the kernel, as torchrun does. The default, `auto`,
//! binds a one-node job only, and only when its ranks outnumber the cores at most twice over,
//! where measurement on this project's 2-core machine favoured it:
//! - At 4 ranks, `bench all --algo all` was >15% faster bound in 23-24 of 73 operation x size
//!   cells and >15% slower in 5; broadcast of 512 KiB by tree took 82-86 us bound against
//!   114-123 unbound. At 3 ranks (two on one core, one alone), auto's collectives were >15%
//!   faster in 17 of 72 cells and slower in 4.
//! - Unbound, which two of the 4 ranks share a core is the kernel's choice and changes from run
//!   to run, and with it whether tree or chain is the faster reduce and broadcast (by up to
//!   35%). Bound in blocks, the pairs that share a core are 0-1 and 2-3, the placement where
//!   both do best: from 128 KiB up the tree was the faster in 46 of 48 operation x size x
//!   run cases over six bound runs, and auto stayed within 10% of the faster in all of them
//!   (below 128 KiB the two trade places from run to run by scheduling noise, bound or not).
//! - At 8 ranks 14-23 cells were >15% slower bound and 1-5 faster: four ranks held to one core
//!   cannot spill onto the other when it idles. With a core or more per rank there is no pair to
//!   place, and the kernel's freedom to move a rank off a busy core is worth more.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long ranks get between SIGTERM and SIGKILL once the job is being stopped.
const GRACE: Duration = Duration::from_secs(3);
/// torchrun's default rendezvous port, used when several nodes must agree on one.
pub const DEFAULT_PORT: u16 = 29500;

/// One node's share of a job.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    pub nproc_per_node: usize,
    pub nnodes: usize,
    pub node_rank: usize,
    pub master_addr: String,
    /// None: a free port when the job has one node, else [`DEFAULT_PORT`].
    pub master_port: Option<u16>,
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub extra_env: Vec<(String, String)>,
    /// Prefix every output line with "[rank]: ".
    pub prefix_output: bool,
}

/// Why a job did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The arguments describe no valid job.
    #[error("{0}")]
    Invalid(String),
    /// A rank's program could not be started.
    #[error("cannot start rank {rank} ({program}): {source}")]
    Spawn { rank: usize, program: String, source: std::io::Error },
    /// No job token could be made for a one-node job.
    #[error("cannot make a job token: {0}")]
    Token(#[from] conflux::auth::AuthError),
    /// A rank exited unsuccessfully; the others were stopped. `code` is its exit status when
    /// it exited with one (not killed), so a program can tell its own verdicts from failures.
    #[error("rank {rank} (local rank {local_rank}, pid {pid}) {status}; the job was stopped")]
    RankFailed { rank: usize, local_rank: usize, pid: u32, status: String, code: Option<i32> },
}

/// A job of `nproc` copies of this very program, with its own arguments, on this host: how
/// `conflux bench`, `tune` and `doctor` start their ranks when not inside a job (each copy
/// then sees WORLD_SIZE and runs as one rank).
pub fn self_job(nproc: usize, extra_env: Vec<(String, String)>) -> Result<LaunchSpec, LaunchError> {
    let program =
        std::env::current_exe().map_err(|e| LaunchError::Invalid(format!("cannot find my own executable: {e}")))?;
    Ok(LaunchSpec {
        nproc_per_node: nproc,
        nnodes: 1,
        node_rank: 0,
        master_addr: "127.0.0.1".into(),
        master_port: None,
        program,
        args: std::env::args_os().skip(1).collect(),
        extra_env,
        prefix_output: false,
    })
}

/// Runs this node's ranks to completion. Fails, naming the rank, as soon as one rank fails;
/// the remaining ranks get SIGTERM, then SIGKILL after a grace period.
pub fn launch(spec: &LaunchSpec) -> Result<(), LaunchError> {
    if spec.nproc_per_node == 0 || spec.nnodes == 0 {
        return Err(LaunchError::Invalid("--nproc-per-node and --nnodes must be at least 1".into()));
    }
    if spec.node_rank >= spec.nnodes {
        return Err(LaunchError::Invalid(format!(
            "--node-rank {} is not below --nnodes {}",
            spec.node_rank, spec.nnodes
        )));
    }
    let port = match spec.master_port {
        Some(p) => p,
        None if spec.nnodes == 1 => free_port(&spec.master_addr)?,
        None => DEFAULT_PORT,
    };
    let world = spec.nproc_per_node * spec.nnodes;
    let run_id = std::env::var("CONFLUX_RUN_ID").unwrap_or_else(|_| new_run_id());
    // Set: the ranks inherit it. Unset: made here for one node; see the module's doc.
    let token = match conflux::config::job_token_from_env() {
        Some(_) => None,
        None if spec.nnodes == 1 => Some(conflux::auth::Token::generate()?),
        None => {
            eprintln!(
                "conflux run: warning: CONFLUX_JOB_TOKEN is not set, so this {}-node job is not \
                 authenticated: anyone who can reach its ports can join or disturb it. Set the same \
                 CONFLUX_JOB_TOKEN on every node.",
                spec.nnodes
            );
            None
        }
    };
    let bind = conflux::config::bind_from_env().map_err(|e| LaunchError::Invalid(e.to_string()))?;
    let cpus = conflux::cpus::allowed();
    let mut ranks: Vec<Rank> = Vec::with_capacity(spec.nproc_per_node);
    for local in 0..spec.nproc_per_node {
        let rank = spec.node_rank * spec.nproc_per_node + local;
        let cpu = binding(bind, local, spec.nproc_per_node, spec.nnodes, &cpus);
        match spawn(spec, rank, local, world, port, &run_id, token.as_ref(), cpu) {
            Ok(r) => ranks.push(r),
            Err(e) => {
                stop(&mut ranks);
                return Err(e);
            }
        }
    }
    let result = supervise(&mut ranks);
    for r in &mut ranks {
        for t in r.relays.drain(..) {
            let _ = t.join();
        }
    }
    result
}

struct Rank {
    rank: usize,
    local: usize,
    child: Child,
    status: Option<ExitStatus>,
    relays: Vec<JoinHandle<()>>,
}

/// The CPU local rank `local` of `ranks` (of a job over `nodes` nodes) is bound to, if any (see
/// the module's doc): ranks spread in blocks over `cpus`, so consecutive ranks share a core when
/// there are more ranks. `Auto` leaves jobs over several nodes alone: their nodes may be
/// emulated on this one host (netns, tests), where launchers that cannot see each other would
/// all bind their first ranks to the first core.
fn binding(bind: conflux::config::Bind, local: usize, ranks: usize, nodes: usize, cpus: &[usize]) -> Option<usize> {
    use conflux::config::Bind;
    let oversubscribed_at_most_twice = ranks > cpus.len() && ranks <= 2 * cpus.len();
    match bind {
        Bind::Off => None,
        Bind::Auto if !oversubscribed_at_most_twice || nodes > 1 => None,
        Bind::Core | Bind::Auto => cpus.get(local * cpus.len() / ranks.max(1)).copied(),
    }
}

#[allow(clippy::too_many_arguments)]
fn spawn(
    spec: &LaunchSpec,
    rank: usize,
    local: usize,
    world: usize,
    port: u16,
    run_id: &str,
    token: Option<&conflux::auth::Token>,
    cpu: Option<usize>,
) -> Result<Rank, LaunchError> {
    let is_python = spec.program.extension().is_some_and(|e| e == "py");
    let mut cmd = if is_python {
        let mut c = Command::new(std::env::var_os("PYTHON").unwrap_or_else(|| "python3".into()));
        c.arg(&spec.program);
        c
    } else {
        Command::new(&spec.program)
    };
    cmd.args(&spec.args)
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("LOCAL_RANK", local.to_string())
        .env("LOCAL_WORLD_SIZE", spec.nproc_per_node.to_string())
        .env("GROUP_RANK", spec.node_rank.to_string())
        .env("NODE_RANK", spec.node_rank.to_string())
        .env("ROLE_RANK", rank.to_string())
        .env("ROLE_WORLD_SIZE", world.to_string())
        .env("MASTER_ADDR", &spec.master_addr)
        .env("MASTER_PORT", port.to_string())
        .env("TORCHELASTIC_RUN_ID", run_id)
        .env("CONFLUX_RUN_ID", run_id);
    if std::env::var_os("OMP_NUM_THREADS").is_none() {
        // torchrun's default too: N ranks each starting one thread per core oversubscribe.
        cmd.env("OMP_NUM_THREADS", "1");
    }
    if let Some(t) = token {
        cmd.env("CONFLUX_JOB_TOKEN", t.expose());
    }
    for (k, v) in &spec.extra_env {
        cmd.env(k, v);
    }
    if spec.prefix_output {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    }
    in_the_child(&mut cmd, cpu);
    let mut child = cmd.spawn().map_err(|source| LaunchError::Spawn {
        rank,
        program: spec.program.display().to_string(),
        source,
    })?;
    let mut relays = Vec::new();
    if spec.prefix_output {
        if let Some(out) = child.stdout.take() {
            relays.push(relay(out, rank, false));
        }
        if let Some(err) = child.stderr.take() {
            relays.push(relay(err, rank, true));
        }
    }
    Ok(Rank { rank, local, child, status: None, relays })
}

/// What the child does before it execs: die with the launcher, and bind to `cpu` if given.
#[allow(unsafe_code)]
fn in_the_child(cmd: &mut Command, cpu: Option<usize>) {
    use std::os::unix::process::CommandExt;
    let set = cpu.map(|c| {
        let mut set = rustix::thread::CpuSet::new();
        set.set(c);
        set
    });
    // SAFETY: the closure runs in the forked child before exec; it makes only the prctl and
    // sched_setaffinity system calls, on a CPU set built before the fork (async-signal-safe,
    // no allocation, no locks), as pre_exec requires.
    unsafe {
        cmd.pre_exec(move || {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))?;
            if let Some(set) = &set {
                rustix::thread::sched_setaffinity(None, set)?;
            }
            Ok(())
        });
    }
}

/// Copies a rank's output to ours, line by line, each line prefixed with its rank.
fn relay(stream: impl Read + Send + 'static, rank: usize, is_err: bool) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stream);
        let mut line = Vec::new();
        loop {
            line.clear();
            match lines.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if line.last() != Some(&b'\n') {
                line.push(b'\n');
            }
            let mut buf = format!("[{rank}]: ").into_bytes();
            buf.extend_from_slice(&line);
            let _ = if is_err { std::io::stderr().write_all(&buf) } else { std::io::stdout().write_all(&buf) };
        }
    })
}

/// Waits for every rank; on the first failure, stops the rest and names the failed rank.
fn supervise(ranks: &mut [Rank]) -> Result<(), LaunchError> {
    loop {
        let mut running = 0;
        for i in 0..ranks.len() {
            if ranks[i].status.is_some() {
                continue;
            }
            match ranks[i].child.try_wait() {
                Ok(Some(st)) => {
                    ranks[i].status = Some(st);
                    if !st.success() {
                        let r = &ranks[i];
                        let err = LaunchError::RankFailed {
                            rank: r.rank,
                            local_rank: r.local,
                            pid: r.child.id(),
                            status: describe(st),
                            code: st.code(),
                        };
                        let others = ranks.iter().filter(|r| r.status.is_none()).count();
                        eprintln!("conflux run: {err}: stopping the {others} rank(s) still running");
                        stop(ranks);
                        return Err(err);
                    }
                }
                Ok(None) => running += 1,
                Err(_) => running += 1,
            }
        }
        if running == 0 {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// SIGTERM to every running rank, SIGKILL to those still there after the grace period.
fn stop(ranks: &mut [Rank]) {
    let signal = |r: &Rank, s| {
        if let Some(pid) = rustix::process::Pid::from_raw(r.child.id() as i32) {
            let _ = rustix::process::kill_process(pid, s);
        }
    };
    for r in ranks.iter().filter(|r| r.status.is_none()) {
        signal(r, rustix::process::Signal::TERM);
    }
    let deadline = Instant::now() + GRACE;
    loop {
        for r in ranks.iter_mut().filter(|r| r.status.is_none()) {
            if let Ok(Some(st)) = r.child.try_wait() {
                r.status = Some(st);
            }
        }
        if ranks.iter().all(|r| r.status.is_some()) {
            return;
        }
        if Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    for r in ranks.iter_mut().filter(|r| r.status.is_none()) {
        let _ = r.child.kill();
        r.status = r.child.wait().ok();
    }
}

fn describe(st: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(s)) => format!("was killed by signal {s}{}", signal_name(s)),
        _ => "ended abnormally".into(),
    }
}

fn signal_name(s: i32) -> &'static str {
    match s {
        6 => " (SIGABRT)",
        9 => " (SIGKILL)",
        11 => " (SIGSEGV)",
        15 => " (SIGTERM)",
        _ => "",
    }
}

/// A port for the job's store that nothing listens on. It is chosen below Linux's ephemeral
/// range (32768 and up), so the data listeners other jobs bind to port 0 cannot take it
/// between this check and rank 0 binding it.
pub fn free_port(addr: &str) -> Result<u16, LaunchError> {
    const LOW: u32 = 20000;
    const SPAN: u32 = 12000;
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let start = (nanos ^ std::process::id().wrapping_mul(2654435761)) % SPAN;
    let mut last = None;
    for i in 0..256 {
        let port = (LOW + (start + i * 7919) % SPAN) as u16;
        match TcpListener::bind((addr, port)) {
            Ok(_) => return Ok(port),
            Err(e) => last = Some(e),
        }
    }
    Err(LaunchError::Invalid(format!(
        "cannot find a free port on --master-addr {addr}: {}",
        last.map_or_else(String::new, |e| e.to_string())
    )))
}

fn new_run_id() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{:x}{:x}", std::process::id(), nanos & 0xffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::binding;
    use conflux::config::Bind;

    fn cpus_of(bind: Bind, ranks: usize, cpus: &[usize]) -> Vec<Option<usize>> {
        (0..ranks).map(|local| binding(bind, local, ranks, 1, cpus)).collect()
    }

    #[test]
    fn core_binds_consecutive_ranks_in_blocks_over_the_allowed_cpus() {
        assert_eq!(cpus_of(Bind::Core, 4, &[0, 1]), [Some(0), Some(0), Some(1), Some(1)]);
        assert_eq!(cpus_of(Bind::Core, 2, &[4, 6]), [Some(4), Some(6)]);
        assert_eq!(cpus_of(Bind::Core, 8, &[0, 1]), [Some(0); 4].into_iter().chain([Some(1); 4]).collect::<Vec<_>>());
    }

    #[test]
    fn auto_binds_only_when_the_ranks_outnumber_the_cores_at_most_twice() {
        assert_eq!(cpus_of(Bind::Auto, 4, &[0, 1]), cpus_of(Bind::Core, 4, &[0, 1]));
        assert_eq!(cpus_of(Bind::Auto, 3, &[0, 1]), cpus_of(Bind::Core, 3, &[0, 1]));
        assert_eq!(cpus_of(Bind::Auto, 2, &[0, 1]), [None, None]);
        assert_eq!(cpus_of(Bind::Auto, 5, &[0, 1]), [None; 5]);
        assert_eq!(cpus_of(Bind::Auto, 8, &[0, 1]), [None; 8]);
        assert_eq!(
            cpus_of(Bind::Auto, 16, &[0, 1, 2, 3, 4, 5, 6, 7]),
            cpus_of(Bind::Core, 16, &[0, 1, 2, 3, 4, 5, 6, 7])
        );
        assert_eq!(cpus_of(Bind::Off, 4, &[0, 1]), [None; 4]);
        // Nodes of a job may share this host: auto binds only a one-node job; core binds all.
        assert_eq!((0..4).map(|l| binding(Bind::Auto, l, 4, 2, &[0, 1])).collect::<Vec<_>>(), [None; 4]);
        assert_eq!(binding(Bind::Core, 3, 4, 2, &[0, 1]), Some(1));
    }
}

//! Who started this process, and so where its rank, the job's size and the store are: torchrun
//! and `conflux run` (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), else Slurm's srun, Open
//! MPI's mpirun, or a PMI launcher (MPICH's and Intel MPI's hydra), as NCCL-based launch
//! helpers read them. torchrun's variables win when both are set (torchrun inside an srun
//! allocation).
//!
//! The store's address: MASTER_ADDR and MASTER_PORT when set. Otherwise, under Slurm, the
//! first host of the step's node list and port 20000 + SLURM_JOB_ID mod 10000; under Open
//! MPI, 127.0.0.1 (a one-host job; set MASTER_ADDR across hosts) and port 20000 + the job id
//! mod 10000; under PMI, MASTER_PORT is required (hydra exports no job id).

use super::{bad, var};
use crate::error::{Error, Result};

/// First port of the range a launcher's job id picks the store's port from.
const PORT_BASE: usize = 20000;
/// How many ports that range holds.
const PORT_SPAN: usize = 10000;

/// The job this process belongs to, as its launcher described it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobEnv {
    pub rank: usize,
    pub size: usize,
    /// "host:port" of the store (rank 0 serves it); None for a one-rank job.
    pub store: Option<String>,
    /// Which launcher's variables these came from: "torchrun", "slurm", "openmpi", "pmi", or
    /// "none" (no variables: a one-rank job).
    pub launcher: &'static str,
}

/// Reads the job from the environment (see the module's comment).
pub fn job_from_env() -> Result<JobEnv> {
    job_from(&|name| var(name))
}

/// `job_from_env` over any lookup, so that tests need not touch the process's environment.
pub fn job_from(get: &dyn Fn(&str) -> Option<String>) -> Result<JobEnv> {
    let num = |name: &str| -> Result<Option<usize>> {
        match get(name) {
            None => Ok(None),
            Some(v) => v.trim().parse().map(Some).map_err(|_| bad(name, &v)),
        }
    };
    let port_from_id = |id_var: &str| -> Result<Option<usize>> {
        Ok(match get(id_var) {
            None => None,
            Some(v) => Some(PORT_BASE + v.trim().parse::<u64>().map_err(|_| bad(id_var, &v))? as usize % PORT_SPAN),
        })
    };
    let (launcher, rank, size, host, port) = if num("RANK")?.is_some() || num("WORLD_SIZE")?.is_some() {
        ("torchrun", num("RANK")?.unwrap_or(0), num("WORLD_SIZE")?.unwrap_or(1), None, None)
    } else if let Some(rank) = num("SLURM_PROCID")? {
        let size = num("SLURM_STEP_NUM_TASKS")?.or(num("SLURM_NTASKS")?).unwrap_or(1);
        let nodes = get("SLURM_STEP_NODELIST").or_else(|| get("SLURM_JOB_NODELIST"));
        ("slurm", rank, size, nodes.and_then(|l| first_host(&l)), port_from_id("SLURM_JOB_ID")?)
    } else if let Some(rank) = num("OMPI_COMM_WORLD_RANK")? {
        let size = num("OMPI_COMM_WORLD_SIZE")?.unwrap_or(1);
        ("openmpi", rank, size, None, port_from_id("OMPI_MCA_ess_base_jobid")?)
    } else if let Some(rank) = num("PMI_RANK")? {
        ("pmi", rank, num("PMI_SIZE")?.unwrap_or(1), None, None)
    } else {
        ("none", 0, 1, None, None)
    };
    if rank >= size {
        return Err(Error::Config(format!("{launcher}'s variables give rank {rank} of a job of {size}")));
    }
    let store = if size > 1 {
        let host = get("MASTER_ADDR").or(host).unwrap_or_else(|| "127.0.0.1".into());
        let port = num("MASTER_PORT")?.or(port).ok_or_else(|| {
            Error::Config(format!("MASTER_PORT is not set (needed when the job has more than one rank; {launcher})"))
        })?;
        Some(format!("{host}:{port}"))
    } else {
        None
    };
    Ok(JobEnv { rank, size, store, launcher })
}

/// The first host of a Slurm host list: "n1,n2" gives n1, "gpu[03-05,9],x" gives gpu03.
pub fn first_host(list: &str) -> Option<String> {
    let list = list.trim();
    let end = list.find([',', '[']).unwrap_or(list.len());
    let prefix = &list[..end];
    if !list[end..].starts_with('[') {
        return (!prefix.is_empty()).then(|| prefix.to_string());
    }
    let inside = &list[end + 1..list[end..].find(']')? + end];
    let first = inside.split([',', '-']).next()?.trim();
    (!first.is_empty() && first.bytes().all(|b| b.is_ascii_digit())).then(|| format!("{prefix}{first}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(vars: &[(&str, &str)]) -> Result<JobEnv> {
        job_from(&|name| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string()))
    }

    #[test]
    fn host_lists_give_their_first_host() {
        assert_eq!(first_host("node7").as_deref(), Some("node7"));
        assert_eq!(first_host("a1,b2").as_deref(), Some("a1"));
        assert_eq!(first_host("gpu[03-05,9],x[1-2]").as_deref(), Some("gpu03"));
        assert_eq!(first_host("gpu[7]").as_deref(), Some("gpu7"));
        assert_eq!(first_host("").as_deref(), None);
        assert_eq!(first_host("gpu[").as_deref(), None);
    }

    #[test]
    fn each_launchers_variables_are_read() {
        let t = job(&[("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "29500"), ("SLURM_PROCID", "0")]).unwrap();
        assert_eq!((t.launcher, t.rank, t.size, t.store.as_deref()), ("torchrun", 1, 2, Some("127.0.0.1:29500")));
        let s = job(&[
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_JOB_NODELIST", "cn[12-13]"),
            ("SLURM_JOB_ID", "123456"),
        ])
        .unwrap();
        assert_eq!((s.launcher, s.rank, s.size, s.store.as_deref()), ("slurm", 3, 4, Some("cn12:23456")));
        let s = job(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_STEP_NUM_TASKS", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "7"),
        ]);
        assert_eq!(s.unwrap().store.as_deref(), Some("h:7"));
        let o = job(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_MCA_ess_base_jobid", "1068040193"),
        ])
        .unwrap();
        assert_eq!((o.launcher, o.rank, o.size, o.store.as_deref()), ("openmpi", 1, 2, Some("127.0.0.1:20193")));
        let p = job(&[("PMI_RANK", "0"), ("PMI_SIZE", "2")]).unwrap_err().to_string();
        assert!(p.contains("MASTER_PORT is not set") && p.contains("pmi"), "{p}");
        let none = job(&[]).unwrap();
        assert_eq!((none.launcher, none.rank, none.size, none.store), ("none", 0, 1, None));
        assert!(job(&[("SLURM_PROCID", "4"), ("SLURM_NTASKS", "4")]).is_err());
        assert!(job(&[("OMPI_COMM_WORLD_RANK", "x")]).is_err());
    }
}

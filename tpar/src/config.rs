//! [`Config`]: how a rank joins its job — rank, world, rendezvous, job id, timeout, the CPU
//! workspace's size — and the settings every backend reads at init (plan overrides, launch
//! settings, topology, tuning). Both backends take it: the CPU [`crate::CpuCommunicator`] and
//! the GPU communicator.
//!
//! Owns: the defaults and the checks that need no peer. Must never read the environment
//! itself: [`Config::from_env`] takes what `crate::settings` parsed.

use crate::error::{Error, Result};
use crate::rendezvous::JoinSpec;
use crate::settings::{LaunchSettings, Overrides, Settings, Tune};
use crate::workspace::MAX_WORLD;
use std::path::PathBuf;
use std::time::Duration;

pub use crate::settings::{DEFAULT_SHM_BYTES, DEFAULT_TIMEOUT};

/// How to join a job.
#[derive(Clone, Debug)]
pub struct Config {
    pub rank: usize,
    pub world: usize,
    /// Unix-domain socket path rank 0 listens on.
    pub rendezvous: PathBuf,
    /// Identifies the job; ranks of another job are refused.
    pub job_id: u64,
    /// Bound on every wait, rendezvous included.
    pub timeout: Duration,
    /// Size of the shared workspace (rank 0's value is used).
    pub shm_budget: usize,
    /// Epoch of the first call (rank 0's value is used). Tests start near u32::MAX to cross
    /// wrap-around.
    pub first_epoch: u32,
    /// Extra salt for the plan-input digest that ranks compare at rendezvous (0 normally;
    /// tests set it to provoke a mismatch). The digest itself covers topology, profile and
    /// overrides.
    pub fingerprint: u64,
    /// The plan's settings (`TPAR_ALGO`, `TPAR_PROFILE`, `TPAR_DEBUG`, …).
    pub overrides: Overrides,
    /// How tpar's kernels are launched (`TPAR_PDL`, `TPAR_LEAN`, …; `TPAR_BLOCKS` is the
    /// plan's, in `overrides`).
    pub launch: LaunchSettings,
    /// `TPAR_TOPOLOGY`: the fabric to plan for instead of the discovered one.
    pub topology: Option<String>,
    /// `TPAR_TUNE`.
    pub tune: Tune,
}

/// The job id when none is given: the rendezvous path and this process's parent. Ranks of
/// one job share a launcher (torchrun, mpirun, `tpar`, a shell script), so they agree; a
/// second job on the same path from another launcher gets another id and is refused by
/// rank 0 instead of pairing with the first. Launchers that start ranks from different
/// parents set `TPAR_JOB_ID` (as `tpar` itself does, with a random id).
pub fn default_job_id(rendezvous: &std::path::Path) -> u64 {
    let mut key = rendezvous.as_os_str().as_encoded_bytes().to_vec();
    key.extend_from_slice(&std::os::unix::process::parent_id().to_le_bytes());
    crate::units::fnv1a64(&key)
}

fn required(var: &'static str, what: &str) -> Error {
    Error::Config { var, value: String::new(), reason: format!("not set; {what}") }
}

impl Config {
    /// A configuration with defaults and no settings; the job id is derived from the
    /// rendezvous path.
    pub fn new(rank: usize, world: usize, rendezvous: impl Into<PathBuf>) -> Config {
        let rendezvous = rendezvous.into();
        Config {
            rank,
            world,
            job_id: default_job_id(&rendezvous),
            rendezvous,
            timeout: DEFAULT_TIMEOUT,
            shm_budget: DEFAULT_SHM_BYTES,
            first_epoch: 0,
            fingerprint: 0,
            overrides: Overrides::default(),
            launch: LaunchSettings::default(),
            topology: None,
            tune: Tune::default(),
        }
    }

    /// A configuration for rank `rank` of `world` on `rendezvous` under `s`: every setting
    /// but the job's identity (which the caller gives) taken from `s`.
    pub fn with_settings(rank: usize, world: usize, rendezvous: impl Into<PathBuf>, s: &Settings) -> Config {
        let mut c = Config::new(rank, world, rendezvous);
        if let Some(j) = s.job.job_id {
            c.job_id = j;
        }
        if let Some(t) = s.job.timeout {
            c.timeout = t;
        }
        if let Some(b) = s.job.shm_bytes {
            c.shm_budget = b;
        }
        if let Some(e) = s.job.first_epoch {
            c.first_epoch = e;
        }
        c.overrides = s.overrides.clone();
        c.launch = s.launch;
        c.topology = s.topology.clone();
        c.tune = s.tune;
        c
    }

    /// The job an outside launcher describes: `TPAR_RANK`, `TPAR_WORLD_SIZE`, `TPAR_RDZV`
    /// (`unix:/path` or a path), and every other setting (`crate::settings`).
    pub fn from_env() -> Result<Config> {
        Config::from_settings(&Settings::from_env()?)
    }

    /// As [`from_env`](Self::from_env), from settings already parsed.
    pub fn from_settings(s: &Settings) -> Result<Config> {
        let rank = s.job.rank.ok_or_else(|| required("TPAR_RANK", "an outside launcher sets TPAR_RANK, TPAR_WORLD_SIZE and TPAR_RDZV"))?;
        let world = s.job.world.ok_or_else(|| required("TPAR_WORLD_SIZE", "an outside launcher sets TPAR_RANK, TPAR_WORLD_SIZE and TPAR_RDZV"))?;
        let rdzv = s.job.rdzv.clone().ok_or_else(|| required("TPAR_RDZV", "expected unix:/path/to/socket"))?;
        Ok(Config::with_settings(rank, world, rdzv, s))
    }

    /// What this rank brings to the rendezvous (for joining a bare `ControlPlane`).
    pub fn join_spec(&self) -> JoinSpec {
        JoinSpec {
            rank: self.rank,
            world: self.world,
            path: self.rendezvous.clone(),
            job_id: self.job_id,
            fingerprint: self.fingerprint,
            timeout: self.timeout,
            shm_budget: self.shm_budget,
            first_epoch: self.first_epoch,
        }
    }

    /// Checks what can be checked before meeting any peer.
    pub fn validate(&self) -> Result<()> {
        if !(2..=MAX_WORLD).contains(&self.world) {
            return Err(Error::invalid(
                "world",
                format!("world size {} is outside 2 to {MAX_WORLD} (a world of 1 needs no all-reduce)", self.world),
            ));
        }
        if self.rank >= self.world {
            return Err(Error::invalid("rank", format!("rank {} is out of range for world size {}", self.rank, self.world)));
        }
        if self.timeout.is_zero() {
            return Err(Error::invalid("timeout", "must be positive"));
        }
        Ok(())
    }
}

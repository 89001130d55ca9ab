//! One start of a communicator: rank 0 decides whether to skip the tune, read the cache, or
//! take the key's lock and tune; every rank follows, and every rank ends with the same
//! [`Outcome`] and the same bytes of the result. The one line a start prints
//! ([`Outcome::line`]) says which, and what it cost.
//!
//! Owns: the start protocol. Must never: let a rank other than rank 0 read or write the
//! cache, tune without the key's lock, or wait for a lock longer than
//! [`StartSpec::lock_wait`].

use super::cache::{Cache, Lookup, TuneLock};
use super::{measure, Ranks, TunePlan, LOCK_POLL};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kinds::CaptureMode;
use crate::plan::profile::ProfileFingerprint;
use crate::plan::tuned::{Cost, Decision, TuneKey, Tuned};
use crate::settings::Tune;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How one start went, the same on every rank.
#[derive(Clone, Debug)]
pub enum Outcome {
    /// No tune and no cached profile: the plan's defaults (or `TPAR_PROFILE`).
    Skipped { why: String },
    /// Read from the cache.
    Cached { tuned: Box<Tuned>, path: PathBuf, ms: f64 },
    /// Measured now. `stored`: the entry's path, or why it could not be stored.
    Tuned { tuned: Box<Tuned>, because: String, seconds: f64, stored: std::result::Result<PathBuf, String> },
    /// The tune failed or was cut short: the plan's defaults are in force.
    Failed { why: String, seconds: f64 },
}

impl Outcome {
    /// The tune this start adopts, if any.
    pub fn tuned(&self) -> Option<&Tuned> {
        match self {
            Outcome::Cached { tuned, .. } | Outcome::Tuned { tuned, .. } => Some(tuned),
            Outcome::Skipped { .. } | Outcome::Failed { .. } => None,
        }
    }

    /// The one line a start prints.
    pub fn line(&self) -> String {
        let note = |t: &Tuned| {
            let mut s = String::new();
            if let Some(why) = t.key.ranks.not_fabric() {
                s.push_str(&format!("; {why}: stored, its buckets are not used by the plan"));
            }
            if !t.rejected.is_empty() {
                let r: Vec<String> = t.rejected.iter().map(|x| x.to_string()).collect();
                s.push_str(&format!("; rejected by the bit-exact screen, never chosen: {}", r.join("; ")));
            }
            s
        };
        match self {
            Outcome::Skipped { why } => format!("tpar: no tune ({why}): the plan's defaults are in force"),
            Outcome::Cached { tuned, path, ms } => format!("tpar: tuned profile read from the cache in {ms:.1} ms ({}){}", path.display(), note(tuned)),
            Outcome::Tuned { tuned, because, seconds, stored } => format!(
                "tpar: tuned this machine in {seconds:.2} s ({}; {} ranks, {} screens, {} points, NCCL {}; {}) {}{}",
                because,
                tuned.key.world,
                tuned.cost.screens,
                tuned.cost.points,
                tuned.nccl,
                tuned.cost.budget,
                match stored {
                    Ok(p) => format!("stored in {}", p.display()),
                    Err(why) => format!("not stored: {why}"),
                },
                note(tuned)
            ),
            Outcome::Failed { why, seconds } => format!("tpar: the tune failed after {seconds:.2} s ({why}): the plan's defaults are in force"),
        }
    }
}

/// One start's tune settings and identity. Only rank 0's are acted on.
pub struct StartSpec<'a> {
    pub tune: Tune,
    /// A reason not to tune known before anything (`TPAR_PROFILE` set, the plan forced, the
    /// ranks not placed).
    pub skip: Option<String>,
    /// The cache directory (`settings::cache_dir()`); `None` when none can be named.
    pub cache: Option<PathBuf>,
    pub key: TuneKey,
    pub max_bytes: u64,
    pub plan: TunePlan,
    /// How long rank 0 waits for another process's tune of this key.
    pub lock_wait: Duration,
    pub fingerprint: &'a dyn Fn(CaptureMode) -> ProfileFingerprint,
    pub default_is_nccl: &'a dyn Fn(CaptureMode, DType, u64) -> bool,
}

/// What rank 0 tells every rank to do.
enum Action {
    Skip(String),
    Use { path: String, ms: f64, text: String },
    Tune(String),
}

impl Action {
    fn encode(&self) -> Vec<u8> {
        match self {
            Action::Skip(why) => [&[0u8][..], why.as_bytes()].concat(),
            Action::Use { path, ms, text } => {
                let mut v = vec![1u8];
                v.extend_from_slice(&(path.len() as u32).to_le_bytes());
                v.extend_from_slice(path.as_bytes());
                v.extend_from_slice(&ms.to_le_bytes());
                v.extend_from_slice(text.as_bytes());
                v
            }
            Action::Tune(because) => [&[2u8][..], because.as_bytes()].concat(),
        }
    }

    fn decode(b: &[u8]) -> Option<Action> {
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        match b.split_first()? {
            (0, why) => Some(Action::Skip(text(why))),
            (2, because) => Some(Action::Tune(text(because))),
            (1, rest) => {
                let n = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?) as usize;
                let path = text(rest.get(4..4 + n)?);
                let ms = f64::from_le_bytes(rest.get(4 + n..12 + n)?.try_into().ok()?);
                Some(Action::Use { path, ms, text: text(rest.get(12 + n..)?) })
            }
            _ => None,
        }
    }
}

/// Rank 0: what this start does (and the lock, when it tunes).
fn choose(spec: &StartSpec<'_>) -> (Action, Option<TuneLock>) {
    if spec.tune == Tune::Off {
        return (Action::Skip("TPAR_TUNE=off".into()), None);
    }
    if let Some(why) = &spec.skip {
        return (Action::Skip(why.clone()), None);
    }
    let Some(root) = &spec.cache else {
        if spec.tune == Tune::Force {
            return (Action::Tune("asked to measure now, without the cache".into()), None);
        }
        return (Action::Skip("no cache directory: set TPAR_CACHE_DIR (or HOME); without one every start would tune".into()), None);
    };
    let cache = Cache::under(root);
    let t0 = Instant::now();
    let hit = |cache: &Cache| match cache.read(&spec.key, spec.max_bytes) {
        Lookup::Hit { text, .. } => Ok(Action::Use { path: cache.entry_path(&spec.key).display().to_string(), ms: t0.elapsed().as_secs_f64() * 1e3, text }),
        Lookup::Miss(why) => Err(why),
    };
    let mut because = match spec.tune {
        Tune::Force => "TPAR_TUNE=force".to_string(),
        Tune::Auto | Tune::Off => match hit(&cache) {
            Ok(a) => return (a, None),
            Err(why) => why,
        },
    };
    loop {
        match cache.try_lock(&spec.key) {
            Err(e) => return (Action::Skip(format!("the tune cache cannot be locked: {e}")), None),
            Ok(Some(lock)) => {
                // Another process may have stored it while this one waited.
                if spec.tune == Tune::Auto {
                    match hit(&cache) {
                        Ok(a) => return (a, None),
                        Err(why) => because = why,
                    }
                }
                return (Action::Tune(because), Some(lock));
            }
            Ok(None) if t0.elapsed() >= spec.lock_wait => {
                let who = cache.lock_holder(&spec.key).map_or_else(|| "another process".to_string(), |p| format!("process {p}"));
                return (Action::Skip(format!("{who} is tuning this machine and did not finish within {:.0} s; this start does not wait longer", spec.lock_wait.as_secs_f64())), None);
            }
            Ok(None) => std::thread::sleep(LOCK_POLL),
        }
    }
}

/// One start: rank 0 decides whether to skip, read the cache or tune (holding the key's
/// lock), every rank follows, and every rank ends with the same [`Outcome`] (a tune's result
/// goes from rank 0 to every rank as the entry's bytes). Only a broken control plane is an
/// `Err`; a failed tune is [`Outcome::Failed`].
pub fn start<R: Ranks + ?Sized>(r: &mut R, spec: &StartSpec<'_>) -> Result<Outcome> {
    let t0 = Instant::now();
    let (action, lock) = if r.is_root() { choose(spec) } else { (Action::Skip(String::new()), None) };
    let all = r.all_gather(&if r.is_root() { action.encode() } else { Vec::new() })?;
    let action = all.first().and_then(|b| Action::decode(b)).ok_or_else(|| Error::invalid("tune", "rank 0 sent no tune action"))?;
    let because = match action {
        Action::Skip(why) => return Ok(Outcome::Skipped { why }),
        Action::Use { path, ms, text } => {
            return Ok(match Tuned::from_entry(&text) {
                Ok(t) => Outcome::Cached { tuned: Box::new(t), path: path.into(), ms },
                Err(e) => Outcome::Failed { why: format!("rank 0's cached entry did not parse here: {e}"), seconds: t0.elapsed().as_secs_f64() },
            });
        }
        Action::Tune(because) => because,
    };
    let tm = Instant::now();
    let m = match measure(r, &spec.plan) {
        Ok(m) => m,
        Err(Error::Tune { agreed: true, reason }) => return Ok(Outcome::Failed { why: reason, seconds: t0.elapsed().as_secs_f64() }),
        Err(e) => return Err(e),
    };
    // Rank 0 decides and stores; every rank adopts its bytes.
    let payload = if r.is_root() {
        let mut cost = Cost {
            seconds: tm.elapsed().as_secs_f64(),
            probe_seconds: m.probe_seconds,
            nccl_seconds: r.nccl_join_seconds(),
            screens: m.screens,
            points: m.points.len(),
            budget: spec.plan.describe(),
        };
        if let Some(why) = &m.probe_failed {
            cost.budget.push_str(&format!("; probe failed ({why})"));
        }
        let tuned = Tuned::decide(Decision {
            key: spec.key.clone(),
            max_bytes: spec.max_bytes,
            points: &m.points,
            rejected: m.rejected.clone(),
            nccl: m.nccl.clone().unwrap_or(Err("not asked".into())),
            fingerprint: spec.fingerprint,
            default_is_nccl: spec.default_is_nccl,
            probe: m.probe.clone(),
            cost,
            unix_time: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        });
        match tuned.to_entry() {
            Err(e) => [&[0u8][..], e.to_string().as_bytes()].concat(),
            Ok(text) => {
                let stored = match (&spec.cache, &lock) {
                    (Some(root), Some(l)) => Cache::under(root).store(&tuned, l).map_err(|e| e.to_string()),
                    (None, _) => Err("no cache directory".to_string()),
                    (Some(_), None) => Err("no cache lock held".to_string()),
                };
                let said = match &stored {
                    Ok(p) => format!("+{}", p.display()),
                    Err(why) => format!("-{why}"),
                };
                let mut v = vec![1u8];
                v.extend_from_slice(&(said.len() as u32).to_le_bytes());
                v.extend_from_slice(said.as_bytes());
                v.extend_from_slice(text.as_bytes());
                v
            }
        }
    } else {
        Vec::new()
    };
    drop(lock);
    let all = r.all_gather(&payload)?;
    let seconds = t0.elapsed().as_secs_f64();
    let root = all.first().map(Vec::as_slice).unwrap_or_default();
    Ok(match root.split_first() {
        Some((1, rest)) => {
            let n = rest.get(..4).and_then(|b| b.try_into().ok()).map_or(usize::MAX, |b: [u8; 4]| u32::from_le_bytes(b) as usize);
            match (rest.get(4..4usize.saturating_add(n)), rest.get(4usize.saturating_add(n)..)) {
                (Some(said), Some(text)) => match Tuned::from_entry(&String::from_utf8_lossy(text)) {
                    Ok(t) => {
                        // Where rank 0 stored it, or why not: the same words on every rank.
                        let said = String::from_utf8_lossy(said);
                        let stored = match said.split_at(said.len().min(1)) {
                            ("+", p) => Ok(PathBuf::from(p)),
                            (_, why) => Err(why.to_string()),
                        };
                        Outcome::Tuned { tuned: Box::new(t), because, seconds, stored }
                    }
                    Err(e) => Outcome::Failed { why: format!("rank 0's result did not parse here: {e}"), seconds },
                },
                _ => Outcome::Failed { why: "rank 0's result was cut short".into(), seconds },
            }
        }
        Some((_, why)) => Outcome::Failed { why: format!("rank 0 could not encode the result: {}", String::from_utf8_lossy(why)), seconds },
        None => Outcome::Failed { why: "rank 0 sent no result".into(), seconds },
    })
}


#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_round_trip() {
        for a in [Action::Skip("why".into()), Action::Tune("because".into()), Action::Use { path: "/p".into(), ms: 1.5, text: "x\ny".into() }] {
            let b = a.encode();
            let back = Action::decode(&b).unwrap();
            assert_eq!(back.encode(), b);
        }
        assert!(Action::decode(&[1, 200, 0, 0, 0]).is_none());
        assert!(Action::decode(&[]).is_none());
    }
}

//! Latency sources for the model: a fixed figure, a closure (the simulator), `tpar bench
//! --json` records interpolated log-log, a tuned profile's buckets. Must never do I/O.

use crate::error::{Error, Result};
use crate::plan::profile::Profile;
use crate::report::Record;
use crate::kinds::Algorithm;
use crate::dtype::DType;

/// A source of all-reduce latency for a message size.
pub trait ArLatency {
    /// Latency in us of one all-reduce of `bytes`, and what produced it (for the report).
    fn latency(&self, bytes: usize) -> Result<(f64, String)>;
}

/// The same latency at every size (`--nccl-us`, `--plan-us`).
#[derive(Clone, Debug)]
pub struct Fixed(pub f64);

impl ArLatency for Fixed {
    fn latency(&self, _bytes: usize) -> Result<(f64, String)> {
        if !(self.0.is_finite() && self.0 >= 0.0) {
            return Err(Error::invalid("latency", format!("{} us is not a latency", self.0)));
        }
        Ok((self.0, "given".to_string()))
    }
}

/// Any function of the size (the simulator, a tuned profile).
pub struct FromFn<F: Fn(usize) -> Result<(f64, String)>>(pub F);

impl<F: Fn(usize) -> Result<(f64, String)>> ArLatency for FromFn<F> {
    fn latency(&self, bytes: usize) -> Result<(f64, String)> {
        (self.0)(bytes)
    }
}

/// Measured (bytes, us) points of one algorithm, interpolated linearly in log(bytes) vs
/// log(us) and extended past the ends along the end segments.
#[derive(Clone, Debug)]
pub struct LogLogTable {
    pub algorithm: Algorithm,
    points: Vec<(f64, f64)>,
}

impl LogLogTable {
    /// Points must have positive bytes and time; duplicates of a size are averaged.
    pub fn new(algorithm: Algorithm, mut points: Vec<(f64, f64)>) -> Result<Self> {
        if points
            .iter()
            .any(|(b, t)| !(*b > 0.0 && *t > 0.0 && b.is_finite() && t.is_finite()))
        {
            return Err(Error::invalid("records", format!("{algorithm}: sizes and times must be positive")));
        }
        if points.is_empty() {
            return Err(Error::invalid("records", format!("no points for {algorithm}")));
        }
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut merged: Vec<(f64, f64, usize)> = Vec::new();
        for (b, t) in points {
            match merged.last_mut() {
                Some(last) if last.0 == b => {
                    last.1 += t;
                    last.2 += 1;
                }
                _ => merged.push((b, t, 1)),
            }
        }
        Ok(LogLogTable {
            algorithm,
            points: merged.into_iter().map(|(b, t, n)| (b, t / n as f64)).collect(),
        })
    }

    /// Interpolated latency in us at `bytes` (> 0).
    pub fn at(&self, bytes: f64) -> f64 {
        let p = &self.points;
        if p.len() == 1 || bytes <= 0.0 {
            return p.first().map(|x| x.1).unwrap_or(0.0);
        }
        let i = match p.iter().position(|(b, _)| *b >= bytes) {
            Some(0) => 1,
            Some(i) => i,
            None => p.len() - 1,
        };
        let (b0, t0) = p[i - 1];
        let (b1, t1) = p[i];
        let w = (bytes.ln() - b0.ln()) / (b1.ln() - b0.ln());
        (t0.ln() + w * (t1.ln() - t0.ln())).exp()
    }

    /// Smallest and largest measured size.
    pub fn range(&self) -> (f64, f64) {
        (
            self.points.first().map(|x| x.0).unwrap_or(0.0),
            self.points.last().map(|x| x.0).unwrap_or(0.0),
        )
    }
}

impl ArLatency for LogLogTable {
    fn latency(&self, bytes: usize) -> Result<(f64, String)> {
        let (lo, hi) = self.range();
        let how = if lo == hi {
            "fixed"
        } else if (bytes as f64) < lo || (bytes as f64) > hi {
            "extrapolated"
        } else {
            "interpolated"
        };
        Ok((self.at(bytes as f64), how.to_string()))
    }
}

/// Latency from `tpar bench --json` records: one algorithm's curve, or the fastest of several
/// (what a tuned plan picks).
#[derive(Clone, Debug)]
pub struct BenchLatency {
    tables: Vec<LogLogTable>,
}

impl BenchLatency {
    /// All-reduce curves for `world` ranks of the algorithms `keep` accepts; records of other
    /// collectives (a bench file may hold all-gathers) and records that failed the
    /// correctness check (`wrong > 0`) are dropped.
    pub fn from_records(records: &[Record], world: usize, keep: impl Fn(Algorithm) -> bool) -> Result<Self> {
        let mut tables = Vec::new();
        for a in Algorithm::ALL {
            if !keep(a) {
                continue;
            }
            let pts: Vec<(f64, f64)> = records
                .iter()
                .filter(|r| r.collective == crate::kinds::Collective::AllReduce && r.algorithm == a && r.world == world && r.wrong <= 0)
                .map(|r| (r.bytes as f64, r.time_us))
                .collect();
            if !pts.is_empty() {
                tables.push(LogLogTable::new(a, pts)?);
            }
        }
        if tables.is_empty() {
            return Err(Error::invalid(
                "records",
                format!("no usable records for world {world} among the requested algorithms"),
            ));
        }
        Ok(BenchLatency { tables })
    }
}

impl ArLatency for BenchLatency {
    fn latency(&self, bytes: usize) -> Result<(f64, String)> {
        let mut best: Option<(f64, &LogLogTable)> = None;
        for t in &self.tables {
            let us = t.at(bytes as f64);
            if best.map_or(true, |(b, _)| us < b) {
                best = Some((us, t));
            }
        }
        let (us, t) = best.ok_or_else(|| Error::invalid("records", "no curves"))?;
        let (lo, hi) = t.range();
        let how = if (bytes as f64) < lo || (bytes as f64) > hi {
            "extrapolated"
        } else {
            "interpolated"
        };
        Ok((us, format!("{} ({how} from bench)", t.algorithm)))
    }
}

/// tpar's latency from a tuned profile: each bucket's winner and its median at the bucket's
/// upper size, interpolated log-log between buckets. Coarse (one point per bucket) but it is
/// what the plan will run on that machine.
#[derive(Clone, Debug)]
pub struct ProfileLatency {
    profile: Profile,
    dtype: DType,
    table: LogLogTable,
}

impl ProfileLatency {
    /// Latency for `dtype` from `profile`; an error if the profile has no table for it.
    pub fn new(profile: &Profile, dtype: DType) -> Result<Self> {
        let t = profile
            .table(crate::kinds::Collective::AllReduce, dtype)
            .ok_or_else(|| Error::invalid("profile", format!("the profile has no {dtype} table")))?;
        let pts = t
            .buckets
            .iter()
            .filter(|b| b.median_us > 0.0)
            .map(|b| (b.max_bytes as f64, b.median_us))
            .collect();
        let algorithm = t.buckets.first().map(|b| b.algorithm).unwrap_or(Algorithm::Nccl);
        Ok(ProfileLatency {
            profile: profile.clone(),
            dtype,
            table: LogLogTable::new(algorithm, pts)?,
        })
    }
}

impl ArLatency for ProfileLatency {
    fn latency(&self, bytes: usize) -> Result<(f64, String)> {
        let algo = self
            .profile
            .lookup(self.dtype, bytes as u64)
            .map(|b| b.algorithm.name().to_string())
            .unwrap_or_else(|| "above the largest tuned size".into());
        Ok((self.table.at(bytes as f64), format!("{algo} (profile)")))
    }
}

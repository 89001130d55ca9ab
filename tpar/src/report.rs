//! Benchmark records as `tpar bench --json` writes them, and the nccl-tests table format.
//!
//! Owns: the record schema shared by `bench`, `tune`, `model` and `sim`. Must never do I/O.

use crate::dtype::DType;
use crate::kinds::{Algorithm, Collective};
use serde::{Deserialize, Serialize};

/// One measured (algorithm, size) point. `time_us` is the median over iterations.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub algorithm: Algorithm,
    /// What the call computed (older records: the all-reduce).
    #[serde(default)]
    pub collective: Collective,
    /// `cpu` or `cuda`.
    pub backend: String,
    pub dtype: DType,
    pub world: usize,
    pub bytes: usize,
    pub count: usize,
    /// Median time per call, microseconds.
    pub time_us: f64,
    /// 10th and 90th percentile per call, microseconds (spread).
    #[serde(default)]
    pub p10_us: f64,
    #[serde(default)]
    pub p90_us: f64,
    /// bytes / time, GB/s.
    pub algbw: f64,
    /// nccl-tests' bus bandwidth, GB/s: algbw x 2(n-1)/n for the all-reduce, x (n-1)/n for
    /// the all-gather and the reduce-scatter.
    pub busbw: f64,
    /// Elements outside tolerance of the f64 reference, or ranks whose output differed; -1 if unchecked.
    pub wrong: i64,
}

impl Record {
    /// A measured point: `count` elements of `dtype` on `world` ranks, times per call in us as
    /// (median, p10, p90); bytes and both bandwidths follow from them.
    pub fn measured(
        algorithm: Algorithm,
        backend: impl Into<String>,
        dtype: DType,
        world: usize,
        count: usize,
        times: (f64, f64, f64),
        wrong: i64,
    ) -> Record {
        Record::measured_for(
            Collective::AllReduce,
            algorithm,
            backend,
            dtype,
            world,
            count,
            times,
            wrong,
        )
    }

    /// As [`measured`](Record::measured) for `collective`; `count` as nccl-tests counts it
    /// (the all-gather's output and the reduce-scatter's input: every rank's part).
    #[allow(clippy::too_many_arguments)]
    pub fn measured_for(
        collective: Collective,
        algorithm: Algorithm,
        backend: impl Into<String>,
        dtype: DType,
        world: usize,
        count: usize,
        (time_us, p10_us, p90_us): (f64, f64, f64),
        wrong: i64,
    ) -> Record {
        let bytes = count * dtype.size();
        let (algbw, busbw) = bandwidths_for(collective, bytes, world, time_us);
        Record {
            algorithm,
            collective,
            backend: backend.into(),
            dtype,
            world,
            bytes,
            count,
            time_us,
            p10_us,
            p90_us,
            algbw,
            busbw,
            wrong,
        }
    }
}

/// algbw and busbw in GB/s for `collective` of `bytes` (nccl-tests' size) on `world` ranks
/// taking `time_us`: nccl-tests' factors, 2(n-1)/n for the all-reduce, (n-1)/n for the
/// all-gather and the reduce-scatter.
pub fn bandwidths_for(
    collective: Collective,
    bytes: usize,
    world: usize,
    time_us: f64,
) -> (f64, f64) {
    let (algbw, busbw) = bandwidths(bytes, world, time_us);
    match collective {
        Collective::AllReduce => (algbw, busbw),
        _ if world > 1 => (algbw, algbw * (world as f64 - 1.0) / world as f64),
        _ => (algbw, algbw),
    }
}

/// algbw and busbw in GB/s for an all-reduce of `bytes` on `world` ranks taking `time_us`.
pub fn bandwidths(bytes: usize, world: usize, time_us: f64) -> (f64, f64) {
    if time_us <= 0.0 {
        return (0.0, 0.0);
    }
    let algbw = bytes as f64 / (time_us * 1e3);
    let n = world as f64;
    let busbw = if world > 1 { algbw * 2.0 * (n - 1.0) / n } else { algbw };
    (algbw, busbw)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measured_records_derive_bytes_and_bandwidths() {
        let g = Record::measured_for(
            Collective::AllGather,
            Algorithm::OneshotPush,
            "cuda",
            DType::BF16,
            4,
            500_000,
            (100.0, 90.0, 110.0),
            0,
        );
        assert!(
            (g.algbw - 10.0).abs() < 1e-9 && (g.busbw - 7.5).abs() < 1e-9,
            "all_gather_perf's (n-1)/n: {g:?}"
        );
        let r = Record::measured(
            Algorithm::TwoshotPush,
            "cuda",
            DType::BF16,
            4,
            500_000,
            (100.0, 90.0, 110.0),
            0,
        );
        assert_eq!((r.bytes, r.count, r.world), (1_000_000, 500_000, 4));
        assert!((r.algbw - 10.0).abs() < 1e-12 && (r.busbw - 15.0).abs() < 1e-12);
        assert_eq!((r.p10_us, r.p90_us, r.wrong), (90.0, 110.0, 0));
    }

    #[test]
    fn busbw_follows_nccl_tests() {
        let (alg, bus) = bandwidths(1_000_000, 8, 100.0);
        assert!((alg - 10.0).abs() < 1e-12);
        assert!((bus - 17.5).abs() < 1e-12);
    }
}

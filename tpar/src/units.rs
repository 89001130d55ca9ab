//! Units shared by every layer: the one size grammar, the one byte formatter, the one
//! stable hash, the one percentile helper, the one conversion of a deadline to the kernels'
//! nanoseconds.
//!
//! Owns: how a size is written by a user (`-b 42K`, `--bytes 1.5MiB`, `TPAR_MAX_BYTES=8M`)
//! and by tpar (`42 KiB`). Must never depend on any other module of the crate but `error`.

use crate::error::{Error, Result};

/// Parses a size the nccl-tests way, powers of 1024: `4096`, `42K`, `1M`, `2G`, `1T`; `B`,
/// `KB`/`KiB`-style suffixes and decimals (`1.5K`, `0.5M`) too; a decimal must come to a
/// whole number of bytes.
pub fn parse_bytes(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    let bad = || Error::invalid("bytes", format!("cannot read {s:?} as a size; expected e.g. 4096, 42K, 1.5M, 1GiB"));
    if num.is_empty() || num == "." {
        return Err(bad());
    }
    let shift = match suffix.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0u32,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return Err(bad()),
    };
    let overflow = || Error::invalid("bytes", format!("{s:?} does not fit in 64 bits"));
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(1u64 << shift).ok_or_else(overflow);
    }
    let x: f64 = num.parse().map_err(|_| bad())?;
    let v = x * (1u64 << shift) as f64;
    if !v.is_finite() || v >= u64::MAX as f64 {
        return Err(overflow());
    }
    if v.fract() != 0.0 {
        return Err(Error::invalid("bytes", format!("{s:?} is not a whole number of bytes ({v})")));
    }
    Ok(v as u64)
}

/// `parse_bytes` for a `usize` (sizes of buffers on this machine).
pub fn parse_size(s: &str) -> Result<usize> {
    let b = parse_bytes(s)?;
    usize::try_from(b).map_err(|_| Error::invalid("bytes", format!("{s:?} is larger than this machine's address space")))
}

/// `42 KiB`, `1 MiB`, `100 B`, `1.5 KiB`: exact where the size is a whole number of a unit,
/// else one decimal of the largest unit it reaches. For reasons, tables and chart axes.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [(u64, &str); 4] = [(1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (size, unit) in UNITS {
        if b >= size {
            if b % size == 0 {
                return format!("{} {unit}", b / size);
            }
            return format!("{:.1} {unit}", b as f64 / size as f64);
        }
    }
    format!("{b} B")
}

/// A deadline as the kernels take it (`TparArgs::timeout_ns`): nanoseconds, saturated at
/// `u64::MAX`, at least 1 (0 would expire every wait at once).
pub fn timeout_ns(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1)
}

/// FNV-1a, 64-bit: small and stable across platforms and releases (unlike `DefaultHasher`).
/// Job ids, fingerprints and cache keys all use this one.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes.iter().fold(OFFSET, |h, &b| (h ^ u64::from(b)).wrapping_mul(PRIME))
}

/// Median and 10th / 90th percentiles (nearest rank) of `xs`, sorted in place; zeros if empty.
pub fn percentiles(xs: &mut [f64]) -> Spread {
    if xs.is_empty() {
        return Spread::default();
    }
    xs.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| xs[((xs.len() - 1) as f64 * q).round() as usize];
    Spread { median: at(0.5), p10: at(0.1), p90: at(0.9) }
}

/// A median with its spread.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub p10: f64,
    pub p90: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_grammar_for_every_size() {
        for (s, want) in [
            ("4096", 4096),
            ("42K", 43008),
            ("42k", 43008),
            ("42KB", 43008),
            ("42KiB", 43008),
            ("42 KiB", 43008),
            ("1M", 1 << 20),
            ("16m", 16 << 20),
            ("1.5K", 1536),
            ("0.5M", 512 << 10),
            ("2G", 2 << 30),
            ("1T", 1 << 40),
            ("8B", 8),
        ] {
            assert_eq!(parse_bytes(s).ok(), Some(want), "{s}");
        }
        for bad in ["", "K", "3X", "1.5", "0.3K", "-1", "99999999999999T", ".K"] {
            assert!(parse_bytes(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn formatter_round_trips_through_the_parser() {
        for b in [0u64, 1, 100, 1024, 1536, 43008, 1 << 20, 3 << 30] {
            let s = human_bytes(b);
            if !s.contains('.') {
                assert_eq!(parse_bytes(&s).ok(), Some(b), "{s}");
            }
        }
        assert_eq!(human_bytes(43008), "42 KiB");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(100), "100 B");
    }

    #[test]
    fn a_deadline_in_nanoseconds_saturates_and_is_never_zero() {
        use std::time::Duration;
        assert_eq!(timeout_ns(Duration::from_millis(30)), 30_000_000);
        assert_eq!(timeout_ns(Duration::ZERO), 1);
        assert_eq!(timeout_ns(Duration::MAX), u64::MAX);
    }

    #[test]
    fn fnv_matches_published_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn percentiles_of_known_data() {
        let mut v: Vec<f64> = (1..=11).map(f64::from).rev().collect();
        assert_eq!(percentiles(&mut v), Spread { median: 6.0, p10: 2.0, p90: 10.0 });
        assert_eq!(percentiles(&mut []), Spread::default());
    }
}

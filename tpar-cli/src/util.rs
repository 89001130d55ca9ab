//! Small parsing and formatting helpers shared by the subcommands.

/// Parses a byte size with an optional K/M/G suffix (powers of 1024), as nccl-tests does.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1usize << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'B' => 1,
                _ => return Err(format!("{s:?}: unknown size suffix {c:?} (use K, M or G)")),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    num.trim()
        .parse::<usize>()
        .map_err(|_| format!("{s:?} is not a size (examples: 8, 42K, 16M)"))
        .and_then(|n| n.checked_mul(mult).ok_or_else(|| format!("{s:?} is too large")))
}

/// Sizes from `min` to `max` multiplying by `factor`, as all_reduce_perf's -b/-e/-f.
pub fn size_steps(min: usize, max: usize, factor: usize) -> Result<Vec<usize>, String> {
    if min > max {
        return Err(format!("-b {min} is larger than -e {max}"));
    }
    if factor < 2 && min != max {
        return Err("-f must be at least 2".into());
    }
    let mut v = vec![];
    let mut s = min.max(1);
    while s <= max {
        v.push(s);
        if factor < 2 {
            break;
        }
        s = match s.checked_mul(factor) {
            Some(n) => n,
            None => break,
        };
    }
    Ok(v)
}

/// GPUs NVML sees, discovered once per process (the launcher's backend choice, rank count
/// and GPU check would otherwise each initialise NVML).
pub fn gpu_count() -> usize {
    static GPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *GPUS.get_or_init(|| tpar::Topology::discover().gpu_count())
}

/// `--backend`: `cpu`, `cuda`, or `auto` (the default): GPUs when the CLI has the CUDA backend
/// and NVML sees two or more of them (or `--emulate-ranks` asks for one GPU), else CPU ranks.
pub fn resolve_backend(backend: &str, emulate: bool) -> Result<&'static str, String> {
    match backend {
        "cpu" => Ok("cpu"),
        "cuda" => Ok("cuda"),
        "auto" if emulate => Ok("cuda"),
        "auto" => {
            if !cfg!(feature = "cuda") {
                return Ok("cpu");
            }
            let gpus = gpu_count();
            if gpus == 1 && !crate::launch::is_rank() {
                eprintln!("tpar: one GPU here: running CPU ranks (GPU paths need 2+ GPUs; --backend cuda --emulate-ranks N runs N ranks on this one)");
            }
            Ok(if gpus >= 2 { "cuda" } else { "cpu" })
        }
        other => Err(format!("--backend {other:?}: expected auto, cpu or cuda")),
    }
}

/// Median and the 10th / 90th percentiles of `xs` (sorted in place).
pub fn percentiles(xs: &mut [f64]) -> (f64, f64, f64) {
    if xs.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    xs.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| xs[((xs.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.1), at(0.9))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_like_nccl_tests() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("42K"), Ok(43008));
        assert_eq!(parse_size("16m"), Ok(16 << 20));
        assert!(parse_size("3X").is_err());
        assert_eq!(size_steps(8, 128, 4).unwrap(), vec![8, 32, 128]);
        assert_eq!(size_steps(64, 64, 1).unwrap(), vec![64]);
    }

    #[test]
    fn backends_resolve() {
        assert_eq!(resolve_backend("cpu", true), Ok("cpu"));
        assert_eq!(resolve_backend("cuda", false), Ok("cuda"));
        assert_eq!(resolve_backend("auto", true), Ok("cuda"), "--emulate-ranks means one GPU");
        let gpus = tpar::Topology::discover().gpu_count();
        let want = if cfg!(feature = "cuda") && gpus >= 2 { "cuda" } else { "cpu" };
        assert_eq!(resolve_backend("auto", false), Ok(want), "{gpus} GPUs here");
        assert!(resolve_backend("tpu", false).unwrap_err().contains("auto, cpu or cuda"));
    }

    #[test]
    fn percentiles_of_known_data() {
        let mut v: Vec<f64> = (1..=11).map(|x| x as f64).rev().collect();
        assert_eq!(percentiles(&mut v), (6.0, 2.0, 10.0));
    }
}

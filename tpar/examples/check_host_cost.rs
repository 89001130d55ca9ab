//! The host side of one `tpar check --emulate-ranks 8` random call, without a GPU: every
//! rank's inputs generated, then every rank's output judged, once with a reference per rank
//! (how the harness judged before) and once with one `Reference` per call (now). The
//! outputs judged are the exact sums, as a passing run's are.
//!
//! cargo run --release -p tpar --example check_host_cost [WORLD] [CALLS]

use std::time::{Duration, Instant};
use tpar::testing::{all_inputs, bit_diffs, count_wrong, digest, expected, Reference, SplitMix};
use tpar::{bf16, f16, Element};

/// Log-uniform in 1..=max, as `tpar check` draws its random calls.
fn log_uniform(g: &mut SplitMix, max: usize) -> usize {
    let u = (g.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    ((max.max(1) as f64).ln() * u).exp().clamp(1.0, max.max(1) as f64) as usize
}

#[derive(Default)]
struct Cost {
    inputs: Duration,
    per_rank: Duration,
    once: Duration,
}

fn call<T: Element>(seed: u64, call: u64, world: usize, n: usize, c: &mut Cost) {
    let t = Instant::now();
    let inputs = all_inputs::<T>(seed, call, world, n);
    c.inputs += t.elapsed();
    let outs: Vec<Vec<T>> = (0..world).map(|_| expected(&inputs)).collect();
    let t = Instant::now();
    let mut before = 0usize;
    for out in &outs {
        before += count_wrong(out, &inputs) + bit_diffs(out, &expected(&inputs)) + (digest(out) & 1) as usize;
    }
    c.per_rank += t.elapsed();
    let t = Instant::now();
    let r = Reference::new(&inputs);
    let mut after = 0usize;
    for out in &outs {
        after += r.count_wrong(out) + bit_diffs(out, &r.exact) + (digest(out) & 1) as usize;
    }
    c.once += t.elapsed();
    assert_eq!(before, after, "both ways judge alike");
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let world = args.first().copied().unwrap_or(8);
    let calls = args.get(1).copied().unwrap_or(300) as u64;
    println!("{world} ranks, {calls} random calls per size (dtype and log-uniform count as tpar check draws them), host ms per call:");
    println!("{:>8} {:>10} {:>22} {:>20}", "-e", "inputs", "judge, ref per rank", "judge, one ref");
    for max_bytes in [64usize << 10, 256 << 10, 1 << 20, 4 << 20] {
        let mut g = SplitMix::new(1);
        let mut c = Cost::default();
        for k in 0..calls {
            match g.below(3) {
                0 => call::<f32>(1, k, world, log_uniform(&mut g, max_bytes / 4), &mut c),
                1 => call::<f16>(1, k, world, log_uniform(&mut g, max_bytes / 2), &mut c),
                _ => call::<bf16>(1, k, world, log_uniform(&mut g, max_bytes / 2), &mut c),
            }
        }
        let ms = |d: Duration| d.as_secs_f64() * 1e3 / calls as f64;
        println!("{:>8} {:>10.3} {:>22.3} {:>20.3}", tpar::units::human_bytes(max_bytes as u64), ms(c.inputs), ms(c.per_rank), ms(c.once));
    }
}

//! How long the first all-reduce of a fresh process takes, phase by phase: CUDA's start (driver
//! and context), the group's workspaces, the inputs, the call itself (which loads, or on an
//! empty cache compiles, the kernel it needs). Eight emulated ranks on GPU 0, one checked
//! call of 42 KiB bf16 (`oneshot-push`, or the algorithm named as the first argument); the
//! output is compared bitwise with the rank-order f32 sum. What `bench/results` quotes as the
//! first call with a cold or warm kernel cache (`TPAR_CACHE_DIR` / `XDG_CACHE_HOME` choose it).
//! `cargo run --release -p tpar --features cuda --example first_call [ALGO]`

#[cfg(not(feature = "cuda"))]
fn main() {
    eprintln!("skipped: the first-call measurement needs the `cuda` feature (--features cuda)");
    std::process::exit(2);
}

#[cfg(feature = "cuda")]
fn main() {
    match run() {
        Ok(0) => {}
        Ok(wrong) => {
            eprintln!("first_call: {wrong} elements differ from the rank-order sum");
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("first_call: {e}");
            std::process::exit(1);
        }
    }
}

#[cfg(feature = "cuda")]
fn run() -> tpar::Result<usize> {
    use std::time::Instant;
    use tpar::cuda::driver::{Device, DeviceBuffer};
    use tpar::cuda::rank_set::{RankSet, SetOptions};
    use tpar::{bf16, Algorithm, DType};
    let t0 = Instant::now();
    let algo = match std::env::args().nth(1) {
        Some(a) => a.parse::<Algorithm>()?,
        None => Algorithm::OneshotPush,
    };
    let (world, count) = (8usize, 21504usize);
    let dev = Device::open(0)?;
    let t_cuda = t0.elapsed();
    let mut g = RankSet::emulated(0, world, count * 2, SetOptions::from_env(tpar::Transport::P2p)?)?;
    let t_group = t0.elapsed();
    let inputs = tpar::testing::all_inputs::<bf16>(1, 0, world, count);
    let mut ins = Vec::with_capacity(world);
    let mut outs = Vec::with_capacity(world);
    for x in &inputs {
        let i = DeviceBuffer::new(&dev, count * 2)?;
        i.upload(x)?;
        let o = DeviceBuffer::new(&dev, count * 2)?;
        o.fill_u32(0xdead_beef)?;
        ins.push(i);
        outs.push(o);
    }
    let t_inputs = t0.elapsed();
    let (ip, op): (Vec<u64>, Vec<u64>) = (ins.iter().map(|b| b.ptr).collect(), outs.iter().map(|b| b.ptr).collect());
    g.all_reduce(algo, DType::BF16, count, &ip, &op, 0)?;
    let t_call = t0.elapsed();
    let want = tpar::testing::expected(&inputs);
    let mut wrong = 0usize;
    for o in &outs {
        let mut got = vec![bf16::ZERO; count];
        o.download(&mut got)?;
        wrong += got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
    }
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    println!(
        "first call: {algo} {world} emulated ranks x 42 KiB bf16: {:.0} ms from main (CUDA start {:.0}, group {:.0}, inputs {:.0}, the call {:.0}); {wrong} wrong",
        ms(t_call),
        ms(t_cuda),
        ms(t_group - t_cuda),
        ms(t_inputs - t_group),
        ms(t_call - t_inputs)
    );
    Ok(wrong)
}

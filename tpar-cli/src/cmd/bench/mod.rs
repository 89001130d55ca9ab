//! `tpar bench`: all_reduce_perf's flags and table, one block per algorithm (`sweep.rs`), or
//! with `--fused` the fused all-reduce + add-RMSNorm against its unfused pair (`fused.rs`).
//! The flags (`args.rs`) are both's.

mod args;
#[cfg(feature = "cuda")]
mod fused;
mod sweep;

pub use args::BenchArgs;

pub fn run(args: BenchArgs) -> Result<(), String> {
    if args.fused {
        #[cfg(feature = "cuda")]
        return fused::run(&args);
        #[cfg(not(feature = "cuda"))]
        return Err("--fused times GPU kernels: this tpar was built without the `cuda` feature".into());
    }
    sweep::run(args)
}

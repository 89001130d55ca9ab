//! Runs the link probe on this machine's GPUs and prints the topology with its probe as JSON
//! (what `tpar topo --probe --json` prints).
//! `cargo run --release -p tpar --features cuda --example probe [GPUS]`

#[cfg(not(feature = "cuda"))]
fn main() {
    eprintln!("skipped: the link probe needs the `cuda` feature (--features cuda)");
    std::process::exit(2);
}

#[cfg(feature = "cuda")]
fn main() {
    let gpus = std::env::args().nth(1).and_then(|s| s.parse().ok());
    let mut topo = tpar::topology::Topology::discover();
    let t0 = std::time::Instant::now();
    match tpar::cuda::probe::run(gpus, &tpar::cuda::probe::ProbeOptions::default()) {
        Ok(p) => {
            eprintln!("probe took {:.1} s", t0.elapsed().as_secs_f64());
            eprint!("{}", p.table());
            if topo.gpu_count() > 0 {
                topo.probe = Some(p);
            }
            println!("{}", topo.to_json());
        }
        Err(e) => {
            eprintln!("probe failed: {e}");
            std::process::exit(1);
        }
    }
}

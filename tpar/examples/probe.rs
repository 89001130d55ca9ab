//! Runs the link probe on this machine's GPUs and prints the topology with its probe as JSON
//! (what `tpar topo --probe --json` will print once the CLI calls `tpar::cuda::probe::run`).
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
            for q in &p.pairs {
                let f = |v: Option<f64>| v.map(|x| format!("{x:8.2}")).unwrap_or_else(|| "       -".into());
                eprintln!(
                    "GPU{} -> {:<5} store {} load {} ce {} | loaded: store {} load {} ce {} | flag {} us",
                    q.src,
                    q.dst.map(|d| format!("GPU{d}")).unwrap_or_else(|| "host".into()),
                    f(q.sm_store_gbps),
                    f(q.sm_load_gbps),
                    f(q.ce_gbps),
                    f(q.sm_store_loaded_gbps),
                    f(q.sm_load_loaded_gbps),
                    f(q.ce_loaded_gbps),
                    f(q.flag_us)
                );
            }
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

//! Self-tests across rank processes (one per GPU, or all on one GPU).

use super::Common;
use crate::harness::gpu::{err, launch_ranks, GpuRanks, TIMING_WORD};
use crate::harness::verify::{judge, Outcome, Verdict};
use crate::harness::{self, launch};
use std::io::Write;
use std::time::{Duration, Instant};
use tpar::cuda::abi::VEC_BYTES;
use tpar::cuda::driver::{DeviceBuffer, Event};
use tpar::cuda::kernels::kernel_algorithms;
use tpar::cuda::{Call, Served};
use tpar::testing::all_inputs;
use tpar::units::percentiles;
use tpar::{bf16, f16, Algorithm, DType, Element};

/// One line to stderr in one write, so lines of several rank processes do not interleave.
fn say_err(line: String) {
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

/// The topology every rank plans for when all share GPU 0 (`--plan-topology`).
fn shared(c: &Common) -> Result<Option<tpar::Topology>, String> {
    c.plan_topology.as_deref().map(|t| tpar::Topology::load(t).map_err(err)).transpose()
}

fn world(c: &Common, shared: bool) -> Result<usize, String> {
    // `--transport host`: remembered for the rank's communicator (GpuRanks::join).
    c.ranks.gpu_transport()?;
    match (shared, c.ranks.world) {
        (true, w) => Ok(w.unwrap_or(2)),
        (false, _) => c.ranks.world(&harness::Target::Gpu),
    }
}

/// Rank K SIGKILLs itself after 200 calls of `-e` bytes (bf16) each, through the plan
/// (tpar's kernels or NCCL, by size); every other rank must get an error (not hang) within
/// its bound, then Poisoned.
pub fn kill_rank(c: &Common, kill: Option<usize>) -> Result<(), String> {
    let shared = shared(c)?;
    let world = world(c, shared.is_some())?;
    let kill = kill.unwrap_or(world - 1);
    if kill >= world {
        return Err(format!("--rank {kill}: there are only {world} ranks"));
    }
    let bytes = c.max_bytes;
    if !launch::is_rank() {
        let timeout = tpar::Config::from_env().map(|c| c.timeout).unwrap_or(tpar::comm::DEFAULT_TIMEOUT);
        let t0 = Instant::now();
        let failures = match launch_ranks(world, timeout * 3 + Duration::from_secs(30), shared.is_some()) {
            Ok(()) => return Err(format!("fault test: rank {kill} was to kill itself, but every rank exited 0")),
            Err(e) => e,
        };
        let others: Vec<&str> = failures.split("; ").filter(|f| !f.starts_with(&format!("rank {kill} "))).collect();
        println!("# fault test: launcher saw \"{failures}\" after {:.1} s", t0.elapsed().as_secs_f64());
        if !others.is_empty() {
            return Err(format!("fault test: survivors failed the test: {}", others.join("; ")));
        }
        println!("PASS: rank {kill} was SIGKILLed; every other rank got an error within its bound and exited cleanly");
        return Ok(());
    }
    let cfg = tpar::Config::from_env().map_err(err)?;
    let mut r = GpuRanks::join(bytes, shared.as_ref())?;
    let (comm, b) = r.rank_process()?;
    let rank = comm.rank();
    let d = DType::BF16;
    let count = (bytes / 2).max(1);
    if rank == 0 {
        println!("# fault test: {world} ranks, calls of {bytes} B bf16 through the plan ({}), rank {kill} dies after 200", comm.plan(d, count * 2, tpar::CaptureMode::Eager).algorithm);
    }
    let inputs = all_inputs::<bf16>(c.seed, 0, world, count);
    b.input.upload(&inputs[rank]).map_err(err)?;
    let (i, o) = (b.input.ptr, b.output.ptr);
    let t0 = Instant::now();
    let bound = cfg.timeout * 2 + Duration::from_secs(5);
    let mut calls = 0u64;
    loop {
        if rank == kill && calls == 200 {
            say_err(format!("[rank {rank}] fault test: SIGKILL to myself after {calls} calls"));
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        }
        let t = Instant::now();
        // SAFETY: both buffers hold max(bytes, 16) B >= count bf16 elements and live past synchronize.
        let res = unsafe { comm.call(&Call::all_reduce(d, count, i, o)) }.and_then(Served::ran).map_err(err).and_then(|_| comm.synchronize().map_err(err));
        calls += 1;
        if let Err(x) = res {
            let waited = t.elapsed();
            say_err(format!(
                "[rank {rank}] fault test: error after {calls} calls, {:.0} ms into the failing call (timeout {} ms): {x}",
                waited.as_secs_f64() * 1e3,
                cfg.timeout.as_millis()
            ));
            // SAFETY: as above.
            let again = unsafe { comm.call(&Call::all_reduce(d, count, i, o)) }.and_then(Served::ran).map_err(err).and_then(|_| comm.synchronize().map_err(err));
            say_err(format!("[rank {rank}] fault test: the next call: {}", again.as_ref().err().map_or("succeeded", |s| s.as_str())));
            if again.is_ok() {
                return Err(format!("rank {rank}: a call after the failure succeeded; the group should be poisoned"));
            }
            if waited > bound {
                return Err(format!("rank {rank}: the error took {:.1} s, beyond {:.1} s", waited.as_secs_f64(), bound.as_secs_f64()));
            }
            return Ok(());
        }
        if t0.elapsed() > bound * 2 + Duration::from_secs(10) {
            return Err(format!("rank {rank}: no error after {calls} calls in {:.0} s", t0.elapsed().as_secs_f64()));
        }
    }
}

/// After an honest call, the last rank calls bf16 where the others call f16 (same bytes, so
/// only the call descriptors differ); every rank must get an error, not a sum of
/// mismatched data.
pub fn mismatch(c: &Common) -> Result<(), String> {
    let shared = shared(c)?;
    let world = world(c, shared.is_some())?;
    if !launch::is_rank() {
        launch_ranks(world, launch::FAIL_GRACE, shared.is_some())?;
        println!("PASS: every rank got an error for a call whose dtype differed on rank {}, eager and at the end of a checked capture", world - 1);
        return Ok(());
    }
    let mut r = GpuRanks::join(64 << 10, shared.as_ref())?;
    let (comm, b) = r.rank_process()?;
    let rank = comm.rank();
    let last = rank + 1 == world;
    let count = 21504;
    b.input.fill_u32(TIMING_WORD).map_err(err)?;
    let (i, o) = (b.input.ptr, b.output.ptr);
    let call = |comm: &mut tpar::cuda::GpuCommunicator, d: DType, n: usize| {
        // SAFETY: both buffers hold 64 KiB >= n elements of d; synchronize follows.
        unsafe { comm.call(&Call::all_reduce(d, n, i, o).forced(Some(Algorithm::OneshotPush))) }.and_then(Served::ran).map_err(err).and_then(|_| comm.synchronize().map_err(err))
    };
    call(comm, DType::BF16, count).map_err(|e| format!("rank {rank}: the honest call failed: {e}"))?;
    let d = if last { DType::BF16 } else { DType::F16 };
    match call(comm, d, count) {
        Ok(()) => return Err(format!("rank {rank}: a call whose dtype differed on rank {} succeeded", world - 1)),
        Err(e) => say_err(format!("[rank {rank}] mismatch test, dtype: {e}")),
    }
    drop(r);
    mismatch_graph(shared.as_ref(), world)
}

/// A checked capture (`begin_capture_check` .. `end_capture_check`) in which the last rank
/// captures bf16 where the others capture f16 at call 5 of 8: every rank must get
/// `Mismatch` when the capture ends (the captured kernels carry no descriptor), and the
/// communicator must refuse the next call. A second job on a fresh rendezvous.
fn mismatch_graph(shared: Option<&tpar::Topology>, world: usize) -> Result<(), String> {
    let mut r = GpuRanks::rejoin(64 << 10, shared, "graph")?;
    let (comm, b) = r.rank_process()?;
    let rank = comm.rank();
    let count = 21504;
    b.input.fill_u32(TIMING_WORD).map_err(err)?;
    let (i, o) = (b.input.ptr, b.output.ptr);
    comm.begin_capture_check().map_err(err)?;
    comm.stream().begin_capture().map_err(err)?;
    let mut cap = Ok(Algorithm::OneshotPush);
    for k in 0..8 {
        let d = if k == 5 && rank + 1 == world { DType::BF16 } else { DType::F16 };
        // SAFETY: both buffers hold 64 KiB >= count elements; the graph is never launched.
        cap = cap.and_then(|_| unsafe { comm.call(&Call::all_reduce(d, count, i, o).mode(tpar::CaptureMode::Graph).forced(Some(Algorithm::OneshotPush))) }.and_then(Served::ran));
    }
    let g = comm.stream().end_capture();
    let checked = comm.end_capture_check();
    cap.map_err(|e| format!("rank {rank}: capturing failed: {e}"))?;
    drop(g.map_err(err)?);
    match checked {
        Ok(n) => Err(format!("rank {rank}: a capture whose call 5 differed on rank {} passed the check ({n} calls)", world - 1)),
        Err(e @ tpar::Error::Mismatch { .. }) => {
            say_err(format!("[rank {rank}] mismatch test, graph: {e}"));
            // SAFETY: as above; the call must be refused before anything is enqueued.
            match unsafe { comm.call(&Call::all_reduce(DType::F16, count, i, o).forced(Some(Algorithm::OneshotPush))) }.and_then(Served::ran) {
                Ok(_) => Err(format!("rank {rank}: a call after the captured mismatch was accepted")),
                Err(_) => Ok(()),
            }
        }
        Err(e) => Err(format!("rank {rank}: expected Mismatch at the end of the capture, got {e}")),
    }
}

/// For the two-process tests: outside a launcher, starts 2 rank processes of this command,
/// waits for them and returns `None`; as a rank, joins tpar's rendezvous for its control
/// plane only (the CPU workspace kept small) and returns the communicator.
fn two_rank_control(test: &str) -> Result<Option<tpar::control::ControlPlane>, String> {
    if !launch::is_rank() {
        launch::launch(2, launch::FAIL_GRACE)?;
        println!("# {test}: both ranks exited cleanly");
        return Ok(None);
    }
    let cfg = tpar::Config::from_env().map_err(err)?;
    cfg.validate().map_err(err)?;
    tpar::control::ControlPlane::join::<tpar::control::NoDataPlane>(&cfg.join_spec()).map(|(c, _)| Some(c)).map_err(err)
}

/// Two rank processes join one NCCL communicator over tpar's rendezvous. NCCL refuses two
/// ranks on one GPU: then every rank must get that error instead of hanging.
pub fn nccl_rdzv(c: &Common) -> Result<(), String> {
    let Some(mut comm) = two_rank_control("nccl-rdzv")? else {
        return Ok(());
    };
    // One GPU per rank when the machine has several; otherwise both share --device.
    let ordinal = if harness::gpu_count() >= comm.world() { comm.rank() } else { c.ranks.device };
    let dev = tpar::cuda::driver::Device::open(ordinal).map_err(err)?;
    let t0 = Instant::now();
    let mut failed = false;
    let verdict = match tpar::cuda::nccl::init_over_rendezvous(&mut comm, &dev) {
        Ok(nc) => {
            let n = 4096usize;
            let inputs = all_inputs::<f32>(c.seed, 0, comm.world(), n);
            let buf = DeviceBuffer::new(&dev, n * 4).map_err(err)?;
            buf.upload(&inputs[comm.rank()]).map_err(err)?;
            let stream = tpar::cuda::driver::Stream::new(&dev).map_err(err)?;
            // SAFETY: buf holds n f32 and outlives the synchronize below.
            unsafe { nc.all_reduce(buf.ptr, buf.ptr, n, DType::F32, &stream) }.map_err(err)?;
            stream.synchronize().map_err(err)?;
            let mut out = vec![0f32; n];
            buf.download(&mut out).map_err(err)?;
            let wrong = judge(&out, &inputs, Algorithm::Nccl).wrong;
            failed = wrong > 0;
            format!("joined in {:.0} ms, one all-reduce of {n} floats: {wrong} wrong", t0.elapsed().as_secs_f64() * 1e3)
        }
        Err(x) => format!("refused in {:.0} ms with an error (no hang): {x}", t0.elapsed().as_secs_f64() * 1e3),
    };
    if let Some(all) = comm.gather_bytes(verdict.as_bytes()).map_err(err)? {
        for (r, v) in all.iter().enumerate() {
            println!("# nccl-rdzv: rank {r}: {}", String::from_utf8_lossy(v));
        }
    }
    comm.barrier().map_err(err)?;
    if failed {
        return Err("NCCL over the rendezvous returned wrong sums".into());
    }
    Ok(())
}

/// Two processes on one GPU, one rank each, workspaces shared through CUDA IPC
/// (`tpar::cuda::RankSet`, placed as one rank per process); the ranks meet through tpar's rendezvous, whose
/// control plane carries the IPC handles and the results.
pub fn ipc(c: &Common) -> Result<(), String> {
    let Some(mut comm) = two_rank_control("ipc")? else {
        return Ok(());
    };
    let (rank, world) = (comm.rank(), comm.world());
    let dtypes = harness::parse_dtypes(&c.dtype)?;
    let first = *dtypes.first().ok_or("no dtype")?;
    let opts = crate::harness::gpu::options(tpar::Transport::P2p)?;
    let max_bytes = c.max_bytes.max(43008);
    let t0 = Instant::now();
    let mut ws = tpar::cuda::RankSet::process(c.ranks.device, rank, world, max_bytes, 0, tpar::cuda::SetOptions { islands: Vec::new(), ..opts }).map_err(err)?;
    let blobs = comm.all_gather_bytes(&ws.handle_blob().map_err(err)?).map_err(err)?;
    ws.connect(&blobs).map_err(err)?;
    let say = |m: String| if rank == 0 { println!("{m}") } else { say_err(format!("[rank 1] {m}")) };
    say(format!("# ipc: rank {rank} of 2 processes (pid {}), workspaces mapped through CUDA IPC in {:.0} ms", std::process::id(), t0.elapsed().as_secs_f64() * 1e3));
    let ab = |x: usize| x.div_ceil(VEC_BYTES) * VEC_BYTES;
    let input = DeviceBuffer::new(ws.device(), ab(max_bytes)).map_err(err)?;
    let output = DeviceBuffer::new(ws.device(), ab(max_bytes)).map_err(err)?;
    let kernels = kernel_algorithms();
    // 1. Checked calls: every algorithm x dtype x count, the same order in both processes.
    let mut bad = 0i64;
    let mut calls = 0u64;
    for &d in &dtypes {
        let counts = [1, 7, 255, 4099, 21504, 65541, max_bytes / d.size()];
        for &algo in &kernels {
            for count in counts.into_iter().filter(|n| n * d.size() <= max_bytes) {
                let o = match d {
                    DType::F32 => ipc_call::<f32>(&mut ws, (&input, &output), algo, (c.seed, calls), count, world, rank)?,
                    DType::F16 => ipc_call::<f16>(&mut ws, (&input, &output), algo, (c.seed, calls), count, world, rank)?,
                    DType::BF16 => ipc_call::<bf16>(&mut ws, (&input, &output), algo, (c.seed, calls), count, world, rank)?,
                };
                let all = comm.all_gather_bytes(&o.encode()).map_err(err)?;
                let outcomes: Vec<Outcome> = all.iter().map(|b| Outcome::decode(b, count)).collect();
                bad += Verdict::of(&outcomes, count).bad_elements();
                calls += 1;
            }
        }
    }
    say(format!("# ipc check: {calls} calls ({} algorithms x {:?}): {bad} wrong elements (bitwise, both ranks identical)", kernels.len(), dtypes.iter().map(|d| d.name()).collect::<Vec<_>>()));
    if bad != 0 {
        return Err("ipc check failed".into());
    }
    // 2. Timings, 42 KiB of the first dtype: eager and in a graph of --graph-inner calls.
    let d = first;
    let count = 43008 / d.size();
    let blocks = 0; // the launch policy (honours TPAR_BLOCKS)
    if rank == 0 {
        println!("# ipc timing: 2 processes, 1 rank each, 43008 B {d}, rank 0's stream; eager = one launch per call per process; graph = {} calls per replay", c.graph_inner);
        println!("# NOTE: without MPS, kernels of two processes on one GPU do not run concurrently; the GPU time-slices");
        println!("# between the contexts, so these figures measure that scheduling, not the collective; they only prove");
        println!("# that the cross-process path completes.");
        println!("# {:>14} {:>10} {:>9} {:>9} {:>10} {:>9} {:>9}", "algorithm", "eager", "p10", "p90", "graph", "p10", "p90");
    }
    let (start, end) = (Event::new(ws.device()).map_err(err)?, Event::new(ws.device()).map_err(err)?);
    let inner = c.graph_inner.max(1);
    for &algo in &kernels {
        let mut eager = Vec::new();
        for k in 0..(c.warmup + c.iters) {
            ws.stream().record(&start).map_err(err)?;
            ws.enqueue(algo, d, count, &[input.ptr], &[output.ptr], blocks).map_err(err)?;
            ws.stream().record(&end).map_err(err)?;
            ws.synchronize().map_err(err)?;
            if k >= c.warmup {
                eager.push(f64::from(start.elapsed_ms(&end).map_err(err)?) * 1e3);
            }
        }
        ws.stream().begin_capture().map_err(err)?;
        let mut cap = Ok(());
        for _ in 0..inner {
            cap = cap.and_then(|()| ws.enqueue(algo, d, count, &[input.ptr], &[output.ptr], blocks));
        }
        let graph = ws.stream().end_capture().map_err(err)?;
        cap.map_err(err)?;
        let mut g = Vec::new();
        for k in 0..(c.warmup.max(1) + c.iters) {
            ws.stream().record(&start).map_err(err)?;
            graph.launch(ws.stream()).map_err(err)?;
            ws.stream().record(&end).map_err(err)?;
            ws.synchronize().map_err(err)?;
            if k >= c.warmup.max(1) {
                g.push(f64::from(start.elapsed_ms(&end).map_err(err)?) * 1e3 / inner as f64);
            }
        }
        let (e, gr) = (percentiles(&mut eager), percentiles(&mut g));
        if rank == 0 {
            println!("  {:>14} {:>10.2} {:>9.2} {:>9.2} {:>10.2} {:>9.2} {:>9.2}", algo.name(), e.median, e.p10, e.p90, gr.median, gr.p10, gr.p90);
        }
    }
    // 3. Agree on the end before anything is unmapped or freed.
    comm.barrier().map_err(err)?;
    drop(ws);
    Ok(())
}

/// One checked call through the IPC workspace, judged by the one verifier.
fn ipc_call<T: Element>(
    ws: &mut tpar::cuda::RankSet,
    (input, output): (&DeviceBuffer, &DeviceBuffer),
    algo: Algorithm,
    (seed, call): (u64, u64),
    count: usize,
    world: usize,
    rank: usize,
) -> Result<Outcome, String> {
    let inputs = all_inputs::<T>(seed, call, world, count);
    input.upload(&inputs[rank]).map_err(err)?;
    output.fill_u32(crate::harness::gpu::POISON_WORD).map_err(err)?;
    ws.enqueue(algo, T::DTYPE, count, &[input.ptr], &[output.ptr], 0).map_err(err)?;
    ws.synchronize().map_err(err)?;
    let mut out = vec![T::from_f32(0.0); count];
    output.download(&mut out).map_err(err)?;
    Ok(judge(&out, &inputs, algo))
}

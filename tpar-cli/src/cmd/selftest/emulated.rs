//! Self-tests on emulated ranks (all ranks as streams of one GPU, in this process).

use super::{Common, Scratch};
use crate::harness::gpu::{islands_for, options, ptrs, rank_bufs, GpuRanks};
use crate::harness::verify::{err, POISON_WORD};
use crate::harness::verify::{judge_on, Judge, Verdict};
use crate::harness::{self, table};
use std::time::{Duration, Instant};
use tpar::cuda::driver::{DeviceBuffer, Event};
use tpar::cuda::kernels::kernel_algorithms;
use tpar::cuda::{RankSet, SetOptions};
use tpar::report::Record;
use tpar::testing::all_inputs;
use tpar::units::percentiles;
use tpar::{bf16, f16, Algorithm, DType, Element, Transport};

/// Distinct input sets of the graph test, cycled over its calls: more than the three
/// buffers, so that calls k..k+3 of a rank never send the same bits.
const INPUT_SETS: usize = 4;

/// 42 KiB of bf16: the verify step's all-reduce.
const COUNT_42K: usize = 21504;

/// The last rank never launches; every algorithm must return Error::Timeout within about
/// the deadline and poison the group.
pub fn timeout((worlds, transport): &(Vec<usize>, Transport), c: &Common) -> Result<(), String> {
    for &world in worlds {
        // hierarchical runs over the islands of --islands (default: two halves).
        let opts = SetOptions { islands: islands_for(c.ranks.islands.as_deref(), world)?, ..options(*transport)? };
        for algo in kernel_algorithms() {
            let mut g = RankSet::emulated(c.ranks.device, world, 64 << 10, opts.clone()).map_err(err)?;
            let bufs = rank_bufs(g.device(), world, 64 << 10)?;
            let (i, o) = ptrs(&bufs);
            let mut present = vec![true; world];
            present[world - 1] = false;
            let t0 = Instant::now();
            g.enqueue_ranks(algo, DType::BF16, COUNT_42K, &i, &o, 2, &present).map_err(err)?;
            let r = g.synchronize();
            let took = t0.elapsed();
            let after = g.all_reduce(algo, DType::BF16, COUNT_42K, &i, &o, 2);
            match r {
                Err(tpar::Error::Timeout { rank, waited_ms, what }) => {
                    println!(
                        "# timeout test: {algo} {world} ranks, rank {} absent: Timeout after {:.0} ms wall (deadline {} ms): rank {rank} waited {waited_ms} ms for {what}; next call: {}",
                        world - 1,
                        took.as_secs_f64() * 1e3,
                        opts.timeout.as_millis(),
                        after.as_ref().err().map_or("succeeded (WRONG: the group should be poisoned)".to_string(), |e| e.to_string())
                    );
                    if after.is_ok() || took > opts.timeout * 3 + Duration::from_secs(2) {
                        return Err(format!("timeout test failed for {algo}"));
                    }
                }
                Err(e) => return Err(format!("timeout test {algo}: expected Timeout, got: {e}")),
                Ok(()) => return Err(format!("timeout test {algo}: a call with a missing rank succeeded")),
            }
        }
    }
    println!("PASS: every algorithm timed out with an error and poisoned the group");
    Ok(())
}

/// For every kernel, the last rank announces a call that differs in one field (dtype,
/// algorithm: the data are the same, so only the descriptor check can tell); every call must
/// end in Error::Mismatch, then Poisoned. A control call with the truth announced must
/// succeed first, so the check is shown to pass what it should.
pub fn mismatch((worlds, transport): &(Vec<usize>, Transport), c: &Common) -> Result<(), String> {
    use tpar::cuda::abi::desc_code;
    for &world in worlds {
        let opts = SetOptions { islands: islands_for(c.ranks.islands.as_deref(), world)?, ..options(*transport)? };
        for algo in kernel_algorithms() {
            let other = if algo == Algorithm::OneshotPush { Algorithm::TwoshotPush } else { Algorithm::OneshotPush };
            let lies = [("dtype", desc_code(algo, DType::F16)), ("algorithm", desc_code(other, DType::BF16))];
            for (field, code) in lies {
                let mut g = RankSet::emulated(c.ranks.device, world, 64 << 10, opts.clone()).map_err(err)?;
                let bufs = rank_bufs(g.device(), world, 64 << 10)?;
                let (i, o) = ptrs(&bufs);
                g.all_reduce(algo, DType::BF16, COUNT_42K, &i, &o, 2).map_err(|e| format!("mismatch test {algo}: the honest control call failed: {e}"))?;
                g.set_desc_override_for_test(Some((world - 1, code)));
                let t0 = Instant::now();
                let r = g.all_reduce(algo, DType::BF16, COUNT_42K, &i, &o, 2);
                let took = t0.elapsed();
                g.set_desc_override_for_test(None);
                let after = g.all_reduce(algo, DType::BF16, COUNT_42K, &i, &o, 2);
                match r {
                    Err(tpar::Error::Mismatch { field: f, .. }) if f == field && after.is_err() => println!(
                        "# mismatch test: {algo} {world} ranks, rank {} announces another {field}: {} in {:.1} ms; next call: {}",
                        world - 1,
                        r.as_ref().err().map_or(String::new(), |e| e.to_string()),
                        took.as_secs_f64() * 1e3,
                        after.as_ref().err().map_or(String::new(), |e| e.to_string())
                    ),
                    Err(e) => return Err(format!("mismatch test {algo} ({field}): expected Mismatch on `{field}` then Poisoned, got: {e}; next: {after:?}")),
                    Ok(()) => return Err(format!("mismatch test {algo} ({field}): a mismatched call succeeded silently")),
                }
                // The same lie inside a capture: the captured sequence is checked once, when
                // the capture ends, on every rank.
                let mut g = RankSet::emulated(c.ranks.device, world, 64 << 10, opts.clone()).map_err(err)?;
                let cap = g.capture(|g| {
                    g.enqueue(algo, DType::BF16, COUNT_42K, &i, &o, 2)?;
                    g.set_desc_override_for_test(Some((world - 1, code)));
                    g.enqueue(algo, DType::BF16, COUNT_42K, &i, &o, 2)
                });
                g.set_desc_override_for_test(None);
                let after = g.all_reduce(algo, DType::BF16, COUNT_42K, &i, &o, 2);
                match cap {
                    Err(tpar::Error::Mismatch { field: f, .. }) if f == field && after.is_err() => println!(
                        "# mismatch test (graph): {algo} {world} ranks, rank {} captured another {field}: {}",
                        world - 1,
                        cap.as_ref().err().map_or(String::new(), |e| e.to_string())
                    ),
                    Err(e) => return Err(format!("mismatch test (graph) {algo} ({field}): expected Mismatch on `{field}` at capture end, got: {e}; next: {after:?}")),
                    Ok(_) => return Err(format!("mismatch test (graph) {algo} ({field}): a mismatched capture succeeded silently")),
                }
            }
        }
    }
    println!("PASS: every mismatched call was an error, then the group was poisoned");
    Ok(())
}

/// Captures `calls` all-reduces (distinct outputs) in one graph, replays it `replays`
/// times, poisons the outputs before the last replay, and checks every output and epoch.
/// `scratch`: every call on per-rank scratch buffers, copied in and out around it.
/// `only`: `--algo`, the algorithms to run (every one by default).
pub fn graph((worlds, transport): &(Vec<usize>, Transport), c: &Common, replays: usize, (calls, bytes): (usize, usize), scratch: Option<Scratch>, only: Option<&str>) -> Result<(), String> {
    let dtypes = harness::parse_dtypes(&c.dtype)?;
    // Every kernel, and the copy-engine path where emulated ranks run it over this transport.
    let mut algos = kernel_algorithms();
    algos.extend(tpar::algorithms::registry::algorithms_emulated(*transport).into_iter().filter(|a| *a == Algorithm::CeRing));
    if let Some(list) = only {
        algos = graph_algos(list, &algos, *transport)?;
    }
    for &world in worlds {
        let mut r = GpuRanks::emulated(c.ranks.device, world, bytes, *transport, c.ranks.skew_ns, c.ranks.islands.as_deref())?;
        for &d in &dtypes {
            for &algo in &algos {
                let v = match d {
                    DType::F32 => graph_one::<f32>(&mut r, algo, c.seed, replays, (calls, bytes), scratch)?,
                    DType::F16 => graph_one::<f16>(&mut r, algo, c.seed, replays, (calls, bytes), scratch)?,
                    DType::BF16 => graph_one::<bf16>(&mut r, algo, c.seed, replays, (calls, bytes), scratch)?,
                };
                if !v {
                    return Err(format!("graph test failed for {algo} {d}"));
                }
            }
        }
    }
    println!("PASS: every replayed call was right and the epochs advanced by calls x replays");
    Ok(())
}

/// `selftest graph --algo LIST`: the named algorithms, each one these emulated ranks run over
/// `transport` among `runs`.
fn graph_algos(list: &str, runs: &[Algorithm], transport: Transport) -> Result<Vec<Algorithm>, String> {
    let names = || runs.iter().map(|a| a.name()).collect::<Vec<_>>().join(", ");
    crate::exit::refusing(|| list.split(',')
        .map(str::trim)
        .map(|x| {
            let a: Algorithm = x.parse().map_err(|_| format!("--algo {x:?}: unknown; emulated ranks over {transport} run here: {}", names()))?;
            if runs.contains(&a) {
                Ok(a)
            } else {
                Err(format!("--algo {a}: emulated ranks over {transport} do not run it in this test; they run: {}", names()))
            }
        })
        .collect())
}

/// One set of a mixed graph's inputs: every rank's host data and device buffer, per
/// collective of the sequence.
type InputSet<T> = Vec<(Vec<Vec<T>>, Vec<DeviceBuffer>)>;

/// `selftest graph --collective` with the all-gather or the reduce-scatter: for every world
/// and dtype, one graph of `calls` calls taking `collectives` in turn, each by the next of
/// `only` (`--algo`; default [`super::MIXED_ALGOS`] where they run) that computes it ([`super::mixed_sequence`]), replayed `replays` times with fresh
/// inputs and poisoned outputs before each replay, every call's output judged on every rank
/// by the one verifier, and the epochs.
pub fn graph_mixed((worlds, transport): &(Vec<usize>, Transport), c: &Common, replays: usize, (calls, bytes): (usize, usize), scratch: Option<Scratch>, (collectives, only): (&[tpar::Collective], Option<&str>)) -> Result<(), String> {
    let dtypes = harness::parse_dtypes(&c.dtype)?;
    // Kernels only: the copy-engine path computes the all-reduce only, and keeps no call epoch.
    let runs: Vec<Algorithm> = kernel_algorithms().into_iter().filter(|a| tpar::algorithms::registry::algorithms_emulated(*transport).contains(a)).collect();
    let algos = match only {
        Some(list) => graph_algos(list, &runs, *transport)?,
        None => graph_algos(super::MIXED_ALGOS, &tpar::Algorithm::ALL, *transport)?.into_iter().filter(|a| runs.contains(a)).collect(),
    };
    let seq = crate::exit::refusing(|| super::mixed_sequence(calls, collectives, &algos))?;
    for &world in worlds {
        let mut r = GpuRanks::emulated(c.ranks.device, world, bytes, *transport, c.ranks.skew_ns, c.ranks.islands.as_deref())?;
        for &d in &dtypes {
            let v = match d {
                DType::F32 => graph_mixed_one::<f32>(&mut r, &seq, c.seed, replays, bytes, scratch)?,
                DType::F16 => graph_mixed_one::<f16>(&mut r, &seq, c.seed, replays, bytes, scratch)?,
                DType::BF16 => graph_mixed_one::<bf16>(&mut r, &seq, c.seed, replays, bytes, scratch)?,
            };
            if !v {
                return Err(format!("graph test failed for the mixed sequence, {d} {world} ranks"));
            }
        }
    }
    println!("PASS: every replayed call of every collective was right and the epochs advanced by calls x replays");
    Ok(())
}

fn graph_mixed_one<T: Element>(r: &mut GpuRanks, seq: &[(tpar::Collective, Algorithm)], seed: u64, replays: usize, bytes: usize, scratch: Option<Scratch>) -> Result<bool, String> {
    use std::collections::BTreeMap;
    use tpar::Collective;
    let d = T::DTYPE;
    let (g, islands) = r.emulated_set()?;
    let islands = islands.to_vec();
    let world = g.world();
    let wire = g.wire();
    // The collectives in the order of the sequence, and each one's elements per rank.
    let mut colls: Vec<Collective> = Vec::new();
    for (col, _) in seq {
        if !colls.contains(col) {
            colls.push(*col);
        }
    }
    let counts: Vec<usize> = colls.iter().map(|&col| harness::per_rank_count(col, d, bytes, world)).collect();
    if let Some(k) = counts.iter().position(|&n| n == 0) {
        return Err(format!("--sequence: {bytes} B hold no whole 16-byte vector per rank for the {} of {world} ranks (need {} B)", colls[k], 16 * world));
    }
    let index = |col: Collective| colls.iter().position(|&x| x == col).unwrap_or(0);
    let alloc = |elems: usize| DeviceBuffer::new(g.device(), (elems * d.size()).max(16).div_ceil(16) * 16).map_err(err);
    // Outputs: one per call and rank. Inputs: INPUT_SETS sets (call k takes set k %
    // INPUT_SETS), each with its own random bits per collective, redrawn before every replay.
    let outs: Vec<Vec<DeviceBuffer>> = seq
        .iter()
        .map(|(col, _)| (0..world).map(|_| alloc(col.io_elems(counts[index(*col)], world).1)).collect::<Result<Vec<_>, _>>())
        .collect::<Result<_, _>>()?;
    let sets = seq.len().clamp(1, INPUT_SETS);
    let mut ins: Vec<InputSet<T>> = Vec::with_capacity(sets);
    for _ in 0..sets {
        let mut set = Vec::with_capacity(colls.len());
        for (ci, &col) in colls.iter().enumerate() {
            let elems = col.io_elems(counts[ci], world).0;
            set.push((Vec::new(), (0..world).map(|_| alloc(elems)).collect::<Result<Vec<_>, _>>()?));
        }
        ins.push(set);
    }
    // Scratch buffers (every collective's input and output fit in BYTES): a call reads `s`;
    // the all-reduce in place writes `s`, every other call `s_out`.
    let scratch_bufs = if scratch.is_some() { rank_bufs(g.device(), world, bytes)? } else { Vec::new() };
    let (s, s_out) = ptrs(&scratch_bufs);
    let e0 = g.epoch(0).map_err(err)?;
    let gr = g
        .capture(|g| {
            for (k, (col, algo)) in seq.iter().enumerate() {
                let ci = index(*col);
                let n = counts[ci];
                let (ie, oe) = col.io_elems(n, world);
                let i: Vec<u64> = ins[k % sets][ci].1.iter().map(|b| b.ptr).collect();
                let o: Vec<u64> = outs[k].iter().map(|b| b.ptr).collect();
                if scratch.is_some() {
                    let into = if scratch == Some(Scratch::InPlace) && *col == Collective::AllReduce { &s } else { &s_out };
                    g.enqueue_copies(&i, &s, ie * d.size())?;
                    g.enqueue_collective(*col, *algo, d, n, &s, into, 0)?;
                    g.enqueue_copies(into, &o, oe * d.size())?;
                } else {
                    g.enqueue_collective(*col, *algo, d, n, &i, &o, 0)?;
                }
            }
            Ok(())
        })
        .map_err(err)?;
    let t0 = Instant::now();
    // Wrong elements per (collective, algorithm), over every replay.
    let mut wrong: BTreeMap<(Collective, Algorithm), i64> = seq.iter().map(|x| (*x, 0)).collect();
    for rep in 0..replays.max(1) {
        // Fresh inputs for this replay (a call that read a peer's previous or next call's
        // bits shows as wrong elements), outputs poisoned.
        for (k, set) in ins.iter_mut().enumerate() {
            for (ci, (host, bufs)) in set.iter_mut().enumerate() {
                let elems = colls[ci].io_elems(counts[ci], world).0;
                let salt = ((rep * sets + k) as u64) << 32 | (colls[ci].code() << 8);
                *host = all_inputs::<T>(seed ^ salt, colls[ci].code(), world, elems);
                for (b, x) in bufs.iter().zip(host.iter()) {
                    b.upload(x).map_err(err)?;
                }
            }
        }
        for b in outs.iter().flatten() {
            b.fill_u32(POISON_WORD).map_err(err)?;
        }
        g.launch(&gr).map_err(err)?;
        g.synchronize().map_err(err)?;
        // One judge per (input set, collective, algorithm): the references once, held
        // against every rank's output.
        let mut judges: BTreeMap<(usize, usize, Algorithm), Judge<T>> = BTreeMap::new();
        for (k, (col, algo)) in seq.iter().enumerate() {
            let ci = index(*col);
            let oe = col.io_elems(counts[ci], world).1;
            let judge = judges.entry((k % sets, ci, *algo)).or_insert_with(|| Judge::for_collective(*col, &ins[k % sets][ci].0, *algo, &islands, wire));
            let mut outcomes = Vec::with_capacity(world);
            for (rank, b) in outs[k].iter().enumerate() {
                let mut host = vec![T::from_f32(0.0); oe];
                b.download(&mut host).map_err(err)?;
                outcomes.push(judge.outcome_of(rank, &host));
            }
            *wrong.entry((*col, *algo)).or_default() += Verdict::of_collective(*col, &outcomes, oe).bad_elements();
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let e1 = g.epoch(0).map_err(err)?;
    let expect = e0.wrapping_add((seq.len() * replays.max(1)) as u32);
    let how = match scratch {
        Some(Scratch::InPlace) => ", on scratch buffers copied in and out (the all-reduce in place)",
        Some(Scratch::OutOfPlace) => ", out of place between scratch buffers copied in and out",
        None => "",
    };
    // The all-gathers and reduce-scatters registered (zero-copy): the set's own rule.
    let registered = seq.iter().filter(|(col, algo)| *col != Collective::AllReduce && g.registers_when_captured(*algo, counts[index(*col)] * d.size())).count();
    let gather_scatter = seq.iter().filter(|(col, _)| *col != Collective::AllReduce).count();
    let per_rank: Vec<String> = colls.iter().zip(&counts).map(|(col, n)| format!("{col} {} B", n * d.size())).collect();
    let total: i64 = wrong.values().sum();
    println!(
        "# graph test: mixed {d} {world} ranks: {} calls ({} per rank; {registered} of {gather_scatter} all-gathers and reduce-scatters registered) x {replays} replays{how}, epoch {e0} -> {e1} (expected {expect}), {total} wrong, {secs:.2} s",
        seq.len(),
        per_rank.join(", ")
    );
    for ((col, algo), w) in &wrong {
        println!("#   {col} by {algo}: {} calls, {w} wrong", seq.iter().filter(|x| x.0 == *col && x.1 == *algo).count() * replays.max(1));
    }
    Ok(total == 0 && e1 == expect)
}

fn graph_one<T: Element>(r: &mut GpuRanks, algo: Algorithm, seed: u64, replays: usize, (calls, bytes): (usize, usize), scratch: Option<Scratch>) -> Result<bool, String> {
    let d = T::DTYPE;
    let (g, islands) = r.emulated_set()?;
    let world = g.world();
    let count = (bytes / d.size()).max(1);
    let outs: Vec<Vec<DeviceBuffer>> = (0..calls)
        .map(|_| (0..world).map(|_| DeviceBuffer::new(g.device(), bytes.div_ceil(16) * 16)).collect::<Result<Vec<_>, _>>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(err)?;
    // Successive calls get different inputs (INPUT_SETS sets, call c takes set c % INPUT_SETS):
    // a call that read a slot a peer's next call had already overwritten would otherwise
    // sum the same bits and pass (the flag protocol's reuse race; the sentinel's shows as
    // a timeout either way).
    let sets = calls.clamp(1, INPUT_SETS);
    let inputs: Vec<Vec<Vec<T>>> = (0..sets).map(|k| all_inputs::<T>(seed ^ ((k as u64) << 32), algo.code(), world, count)).collect();
    let mut ins: Vec<Vec<DeviceBuffer>> = Vec::with_capacity(sets);
    for set in &inputs {
        let bufs = (0..world).map(|_| DeviceBuffer::new(g.device(), bytes.div_ceil(16) * 16)).collect::<Result<Vec<_>, _>>().map_err(err)?;
        for (b, x) in bufs.iter().zip(set) {
            b.upload(x).map_err(err)?;
        }
        ins.push(bufs);
    }
    // Scratch buffers: a call reads `s` and writes `so` (the same buffer in place).
    let scratch_bufs = if scratch.is_some() { rank_bufs(g.device(), world, bytes)? } else { Vec::new() };
    let (s, scratch_out) = ptrs(&scratch_bufs);
    let so = if scratch == Some(Scratch::OutOfPlace) { scratch_out } else { s.clone() };
    let moved = count * d.size();
    let e0 = g.epoch(0).map_err(err)?;
    // Blocks 0: the launch policy (`TPAR_BLOCKS` honoured), as for every call of a set.
    let gr = g
        .capture(|g| {
            for (c, out) in outs.iter().enumerate() {
                let i: Vec<u64> = ins[c % sets].iter().map(|b| b.ptr).collect();
                let o: Vec<u64> = out.iter().map(|b| b.ptr).collect();
                if scratch.is_some() {
                    g.enqueue_copies(&i, &s, moved)?;
                    g.enqueue(algo, d, count, &s, &so, 0)?;
                    g.enqueue_copies(&so, &o, moved)?;
                } else {
                    g.enqueue(algo, d, count, &i, &o, 0)?;
                }
            }
            Ok(())
        })
        .map_err(err)?;
    let t0 = Instant::now();
    for _ in 0..replays.saturating_sub(1) {
        g.launch(&gr).map_err(err)?;
    }
    g.synchronize().map_err(err)?;
    for b in outs.iter().flatten() {
        b.fill_u32(POISON_WORD).map_err(err)?;
    }
    g.launch(&gr).map_err(err)?;
    g.synchronize().map_err(err)?;
    let secs = t0.elapsed().as_secs_f64();
    let mut wrong = 0i64;
    for (c, out) in outs.iter().enumerate() {
        let mut outcomes = Vec::with_capacity(world);
        for b in out {
            let mut host = vec![T::from_f32(0.0); count];
            b.download(&mut host).map_err(err)?;
            outcomes.push(judge_on(&host, &inputs[c % sets], algo, islands, g.wire()));
        }
        wrong += Verdict::of(&outcomes, count).bad_elements();
    }
    let e1 = g.epoch(0).map_err(err)?;
    // The kernels' call epoch advances once per call; ce-ring's copies and kernels keep their
    // own generations (flags) and leave it alone.
    let expect = if algo == Algorithm::CeRing { e0 } else { e0.wrapping_add((calls * replays) as u32) };
    let how = match scratch {
        Some(Scratch::InPlace) => ", in place on scratch buffers copied in and out",
        Some(Scratch::OutOfPlace) => ", out of place between scratch buffers copied in and out",
        None => "",
    };
    println!("# graph test: {algo} {d} {world} ranks: {calls} calls x {replays} replays{how}, epoch {e0} -> {e1} (expected {expect}), {wrong} wrong, {secs:.2} s");
    Ok(wrong == 0 && e1 == expect)
}

/// The check sweep with every epoch starting at `start`, so the calls cross 2^32.
pub fn epoch_wrap((worlds, transport): &(Vec<usize>, Transport), c: &Common, start: u32) -> Result<(), String> {
    let sweep = crate::cmd::check::Sweep {
        collective: tpar::Collective::AllReduce,
        dtypes: harness::parse_dtypes(&c.dtype)?,
        algos: kernel_algorithms().into_iter().map(Some).collect(),
        max_bytes: c.max_bytes,
        calls: 200,
        seed: c.seed,
        quiet: false,
    };
    for &world in worlds {
        let mut r = GpuRanks::emulated(c.ranks.device, world, c.max_bytes, *transport, c.ranks.skew_ns, c.ranks.islands.as_deref())?;
        r.emulated_set()?.0.set_epoch_for_test(start).map_err(err)?;
        println!("# epochs start at {start} (wrap-around test)");
        crate::cmd::check::check_group(&mut harness::Group::Gpu(r), &sweep)?;
    }
    Ok(())
}

/// NCCL with one rank on this GPU: proves the loader and the call path; its time is a local
/// copy plus NCCL's launch overhead, labelled so.
pub fn nccl_local(c: &Common) -> Result<(), String> {
    use tpar::cuda::nccl::{self, NcclComm};
    let lib = nccl::load().map_err(err)?;
    let version = lib.version().map_err(err)?;
    let dev = tpar::cuda::driver::Device::open(c.ranks.device).map_err(err)?;
    let comms = NcclComm::init_all(&[dev.ordinal as i32]).map_err(err)?;
    let comm = comms.first().ok_or("ncclCommInitAll returned no communicator")?;
    let stream = tpar::cuda::driver::Stream::new(&dev).map_err(err)?;
    let (start, end) = (Event::new(&dev).map_err(err)?, Event::new(&dev).map_err(err)?);
    let max = c.max_bytes.max(16);
    let (input, output) = (DeviceBuffer::new(&dev, max.div_ceil(16) * 16).map_err(err)?, DeviceBuffer::new(&dev, max.div_ceil(16) * 16).map_err(err)?);
    let mut wrong_total = 0i64;
    for d in harness::parse_dtypes(&c.dtype)? {
        let label = format!("nccl (1 rank, {} v{version}; NOT comparable)", lib.path);
        table::block_header(&label, "nccl", 1, &dev.name, &[tpar::CaptureMode::Eager]);
        let mut bytes = 1024usize.min(max);
        while bytes <= max {
            let count = (bytes / d.size()).max(1);
            let mine: Vec<u8> = (0..count * d.size()).map(|k| (k % 61) as u8 + 1).collect();
            input.upload(&mine).map_err(err)?;
            output.fill_u32(POISON_WORD).map_err(err)?;
            // SAFETY: both buffers hold max >= count elements and outlive the synchronize.
            unsafe { comm.all_reduce(input.ptr, output.ptr, count, d, &stream) }.map_err(err)?;
            stream.synchronize().map_err(err)?;
            let mut out = vec![0u8; count * d.size()];
            output.download(&mut out).map_err(err)?;
            // One rank's sum is its input, bit for bit.
            let wrong = out.chunks(d.size()).zip(mine.chunks(d.size())).filter(|(a, b)| a != b).count() as i64;
            wrong_total += wrong;
            let mut samples = Vec::new();
            for k in 0..(c.warmup + c.iters.max(1)) {
                stream.record(&start).map_err(err)?;
                // SAFETY: as above.
                unsafe { comm.all_reduce(input.ptr, output.ptr, count, d, &stream) }.map_err(err)?;
                stream.record(&end).map_err(err)?;
                end.synchronize().map_err(err)?;
                if k >= c.warmup {
                    samples.push(f64::from(start.elapsed_ms(&end).map_err(err)?) * 1e3);
                }
            }
            let s = percentiles(&mut samples);
            table::row(&[Record::measured(Algorithm::Nccl, "nccl-1rank", d, 1, count, (s.median, s.p10, s.p90), wrong)], wrong);
            bytes *= 8;
        }
    }
    if wrong_total > 0 {
        return Err(format!("one-rank NCCL changed {wrong_total} elements"));
    }
    println!("PASS: NCCL loaded, joined one rank and returned its input");
    Ok(())
}

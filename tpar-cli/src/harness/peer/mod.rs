//! Peers: another project's collective kernels timed beside tpar's, in the same run and the
//! same group, by the same harness (`tpar bench --compare vllm`, with `--collective` for the
//! all-gather and the reduce-scatter). Today one peer: vLLM's custom all-reduce
//! (`vllm::CustomAllreduce`) and its custom all-gather and reduce-scatter kernels, through the
//! small C API of `bench/compare/vllm_ar/peer.cu`, which `bench/compare/vllm.sh` compiles
//! against vLLM's downloaded headers on the GPU machine; `vllm.rs` loads that library with
//! libloading.
//!
//! Owns: loading a peer library, driving it on emulated ranks (streams of one GPU, the peers'
//! pointers plain device pointers) or as one rank per GPU process (IPC handles exchanged over
//! tpar's control plane), its correctness check and its timings, and the table of tpar / peer.
//! Timed exactly as [`super::gpu::GpuRanks`] times tpar: the same K calls per iteration (back to back, or captured once in one graph and
//! replayed), the same events on the same kind of origin stream, the same fork/join of rank
//! streams, the same warm-up, medians and p10/p90, per iteration the slowest rank.
//! Must never: time a peer whose results were not checked in the same run (unless `-c 0`
//! asked, as for tpar's blocks), run a peer's
//! spin-waiting kernels with more blocks than one GPU holds at once (they would deadlock), or
//! present a time-sliced run (rank processes sharing one GPU) as a measurement, or time a size
//! that vLLM itself would not give its kernel (its all-gather and reduce-scatter size limits:
//! [`vllm_declines`]; such a size is said, not timed, and is no failure).

mod vllm;

use super::output::BenchRecord;
use super::{Group, Timing};
use std::path::{Path, PathBuf};
use tpar::cuda::driver::Device;
use tpar::cuda::GpuCommunicator;
use tpar::plan::CaptureMode;
use tpar::units::Spread;
use tpar::{Algorithm, Collective, DType};
use vllm::{Api, VllmRanks};

/// Where `bench/compare/vllm.sh` puts the library, relative to the repository root (an
/// ignored folder).
pub const VLLM_DEFAULT_LIB: &str = ".gpu/vllm-build/libtpar_vllm_ar.so";

/// The topology whose plan stands for "tpar's pick" on emulated ranks, which have no fabric and
/// so no plan of their own: every peer of an emulated rank is local memory, as on NVSwitch.
pub const EMULATED_PLAN_PRESET: &str = "h200-nvswitch-8";

/// Call ids of the peer's checked calls (tpar's blocks use the algorithm's code; `0x7065` is
/// "pe"): different inputs from tpar's, fresh per size and mode.
const PEER_CALL_TAG: u64 = 0x7065 << 40;

/// One `--compare` item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerSpec {
    pub name: String,
    pub lib: PathBuf,
}

/// `--compare vllm[=LIB],...`: the peers to time. Known: `vllm`.
pub fn parse(s: &str) -> Result<Vec<PeerSpec>, String> {
    let mut v: Vec<PeerSpec> = Vec::new();
    for item in s.split(',').map(str::trim).filter(|x| !x.is_empty()) {
        let (name, lib) = match item.split_once('=') {
            Some((n, p)) => (n.trim(), Some(PathBuf::from(p.trim()))),
            None => (item, None),
        };
        match name {
            "vllm" => {
                let lib = lib.or_else(tpar::settings::vllm_lib).unwrap_or_else(|| PathBuf::from(VLLM_DEFAULT_LIB));
                v.push(PeerSpec { name: name.into(), lib });
            }
            "flashinfer" | "b12x" => {
                return Err(format!(
                    "--compare {name}: its all-reduce runs one process per GPU from Python (bench/compare/peers_multi_gpu.py), not inside tpar bench"
                ))
            }
            other => return Err(format!("--compare {other:?}: known peers: vllm (vllm=PATH for the library's path)")),
        }
    }
    if v.is_empty() {
        return Err("--compare: name a peer (vllm)".into());
    }
    v.dedup_by(|a, b| a.name == b.name);
    Ok(v)
}

/// Fails unless every peer's library exists, with the command that builds it.
pub fn check_libs(peers: &[PeerSpec]) -> Result<(), String> {
    for p in peers {
        if !p.lib.is_file() {
            return Err(format!(
                "--compare {}: no library at {} (build it on the GPU machine with bench/compare/vllm.sh, which needs nvcc; or give vllm=PATH)",
                p.name,
                p.lib.display()
            ));
        }
    }
    Ok(())
}

/// Where a group's ranks are, as a peer needs to know it.
pub enum Site<'a> {
    /// Every rank of the world as a stream of this one GPU, in this process.
    Emulated { device: &'a Device, world: usize },
    /// This process is one rank (GPU `comm.device()`); the control plane exchanges bytes.
    /// `shared`: every rank on GPU 0 (a correctness test; the processes time-slice it).
    Rank { comm: &'a mut GpuCommunicator, shared: bool },
}

/// vLLM 0.33.0's largest custom all-gather: 2 MiB of input per rank
/// (`CustomAllreduce._DEFAULT_ALL_GATHER_MAX_SIZE`, distributed/device_communicators/
/// custom_all_reduce.py; larger calls go to NCCL there).
pub const VLLM_ALL_GATHER_MAX: usize = 2 << 20;
/// vLLM 0.33.0's largest custom reduce-scatter: 16 MiB of input per rank
/// (`_DEFAULT_REDUCE_SCATTER_MAX_SIZE`, the same file).
pub const VLLM_REDUCE_SCATTER_MAX: usize = 16 << 20;

/// Why vLLM would not run its own kernel for a call of `c` with `count` elements of `d` per
/// rank (as `Collective::io_elems` counts them) on `world` ranks, or None where it would: its
/// Python class's gates (`should_custom_all_gather`, `_select_reduce_scatter_backend`: a
/// positive size, whole 16-byte vectors per rank, at most its maximum input). The all-reduce
/// is not gated here (tpar's run times it at every size it names, as before).
pub fn vllm_declines(c: Collective, d: DType, count: usize, world: usize) -> Option<String> {
    let shard = count * d.size();
    let input = c.io_elems(count, world).0 * d.size();
    let (name, max, limit) = match c {
        Collective::AllReduce => return None,
        Collective::AllGather => ("custom_all_gather", VLLM_ALL_GATHER_MAX, "input per rank"),
        Collective::ReduceScatter => ("custom_reduce_scatter", VLLM_REDUCE_SCATTER_MAX, "input per rank (world x output)"),
    };
    if shard == 0 || shard % 16 != 0 {
        return Some(format!("vLLM's {name} takes whole 16-byte vectors per rank, not {shard} B"));
    }
    (input > max).then(|| format!("vLLM does not take this size: {name} runs at most {} MiB of {limit}, this call {input} B (vLLM gives it to NCCL)", max >> 20))
}

/// What the peers run: the same collective, sizes, dtypes, modes and timing as tpar's blocks.
#[derive(Clone, Debug)]
pub struct PeerRun {
    pub collective: Collective,
    pub sizes: Vec<usize>,
    pub dtypes: Vec<DType>,
    pub modes: Vec<CaptureMode>,
    pub inner: usize,
    pub warmup: usize,
    pub iters: usize,
    pub check: bool,
    pub sequence: Option<(usize, usize)>,
}

/// One measured point of a peer, as `--json` writes it beside tpar's records.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PeerRecord {
    pub peer: String,
    pub collective: Collective,
    /// `cuda-emulated-p2p` or `cuda`; `-sequenceN` appended for a `--sequence` step.
    pub backend: String,
    pub dtype: DType,
    pub world: usize,
    /// nccl-tests' size and count (the all-gather's output, the reduce-scatter's input), as
    /// tpar's records.
    pub bytes: usize,
    pub count: usize,
    pub time_us: f64,
    pub p10_us: f64,
    pub p90_us: f64,
    pub algbw: f64,
    pub busbw: f64,
    /// As tpar's `#wrong`; -1 unchecked.
    pub wrong: i64,
    pub mode: CaptureMode,
    pub inner: usize,
    /// The peer's own kernel for this size (vLLM: `1stage` or `2stage`; `all_gather`,
    /// `reduce_scatter`).
    pub kernel: String,
    pub blocks_max: i32,
}

/// One line of the comparison: tpar against one peer at one point.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Comparison {
    pub peer: String,
    pub collective: Collective,
    pub mode: CaptureMode,
    pub dtype: DType,
    pub world: usize,
    pub bytes: usize,
    /// Calls per step for a `--sequence` line, else 1.
    pub calls: usize,
    /// tpar's plan pick and its time (None: the plan picks what this group does not run).
    pub tpar_plan: Algorithm,
    pub tpar_plan_us: Option<f64>,
    pub tpar_fastest: Option<Algorithm>,
    pub tpar_fastest_us: Option<f64>,
    pub peer_us: f64,
    /// tpar / peer: below 1, tpar is faster.
    pub plan_over_peer: Option<f64>,
    pub fastest_over_peer: Option<f64>,
}

/// `--json FILE`: the peers' records and comparison lines go to `FILE` with `.peers.json` in
/// place of `.json` (tpar's own records keep their file and schema).
pub fn json_path(tpar_json: &Path) -> PathBuf {
    let stem = tpar_json.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    tpar_json.with_file_name(format!("{stem}.peers.json"))
}

pub fn write_json(path: &Path, records: &[PeerRecord], comparisons: &[Comparison]) -> Result<(), String> {
    let v = serde_json::json!({ "peers": records, "comparison": comparisons });
    let s = serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?;
    std::fs::write(path, s).map_err(|e| format!("writing {}: {e}", path.display()))
}

/// The peers of one `tpar bench --compare` run, across its groups.
pub struct Session {
    peers: Vec<PeerSpec>,
    /// Each peer's library, loaded at the first group and kept loaded to the end of the
    /// process (it links the CUDA runtime statically: no unload and reload between groups).
    apis: Vec<Option<Api>>,
    run: PeerRun,
    records: Vec<PeerRecord>,
    lines: Vec<Comparison>,
}

impl Session {
    /// `--compare` of a run on `target`, checked before any rank starts: known peers, their
    /// libraries present, the peers' JSON path writable. `None`: no `--compare`.
    pub fn new(compare: Option<&str>, target: &super::Target, json: Option<&Path>, run: PeerRun) -> Result<Option<Session>, String> {
        let Some(s) = compare else { return Ok(None) };
        if !matches!(target, super::Target::Emulated { .. } | super::Target::Gpu) {
            return Err("--compare times peers on GPUs: use --emulate-ranks N on one GPU, or --backend cuda across GPUs".into());
        }
        let peers = parse(s)?;
        if super::first_process() {
            check_libs(&peers)?;
            if let Some(j) = json {
                super::output::check_writable("--json (the peers' file)", &json_path(j))?;
            }
        }
        let apis = peers.iter().map(|_| None).collect();
        Ok(Some(Session { peers, apis, run, records: Vec::new(), lines: Vec::new() }))
    }

    /// After tpar's blocks of group `g` (`tpar`: every record so far): the peers on the same
    /// group. Returns their wrong elements.
    pub fn after_group(&mut self, g: &mut Group, tpar: &[BenchRecord]) -> Result<i64, String> {
        for (spec, api) in self.peers.iter().zip(self.apis.iter_mut()) {
            if api.is_none() {
                *api = Some(Api::load(&spec.lib)?);
            }
        }
        let peers: Vec<(&PeerSpec, &Api)> = self.peers.iter().zip(self.apis.iter().flatten()).collect();
        compare(g, &peers, &self.run, tpar, &mut self.records, &mut self.lines)
    }

    /// Writes the peers' records and comparison lines beside `--json` (at the root).
    pub fn write(&self, json: Option<&Path>) -> Result<(), String> {
        if let Some(j) = json {
            let p = json_path(j);
            write_json(&p, &self.records, &self.lines)?;
            println!("# wrote {} peer records and {} comparison lines to {}", self.records.len(), self.lines.len(), p.display());
        }
        Ok(())
    }
}

// ------------------------------------------------------------------------------------------
// The comparison.
// ------------------------------------------------------------------------------------------

/// tpar's pick for each point: the group's own plan where it has one (rank processes), else
/// the plan for [`EMULATED_PLAN_PRESET`] at this world (emulated ranks). `bytes`: per rank, as
/// `Collective::io_elems` counts them.
fn tpar_pick(g: &mut Group, c: Collective, d: DType, bytes: usize, mode: CaptureMode) -> Algorithm {
    if let Some(a) = g.planned(c, d, bytes, mode) {
        return a;
    }
    let topology = tpar::Topology::load(EMULATED_PLAN_PRESET).unwrap_or_else(|_| tpar::Topology::cpu());
    let overrides = tpar::Overrides::from_env().unwrap_or_default();
    tpar::plan::plan_collective(
        c,
        &tpar::PlanInput {
            topology: &topology,
            world: g.world(),
            bytes: bytes as u64,
            dtype: d,
            capture: mode,
            backend: tpar::Backend::Cuda,
            profile: None,
            overrides: &overrides,
        },
    )
    .algorithm
}

fn peer_header(name: &str, world: usize, place: &str, modes: &[CaptureMode]) {
    super::table::block_header(name, "p2p (the peer's own buffers)", world, place, modes);
}

fn peer_row(cells: &[PeerRecord], wrong: i64, kernel: &str) {
    let Some(f) = cells.first() else { return };
    let redop = if f.collective == Collective::AllGather { "none" } else { "sum" };
    let mut s = format!("  {:>10} {:>12} {:>8} {:>6}", f.bytes, f.count, f.dtype.name(), redop);
    for r in cells {
        s.push_str(&format!(" {:>10.2} {:>9.2} {:>9.2} {:>7.2} {:>7.2}", r.time_us, r.p10_us, r.p90_us, r.algbw, r.busbw));
    }
    let wrong = if wrong < 0 { "N/A".to_string() } else { wrong.to_string() };
    println!("{s} {wrong:>6}  {kernel}");
}

/// One measured point; `count`: nccl-tests' count (all-gather: output, reduce-scatter: input).
#[allow(clippy::too_many_arguments)]
fn record(peer: &str, c: Collective, backend: String, d: DType, world: usize, count: usize, s: Spread, wrong: i64, mode: CaptureMode, inner: usize, kernel: String, blocks_max: i32) -> PeerRecord {
    let bytes = count * d.size();
    let (algbw, busbw) = tpar::report::bandwidths_for(c, bytes, world, s.median);
    PeerRecord { peer: peer.into(), collective: c, backend, dtype: d, world, bytes, count, time_us: s.median, p10_us: s.p10, p90_us: s.p90, algbw, busbw, wrong, mode, inner, kernel, blocks_max }
}

/// The per-rank elements of a call of nccl-tests' size `bytes` (as tpar's blocks take it),
/// or why vLLM takes no call of that size.
fn peer_count(c: Collective, d: DType, bytes: usize, world: usize) -> Result<usize, String> {
    if c == Collective::AllReduce {
        let count = bytes / d.size();
        return if count == 0 || bytes % 16 != 0 || count * d.size() != bytes { Err("skipped: vLLM needs a positive multiple of 16 bytes".into()) } else { Ok(count) };
    }
    let count = super::per_rank_count(c, d, bytes, world);
    match vllm_declines(c, d, count, world) {
        Some(why) => Err(why),
        None => Ok(count),
    }
}

/// The header lines of vLLM's block for `c`.
fn peer_description(c: Collective, lib: &Path, info: &str) {
    match c {
        Collective::AllReduce => {
            println!("# peer: vllm, vLLM 0.33.0's custom all-reduce (vllm::CustomAllreduce of csrc/custom_all_reduce.cuh, built from its sdist by bench/compare/vllm.sh), library {}", lib.display());
            println!("#   {info}");
            println!("#   graph mode: inputs captured in the graph, registered after capture (zero copy); eager mode: a copy into its registered buffer, then the kernel (vLLM's eager path)");
            println!("#   checked against vLLM's own summation order (rank order for 1stage; 2stage starts each part at its owner rank), bit for bit, and the f64 bound");
        }
        _ => {
            let (what, kernel, max) = match c {
                Collective::AllGather => ("all-gather", "cross_device_all_gather", format!("at most {} MiB of input per rank", VLLM_ALL_GATHER_MAX >> 20)),
                _ => ("reduce-scatter", "cross_device_reduce_scatter", format!("at most {} MiB of input per rank", VLLM_REDUCE_SCATTER_MAX >> 20)),
            };
            println!(
                "# peer: vllm, vLLM 0.33.0's custom {what} ({kernel} of csrc/custom_all_gather_reduce_scatter.cuh, launched with the grid of CustomAllreduce's own launcher, built from its sdist by bench/compare/vllm.sh), library {}",
                lib.display()
            );
            println!("#   {info}");
            println!("#   both modes as vLLM's custom_{}: a copy of the input into its registered buffer, then the kernel (in a graph too: vLLM registers no graph inputs for it)", what.replace('-', "_"));
            println!("#   vLLM runs its kernel for {max} (its Python class's limit; larger calls go to NCCL there): beyond that, the row says vLLM does not take the size (not a failure)");
            match c {
                Collective::AllGather => println!("#   checked by tpar's verifier, as tpar's: every rank's output a bitwise copy of every rank's input in rank order"),
                _ => println!(
                    "#   checked by tpar's verifier, as tpar's: within the f64 reference's bound, and bit for bit against the rank-order f32 sum rounded once (vLLM's kernel adds the ranks in rank order in f32: packed_reduce)"
                ),
            }
        }
    }
}

/// Runs every peer of `peers` on group `g` (after tpar's blocks for it: `tpar` holds tpar's
/// records, this group's among them), prints each peer's block, its `--sequence` step, and
/// tpar / peer per point. Collective over rank processes. Returns the peers' wrong elements.
fn compare(
    g: &mut Group,
    peers: &[(&PeerSpec, &Api)],
    run: &PeerRun,
    tpar: &[BenchRecord],
    out: &mut Vec<PeerRecord>,
    lines: &mut Vec<Comparison>,
) -> Result<i64, String> {
    let root = g.root();
    let world = g.world();
    let c = run.collective;
    let label = g.label();
    let place = if label == "cuda" { "one process per GPU".to_string() } else { format!("emulated on one GPU, {}", label.trim_start_matches("cuda-emulated-")) };
    // tpar's picks (per rank bytes as the plan takes them), asked before the peer borrows the group.
    let mut picks = Vec::new();
    for &d in &run.dtypes {
        for &mode in &run.modes {
            for &bytes in run.sizes.iter().chain(run.sequence.as_ref().map(|s| &s.1)) {
                let per_rank = super::per_rank_count(c, d, bytes, world) * d.size();
                picks.push(((d, mode, per_rank), tpar_pick(g, c, d, per_rank, mode)));
            }
        }
    }
    let pick = |d: DType, mode: CaptureMode, per_rank: usize| picks.iter().find(|(k, _)| *k == (d, mode, per_rank)).map(|(_, a)| *a);
    let max_bytes = run.sizes.iter().copied().chain(run.sequence.map(|s| s.1)).max().unwrap_or(16);
    let mut wrong_total = 0i64;
    for &(p, api) in peers {
        if ![2, 4, 6, 8].contains(&world) {
            if root {
                println!("#\n# {}: skipped at {world} ranks (vLLM's custom {c} runs 2, 4, 6 or 8)", p.name);
            }
            continue;
        }
        let Some(site) = g.peer_site() else {
            return Err("--compare runs on GPUs (emulated ranks or one process per GPU)".into());
        };
        let mut v = VllmRanks::new(api, site, max_bytes)?;
        if c != Collective::AllReduce && !v.full_nvlink {
            if root {
                println!("#\n# {}: skipped: vLLM runs its custom {c} only where every pair of GPUs is on NVLink (it gives these calls to NCCL)", p.name);
            }
            continue;
        }
        let blocks = v.block_limit(c)?;
        if root {
            println!("#");
            peer_description(c, &p.lib, &v.info());
            peer_header(&p.name, world, &place, &run.modes);
        }
        let mut mine: Vec<PeerRecord> = Vec::new();
        for &d in &run.dtypes {
            for &bytes in &run.sizes {
                let count = match peer_count(c, d, bytes, world) {
                    Ok(n) => n,
                    Err(why) => {
                        if root {
                            let total = c.io_elems(super::per_rank_count(c, d, bytes, world), world);
                            println!("  {bytes:>10} {:>12} {:>8}  {why}", total.0.max(total.1), d.name());
                        }
                        continue;
                    }
                };
                let (ins, outs) = c.io_elems(count, world);
                let total = ins.max(outs);
                let kernel = match c {
                    Collective::AllReduce => format!("{}stage", v.stage(bytes)?),
                    Collective::AllGather => "all_gather".to_string(),
                    Collective::ReduceScatter => "reduce_scatter".to_string(),
                };
                let mut wrong = -1i64;
                if run.check {
                    wrong = 0;
                    for (k, &mode) in run.modes.iter().enumerate() {
                        let call = PEER_CALL_TAG ^ (bytes as u64) ^ ((k as u64) << 56) ^ (c.code() << 52);
                        wrong += by_dtype!(d, T => v.checked_collective::<T>(c, mode, call, count)?);
                    }
                    wrong_total += wrong;
                }
                let mut row = Vec::new();
                for &mode in &run.modes {
                    let t = Timing { mode, inner: run.inner, warmup: run.warmup, iters: run.iters };
                    if let Some(s) = v.time(c, d, count, t)? {
                        row.push(record(&p.name, c, v.label.clone(), d, world, total, s, wrong, mode, run.inner, kernel.clone(), blocks));
                    }
                }
                if root {
                    peer_row(&row, wrong, &kernel);
                }
                mine.extend(row);
            }
        }
        if let (Some((calls, bytes)), Collective::AllReduce) = (run.sequence, c) {
            let d = if run.dtypes.contains(&DType::BF16) { DType::BF16 } else { run.dtypes[0] };
            let count = bytes / d.size();
            if count > 0 && bytes % 16 == 0 && count * d.size() == bytes {
                let kernel = format!("{}stage", v.stage(bytes)?);
                let mut wrong = -1;
                if run.check {
                    wrong = 0;
                    for (k, &mode) in run.modes.iter().enumerate() {
                        let call = PEER_CALL_TAG ^ (bytes as u64) ^ ((k as u64 + 8) << 56);
                        wrong += by_dtype!(d, T => v.checked::<T>(mode, call, count)?);
                    }
                    wrong_total += wrong;
                }
                if root {
                    println!("#");
                    println!("# Sequence (peer {}): {calls} all-reduces of {bytes} B {d} per step, {kernel}; us per step, median [p10-p90], slowest rank; #wrong {wrong}", p.name);
                }
                for &mode in &run.modes {
                    let t = Timing { mode, inner: calls, warmup: run.warmup.min(3), iters: run.iters };
                    if let Some(s) = v.time(c, d, count, t)? {
                        let k = calls as f64;
                        if root {
                            println!("  {:>6} {:>14} {:>10.1} us [{:.1}-{:.1}]  {:>6.2} us per call", mode.name(), p.name, s.median * k, s.p10 * k, s.p90 * k, s.median);
                        }
                        mine.push(record(&p.name, c, format!("{}-sequence{calls}", v.label), d, world, count, s, wrong, mode, calls, kernel.clone(), blocks));
                    }
                }
            } else if root {
                println!("# Sequence (peer {}): skipped: {bytes} B is not a multiple of 16 bytes", p.name);
            }
        }
        drop(v);
        if root {
            let here: Vec<Comparison> = mine
                .iter()
                .map(|r| {
                    let per_rank = if c == Collective::AllReduce { r.bytes } else { r.bytes / world };
                    compare_one(r, tpar, &label, world, pick(r.dtype, r.mode, per_rank))
                })
                .collect();
            print_comparison(&p.name, c, &here);
            lines.extend(here);
        }
        out.extend(mine);
    }
    Ok(wrong_total)
}

/// tpar against one peer record: the plan's pick and the fastest of tpar's blocks measured
/// in this group at the same point (same collective, mode, dtype, size; sequence steps
/// against tpar's).
fn compare_one(r: &PeerRecord, tpar: &[BenchRecord], label: &str, world: usize, pick: Option<Algorithm>) -> Comparison {
    let calls = if r.backend.contains("-sequence") { r.inner } else { 1 };
    let backend = if calls > 1 { format!("{label}-sequence{calls}") } else { label.to_string() };
    let here = || {
        tpar.iter().filter(|b| {
            b.mode == r.mode
                && b.record.collective == r.collective
                && b.record.backend == backend
                && b.record.world == world
                && b.record.dtype == r.dtype
                && b.record.bytes == r.bytes
                && b.record.wrong <= 0
        })
    };
    let plan = pick.unwrap_or(Algorithm::Nccl);
    let plan_us = here().find(|b| b.record.algorithm == plan).map(|b| b.record.time_us);
    let fastest = here().filter(|b| b.record.algorithm != Algorithm::GatherBcast).min_by(|a, b| a.record.time_us.total_cmp(&b.record.time_us));
    let ratio = |t: Option<f64>| t.filter(|_| r.time_us > 0.0).map(|t| t / r.time_us);
    Comparison {
        peer: r.peer.clone(),
        collective: r.collective,
        mode: r.mode,
        dtype: r.dtype,
        world,
        bytes: r.bytes,
        calls,
        tpar_plan: plan,
        tpar_plan_us: plan_us,
        tpar_fastest: fastest.map(|b| b.record.algorithm),
        tpar_fastest_us: fastest.map(|b| b.record.time_us),
        peer_us: r.time_us,
        plan_over_peer: ratio(plan_us),
        fastest_over_peer: ratio(fastest.map(|b| b.record.time_us)),
    }
}

fn print_comparison(peer: &str, c: Collective, lines: &[Comparison]) {
    let f = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.2}"));
    println!("#");
    println!(
        "# tpar against {peer}, {c}, this group, same harness (median us per call; size as nccl-tests gives it; ratio = tpar / {peer}: below 1 tpar is faster). \
         tpar's pick: the plan here, or on emulated ranks the plan for {EMULATED_PLAN_PRESET} at this world; '-': not measured in this run"
    );
    println!(
        "# {:>6} {:>9} {:>10} {:>5} {:>14} {:>9} {:>14} {:>9} {:>9} {:>9} {:>9}",
        "mode", "type", "size (B)", "calls", "tpar pick", "(us)", "tpar fastest", "(us)", peer, "pick/", "fastest/"
    );
    for l in lines {
        println!(
            "  {:>6} {:>9} {:>10} {:>5} {:>14} {:>9} {:>14} {:>9} {:>9.2} {:>9} {:>9}",
            l.mode.name(),
            l.dtype.name(),
            l.bytes,
            l.calls,
            l.tpar_plan.name(),
            f(l.tpar_plan_us),
            l.tpar_fastest.map_or("-", |a| a.name()),
            f(l.tpar_fastest_us),
            l.peer_us,
            f(l.plan_over_peer),
            f(l.fastest_over_peer)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_lists_parse() {
        let v = parse("vllm=/x/lib.so").unwrap();
        assert_eq!(v, vec![PeerSpec { name: "vllm".into(), lib: "/x/lib.so".into() }]);
        assert_eq!(parse("vllm,vllm").unwrap().len(), 1);
        assert!(parse("nccl").unwrap_err().contains("known peers"));
        assert!(parse("flashinfer").unwrap_err().contains("peers_multi_gpu.py"));
        assert!(parse(" , ").is_err());
        assert!(check_libs(&parse("vllm=/no/such/lib.so").unwrap()).unwrap_err().contains("vllm.sh"));
    }

    #[test]
    fn vllm_takes_what_its_python_class_gives_its_kernels() {
        let (ag, rs, bf) = (Collective::AllGather, Collective::ReduceScatter, DType::BF16);
        // All-gather: at most 2 MiB of input per rank, whatever the world.
        assert_eq!(vllm_declines(ag, bf, (2 << 20) / 2, 8), None);
        assert!(vllm_declines(ag, bf, (4 << 20) / 2, 2).unwrap().contains("does not take this size"));
        // Reduce-scatter: at most 16 MiB of input (world x output) per rank.
        assert_eq!(vllm_declines(rs, bf, (2 << 20) / 2, 8), None);
        assert!(vllm_declines(rs, bf, (4 << 20) / 2, 8).unwrap().contains("16 MiB"));
        assert_eq!(vllm_declines(rs, bf, (4 << 20) / 2, 4), None);
        assert!(vllm_declines(rs, DType::F32, (4 << 20) / 4 + 4, 4).is_some());
        // Whole 16-byte vectors per rank, and never an empty call.
        assert!(vllm_declines(ag, bf, 4, 2).unwrap().contains("16-byte"));
        assert!(vllm_declines(rs, bf, 0, 2).is_some());
        // The all-reduce is not gated.
        assert_eq!(vllm_declines(Collective::AllReduce, bf, 1 << 30, 8), None);
    }

    #[test]
    fn peer_calls_take_tpars_per_rank_sizes() {
        // nccl-tests' size: the all-gather's output, the reduce-scatter's input; per rank the
        // size over the world, in whole 16-byte vectors, as tpar's blocks take it.
        let (ag, rs, bf) = (Collective::AllGather, Collective::ReduceScatter, DType::BF16);
        assert_eq!(peer_count(ag, bf, 8 << 10, 8), Ok(512));
        assert_eq!(peer_count(rs, bf, 8 << 10, 8), Ok(512));
        assert_eq!(peer_count(ag, bf, (8 << 10) + 40, 8), Ok(512));
        assert!(peer_count(ag, bf, 8 << 20, 2).is_err());
        assert_eq!(peer_count(rs, bf, 16 << 20, 4), Ok((4 << 20) / 2));
        assert!(peer_count(rs, bf, 32 << 20, 8).is_err());
        // Less than a vector per rank: nothing to call.
        assert!(peer_count(ag, bf, 64, 8).unwrap_err().contains("16-byte"));
        // The all-reduce as before: any whole multiple of 16 bytes.
        assert_eq!(peer_count(Collective::AllReduce, DType::F32, 4096, 8), Ok(1024));
        assert!(peer_count(Collective::AllReduce, DType::F32, 4100, 8).is_err());
    }

    #[test]
    fn json_goes_beside_tpars() {
        assert_eq!(json_path(Path::new("/o/run.json")), PathBuf::from("/o/run.peers.json"));
        assert_eq!(json_path(Path::new("run")), PathBuf::from("run.peers.json"));
    }
}

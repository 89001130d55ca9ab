//! `tpar bench`'s size sweep: all_reduce_perf's table, one block per algorithm, on CPU rank
//! processes, one rank process per GPU, or emulated ranks alike (the harness decides where).

use super::args::BenchArgs;
use crate::harness::output::{self, BenchRecord};
use crate::harness::{self, launch, table, Group, Io, Target, Timing};
use crate::harness::progress::Progress;
use tpar::algorithms::registry::{spec, Role};
use tpar::report::Record;
use tpar::units::Spread;
use tpar::{Algorithm, CaptureMode, Collective, DType};

/// Everything validated, before any rank starts.
struct Plan {
    sizes: Vec<usize>,
    dtypes: Vec<DType>,
    algos: Vec<Option<Algorithm>>,
    modes: Vec<CaptureMode>,
    sequence: Option<(usize, usize)>,
}

/// The size sweep: every size x dtype x algorithm x mode, on the ranks the flags name.
pub fn run(args: BenchArgs) -> Result<(), String> {
    let target = args.ranks.target("bench", true)?;
    if args.iters == 0 {
        return Err("-n must be at least 1".into());
    }
    let mode = if args.graph {
        Some("graph")
    } else {
        args.mode.as_deref()
    };
    let c = args.collective;
    let algos = harness::parse_algos_for(&args.algo, &target, c)?;
    if c != Collective::AllReduce && args.sequence.is_some() {
        return Err(format!("--collective {c}: --sequence times the all-reduce only"));
    }
    let p = Plan {
        sizes: args.sizes()?,
        dtypes: harness::parse_dtypes(&args.dtype)?,
        algos,
        modes: harness::parse_modes(mode, &target)?,
        sequence: args.sequence.as_deref().map(harness::parse_sequence).transpose()?,
    };
    harness::holds_an_element("-b", args.min_bytes, &p.dtypes)?;
    if p.sequence.is_some() && target == Target::Cpu {
        return Err("--sequence times CUDA graphs of a whole step: GPUs only".into());
    }
    if p.algos == [None] && matches!(target, Target::Emulated { .. }) {
        return Err("--algo auto: emulated ranks have no plan (they are not a fabric); name algorithms or use all".into());
    }
    if harness::first_process() {
        output::check_all(&[("--json", args.json.as_deref()), ("--csv", args.csv.as_deref()), ("--svg", args.svg.as_deref())])?;
    }
    if target == Target::Cpu && !launch::is_rank() {
        let world = args.ranks.world(&target)?;
        if world > harness::cores() {
            eprintln!(
                "tpar: warning: {world} ranks on {} cores: ranks that share a core wait for each other's time slices, so times measure the scheduler",
                harness::cores()
            );
        }
    }
    #[cfg(feature = "cuda")]
    let mut peers = {
        let run = harness::peer::PeerRun {
            collective: c,
            sizes: p.sizes.clone(),
            dtypes: p.dtypes.clone(),
            modes: p.modes.clone(),
            inner: args.graph_inner,
            warmup: args.warmup,
            iters: args.iters,
            check: args.check != 0,
            sequence: p.sequence,
        };
        harness::peer::Session::new(args.compare.as_deref(), &target, args.json.as_deref(), run)?
    };
    #[cfg(not(feature = "cuda"))]
    if args.compare.is_some() {
        return Err("--compare: this tpar was built without the `cuda` feature".into());
    }
    let max_bytes = p.sizes.iter().copied().max().unwrap_or(0).max(p.sequence.map_or(0, |s| s.1));
    let mut records = Vec::new();
    let mut wrong = 0i64;
    let mut root = false;
    match (&args.plan_topology, &target) {
        (None, _) => {
            harness::run_groups(&target, &args.ranks, max_bytes, |g| {
                root = g.root();
                wrong += bench_group(g, &args, &p, &mut records)?;
                #[cfg(feature = "cuda")]
                if let Some(s) = peers.as_mut() {
                    wrong += s.after_group(g, &records)?;
                }
                Ok(())
            })?;
        }
        #[cfg(feature = "cuda")]
        (Some(t), Target::Gpu) => {
            let topology = tpar::Topology::load(t).map_err(|e| e.to_string())?;
            if !launch::is_rank() {
                return harness::gpu::launch_ranks(args.ranks.world.unwrap_or(2), launch::FAIL_GRACE, true);
            }
            let mut g = Group::Gpu(harness::gpu::GpuRanks::join(max_bytes, Some(&topology))?);
            root = g.root();
            wrong += bench_group(&mut g, &args, &p, &mut records)?;
            if let Some(s) = peers.as_mut() {
                wrong += s.after_group(&mut g, &records)?;
            }
        }
        (Some(_), _) => return Err("--plan-topology puts GPU rank processes on one GPU: use --backend cuda".into()),
    }
    if root {
        if let Some(f) = &args.json {
            output::write_json(f, &records)?;
            println!("# wrote {} records to {}", records.len(), f.display());
        }
        if let Some(f) = &args.csv {
            output::write_csv(f, &records)?;
        }
        if let Some(f) = &args.svg {
            output::write_svg(f, &records)?;
        }
        #[cfg(feature = "cuda")]
        if let Some(s) = &peers {
            s.write(args.json.as_deref())?;
        }
    }
    if wrong > 0 {
        return Err(format!("{wrong} wrong elements in total (see #wrong)"));
    }
    Ok(())
}

/// One group's blocks, summary and sequence; returns its wrong elements.
fn bench_group(g: &mut Group, a: &BenchArgs, p: &Plan, records: &mut Vec<BenchRecord>) -> Result<i64, String> {
    let root = g.root();
    let runs = g.algorithms();
    let algos: Vec<Option<Algorithm>> = p.algos.iter().copied().filter(|c| c.map_or(true, |x| runs.contains(&x))).collect();
    let describe = g.describe()?;
    if root {
        let c = a.collective;
        println!(
            "# tpar bench ({} format)",
            c.name().replace('-', "_") + "_perf"
        );
        table::preamble(&describe);
        table::preamble(&[
            format!(
                "minBytes {} maxBytes {} step: {}(factor) warmup iters: {} iters: {} validation: {}",
                a.min_bytes, a.max_bytes, a.step_factor, a.warmup, a.iters, a.check
            ),
            format!(
                "time = median us per call over -n iterations (each iteration: the slowest rank), p10/p90 = spread; {} call(s) per iteration{}",
                if g.label() == "cpu" { 1 } else { a.graph_inner },
                if p.modes.contains(&CaptureMode::Graph) { ", captured once and replayed in graph mode" } else { "" }
            ),
        ]);
        if algos.len() < p.algos.len() {
            println!("#  NCCL is not measured: it did not join");
        }
    }
    let inner = if g.label() == "cpu" { 1 } else { a.graph_inner };
    let timing = |mode| Timing { mode, inner, warmup: a.warmup, iters: a.iters };
    let mut mine = Vec::new();
    let mut wrong_total = 0i64;
    let mut bar = Progress::new(root, p.dtypes.len() * algos.len() * p.sizes.len());
    for &d in &p.dtypes {
        for &choice in &algos {
            if root {
                let (name, transport) = match choice {
                    Some(x) if spec(x).role == Role::Baseline => (format!("{x} (baseline)"), g.transport(x).to_string()),
                    Some(x) => (x.to_string(), g.transport(x).to_string()),
                    None => ("auto (the plan's pick per size)".to_string(), "the plan's".to_string()),
                };
                bar.suspend(|| table::block_header(&name, &transport, g.world(), &place(g), &p.modes));
            }
            for &bytes in &p.sizes {
                let c = a.collective;
                // Per rank, as the calls take it; the row shows nccl-tests' size and count.
                let count = harness::per_rank_count(c, d, bytes, g.world());
                let total = c
                    .io_elems(count, g.world())
                    .0
                    .max(c.io_elems(count, g.world()).1);
                bar.inc();
                if count == 0 {
                    continue;
                }
                bar.set_message(format!("{} {d} {bytes} B", choice.map_or("auto", |x| x.name())));
                let code = choice.map_or(0, |x| x.code());
                let wrong = if a.check != 0 {
                    g.checked(
                        c,
                        d,
                        choice,
                        0xbe4c,
                        bytes as u64 ^ (code << 40),
                        count,
                        Io::OutOfPlace,
                    )?
                    .bad_elements()
                } else {
                    -1
                };
                wrong_total += wrong.max(0);
                let mut row = Vec::new();
                for &mode in &p.modes {
                    let Some(algo) = choice.or_else(|| g.planned(c, d, count * d.size(), mode))
                    else {
                        continue;
                    };
                    if let Some(s) = g.time(c, algo, d, count, timing(mode))? {
                        let record = Record::measured_for(
                            c,
                            algo,
                            g.label(),
                            d,
                            g.world(),
                            total,
                            (s.median, s.p10, s.p90),
                            wrong,
                        );
                        row.push(record.clone());
                        mine.push(BenchRecord { record, mode, inner });
                    }
                }
                if root {
                    bar.suspend(|| table::row(&row, wrong));
                    progress(a, records, &mine)?;
                }
            }
        }
    }
    bar.finish();
    if let Some((calls, bytes)) = p.sequence {
        sequence(g, a, p, &algos, calls, bytes, &mut mine)?;
        if root {
            progress(a, records, &mine)?;
        }
    }
    if root {
        let (c, world) = (a.collective, g.world());
        table::summary(&mine, &mut |mode, d, bytes| {
            g.planned(
                c,
                d,
                harness::per_rank_count(c, d, bytes, world) * d.size(),
                mode,
            )
        });
    }
    g.barrier()?;
    records.extend(mine);
    Ok(wrong_total)
}

/// Rewrites `--json` and `--csv` with what is measured so far, marked incomplete.
fn progress(a: &BenchArgs, earlier: &[BenchRecord], mine: &[BenchRecord]) -> Result<(), String> {
    if a.json.is_none() && a.csv.is_none() {
        return Ok(());
    }
    let all: Vec<BenchRecord> = earlier.iter().chain(mine).cloned().collect();
    output::write_progress(a.json.as_deref(), a.csv.as_deref(), &all)
}

/// Where the ranks are, for block headers.
fn place(g: &Group) -> String {
    match g.label().as_str() {
        "cpu" => "rank processes".into(),
        "cuda" => "one process per GPU".into(),
        other => format!("emulated on one GPU, {}", other.trim_start_matches("cuda-emulated-")),
    }
}

/// `--sequence CALLSxBYTES`: a whole step of all-reduces per algorithm and mode (bf16 when
/// measured, else the first dtype). The plan's pick is marked.
fn sequence(g: &mut Group, a: &BenchArgs, p: &Plan, algos: &[Option<Algorithm>], calls: usize, bytes: usize, out: &mut Vec<BenchRecord>) -> Result<(), String> {
    let d = if p.dtypes.contains(&DType::BF16) { DType::BF16 } else { p.dtypes[0] };
    let count = bytes / d.size();
    if count == 0 {
        return Err(format!("--sequence: {bytes} B is less than one {d} element"));
    }
    if g.root() {
        table::sequence_header(calls, bytes, d);
    }
    let mut rows: Vec<(CaptureMode, Algorithm, Spread)> = Vec::new();
    for &choice in algos {
        for &mode in &p.modes {
            let Some(algo) = choice.or_else(|| g.planned(Collective::AllReduce, d, bytes, mode))
            else {
                continue;
            };
            let t = Timing {
                mode,
                inner: calls,
                warmup: a.warmup.min(3),
                iters: a.iters,
            };
            if let Some(s) = g.time(Collective::AllReduce, algo, d, count, t)? {
                rows.push((mode, algo, s));
                let record = Record::measured(algo, format!("{}-sequence{calls}", g.label()), d, g.world(), count, (s.median, s.p10, s.p90), -1);
                out.push(BenchRecord { record, mode, inner: calls });
            }
        }
    }
    if g.root() {
        let c = calls as f64;
        for &(mode, algo, s) in &rows {
            let nccl = rows
                .iter()
                .find(|r| r.0 == mode && r.1 == Algorithm::Nccl)
                .map(|r| r.2.median * c);
            let picked = g.planned(Collective::AllReduce, d, bytes, mode) == Some(algo);
            table::sequence_row(
                mode,
                algo,
                calls,
                (s.median * c, s.p10 * c, s.p90 * c),
                nccl,
                picked,
            );
        }
    }
    Ok(())
}

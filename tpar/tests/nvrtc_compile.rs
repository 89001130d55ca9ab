//! CI test without a GPU: every kernel variant compiles with NVRTC to cubin for sm_80, sm_90
//! and sm_120 — each file with all three dtype instantiations, and each (file, dtype) alone
//! as the launch path compiles it — plus the header alone (the ABI probe). NVRTC comes from
//! the pinned wheel `nvidia-cuda-nvrtc==13.0.88` (`scripts/install-nvrtc.sh`), found through
//! `TPAR_NVRTC_LIB` or `LD_LIBRARY_PATH`. Without it the test prints `SKIPPED <test>: <why>` (and logs it for the summary);
//! with `TPAR_REQUIRE_NVRTC=1` a missing NVRTC fails instead.
#![cfg(feature = "cuda")]

mod common;
use tpar::cuda::kernels::{self, probe_unit, sources};
use tpar::cuda::nvrtc;
use tpar::{Algorithm, DType};

const ARCHS: [&str; 3] = ["sm_80", "sm_90", "sm_120"];

fn no_local_memory(what: &str, ptx: &str) {
    // No stack frame: a kernel argument or frame whose address escapes is copied to local
    // memory in every thread (it once doubled a 1 KiB call on an H200); spills show the same.
    assert!(!ptx.contains("__local_depot"), "{what} uses local memory (a stack frame)");
    assert!(!ptx.contains(".local"), "{what} uses local memory");
}

fn no_spills(what: &str, log: &str) {
    // ptxas spills happen after PTX: a PTX without .local can still run from a stack frame.
    // One thread checking all 16 call descriptors beside 16 data vectors once spilled
    // 0.6-3 KB per thread and made the push kernels 1.2-3.7x slower on an H200.
    let frames: Vec<&str> = log.lines().filter(|l| l.contains("bytes stack frame")).collect();
    assert!(!frames.is_empty(), "{what}: no ptxas resource lines in the log:\n{log}");
    for l in frames {
        let nums: Vec<u64> = l.split(|c: char| !c.is_ascii_digit()).filter_map(|t| t.parse().ok()).collect();
        assert!(nums.iter().all(|n| *n == 0), "{what}: stack frame or spills: {l}\n{log}");
    }
}

/// `TPAR_DUMP_PTX=DIR`: every variant's PTX goes to DIR/NAME.ptx, so that a rewrite meant to
/// change no code can be checked by comparing two dumps.
fn dump_ptx(name: &str, ptx: &str) {
    if let Ok(dir) = std::env::var("TPAR_DUMP_PTX") {
        let _ = std::fs::write(format!("{dir}/{name}.ptx"), ptx);
    }
}

fn max_registers(log: &str) -> u64 {
    log.lines()
        .filter_map(|l| l.split("Used ").nth(1)?.split(" registers").next()?.trim().parse::<u64>().ok())
        .max()
        .unwrap_or_else(|| panic!("no register counts in the ptxas log:\n{log}"))
}

#[test]
fn every_kernel_variant_compiles_with_nvrtc() {
    let version = match nvrtc::probe() {
        Ok(v) => v,
        Err(e) => {
            if std::env::var("TPAR_REQUIRE_NVRTC").is_ok_and(|v| v == "1") {
                panic!("TPAR_REQUIRE_NVRTC=1 but NVRTC is missing: {e}");
            }
            // Printed to the stderr handle and logged for the summary (common::skip).
            common::skip("nvrtc_compile::every_kernel_variant_compiles_with_nvrtc", &format!("NVRTC not found: {e}"));
            return;
        }
    };
    assert_eq!(version.major, 13, "pinned NVRTC is 13.0.x (the GPU machine's CUDA); got {version:?}");
    let mut compiled = 0;
    for arch in ARCHS {
        let probe = nvrtc::compile_unit("common.cuh", &probe_unit(), &nvrtc::options(arch, None)).unwrap_or_else(|e| panic!("{e}"));
        assert!(probe.ptx.contains(".entry tpar_abi_offsets(") && probe.ptx.contains(".entry tpar_noop("));
        assert!(!probe.cubin.is_empty());
        // The link probe's kernels (`tpar topo --probe`), compiled the same way.
        let link = nvrtc::compile_unit("probe.cu", tpar::cuda::probe::PROBE_CU, &nvrtc::options(arch, None)).unwrap_or_else(|e| panic!("{e}"));
        for k in ["probe_store", "probe_load", "probe_pingpong"] {
            assert!(link.ptx.contains(&format!(".entry {k}(")), "probe.cu for {arch}: no {k}");
        }
        no_local_memory(&format!("probe.cu for {arch}"), &link.ptx);
        for src in &sources().collect::<Vec<_>>() {
            let all = nvrtc::compile(src, arch, None).unwrap_or_else(|e| panic!("{e}"));
            assert!(all.ptx.contains(&format!(".target {arch}")), "{} not compiled for {arch}", src.file);
            assert!(all.cubin.starts_with(b"\x7fELF"), "{} for {arch}: the cubin is not an ELF image", src.file);
            dump_ptx(&format!("{}-{arch}", src.file), &all.ptx);
            no_local_memory(&format!("{} for {arch}", src.file), &all.ptx);
            for d in DType::ALL {
                let entry = format!(".entry {}(", src.entry(d));
                assert!(all.ptx.contains(&entry), "{} for {arch}: no `{entry}` in the PTX", src.file);
                // The all-gather and reduce-scatter entries exactly where the registry declares them.
                for k in [tpar::Collective::AllGather, tpar::Collective::ReduceScatter] {
                    let e = format!(".entry {}(", src.entry_for(k, d));
                    assert_eq!(all.ptx.contains(&e), kernels::has_gather_scatter(src.algorithm), "{} for {arch}: `{e}`", src.file);
                }
                let one = nvrtc::compile(src, arch, Some(d)).unwrap_or_else(|e| panic!("{e}"));
                assert!(one.ptx.contains(&entry), "{} {d} alone for {arch}: no `{entry}`", src.file);
                for other in DType::ALL.into_iter().filter(|o| *o != d) {
                    assert!(!one.ptx.contains(&format!(".entry {}(", src.entry(other))), "{} {d} alone also holds {other}", src.file);
                }
                no_local_memory(&format!("{} {d} for {arch}", src.file), &one.ptx);
                // As the launch path compiles it, with ptxas's resource report.
                let mut opts = nvrtc::options(arch, Some(d));
                opts.push("--ptxas-options=-v".into());
                let v = nvrtc::compile_unit(src.file, &src.translation_unit(), &opts).unwrap_or_else(|e| panic!("{e}"));
                no_spills(&format!("{} {d} for {arch}", src.file), &v.log);
                compiled += 1;
                // The host transport's variant (flag protocol), as the launch path compiles it.
                if kernels::has_flag_variant(src.algorithm) {
                    let mut opts = nvrtc::options(arch, Some(d));
                    opts.extend(tpar::cuda::launch::protocol_defines(tpar::plan::HostProtocol::Flags));
                    opts.push("--ptxas-options=-v".into());
                    let h = nvrtc::compile_unit(src.file, &src.translation_unit(), &opts).unwrap_or_else(|e| panic!("{e}"));
                    assert!(h.ptx.contains(&entry), "{} {d} (flags) for {arch}: no `{entry}`", src.file);
                    for k in [tpar::Collective::AllGather, tpar::Collective::ReduceScatter] {
                        let e = format!(".entry {}(", src.entry_for(k, d));
                        assert_eq!(h.ptx.contains(&e), kernels::has_gather_scatter(src.algorithm), "{} {d} (flags) for {arch}: `{e}`", src.file);
                    }
                    assert!(h.ptx.contains("st.release.sys") && h.ptx.contains("ld.acquire.sys"), "{} {d} (flags) for {arch}: no release/acquire flags", src.file);
                    dump_ptx(&format!("{}-{d}-flags-{arch}", src.file), &h.ptx);
                    no_local_memory(&format!("{} {d} (flags) for {arch}", src.file), &h.ptx);
                    no_spills(&format!("{} {d} (flags) for {arch}", src.file), &h.log);
                    compiled += 1;
                }
                // The lean variant for large messages (launch::size_class), each protocol it
                // runs under: no spill, and at most 64 registers a thread (two blocks of
                // TPAR_THREADS per SM: the point of the variant).
                if kernels::has_lean_variant(src.algorithm) {
                    let mut protos = vec![tpar::plan::HostProtocol::Sentinel];
                    if kernels::runs_with_flags(src.algorithm) {
                        protos.push(tpar::plan::HostProtocol::Flags);
                    }
                    for p in protos {
                        let mut opts = nvrtc::options(arch, Some(d));
                        opts.extend(tpar::cuda::launch::protocol_defines(p));
                        opts.extend(tpar::cuda::launch::size_class_defines(tpar::cuda::launch::SizeClass::Lean));
                        opts.push("--ptxas-options=-v".into());
                        let what = format!("{} {d} (lean, {p:?}) for {arch}", src.file);
                        let l = nvrtc::compile_unit(src.file, &src.translation_unit(), &opts).unwrap_or_else(|e| panic!("{e}"));
                        assert!(l.ptx.contains(&entry), "{what}: no `{entry}`");
                        assert!(l.ptx.contains(".minnctapersm 2"), "{what}: not bounded to two blocks per SM");
                        dump_ptx(&format!("{}-{d}-lean-{p:?}-{arch}", src.file), &l.ptx);
                        no_local_memory(&what, &l.ptx);
                        no_spills(&what, &l.log);
                        let regs = max_registers(&l.log);
                        assert!(regs <= 64, "{what}: {regs} registers a thread (two 512-thread blocks per SM need <= 64)");
                        compiled += 1;
                    }
                }
            }
            // griddepcontrol is sm_90+: present there, absent on sm_80 (a no-op there).
            assert_eq!(all.ptx.contains("griddepcontrol.wait"), arch != "sm_80", "{} for {arch}: griddepcontrol", src.file);
            compiled += 1;
        }
    }
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "compiled {} kernel files x {} archs (all dtypes, and each dtype alone: {compiled} NVRTC compiles to cubin) with NVRTC {}.{}", sources().count(), ARCHS.len(), version.major, version.minor);
}

/// The copy-engine path's kernels (`kernels/ce_ring.cu`, not a registry kernel: its module
/// holds several entries, loaded by `cuda::ce`): each dtype alone, as `cuda::ce` compiles it,
/// for every architecture, with every entry, release/acquire-free flags (descriptors with a
/// check word, fenced), no division and no fused multiply-add in the wire codec, no local memory, and no spill but
/// a bounded one in the lossy-wire kernels (`ce_spills_bounded`).
#[test]
fn the_copy_engine_kernels_compile_with_nvrtc() {
    if nvrtc::probe().is_err() {
        if std::env::var("TPAR_REQUIRE_NVRTC").is_ok_and(|v| v == "1") {
            panic!("TPAR_REQUIRE_NVRTC=1 but NVRTC is missing");
        }
        common::skip("nvrtc_compile::the_copy_engine_kernels_compile_with_nvrtc", "NVRTC not found");
        return;
    }
    let tu = tpar::cuda::ce::translation_unit();
    assert!(!tu.contains("#include"), "the header is spliced in");
    for arch in ARCHS {
        for d in DType::ALL {
            let mut opts = tpar::cuda::ce::options(arch, d);
            opts.push("--ptxas-options=-v".into());
            let what = format!("ce_ring.cu {d} for {arch}");
            let c = nvrtc::compile_unit("ce_ring.cu", &tu, &opts).unwrap_or_else(|e| panic!("{what}: {e}"));
            use tpar::cuda::ce::entry;
            use tpar::kinds::Wire;
            let mut entries: Vec<String> = ["ce_signal", "ce_wait", "ce_pause"].iter().map(|s| s.to_string()).collect();
            for w in Wire::ALL {
                entries.extend(["ce_reduce", "ce_finish"].iter().map(|s| entry(s, w, d)));
                if w.is_lossy() {
                    entries.push(entry("ce_quant", w, d));
                }
            }
            for e in &entries {
                assert!(c.ptx.contains(&format!(".entry {e}(")), "{what}: no `{e}`");
            }
            for other in DType::ALL.into_iter().filter(|o| *o != d) {
                assert!(!c.ptx.contains(&format!(".entry ce_reduce_{}(", kernels::dtype_suffix(other))), "{what} also holds {other}");
            }
            // The codec's operations are the explicit round-to-nearest ones (never contracted).
            assert!(c.ptx.contains("cvt.rni.f32.f32") && !c.ptx.contains("fma.rn.f32") && !c.ptx.contains("div."), "{what}: wire arithmetic");
            assert!(c.ptx.contains("fence.sc.sys"), "{what}: signals fenced");
            assert!(c.cubin.starts_with(b"\x7fELF"), "{what}: not an ELF cubin");
            dump_ptx(&format!("ce_ring-{d}-{arch}"), &c.ptx);
            no_local_memory(&what, &c.ptx);
            ce_spills_bounded(&what, &c.log);
        }
    }
}

/// As `no_spills`, except for the lossy-wire kernels (quantise and reduce, fp8/int8): ptxas
/// gives some of them, for 16-bit dtypes on sm_90 and sm_120, an 8-16 byte frame and 12-16
/// bytes of spills at under 50 registers (forced inlining and an un-unrolled vector loop did
/// not remove them). They run once per piece between copies that take tens of microseconds;
/// more than 32 bytes would be a real regression, and the exact path's kernels get none.
fn ce_spills_bounded(what: &str, log: &str) {
    let mut name = "";
    let mut seen = 0;
    for l in log.lines() {
        if let Some(n) = l.split("Function properties for ").nth(1) {
            name = n.trim();
        }
        if !l.contains("bytes stack frame") {
            continue;
        }
        seen += 1;
        let nums: Vec<u64> = l.split(|c: char| !c.is_ascii_digit()).filter_map(|t| t.parse().ok()).collect();
        let lossy = name.contains("_fp8_") || name.contains("_int8_");
        let limit = if lossy { 32 } else { 0 };
        assert!(nums.iter().all(|n| *n <= limit), "{what}: {name}: stack frame or spills: {l}\n{log}");
    }
    assert!(seen > 0, "{what}: no ptxas resource lines in the log:\n{log}");
}

/// The fused variants (all-reduce + residual add + RMSNorm, `-DTPAR_FUSED`) of every kernel
/// that has one, under each protocol it runs, and the standalone add-RMSNorm kernel: each
/// (file, dtype, arch) as the launch path compiles it, no local memory, no spill; a kernel
/// without the variant refuses the define. Separate from the test above so that it can run
/// alone (`cargo test ... --test nvrtc_compile fused`).
#[test]
fn every_fused_variant_compiles_with_nvrtc() {
    use tpar::cuda::launch::{protocol_defines, size_class_defines, SizeClass};
    use tpar::plan::HostProtocol;
    let version = match nvrtc::probe() {
        Ok(v) => v,
        Err(e) => {
            if std::env::var("TPAR_REQUIRE_NVRTC").is_ok_and(|v| v == "1") {
                panic!("TPAR_REQUIRE_NVRTC=1 but NVRTC is missing: {e}");
            }
            common::skip("nvrtc_compile::fused kernels", &format!("NVRTC not found: {e}"));
            return;
        }
    };
    let mut compiled = 0;
    let fusable: Vec<_> = sources().filter(|s| kernels::has_fused_variant(s.algorithm)).collect();
    assert_eq!(fusable.len(), 4, "one-shot and two-shot, push and pull");
    for arch in ARCHS {
        for src in &fusable {
            let mut protos = vec![HostProtocol::Sentinel];
            if kernels::has_flag_variant(src.algorithm) {
                protos.push(HostProtocol::Flags);
            }
            for d in DType::ALL {
                let entry = format!(".entry {}(", src.entry(d));
                for p in &protos {
                    let mut opts = nvrtc::options(arch, Some(d));
                    opts.extend(protocol_defines(*p));
                    opts.extend(size_class_defines(SizeClass::Fused));
                    opts.push("--ptxas-options=-v".into());
                    let what = format!("{} {d} (fused, {p:?}) for {arch}", src.file);
                    let u = nvrtc::compile_unit(src.file, &src.translation_unit(), &opts).unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert!(u.ptx.contains(&entry), "{what}: no `{entry}`");
                    // The entry takes the fused arguments (TparFusedArgs, 400 bytes).
                    assert!(u.ptx.contains("_param_0[400]"), "{what}: the entry does not take TparFusedArgs");
                    assert!(u.ptx.contains("shfl.sync.bfly.b32") && u.ptx.contains("sqrt.rn.f32"), "{what}: no norm epilogue");
                    // The family's FP8 output (norm.cuh quant_fp8: the clamp and the rounding).
                    assert!(u.ptx.contains("cvt.rni.u32.f32") && u.ptx.contains("min.f32") && u.ptx.contains("0fC3E00000"), "{what}: no FP8 output");
                    assert!(!u.ptx.contains("st.async") && !u.ptx.contains("barrier.cluster"), "{what}: the plain fused variant has the cluster path");
                    // Both fused variants stage a thread's first residual and weight in shared
                    // memory (norm.cuh `stage`) in every kernel but two-shot push.
                    let stages = src.algorithm != Algorithm::TwoshotPush;
                    assert_eq!(u.ptx.contains("cp.async.cg.shared.global"), stages, "{what}: cp.async staging");
                    dump_ptx(&format!("{}-{d}-fused-{p:?}-{arch}", src.file), &u.ptx);
                    no_local_memory(&what, &u.ptx);
                    no_spills(&what, &u.log);
                    compiled += 1;
                    // The rows variant (norm.cuh: each rank owns whole rows and normalises
                    // them; the all-gather moves finished outputs): two-shot pull's alone.
                    let mut ropts = nvrtc::options(arch, Some(d));
                    ropts.extend(protocol_defines(*p));
                    ropts.extend(size_class_defines(SizeClass::FusedRows));
                    ropts.push("--ptxas-options=-v".into());
                    let rwhat = format!("{} {d} (fused rows, {p:?}) for {arch}", src.file);
                    let ru = nvrtc::compile_unit(src.file, &src.translation_unit(), &ropts);
                    if kernels::has_fused_rows(src.algorithm) {
                        let ru = ru.unwrap_or_else(|e| panic!("{rwhat}: {e}"));
                        assert!(ru.ptx.contains(&entry) && ru.ptx.contains("_param_0[400]"), "{rwhat}: no fused entry");
                        assert!(ru.ptx.contains("shfl.sync.bfly.b32") && ru.ptx.contains("sqrt.rn.f32") && ru.ptx.contains("cvt.rni.u32.f32"), "{rwhat}: no norm epilogue with FP8 output");
                        // No spread norm: no release fence before tile words (norm.cuh flush).
                        assert!(!ru.ptx.contains("ld.acquire.gpu"), "{rwhat}: the spread norm's acquire polls");
                        assert!(u.ptx.contains("ld.acquire.gpu"), "{what}: the plain fused variant lost its spread norm");
                        dump_ptx(&format!("{}-{d}-fused-rows-{p:?}-{arch}", src.file), &ru.ptx);
                        no_local_memory(&rwhat, &ru.ptx);
                        no_spills(&rwhat, &ru.log);
                        compiled += 1;
                    } else {
                        assert!(ru.is_err(), "{rwhat}: compiled where the launcher never asks for it");
                    }
                    // The cluster variant (norm.cuh: the row's sums through distributed
                    // shared memory, residual and weight staged by cp.async): the one-shot
                    // kernels from sm_90 on; refused elsewhere.
                    let mut copts = nvrtc::options(arch, Some(d));
                    copts.extend(protocol_defines(*p));
                    copts.extend(size_class_defines(SizeClass::FusedCluster));
                    copts.push("--ptxas-options=-v".into());
                    let cwhat = format!("{} {d} (fused cluster, {p:?}) for {arch}", src.file);
                    let cu = nvrtc::compile_unit(src.file, &src.translation_unit(), &copts);
                    if !kernels::has_cluster_rows(src.algorithm) || arch == "sm_80" {
                        assert!(cu.is_err(), "{cwhat}: compiled where the launcher never asks for it");
                        continue;
                    }
                    let cu = cu.unwrap_or_else(|e| panic!("{cwhat}: {e}"));
                    assert!(cu.ptx.contains(&entry) && cu.ptx.contains("_param_0[400]"), "{cwhat}: no fused entry");
                    for needle in ["st.async.shared::cluster", "mbarrier.try_wait.parity", "barrier.cluster.wait", "cp.async.cg.shared.global"] {
                        assert!(cu.ptx.contains(needle), "{cwhat}: no `{needle}`");
                    }
                    dump_ptx(&format!("{}-{d}-fused-cluster-{p:?}-{arch}", src.file), &cu.ptx);
                    no_local_memory(&cwhat, &cu.ptx);
                    no_spills(&cwhat, &cu.log);
                    compiled += 1;
                }
            }
        }
        for d in DType::ALL {
            let mut opts = nvrtc::options(arch, Some(d));
            opts.push("--ptxas-options=-v".into());
            let what = format!("add_rmsnorm.cu {d} for {arch}");
            let u = nvrtc::compile_unit("add_rmsnorm.cu", &kernels::add_rmsnorm_unit(), &opts).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(u.ptx.contains(&format!(".entry {}(", kernels::add_rmsnorm_entry(d))), "{what}: no entry");
            assert!(u.ptx.contains("cvt.rni.u32.f32") && u.ptx.contains("0f43E00000"), "{what}: no FP8 output");
            dump_ptx(&format!("add_rmsnorm-{d}-{arch}"), &u.ptx);
            no_local_memory(&what, &u.ptx);
            no_spills(&what, &u.log);
            compiled += 1;
        }
        let all = nvrtc::compile_unit("add_rmsnorm.cu", &kernels::add_rmsnorm_unit(), &nvrtc::options(arch, None)).unwrap_or_else(|e| panic!("{e}"));
        for d in DType::ALL {
            assert!(all.ptx.contains(&format!(".entry {}(", kernels::add_rmsnorm_entry(d))), "add_rmsnorm.cu for {arch}: no {d} entry");
        }
        no_local_memory(&format!("add_rmsnorm.cu for {arch}"), &all.ptx);
    }
    // A kernel without the variant refuses the define instead of compiling a plain kernel.
    let staged = sources().find(|s| !kernels::has_fused_variant(s.algorithm)).expect("a kernel without a fused variant");
    let mut opts = nvrtc::options("sm_90", Some(DType::BF16));
    opts.extend(size_class_defines(SizeClass::Fused));
    assert!(nvrtc::compile_unit(staged.file, &staged.translation_unit(), &opts).is_err(), "{} compiled with -DTPAR_FUSED", staged.file);
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "compiled {compiled} fused and add-RMSNorm variants with NVRTC {}.{}", version.major, version.minor);
}

/// `TPAR_TEST_STAMPS=1` (measuring only): the kernels that carry phase stamps compile with
/// them for every architecture, write `%globaltimer` (the plain build does not), and still
/// keep everything in registers.
#[test]
fn the_stamped_kernels_compile_with_nvrtc() {
    use tpar::cuda::launch::{size_class_defines, SizeClass};
    use tpar::kinds::Algorithm;
    if let Err(e) = nvrtc::probe() {
        if std::env::var("TPAR_REQUIRE_NVRTC").is_ok_and(|v| v == "1") {
            panic!("TPAR_REQUIRE_NVRTC=1 but NVRTC is missing: {e}");
        }
        common::skip("nvrtc_compile::stamped kernels", &format!("NVRTC not found: {e}"));
        return;
    }
    let d = DType::BF16;
    for arch in ARCHS {
        for algo in [Algorithm::OneshotPull, Algorithm::TwoshotPull] {
            let src = sources().find(|s| s.algorithm == algo).expect("a pull kernel source");
            let mut classes = vec![None];
            classes.push(Some(SizeClass::Fused));
            for class in classes {
                let mut opts = nvrtc::options(arch, Some(d));
                if let Some(c) = class {
                    opts.extend(size_class_defines(c));
                }
                let plain = nvrtc::compile_unit(src.file, &src.translation_unit(), &opts).unwrap_or_else(|e| panic!("{e}"));
                opts.push("-DTPAR_TEST_STAMPS".into());
                opts.push("--ptxas-options=-v".into());
                let what = format!("{} {d} {class:?} with stamps for {arch}", src.file);
                let st = nvrtc::compile_unit(src.file, &src.translation_unit(), &opts).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert!(st.ptx.matches("%globaltimer").count() > plain.ptx.matches("%globaltimer").count(), "{what}: no stamps in the PTX");
                no_local_memory(&what, &st.ptx);
                no_spills(&what, &st.log);
            }
        }
    }
}

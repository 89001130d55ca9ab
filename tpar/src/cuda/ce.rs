//! The copy-engine path (`ce-ring`, `algorithms::ce_ring`) on the GPU: copy engines
//! (`cuMemcpyAsync`) move the data, the kernels of `kernels/ce_ring.cu` synchronise and add.
//!
//! A call on one rank uses three streams: the caller's (or the communicator's) stream for
//! the kernels, a copy stream for the copies (back to back, so the engine never waits for a
//! kernel launch between two copies) and, across processes, a flag stream for the signals
//! that follow each phase's copies. One [`CePath`] holds a rank set's state (a lane per local
//! rank) and runs one data flow; only the ordering between ranks differs by placement
//! ([`Order`]): rank processes order each other with the flag protocol of `ce_signal` /
//! `ce_wait` (descriptors in the flag area, generations on the device, every wait bounded by
//! the call's deadline and recorded like every kernel's error); emulated ranks with events
//! between their streams: one process issues every rank's work, so nothing can be awaited
//! that was not already enqueued, and nothing spins.
//!
//! The data regions are the pull region of each rank's data area (the inbox, then the gather
//! area): they are free between calls, and the entry barrier of every call (each rank has
//! finished its previous call before any peer copies into it) keeps a pull call's last reads
//! of it safe. The flag descriptors have their own rows at `abi::CE_FLAG_OFFSET`.
//!
//! Owns: the kernels' argument twin, loading the kernels, the per-rank copy-engine state of
//! a rank set (streams, events, generations, stages), the steps of a call and both orderings. Must never: copy into a rank's region before that
//! rank's previous call has finished (the entry barrier), or wait without a deadline.

use super::abi::{self, TparArgs, MAX_RANKS};
use super::driver::{self, sys, Device, DeviceBuffer, Event, Module, Stream};
use super::{kernels, launch, nvrtc};
use crate::algorithms::ce_ring::{Geometry, MAX_PIECES};
use crate::error::{Error, Result};
use crate::kinds::Wire;
use crate::dtype::DType;
use std::collections::HashMap;
use std::mem::{offset_of, size_of};

/// The kernels' source, embedded (compiled per dtype by NVRTC when first needed).
pub const CE_RING_CU: &str = include_str!("../../kernels/ce_ring.cu");
/// Flag phases: the entry barrier, the reduce-scatter, the all-gather.
pub const PHASE_ENTRY: u32 = 0;
pub const PHASE_RS: u32 = 1;
pub const PHASE_AG: u32 = 2;
const PHASES: usize = 3;
/// Threads per block of the data kernels (`__launch_bounds__(256)` in ce_ring.cu).
const THREADS: u32 = 256;
/// Most blocks of a data kernel (grid-stride loops cover the rest).
const MAX_GRID: u64 = 1024;

/// Twin of `struct CeArgs` in ce_ring.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CeArgs {
    pub a: TparArgs,
    pub gens: u64,
    pub stage: u64,
    pub region: u64,
    pub region_bytes: u64,
    pub slot_bytes: u64,
    pub piece_v0: u64,
    pub piece_v1: u64,
    pub chunk_vecs: u64,
    pub piece: u32,
    pub pieces: u32,
    pub phase: u32,
    pub wire: u32,
}
// The same numbers are static_asserts in ce_ring.cu (so loading needs no probe launch).
const _: () = {
    assert!(size_of::<CeArgs>() == 424);
    assert!(offset_of!(CeArgs, gens) == 344);
    assert!(offset_of!(CeArgs, chunk_vecs) == 400);
    assert!(offset_of!(CeArgs, piece) == 408);
    assert!(offset_of!(CeArgs, wire) == 420);
    assert!(offset_of!(TparArgs, count) == 288);
};

/// The kernels' translation unit: the header spliced in, as for every kernel.
pub fn translation_unit() -> String {
    CE_RING_CU.replace("#include \"common.cuh\"", &kernels::header())
}

/// NVRTC options of the module for `dtype` (IEEE division stated, not assumed: the wire
/// codec must match `algorithms::ce_wire` bit for bit).
pub fn options(arch: &str, dtype: DType) -> Vec<String> {
    let mut o = nvrtc::options(arch, Some(dtype));
    o.push("--prec-div=true".into());
    o
}

/// The entry name of data kernel `stem` for `wire` and `dtype`: `ce_reduce_bf16`,
/// `ce_reduce_fp8_bf16`, ... (ce_ring.cu's `CE_KERNELS`).
pub fn entry(stem: &str, wire: Wire, dtype: DType) -> String {
    let w = if wire.is_lossy() { format!("_{}", wire.name()) } else { String::new() };
    format!("{stem}{w}_{}", kernels::dtype_suffix(dtype))
}

/// The functions of one dtype's module.
pub struct CeKernels {
    _module: Module,
    signal: sys::CUfunction,
    wait: sys::CUfunction,
    pause: sys::CUfunction,
    /// Lossy wire only.
    quant: Option<sys::CUfunction>,
    reduce: sys::CUfunction,
    finish: sys::CUfunction,
}

// SAFETY: CUfunction handles are opaque values any thread may use with the context current
// (every caller binds it); the module they belong to is owned here.
unsafe impl Send for CeKernels {}

impl CeKernels {
    /// Compiles (or reads from the cache) and loads the module of `dtype`, with the data
    /// kernels of `wire` (each wire format has its own entries). Launches nothing (the
    /// struct's layout is asserted at compile time on both sides), so a first call inside a
    /// stream capture may load it.
    pub fn load(dev: &Device, dtype: DType, wire: Wire) -> Result<Self> {
        let arch = dev.arch();
        let sfx = kernels::dtype_suffix(dtype);
        let label = format!("ce_ring-{sfx}");
        let mut m = launch::load_unit(dev, &label, &translation_unit(), &options(&arch, dtype), &arch, driver::driver_version())?;
        Ok(CeKernels {
            signal: m.function("ce_signal")?,
            wait: m.function("ce_wait")?,
            pause: m.function("ce_pause")?,
            quant: if wire.is_lossy() { Some(m.function(&entry("ce_quant", wire, dtype))?) } else { None },
            reduce: m.function(&entry("ce_reduce", wire, dtype))?,
            finish: m.function(&entry("ce_finish", wire, dtype))?,
            _module: m,
        })
    }
}

/// What a call's steps need of one rank: its workspace pointers (as this process addresses
/// every rank's areas) and its copy-engine state.
#[derive(Clone, Copy, Debug)]
pub struct RankView {
    pub data: [u64; MAX_RANKS],
    pub flags: [u64; MAX_RANKS],
    pub state: u64,
    pub err: u64,
    pub rank: usize,
    pub world: usize,
    pub timeout_ns: u64,
    /// Byte offset of the pull region (the inbox) in a data area, and its bytes.
    pub region: u64,
    pub region_cap: u64,
    /// This rank's generation words (0 for emulated ranks: no signals) and stage (lossy wire).
    pub gens: u64,
    pub stage: u64,
}

/// The region of a data area the path uses: the pull region, after the push region.
pub fn region_of(world: usize, slot_vecs: usize) -> (u64, u64) {
    let push = abi::push_region_bytes(world, slot_vecs) as u64;
    let total = abi::data_bytes(world, slot_vecs) as u64;
    (push, total - push)
}

/// One call as every rank runs it.
#[derive(Clone, Copy, Debug)]
pub struct Call {
    pub geom: Geometry,
    pub wire: Wire,
    /// `abi::desc_code` announced in the descriptors (0: not compared).
    pub desc_code: u32,
    pub input: u64,
    pub output: u64,
    /// Skewed-rank test hook: this rank starts late (emulated ranks only).
    pub delay_ns: u32,
}

impl Call {
    /// Refuses a call whose inbox and gather area do not fit the rank's region (or whose
    /// lossy stage does not fit `stage_cap`), naming the sizes.
    pub fn check(&self, v: &RankView, stage_cap: usize) -> Result<()> {
        let need = 2 * self.geom.region_bytes() as u64;
        if need > v.region_cap {
            return Err(Error::invalid(
                "count",
                format!("ce-ring: {} elements need {need} bytes of inbox and gather area; this workspace has {} (a larger max_bytes makes room)", self.geom.count, v.region_cap),
            ));
        }
        if self.wire.is_lossy() && self.geom.region_bytes() > stage_cap {
            return Err(Error::invalid("count", format!("ce-ring: the {} stage needs {} bytes, has {stage_cap}", self.wire, self.geom.region_bytes())));
        }
        Ok(())
    }

    fn args(&self, v: &RankView, piece: usize, phase: u32) -> CeArgs {
        let g = &self.geom;
        let r = g.piece(piece);
        let mut a = TparArgs {
            data: v.data,
            flags: v.flags,
            state: v.state,
            err: v.err,
            input: self.input,
            output: self.output,
            count: g.count as u64,
            timeout_ns: v.timeout_ns,
            rank: v.rank as u32,
            world: v.world as u32,
            desc_code: self.desc_code,
            test_delay_ns: self.delay_ns,
            ..Default::default()
        };
        a.slot_vecs = 0;
        CeArgs {
            a,
            gens: v.gens,
            stage: v.stage,
            region: v.region,
            region_bytes: g.region_bytes() as u64,
            slot_bytes: g.slot_bytes as u64,
            piece_v0: r.start as u64,
            piece_v1: r.end as u64,
            chunk_vecs: g.chunk_vecs(piece) as u64,
            piece: piece as u32,
            pieces: g.pieces as u32,
            phase,
            wire: self.wire.code(),
        }
    }

    fn lossy(&self) -> bool {
        self.wire.is_lossy()
    }
}

fn grid_for(units: u64, threads: u32) -> u32 {
    units.div_ceil(u64::from(threads)).clamp(1, MAX_GRID) as u32
}

/// Launches `f` with `args` (no PDL: the path orders its streams with events and flags).
///
/// # Safety
/// `f` takes one `CeArgs` by value; every pointer in `args` (and the caller's input and
/// output of the call) stays valid until the kernel completes.
unsafe fn run(f: sys::CUfunction, grid: u32, threads: u32, stream: &Stream, args: &CeArgs) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe { driver::launch_ex(f, grid, threads, false, 1, stream, args) }
}

/// The steps of a call on one rank; each enqueues on the stream it is given. The caller
/// (an emulated group or a [`CeRank`]) orders them across streams and ranks.
pub struct Steps<'a> {
    pub k: &'a CeKernels,
    pub v: &'a RankView,
    pub call: &'a Call,
}

// SAFETY (every `unsafe` call below): each kernel takes one CeArgs by value; its pointers
// are the ranks' live areas (kept alive by the workspace or group that built the view), the
// caller's input and output (the all-reduce's contract: valid until the stream's work
// completes) and this rank's stage and generation words (owned by its state).
impl Steps<'_> {
    /// Skewed-rank test hook: stalls this rank's stream.
    pub fn pause(&self, s: &Stream) -> Result<()> {
        if self.call.delay_ns == 0 {
            return Ok(());
        }
        let a = self.call.args(self.v, 0, PHASE_ENTRY);
        // SAFETY: see the impl.
        unsafe { run(self.k.pause, 1, 32, s, &a) }
    }

    /// Tells every peer this rank's copies of `phase` (piece `p`) have landed.
    pub fn signal(&self, p: usize, phase: u32, s: &Stream) -> Result<()> {
        let a = self.call.args(self.v, p, phase);
        // SAFETY: see the impl.
        unsafe { run(self.k.signal, 1, 32, s, &a) }
    }

    /// Waits (bounded) for every peer's signal of `phase` (piece `p`).
    pub fn wait(&self, p: usize, phase: u32, s: &Stream) -> Result<()> {
        let a = self.call.args(self.v, p, phase);
        // SAFETY: see the impl.
        unsafe { run(self.k.wait, 1, 32, s, &a) }
    }

    /// Lossy wire: this rank's chunks of piece `p` for the other owners, into its stage.
    pub fn quant(&self, p: usize, s: &Stream) -> Result<()> {
        let g = &self.call.geom;
        let units: u64 = (0..g.world).filter(|&o| o != self.v.rank).map(|o| g.chunk_elems(p, o).len().div_ceil(crate::algorithms::ce_ring::QBLOCK) as u64).sum();
        let Some(f) = self.k.quant.filter(|_| self.call.lossy() && units > 0) else {
            return Ok(());
        };
        let a = self.call.args(self.v, p, PHASE_RS);
        // SAFETY: see the impl.
        unsafe { run(f, grid_for(units, THREADS), THREADS, s, &a) }
    }

    /// This rank's chunk of piece `p`, summed in rank order into its output (lossy: and
    /// into its stage for the all-gather).
    pub fn reduce(&self, p: usize, s: &Stream) -> Result<()> {
        let g = &self.call.geom;
        let units = if self.call.lossy() {
            g.chunk_elems(p, self.v.rank).len().div_ceil(crate::algorithms::ce_ring::QBLOCK)
        } else {
            g.chunk(p, self.v.rank).len()
        } as u64;
        if units == 0 {
            return Ok(());
        }
        let a = self.call.args(self.v, p, PHASE_RS);
        // SAFETY: see the impl.
        unsafe { run(self.k.reduce, grid_for(units, THREADS), THREADS, s, &a) }
    }

    /// The other owners' chunks of piece `p`, from this rank's gather area into its output.
    pub fn finish(&self, p: usize, s: &Stream) -> Result<()> {
        let units = self.call.geom.chunk_vecs(p) as u64;
        if self.call.geom.piece(p).is_empty() || self.call.geom.world < 2 {
            return Ok(());
        }
        let a = self.call.args(self.v, p, PHASE_AG);
        // SAFETY: see the impl.
        unsafe { run(self.k.finish, grid_for(units, THREADS), THREADS, s, &a) }
    }

    /// Reduce-scatter copies of piece `p`: chunk o of this rank's input (lossy: of its
    /// stage) into slot [me] of owner o's inbox, for o = me + 1, me + 2, ... (every rank in
    /// step: one outbound and one inbound copy per rank at a time).
    pub fn rs_copies(&self, p: usize, s: &Stream) -> Result<()> {
        let (g, v, me) = (&self.call.geom, self.v, self.v.rank);
        for k in 1..g.world {
            let o = (me + k) % g.world;
            let bytes = g.copy_bytes(p, o, self.call.lossy());
            if bytes == 0 {
                continue;
            }
            let src = if self.call.lossy() { v.stage + g.slot_offset(o, p) as u64 } else { self.call.input + (g.chunk_elems(p, o).start * g.dtype.size()) as u64 };
            let dst = v.data[o] + v.region + g.slot_offset(me, p) as u64;
            // SAFETY: both ranges lie inside live allocations (the input holds the message;
            // a slot holds `slot_bytes` >= bytes, checked by `Call::check`).
            unsafe { driver::memcpy_async(dst, src, bytes, s)? };
        }
        Ok(())
    }

    /// All-gather copies of piece `p`: this rank's summed chunk (lossy: its quantised sum)
    /// into slot [me] of every peer's gather area, in the same shifted order.
    pub fn ag_copies(&self, p: usize, s: &Stream) -> Result<()> {
        let (g, v, me) = (&self.call.geom, self.v, self.v.rank);
        let bytes = g.copy_bytes(p, me, self.call.lossy());
        if bytes == 0 {
            return Ok(());
        }
        let src = if self.call.lossy() { v.stage + g.slot_offset(me, p) as u64 } else { self.call.output + (g.chunk_elems(p, me).start * g.dtype.size()) as u64 };
        for k in 1..g.world {
            let o = (me + k) % g.world;
            let dst = v.data[o] + v.region + g.region_bytes() as u64 + g.slot_offset(me, p) as u64;
            // SAFETY: as in rs_copies.
            unsafe { driver::memcpy_async(dst, src, bytes, s)? };
        }
        Ok(())
    }
}

/// Events of one rank's call: input ready, per piece quantised / copied out / reduced /
/// gathered, and the copy or flag stream done.
pub struct CallEvents {
    pub input: Event,
    pub quant: Vec<Event>,
    pub rs: Vec<Event>,
    pub reduced: Vec<Event>,
    pub ag: Vec<Event>,
    pub done: Event,
}

impl CallEvents {
    pub fn new(dev: &Device) -> Result<Self> {
        let many = || (0..MAX_PIECES).map(|_| Event::ordering(dev)).collect::<Result<Vec<_>>>();
        Ok(Self { input: Event::ordering(dev)?, quant: many()?, rs: many()?, reduced: many()?, ag: many()?, done: Event::ordering(dev)? })
    }
}

/// Bytes of a rank's stage for calls up to `max_bytes`: the largest lossy inbox of any dtype.
pub fn stage_bytes(max_bytes: usize, world: usize) -> usize {
    DType::ALL.iter().map(|d| Geometry::new(max_bytes / d.size(), *d, world).region_bytes()).max().unwrap_or(0)
}

/// One local rank's copy-engine state: its copy and flag streams, events, generation words
/// and (lossy wire) stage.
struct Lane {
    copy: Stream,
    flag: Stream,
    ev: CallEvents,
    gens: DeviceBuffer,
    stage: Option<DeviceBuffer>,
}

impl Lane {
    fn new(dev: &Device, wire: Wire, stage: usize) -> Result<Self> {
        let gens = DeviceBuffer::new(dev, 2 * PHASES * MAX_PIECES * 4)?;
        gens.fill_u32(0)?;
        let stage = if wire.is_lossy() { Some(DeviceBuffer::new(dev, stage)?) } else { None };
        Ok(Self { copy: Stream::new(dev)?, flag: Stream::new(dev)?, ev: CallEvents::new(dev)?, gens, stage })
    }

    /// The view of `base` (the workspace's pointers) with this rank's words and stage.
    fn view(&self, mut base: RankView) -> RankView {
        base.gens = self.gens.ptr;
        base.stage = self.stage.as_ref().map_or(0, |s| s.ptr);
        base
    }

    fn stage_cap(&self) -> usize {
        self.stage.as_ref().map_or(0, |s| s.bytes)
    }
}

/// How the ranks of one call order each other.
pub enum Order<'a> {
    /// Rank processes: the flag protocol on the device (one local rank, its kernels on `main`).
    Flags { main: &'a Stream },
    /// Emulated ranks: events between the ranks' streams, one process enqueuing every rank's
    /// work in dependency order (nothing spins, nothing can hang).
    Events(Fan<'a>),
}

/// What an emulated call needs of the group: its streams and fork/join events.
pub struct Fan<'a> {
    pub streams: &'a [&'a Stream],
    pub origin: &'a Stream,
    pub fork: &'a Event,
    pub joins: &'a [Event],
    /// Fork from and join into the origin around the call (not inside a capture).
    pub eager: bool,
}

/// The copy-engine path of a rank set: the kernels per dtype and one [`Lane`] per local rank
/// (one for a rank process, `world` for emulated ranks).
pub struct CePath {
    kernels: HashMap<DType, CeKernels>,
    lanes: Vec<Lane>,
    wire: Wire,
}

impl CePath {
    /// State for `lanes` local ranks of a `world`-rank group, calls up to `max_bytes`, `wire`
    /// on the wire. Made at init, never inside a capture.
    pub fn new(dev: &Device, wire: Wire, max_bytes: usize, world: usize, lanes: usize) -> Result<Self> {
        let stage = stage_bytes(max_bytes, world);
        Ok(Self { kernels: HashMap::new(), lanes: (0..lanes).map(|_| Lane::new(dev, wire, stage)).collect::<Result<_>>()?, wire })
    }

    pub fn wire(&self) -> Wire {
        self.wire
    }

    /// Loads the kernels of `dtype` now (outside any capture, once) and checks that a call
    /// of `count` elements fits every lane.
    pub fn prepare(&mut self, dev: &Device, dtype: DType, count: usize, base: RankView) -> Result<()> {
        if !self.kernels.contains_key(&dtype) {
            let k = CeKernels::load(dev, dtype, self.wire)?;
            self.kernels.insert(dtype, k);
        }
        let call = Call { geom: Geometry::new(count, dtype, base.world), wire: self.wire, desc_code: 0, input: 16, output: 16, delay_ns: 0 };
        self.lanes.iter().try_for_each(|l| call.check(&l.view(base), l.stage_cap()))
    }

    /// Enqueues one call on every local rank: `bases[i]`, `io.0[i]`, `io.1[i]` and
    /// `delays[i]` (skewed-rank test hook, ns) are local rank i's view, input, output and delay.
    #[allow(clippy::too_many_arguments)]
    pub fn enqueue(&mut self, dev: &Device, order: Order<'_>, bases: &[RankView], dtype: DType, count: usize, io: (&[u64], &[u64]), delays: &[u32], desc_code: u32) -> Result<()> {
        let n = self.lanes.len();
        if bases.len() != n || io.0.len() != n || io.1.len() != n || matches!(&order, Order::Events(f) if f.streams.len() != n) {
            return Err(Error::invalid("ce-ring", format!("{n} lanes, {} views, {} inputs, {} outputs", bases.len(), io.0.len(), io.1.len())));
        }
        let Some(base0) = bases.first() else {
            return Err(Error::invalid("ce-ring", "no local ranks"));
        };
        self.prepare(dev, dtype, count, *base0)?;
        let k = self.kernels.get(&dtype).ok_or_else(|| Error::invalid("ce-ring", "kernels not loaded"))?;
        let views: Vec<RankView> = self.lanes.iter().zip(bases).map(|(l, b)| l.view(*b)).collect();
        let geom = Geometry::new(count, dtype, base0.world);
        let calls: Vec<Call> =
            (0..n).map(|r| Call { geom, wire: self.wire, desc_code, input: io.0[r], output: io.1[r], delay_ns: delays.get(r).copied().unwrap_or(0) }).collect();
        for ((c, v), l) in calls.iter().zip(&views).zip(&self.lanes) {
            c.check(v, l.stage_cap())?;
        }
        let steps: Vec<Steps<'_>> = views.iter().zip(&calls).map(|(v, call)| Steps { k, v, call }).collect();
        match order {
            Order::Flags { main } if n == 1 => by_flags(&steps[0], &self.lanes[0], main),
            Order::Flags { .. } => Err(Error::invalid("ce-ring", format!("the flag protocol drives one local rank, not {n}"))),
            Order::Events(f) => by_events(&steps, &self.lanes, &f),
        }
    }
}

/// A rank process's call: ranks order each other by the flag protocol on the device.
fn by_flags(st: &Steps<'_>, l: &Lane, main: &Stream) -> Result<()> {
    let (ev, copy, flag) = (&l.ev, &l.copy, &l.flag);
    let pieces = st.call.geom.pieces;
    // Entry: every rank has finished its previous call before anyone copies into it.
    st.signal(0, PHASE_ENTRY, main)?;
    st.wait(0, PHASE_ENTRY, main)?;
    main.record(&ev.input)?;
    copy.wait(&ev.input)?;
    for p in 0..pieces {
        if st.call.lossy() {
            st.quant(p, main)?;
            main.record(&ev.quant[p])?;
            copy.wait(&ev.quant[p])?;
        }
        st.rs_copies(p, copy)?;
        copy.record(&ev.rs[p])?;
        flag.wait(&ev.rs[p])?;
        st.signal(p, PHASE_RS, flag)?;
    }
    for p in 0..pieces {
        st.wait(p, PHASE_RS, main)?;
        st.reduce(p, main)?;
        main.record(&ev.reduced[p])?;
        copy.wait(&ev.reduced[p])?;
        st.ag_copies(p, copy)?;
        copy.record(&ev.ag[p])?;
        flag.wait(&ev.ag[p])?;
        st.signal(p, PHASE_AG, flag)?;
    }
    for p in 0..pieces {
        st.wait(p, PHASE_AG, main)?;
        st.finish(p, main)?;
    }
    // The copy and flag streams join back (a capture must end joined; the next call's
    // stage writes must follow this call's copies).
    flag.record(&ev.done)?;
    main.wait(&ev.done)
}

/// Emulated ranks' call: per call, each rank's input ready (after the skew hook) -> every
/// copy stream waits for every rank's (the entry barrier) -> per piece, each rank's chunks
/// copied out (lossy: after its quantisation) -> each owner waits for the n-1 copies into it,
/// sums, and its copy stream copies the sum out -> each rank waits for the n-1 copies into it
/// and finishes -> each copy stream joins its rank stream. Eager calls fork from and join
/// into the origin stream; in a capture the group forks and joins once around the whole body.
// Rank r indexes its stream, lane and steps together: plainer by index.
#[allow(clippy::needless_range_loop)]
fn by_events(st: &[Steps<'_>], lanes: &[Lane], g: &Fan<'_>) -> Result<()> {
    let (world, rs) = (lanes.len(), g.streams);
    let (ev, cp) = (|r: usize| &lanes[r].ev, |r: usize| &lanes[r].copy);
    if g.eager {
        g.origin.record(g.fork)?;
        for s in rs {
            s.wait(g.fork)?;
        }
    }
    for r in 0..world {
        st[r].pause(rs[r])?;
        rs[r].record(&ev(r).input)?;
    }
    // Entry barrier: no copy into any rank before every rank's previous call has ended.
    for c in 0..world {
        for e in 0..world {
            cp(c).wait(&ev(e).input)?;
        }
    }
    let Some(first) = st.first() else {
        return Ok(());
    };
    let (pieces, lossy) = (first.call.geom.pieces, first.call.lossy());
    for p in 0..pieces {
        for r in 0..world {
            if lossy {
                st[r].quant(p, rs[r])?;
                rs[r].record(&ev(r).quant[p])?;
                cp(r).wait(&ev(r).quant[p])?;
            }
            st[r].rs_copies(p, cp(r))?;
            cp(r).record(&ev(r).rs[p])?;
        }
    }
    for p in 0..pieces {
        for r in 0..world {
            for q in (0..world).filter(|&q| q != r) {
                rs[r].wait(&ev(q).rs[p])?;
            }
            st[r].reduce(p, rs[r])?;
            rs[r].record(&ev(r).reduced[p])?;
            cp(r).wait(&ev(r).reduced[p])?;
            st[r].ag_copies(p, cp(r))?;
            cp(r).record(&ev(r).ag[p])?;
        }
    }
    for p in 0..pieces {
        for r in 0..world {
            for q in (0..world).filter(|&q| q != r) {
                rs[r].wait(&ev(q).ag[p])?;
            }
            st[r].finish(p, rs[r])?;
        }
    }
    for r in 0..world {
        cp(r).record(&ev(r).done)?;
        rs[r].wait(&ev(r).done)?;
    }
    if g.eager {
        for (s, j) in rs.iter().zip(g.joins) {
            s.record(j)?;
            g.origin.wait(j)?;
        }
    }
    Ok(())
}

//! Emulated ranks on one GPU: `world` ranks in one process, one stream each, "peer"
//! pointers being plain device pointers of the same process. Proves the kernels, the
//! protocols and the timeout path on a single device; with [`Transport::Host`] every
//! workspace lives in pinned host memory, so the traffic crosses the real PCIe link.
//!
//! Owns: the per-rank workspaces (data area from `cuMemAlloc` or pinned mapped host memory,
//! flag area, device-local epoch state, host-visible error record), the rank streams, the
//! fork/join that makes one collective out of `world` launches (so it can be captured into
//! one graph), and turning an error record into `Error::Timeout` + poisoning.
//! Must never launch a kernel for a subset of ranks except through the explicit test hook,
//! and never reuse a poisoned group.

use super::abi::{self, TparArgs, TparError, TparFusedArgs, TparNorm, TparState, MAX_RANKS};
use super::fused::{fused_unfit, FusedBufs, FusedCall, FusedPath};
use super::driver::{Device, DeviceBuffer, Event, Graph, HostMapped, Stream};
use super::io_tables::{self, IoTables};
use super::launch::{self, CallSpec, Launch, Launcher};
use crate::error::{Error, Result};
use crate::plan::HostProtocol;
use crate::settings::LaunchSettings;
use crate::dtype::DType;
use crate::kinds::{Algorithm, Transport};
use std::time::Duration;

// Completion, device errors and graph capture.
mod completion;
// The fused all-reduce + residual add + RMSNorm on emulated ranks.
mod fused_calls;

/// Device-side deadline per call when `TPAR_TIMEOUT_MS` is unset: the crate's one default.
pub const DEFAULT_TIMEOUT: Duration = crate::settings::DEFAULT_TIMEOUT;

/// Options of an emulated group.
#[derive(Clone, Debug)]
pub struct GroupOptions {
    /// `P2p`: workspaces in device memory (what IPC-mapped peers would be);
    /// `Host`: workspaces in pinned host memory mapped into the device.
    pub transport: Transport,
    /// Device-side deadline of every wait in a call.
    pub timeout: Duration,
    /// Compare every call's count, dtype and algorithm across ranks (TPAR_CHECK_CALLS).
    pub check_calls: bool,
    /// The islands `hierarchical` reduces over, as lists of ranks that partition the world
    /// (`algorithms::hierarchical::from_sizes` makes them from sizes); empty: one island.
    /// Emulated ranks share one GPU: islands here choose the protocol, not the fabric.
    pub islands: Vec<Vec<u32>>,
    /// The push kernels' protocol over the host transport, when forced
    /// (`Overrides::host_protocol`, TPAR_HOST_PROTOCOL); `None`: [`HostProtocol::auto`].
    pub host_protocol: Option<HostProtocol>,
    /// How the kernels are launched (`TPAR_BLOCKS`, `TPAR_PDL`, `TPAR_LEAN`).
    pub launch: LaunchSettings,
    /// What `ce-ring` puts on the wire (`TPAR_WIRE`; exact by default).
    pub wire: crate::kinds::Wire,
}

impl Default for GroupOptions {
    /// p2p, [`DEFAULT_TIMEOUT`], calls checked, the host protocol chosen by world size.
    /// Reads nothing from the environment: [`GroupOptions::from_env`] does.
    fn default() -> Self {
        Self { transport: Transport::P2p, timeout: DEFAULT_TIMEOUT, check_calls: true, islands: Vec::new(), host_protocol: None, launch: LaunchSettings::default(), wire: crate::kinds::Wire::Exact }
    }
}

impl GroupOptions {
    /// The defaults under the environment's settings (`crate::settings`): `TPAR_TIMEOUT_MS`,
    /// `TPAR_CHECK_CALLS`, `TPAR_HOST_PROTOCOL` and the launch settings. A malformed value is
    /// an error that names it, never ignored.
    pub fn from_env(transport: Transport) -> Result<Self> {
        Ok(Self::from_settings(transport, &crate::settings::Settings::from_env()?))
    }

    /// As [`from_env`](Self::from_env), from settings already parsed.
    pub fn from_settings(transport: Transport, s: &crate::settings::Settings) -> Self {
        Self {
            transport,
            timeout: s.job.timeout.unwrap_or(DEFAULT_TIMEOUT),
            check_calls: s.overrides.check_calls != Some(false),
            host_protocol: s.overrides.host_protocol,
            launch: s.launch,
            wire: s.overrides.wire.unwrap_or_default(),
            ..Self::default()
        }
    }
}

enum Mem {
    Device(DeviceBuffer),
    Host(HostMapped),
}

impl Mem {
    fn new(dev: &Device, transport: Transport, bytes: usize) -> Result<Self> {
        Ok(match transport {
            Transport::Host => Mem::Host(HostMapped::new(dev, bytes)?),
            _ => Mem::Device(DeviceBuffer::new(dev, bytes)?),
        })
    }
    fn ptr(&self) -> u64 {
        match self {
            Mem::Device(b) => b.ptr,
            Mem::Host(h) => h.dev,
        }
    }
    /// Fills the first `bytes` with `word`. No kernel may be using the memory.
    fn fill_prefix(&self, bytes: usize, word: u32) -> Result<()> {
        match self {
            Mem::Device(b) => b.fill_prefix_u32(bytes, word),
            Mem::Host(h) => {
                for off in (0..bytes.min(h.bytes)).step_by(4) {
                    h.write(off, word);
                }
                Ok(())
            }
        }
    }
}

/// Launches [`EmulatedGroup::take_launches`] keeps.
pub const RECENT_LAUNCHES: usize = 8;

/// `world` emulated ranks on one device.
pub struct EmulatedGroup {
    // Field order is drop order: graphs/modules/streams reference the context in `dev`,
    // which every wrapper also holds by Arc, so any order is safe; keep dev last for clarity.
    launcher: Launcher,
    streams: Vec<Stream>,
    origin: Stream,
    fork: Event,
    joins: Vec<Event>,
    data: Vec<Mem>,
    flags: Vec<Mem>,
    state: Vec<DeviceBuffer>,
    err: HostMapped,
    world: usize,
    max_bytes: usize,
    slot_vecs: usize,
    transport: Transport,
    timeout_ns: u64,
    capturing: bool,
    poisoned: Option<String>,
    /// Test hook: (rank, descriptor code) that rank announces instead of its call's.
    desc_override: Option<(usize, u32)>,
    check_calls: bool,
    /// `TparArgs::islands` of every call (0: one island).
    islands: u64,
    /// During a capture: what each rank was asked to call, `count << 8 | desc_code`, checked
    /// across ranks when the capture ends (the kernels then carry no descriptor).
    captured: Vec<Vec<u64>>,
    /// The registered-buffer tables of captured calls (zero copy; `launch::registers`):
    /// every rank's pointers are this process's, so a capture registers its calls itself.
    io: IoTables,
    /// Test hook: (seed, most ns) of random per-rank, per-call delays; launches counted.
    skew: Option<(u64, u32)>,
    launches: u64,
    /// The shapes of the kernel launches since [`take_launches`](Self::take_launches) last
    /// ran (the most recent [`RECENT_LAUNCHES`]): what a call ran, for the bench's report.
    recent: Vec<Launch>,
    /// The copy-engine path (`ce-ring`), where the registry runs it over this transport.
    ce: Option<super::ce_emulated::EmulatedCe>,
    dev: Device,
}

impl EmulatedGroup {
    /// Opens device `ordinal`, compiles (or loads from cache) every kernel, allocates
    /// `world` workspaces able to reduce up to `max_bytes` per call, and checks the ABI.
    pub fn new(ordinal: usize, world: usize, max_bytes: usize, opts: GroupOptions) -> Result<Self> {
        if !(2..=MAX_RANKS).contains(&world) {
            return Err(Error::invalid("world", format!("{world}: emulated groups have 2 to {MAX_RANKS} ranks")));
        }
        if !matches!(opts.transport, Transport::P2p | Transport::Host) {
            return Err(Error::Unsupported {
                what: format!("transport {} for emulated ranks", opts.transport),
                reason: "emulated ranks run the p2p or host transport".into(),
            });
        }
        if max_bytes == 0 {
            return Err(Error::invalid("max_bytes", "must be positive"));
        }
        let queues = crate::settings::cuda_hardware_queues();
        if world > queues {
            return Err(Error::Unsupported {
                what: format!("{world} emulated ranks"),
                reason: format!(
                    "CUDA gives this process {queues} hardware queues (CUDA_DEVICE_MAX_CONNECTIONS, 8 unless set); ranks whose streams share a queue wait on each other until the timeout. Set CUDA_DEVICE_MAX_CONNECTIONS={} or more before CUDA starts (the tpar command does so for --emulate-ranks above 8)",
                    world
                ),
            });
        }
        let islands = if opts.islands.is_empty() { 0 } else { crate::algorithms::hierarchical::island_word(&opts.islands, world)? };
        let dev = Device::open(ordinal)?;
        let origin = Stream::new(&dev)?;
        let launcher = Launcher::new(&dev, &origin, world, world, opts.transport, opts.host_protocol, max_bytes, opts.launch)?;
        let slot_vecs = abi::slot_vecs(max_bytes);
        let data_bytes = abi::data_bytes(world, slot_vecs);
        let mut data = Vec::with_capacity(world);
        let mut flags = Vec::with_capacity(world);
        let mut state = Vec::with_capacity(world);
        let mut streams = Vec::with_capacity(world);
        let mut joins = Vec::with_capacity(world);
        for _ in 0..world {
            data.push(Mem::new(&dev, opts.transport, data_bytes)?);
            flags.push(Mem::new(&dev, opts.transport, abi::FLAG_BYTES)?);
            // The state, then the fused calls' tile words (norm.cuh), all epoch 0 (see reset).
            let st = DeviceBuffer::new(&dev, abi::state_bytes(slot_vecs))?;
            st.fill_u32(0)?;
            state.push(st);
            streams.push(Stream::new(&dev)?);
            joins.push(Event::new(&dev)?);
        }
        let err = HostMapped::new(&dev, world * std::mem::size_of::<TparError>())?;
        let fork = Event::new(&dev)?;
        let timeout_ns = u64::try_from(opts.timeout.as_nanos()).unwrap_or(u64::MAX).max(1);
        let ce = if crate::algorithms::registry::spec(Algorithm::CeRing).emulated_transports.contains(&opts.transport) {
            Some(super::ce_emulated::EmulatedCe::new(&dev, world, opts.wire, max_bytes)?)
        } else {
            None
        };
        let mut g = Self {
            ce,
            launcher,
            captured: Vec::new(),
            io: IoTables::default(),
            skew: None,
            launches: 0,
            recent: Vec::new(),
            streams,
            origin,
            fork,
            joins,
            data,
            flags,
            state,
            err,
            world,
            max_bytes,
            slot_vecs,
            transport: opts.transport,
            timeout_ns,
            capturing: false,
            desc_override: None,
            check_calls: opts.check_calls,
            islands,
            poisoned: None,
            dev,
        };
        g.reset_workspaces(0)?;
        Ok(g)
    }

    pub fn world(&self) -> usize {
        self.world
    }
    /// The islands word every call carries (`algorithms::hierarchical::island_word`).
    pub fn island_word(&self) -> u64 {
        self.islands
    }
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }
    pub fn transport(&self) -> Transport {
        self.transport
    }
    pub fn device(&self) -> &Device {
        &self.dev
    }
    /// The stream that represents the whole collective: time and capture on it.
    pub fn origin(&self) -> &Stream {
        &self.origin
    }
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.is_some()
    }

    /// The launch path (its settings; PDL on or off for comparisons).
    pub fn launcher(&mut self) -> &mut Launcher {
        &mut self.launcher
    }

    /// Compiles and loads the kernels of `calls` now (first calls then compile nothing).
    pub fn preload(&mut self, calls: &[(Algorithm, DType)]) -> Result<()> {
        self.launcher.preload(&self.dev, calls)
    }

    /// Waits for everything, then refills every push region with the empty sentinel, zeroes
    /// the error records and claim words, and sets every rank's epoch — and every barrier
    /// flag — to `epoch` (flags must equal the last completed generation, see barrier_block).
    fn reset_workspaces(&mut self, epoch: u32) -> Result<()> {
        let word = abi::EMPTY_WORD;
        self.synchronize_streams()?;
        let push = abi::push_region_bytes(self.world, self.slot_vecs);
        for r in 0..self.world {
            self.data[r].fill_prefix(push, word)?;
            self.flags[r].fill_prefix(abi::FLAG_BYTES, epoch)?;
            let st = TparState::at(epoch);
            // The fused calls' tile words carry the epoch: never the next call's generation.
            self.state[r].fill_u32(epoch)?;
            self.state[r].upload(std::slice::from_ref(&st))?;
            self.err.write(r * std::mem::size_of::<TparError>(), TparError::default());
        }
        self.dev.synchronize()
    }

    /// Test hook: rank `rank` announces `desc_code` (see `abi::desc_code`) instead of its
    /// call's, as a rank calling another dtype or algorithm would, while moving the same data
    /// as the others; None restores the truth.
    pub fn set_desc_override_for_test(&mut self, o: Option<(usize, u32)>) {
        self.desc_override = o;
    }

    /// Test hook (skewed ranks): from now on, before each call every rank waits on the device
    /// for a random time, drawn per rank and per call (half the time 0, else up to `max_ns`),
    /// inside the kernel, so that PDL chains and graphs are kept. None: no delays.
    pub fn set_skew_for_test(&mut self, skew: Option<(u64, u32)>) {
        self.skew = skew;
    }

    fn skew_ns(&self, rank: usize) -> u32 {
        let Some((seed, max)) = self.skew else { return 0 };
        // splitmix64 of (seed, launch, rank): reproducible, different per rank and call.
        let mut z = seed ^ self.launches.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (rank as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        if z & 1 == 0 || max == 0 {
            0
        } else {
            ((z >> 1) % u64::from(max)) as u32 + 1
        }
    }

    /// Test hook: restart every rank's epoch at `epoch` (e.g. near u32::MAX to test wrap-around).
    pub fn set_epoch_for_test(&mut self, epoch: u32) -> Result<()> {
        self.check_usable()?;
        self.reset_workspaces(epoch)
    }

    /// The launches (grid, block, cluster, PDL) since the last call of this, oldest first:
    /// at most the last [`RECENT_LAUNCHES`]. A call's kernels (a fused call's one, an unfused
    /// call's two); nothing for the copy-engine path.
    pub fn take_launches(&mut self) -> Vec<Launch> {
        std::mem::take(&mut self.recent)
    }

    /// Whether the kernels carry their phase stamps (`TPAR_TEST_STAMPS`: measuring only).
    pub fn stamps_enabled(&self) -> bool {
        self.launcher.settings().test_stamps
    }

    /// Zeroes every rank's stamps (synchronises first), so that a later read shows only the
    /// blocks of calls made since.
    pub fn clear_stamps(&self) -> Result<()> {
        self.synchronize_streams()?;
        let zeros = vec![0u64; abi::STAMP_BYTES / 8];
        for st in &self.state {
            st.upload_at(abi::stamps_offset(self.slot_vecs), &zeros)?;
        }
        Ok(())
    }

    /// Rank `r`'s stamps (synchronises first): per block, the `%globaltimer` ns of each phase
    /// the kernel stamped (0 where it wrote none; common.cuh `TPAR_STAMP`).
    pub fn stamps(&self, r: usize) -> Result<Vec<[u64; abi::STAMPS_PER_BLOCK]>> {
        self.synchronize_streams()?;
        let st = self.state.get(r).ok_or_else(|| Error::invalid("rank", "out of range"))?;
        let mut words = vec![0u64; abi::STAMP_BYTES / 8];
        st.download_at(abi::stamps_offset(self.slot_vecs), &mut words)?;
        Ok(words.chunks_exact(abi::STAMPS_PER_BLOCK).map(|c| std::array::from_fn(|k| c[k])).collect())
    }

    /// Reads rank `r`'s device epoch (synchronises first).
    pub fn epoch(&self, r: usize) -> Result<u32> {
        self.synchronize_streams()?;
        let mut st = [TparState::default()];
        self.state.get(r).ok_or_else(|| Error::invalid("rank", "out of range"))?.download(&mut st)?;
        Ok(st[0].epoch[0])
    }

    fn check_usable(&self) -> Result<()> {
        match &self.poisoned {
            Some(cause) => Err(Error::Poisoned { rank: 0, cause: cause.clone() }),
            None => Ok(()),
        }
    }

    fn args_for(&self, r: usize, count: usize, input: u64, output: u64, desc_code: u32) -> TparArgs {
        let mut a = TparArgs {
            state: self.state[r].ptr,
            err: self.err.dev + (r * std::mem::size_of::<TparError>()) as u64,
            input,
            output,
            count: count as u64,
            slot_vecs: self.slot_vecs as u64,
            timeout_ns: self.timeout_ns,
            rank: r as u32,
            world: self.world as u32,
            desc_code,
            islands: self.islands,
            ..Default::default()
        };
        // The test hook changes what rank r announces, not what it moves.
        if let Some((rank, code)) = self.desc_override {
            if rank == r {
                a.desc_code = code;
            }
        }
        for q in 0..self.world {
            a.data[q] = self.data[q].ptr();
            a.flags[q] = self.flags[q].ptr();
        }
        a
    }

    /// Enqueues one all-reduce of `count` elements on every rank (asynchronous), forked from
    /// and joined into the origin stream. `inputs[r]`/`outputs[r]` are rank r's device
    /// pointers (16-byte aligned; an output may equal its input).
    pub fn enqueue(&mut self, algo: Algorithm, dtype: DType, count: usize, inputs: &[u64], outputs: &[u64], blocks: u32) -> Result<()> {
        let all = vec![true; self.world];
        self.enqueue_ranks(algo, dtype, count, inputs, outputs, blocks, &all)
    }

    /// Test hook behind [`enqueue`](Self::enqueue): launches only the ranks with
    /// `present[r]`, to prove that a rank that never arrives costs a Timeout, not a hang.
    #[allow(clippy::too_many_arguments)]
    pub fn enqueue_ranks(
        &mut self,
        algo: Algorithm,
        dtype: DType,
        count: usize,
        inputs: &[u64],
        outputs: &[u64],
        blocks: u32,
        present: &[bool],
    ) -> Result<()> {
        self.enqueue_plain(algo, dtype, count, (inputs, outputs), blocks, present, true)
    }

    /// [`enqueue_ranks`](Self::enqueue_ranks); `may_register`: false for the all-reduce of a
    /// fused call's unfused path (fused calls keep the copy path).
    #[allow(clippy::too_many_arguments)]
    fn enqueue_plain(&mut self, algo: Algorithm, dtype: DType, count: usize, (inputs, outputs): (&[u64], &[u64]), blocks: u32, present: &[bool], may_register: bool) -> Result<()> {
        self.check_usable()?;
        if inputs.len() != self.world || outputs.len() != self.world || present.len() != self.world {
            return Err(Error::invalid("inputs", format!("need one input and output per rank ({})", self.world)));
        }
        if algo == Algorithm::CeRing {
            return self.enqueue_ce(dtype, count, inputs, outputs, present);
        }
        let ptrs: Vec<u64> = inputs.iter().chain(outputs.iter()).copied().collect();
        // Inside a capture the buffers are registered (their tables flushed when it ends),
        // unless they alias in a way the registered kernel cannot take (one-shot in place).
        let bytes = count.saturating_mul(dtype.size());
        let registered = may_register
            && self.capturing
            && self.transport == Transport::P2p
            && launch::registers(algo, bytes, self.launcher.settings().zero_copy)
            && io_tables::may_register(algo, inputs, outputs, bytes);
        let l = self.launcher.prepare(&self.dev, CallSpec { algo, dtype, count, blocks, registered }, &ptrs)?;
        let code = if self.check_calls { abi::desc_code(algo, dtype) } else { 0 };
        let io = if registered { Some(io_tables::table(inputs, outputs)) } else { None };
        self.launch_all(&l, (count, code), (inputs, outputs, io), present, None)
    }

    /// Test hook: on every rank's stream, copies `bytes` from `src[r]` to `dst[r]` (device
    /// pointers), as an engine's own work between two calls would (capturable: inside a
    /// capture the copies join each rank's chain). The skewed graph test overwrites a rank's
    /// input and reads its output this way right after its call: a rank that left a
    /// registered call while a peer still used its buffers gives wrong sums.
    pub fn enqueue_copies(&mut self, src: &[u64], dst: &[u64], bytes: usize) -> Result<()> {
        self.check_usable()?;
        if src.len() != self.world || dst.len() != self.world {
            return Err(Error::invalid("copies", format!("need one source and destination per rank ({})", self.world)));
        }
        let eager = !self.capturing;
        if eager {
            self.origin.record(&self.fork)?;
        }
        for r in 0..self.world {
            if eager {
                self.streams[r].wait(&self.fork)?;
            }
            // SAFETY: the caller's buffers hold at least `bytes` each (a test hook's contract),
            // live until synchronize; the stream is this group's.
            unsafe { super::driver::memcpy_async(dst[r], src[r], bytes, &self.streams[r])? };
            if eager {
                self.streams[r].record(&self.joins[r])?;
                self.origin.wait(&self.joins[r])?;
            }
        }
        Ok(())
    }

    /// What `ce-ring` puts on the wire here.
    pub fn wire(&self) -> crate::kinds::Wire {
        self.ce.as_ref().map_or(crate::kinds::Wire::Exact, |c| c.wire())
    }

    /// `ce-ring` (`cuda::ce_emulated`): copies and kernels ordered by events between the
    /// ranks' streams.
    fn enqueue_ce(&mut self, dtype: DType, count: usize, inputs: &[u64], outputs: &[u64], present: &[bool]) -> Result<()> {
        if present.iter().any(|p| !p) {
            return Err(Error::Unsupported { what: "ce-ring with absent emulated ranks".into(), reason: "its emulated ranks order each other with events: nothing waits on the device, so there is no timeout to test".into() });
        }
        if count == 0 || count.checked_mul(dtype.size()).map_or(true, |b| b > self.max_bytes) {
            return Err(Error::invalid("count", format!("{count} elements of {dtype}: must be positive and fit max_bytes {}", self.max_bytes)));
        }
        launch::check_pointers(inputs)?;
        launch::check_pointers(outputs)?;
        let code = if self.check_calls { abi::desc_code(Algorithm::CeRing, dtype) } else { 0 };
        if self.capturing && code != 0 {
            for seq in &mut self.captured {
                seq.push(abi::pack_call(count, code));
            }
        }
        let delays: Vec<u32> = (0..self.world).map(|r| self.skew_ns(r)).collect();
        let (region, region_cap) = super::ce::region_of(self.world, self.slot_vecs);
        let mut data = [0u64; MAX_RANKS];
        let mut flags = [0u64; MAX_RANKS];
        for q in 0..self.world {
            data[q] = self.data[q].ptr();
            flags[q] = self.flags[q].ptr();
        }
        let views = (0..self.world)
            .map(|r| super::ce::RankView { data, flags, state: self.state[r].ptr, err: self.err.dev + (r * std::mem::size_of::<TparError>()) as u64, rank: r, world: self.world, timeout_ns: self.timeout_ns, region, region_cap, gens: 0, stage: 0 })
            .collect();
        let g = super::ce_emulated::Group { streams: &self.streams, origin: &self.origin, fork: &self.fork, joins: &self.joins, views, eager: !self.capturing, delays };
        let ce = self.ce.as_mut().ok_or_else(|| Error::Unsupported { what: format!("ce-ring over {}", self.transport), reason: "the registry runs it over p2p and host".into() })?;
        ce.enqueue(&self.dev, g, dtype, count, (inputs, outputs), code)?;
        self.launches += 1;
        Ok(())
    }

    /// Measurement hook: launches the empty kernel `tpar_noop` on every rank exactly as a
    /// collective is launched (fork/join, grid, arguments), to measure the launch floor of
    /// emulated ranks.
    pub fn enqueue_floor(&mut self, blocks: u32, inputs: &[u64], outputs: &[u64]) -> Result<()> {
        self.check_usable()?;
        if inputs.len() != self.world || outputs.len() != self.world {
            return Err(Error::invalid("inputs", format!("need one input and output per rank ({})", self.world)));
        }
        let all = vec![true; self.world];
        let l = self.launcher.floor(blocks)?;
        self.launch_all(&l, (1, 0), (inputs, outputs, None), &all, None)
    }

    /// `(count, desc_code)`: the call as every rank announces it (see `abi::desc_code`).
    /// Inside a capture the kernels get no descriptor: the host records each rank's call and
    /// checks the sequences across ranks when the capture ends. `io`: the call's registered
    /// buffers (every rank's input and output, one table for all ranks: one address space;
    /// never with `norm`). `norm`: the kernel takes the fused arguments, rank r's norm part
    /// `norm[r]` (fused kernels, tpar's add-RMSNorm).
    fn launch_all(&mut self, l: &Launch, (count, desc_code): (usize, u32), (inputs, outputs, io): (&[u64], &[u64], Option<abi::TparIo>), present: &[bool], norm: Option<&[TparNorm]>) -> Result<()> {
        // Eager: fork from and join into the origin stream around every call, so the origin
        // stream carries the collective (and timing events on it cover all ranks). Inside a
        // capture the fork/join happens once around the whole body instead, so each rank's
        // calls form an independent chain, as in a real multi-process deployment.
        let eager = !self.capturing;
        if eager {
            self.origin.record(&self.fork)?;
        }
        for r in 0..self.world {
            if !present[r] {
                continue;
            }
            let mut a = self.args_for(r, count, inputs[r], outputs[r], desc_code);
            a.test_delay_ns = self.skew_ns(r);
            if let Some(t) = io {
                a.io = self.io.address(&self.dev, t)?;
            }
            if !eager && desc_code != 0 {
                if let Some(seq) = self.captured.get_mut(r) {
                    seq.push(abi::pack_call(count, a.desc_code));
                }
                a.desc_code = 0;
            }
            if eager {
                self.streams[r].wait(&self.fork)?;
            }
            match norm.and_then(|n| n.get(r)) {
                // SAFETY: l.f takes one TparFusedArgs (the callers pair a fused or add-RMSNorm
                // launch with `norm`); `a` as below, and n's buffers are the caller's, checked
                // (FusedBufs::check) and kept alive by the caller until synchronize.
                Some(n) => unsafe { launch::launch_fused(l, &self.streams[r], &TparFusedArgs { a, n: *n })? },
                // SAFETY: l.f takes one TparArgs by value; every pointer in `a` is a live allocation
                // of this group (or a caller buffer of >= count elements), kept alive by &mut self
                // until synchronize; the kernel's accesses stay inside the layout in common.cuh.
                None => unsafe { launch::launch(l, &self.streams[r], &a)? },
            }
            if eager {
                self.streams[r].record(&self.joins[r])?;
                self.origin.wait(&self.joins[r])?;
            }
        }
        if self.recent.len() == RECENT_LAUNCHES {
            self.recent.remove(0);
        }
        self.recent.push(*l);
        self.launches += 1;
        Ok(())
    }
}

//! [`GpuCommunicator`]'s fused all-reduce + residual add + RMSNorm (docs/cuda.md "Fused"):
//! resolving a fused call shape once, and running it as the fused kernel or as the unfused
//! path (the all-reduce's own route, then tpar's add-RMSNorm kernel).

use super::*;
use super::super::fused::fused_declined;

/// The fused all-reduce + residual add + RMSNorm on one rank per process.
impl GpuCommunicator {
    /// The fused call shape of `call` in `mode` (docs/cuda.md "Fused"), resolved once and
    /// remembered: the plan for x's bytes decides the algorithm (the all-reduce's, or the
    /// fused call's own where the plan ranks the fused kernels apart: `fused_pick`); its fused kernel where it
    /// takes the shape (`fused::fused_unfit`) and is not declined (`fused::fused_declined`:
    /// two-shot pull's, or any under `TPAR_FUSED=0`; the same answers on every rank), else
    /// the all-reduce's own route followed by tpar's add-RMSNorm kernel (the same bits).
    pub fn resolve_fused(&mut self, call: &FusedCall, mode: CaptureMode) -> Result<Arc<FusedResolved>> {
        let key = (call.dtype, call.rows, call.hidden, call.pattern, mode);
        if let Some(r) = self.fused_resolved.get(&key) {
            return Ok(Arc::clone(r));
        }
        call.validate()?;
        let ar = self.resolve(call.dtype, call.bytes(), mode)?;
        let own = self.fused_pick(call, mode, &ar.plan);
        if let Some(o) = &own {
            self.log_fused(call, mode, &o.plan.reason);
        }
        let ar = own.unwrap_or(ar);
        // The plan's kernel, where its fused variant takes the shape; then whether it runs it.
        let fits = match ar.route {
            Route::Kernel { algorithm, .. } if self.ws.fused_unfit(algorithm, call).is_none() => Some(algorithm),
            _ => None,
        };
        let declined = fits.and_then(|a| fused_declined(a, self.overrides.fused, self.ws.fused_rows_owned(a, call)));
        let route = match fits {
            Some(algorithm) if declined.is_none() => {
                let launch = self.ws.resolve_fused(algorithm, call, ar.plan.blocks)?;
                FusedRoute::Fused { algorithm, launch, desc_code: self.ws.fused_desc_code(algorithm, call) }
            }
            _ => FusedRoute::Unfused { all_reduce: ar.route, norm: self.ws.resolve_add_rmsnorm(call)? },
        };
        if let (Some(why), true) = (&declined, self.overrides.debug) {
            self.log_fused(call, mode, &format!("the all-reduce, then the add-RMSNorm kernel: {why}"));
        }
        if self.fused_resolved.len() >= RESOLVED_MAX {
            self.fused_resolved.clear();
        }
        let r = Arc::new(FusedResolved { plan: Arc::clone(&ar.plan), route });
        self.fused_resolved.insert(key, Arc::clone(&r));
        Ok(r)
    }

    /// The fused call's own kernel where the plan ranks the fused kernels apart from the
    /// all-reduces (`plan::fused_kernel`: one-shot pull's, measured the fastest fused at 8
    /// NVLink ranks in graphs up to a size), resolved as an all-reduce of that kernel; `None`
    /// (the all-reduce's own resolution stands) where the plan keeps the all-reduce's pick,
    /// or that kernel failed this machine's bit-exact screen, does not take the shape, is
    /// declined under `TPAR_FUSED`, or cannot be routed here.
    /// `ar`: the all-reduce's plan for x's bytes.
    fn fused_pick(&mut self, call: &FusedCall, mode: CaptureMode, ar: &Plan) -> Option<Arc<Resolved>> {
        let p = crate::plan::fused_kernel(&self.plan_input(call.dtype, call.bytes(), mode), ar)?;
        let a = p.algorithm;
        if self.rejected.iter().any(|r| r.collective == Collective::AllReduce && r.algorithm == a)
            || self.ws.fused_unfit(a, call).is_some()
            || fused_declined(a, self.overrides.fused, self.ws.fused_rows_owned(a, call)).is_some()
        {
            return None;
        }
        let route = self.route_of(&p, Collective::AllReduce, call.dtype, call.bytes()).ok()?;
        Some(Arc::new(Resolved { plan: Arc::new(p), route, collective: Collective::AllReduce }))
    }

    /// One `TPAR_DEBUG=INFO` line about a fused shape's path, as the plan's INFO lines: once
    /// per shape and mode (the resolution is remembered).
    fn log_fused(&self, call: &FusedCall, mode: CaptureMode, what: &str) {
        if self.overrides.debug {
            let line = format!("tpar INFO fused: {} x {} {} {mode:?}: {what}", call.rows, call.hidden, call.dtype);
            tracing::info!(target: "tpar::plan", "{line}");
            eprintln!("{line}");
        }
    }

    /// Enqueues a fused all-reduce + residual add + RMSNorm on [`stream`](Self::stream)
    /// (docs/cuda.md "Fused"): every rank's `bufs.input` summed in rank order, rounded once;
    /// `residual_out = round(sum + residual)`; `norm_out = round((residual_out * inv_rms) *
    /// weight)` per row, the sum of squares in a fixed order; `call.pattern` picks the member
    /// of the family (no residual: `residual_out` is the sum; Gemma: `f32(w) + 1`; FP8: the
    /// output quantized with the scale at `bufs.scale`). Returns the path taken (the
    /// same bits either way). `residual`, `weight`, `eps`, `hidden` and the pattern must be
    /// the same on every rank, as under tensor parallelism.
    ///
    /// # Safety
    /// As for [`call`](Self::call), for every buffer of `bufs` (x, the residual
    /// and both outputs `call.count()` elements, the weight `call.hidden`).
    pub unsafe fn all_reduce_add_rmsnorm(&mut self, call: &FusedCall, bufs: &FusedBufs, mode: CaptureMode) -> Result<FusedPath> {
        let r = self.resolve_fused(call, mode)?;
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { self.submit_fused(None, &r, call, bufs, mode) }
    }

    /// As [`all_reduce_add_rmsnorm`](Self::all_reduce_add_rmsnorm), directly on the caller's
    /// `stream` (as [`call`](Self::call) on a caller's stream; a shape whose all-reduce the plan
    /// gives to the caller's NCCL is refused: ask [`resolve_fused`](Self::resolve_fused)).
    ///
    /// # Safety
    /// As for [`all_reduce_add_rmsnorm`](Self::all_reduce_add_rmsnorm), and `stream` must be a
    /// live stream of this rank's device (or 0, the legacy stream).
    pub unsafe fn all_reduce_add_rmsnorm_on(&mut self, stream: u64, call: &FusedCall, bufs: &FusedBufs, mode: CaptureMode) -> Result<FusedPath> {
        let r = self.resolve_fused(call, mode)?;
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { self.submit_fused(Some(stream), &r, call, bufs, mode) }
    }

    /// As [`all_reduce_add_rmsnorm`](Self::all_reduce_add_rmsnorm) with `algo` forced, and with
    /// `unfused` the unfused path even where a fused kernel would take the call (benchmarks:
    /// the fused kernel against the all-reduce followed by the add-RMSNorm kernel).
    ///
    /// # Safety
    /// As for [`all_reduce_add_rmsnorm`](Self::all_reduce_add_rmsnorm).
    pub unsafe fn all_reduce_add_rmsnorm_with(&mut self, algo: Algorithm, call: &FusedCall, bufs: &FusedBufs, mode: CaptureMode, unfused: bool) -> Result<FusedPath> {
        call.validate()?;
        let bytes = call.bytes();
        let planned = self.plan(call.dtype, bytes, mode);
        let p = if planned.algorithm == algo {
            (*planned).clone()
        } else {
            planned.replaced(algo, self.transport(), format!("forced by the caller (the plan said {}: {})", planned.algorithm, planned.reason))
        };
        let ar = self.route_of(&p, crate::kinds::Collective::AllReduce, call.dtype, bytes)?;
        let route = match ar {
            Route::Kernel { algorithm, .. } if !unfused && self.ws.fused_unfit(algorithm, call).is_none() => {
                let launch = self.ws.resolve_fused(algorithm, call, p.blocks)?;
                FusedRoute::Fused { algorithm, launch, desc_code: self.ws.fused_desc_code(algorithm, call) }
            }
            all_reduce => FusedRoute::Unfused { all_reduce, norm: self.ws.resolve_add_rmsnorm(call)? },
        };
        let r = FusedResolved { plan: Arc::new(p), route };
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { self.submit_fused(None, &r, call, bufs, mode) }
    }

    /// tpar's add-RMSNorm kernel alone (no communication) on the caller's `stream`: for a
    /// caller whose all-reduce ran on its own NCCL (a fused shape routed to the caller's
    /// NCCL). x = `bufs.input`; in place when `norm_out == input`.
    ///
    /// # Safety
    /// As for [`all_reduce_add_rmsnorm_on`](Self::all_reduce_add_rmsnorm_on).
    pub unsafe fn add_rmsnorm_on(&mut self, stream: u64, call: &FusedCall, bufs: &FusedBufs) -> Result<()> {
        self.ws.check_poisoned()?;
        self.ws.device().bind()?;
        let l = self.ws.resolve_add_rmsnorm(call)?;
        // SAFETY: the caller vouches for `stream`; swapped back below, and the launch neither
        // panics nor drops the workspace.
        let own = unsafe { self.ws.swap_stream(stream as super::super::driver::sys::CUstream) };
        let res = self.ws.launch_add_rmsnorm(&l, call, std::slice::from_ref(bufs));
        // SAFETY: `own` is this workspace's own live stream, swapped out above.
        unsafe { self.ws.swap_stream(own) };
        res
    }

    /// Runs a resolved fused call: on `stream` (the caller's) or this communicator's own.
    ///
    /// # Safety
    /// As for [`all_reduce_add_rmsnorm_on`](Self::all_reduce_add_rmsnorm_on).
    unsafe fn submit_fused(&mut self, stream: Option<u64>, r: &FusedResolved, call: &FusedCall, bufs: &FusedBufs, mode: CaptureMode) -> Result<FusedPath> {
        self.ws.check_poisoned()?;
        bufs.check(call)?;
        match r.route {
            FusedRoute::Fused { algorithm, launch, desc_code } => {
                if let Some(peer) = self.watchdog.dead_peer() {
                    let e = Error::PeerDied { rank: self.rank(), peer, during: "an earlier call (seen by this rank's liveness watchdog)".into() };
                    self.ws.poison(e.to_string());
                    return Err(e);
                }
                self.ws.device().bind()?;
                let recorded = match (&mut self.captured, mode) {
                    (Some(seq), CaptureMode::Graph) => {
                        seq.push(super::super::abi::pack_call(call.count(), desc_code));
                        true
                    }
                    _ => false,
                };
                let desc = if recorded || !self.check_calls { 0 } else { desc_code };
                let own = stream.map(|s| {
                    // SAFETY: the caller vouches for `s`; it is swapped back below, and
                    // launch_fused_resolved neither panics nor drops the workspace.
                    unsafe { self.ws.swap_stream(s as super::super::driver::sys::CUstream) }
                });
                let res = self.ws.launch_fused_resolved(&launch, algorithm, desc, call, std::slice::from_ref(bufs));
                if let Some(own) = own {
                    // SAFETY: `own` is this workspace's own live stream, swapped out above.
                    unsafe { self.ws.swap_stream(own) };
                }
                res.map(|()| FusedPath::Fused(algorithm))
            }
            FusedRoute::Unfused { all_reduce, norm } => {
                let ar = Resolved { plan: Arc::clone(&r.plan), route: all_reduce, collective: crate::kinds::Collective::AllReduce };
                let sum = bufs.unfused_sum(call);
                let c = Call { stream, ..Call::all_reduce(call.dtype, call.count(), bufs.input, sum).mode(mode) };
                // SAFETY: the caller's contract covers x and the sum's buffer (norm_out,
                // residual_out or x: FusedBufs::unfused_sum) for count elements.
                let algo = unsafe { self.submit(&c, &ar) }?;
                let normed = FusedBufs { input: sum, ..*bufs };
                let own = stream.map(|s| {
                    // SAFETY: as above.
                    unsafe { self.ws.swap_stream(s as super::super::driver::sys::CUstream) }
                });
                let res = self.ws.launch_add_rmsnorm(&norm, call, std::slice::from_ref(&normed));
                if let Some(own) = own {
                    // SAFETY: `own` is this workspace's own live stream, swapped out above.
                    unsafe { self.ws.swap_stream(own) };
                }
                res.map(|()| FusedPath::Unfused(algo))
            }
        }
    }
}

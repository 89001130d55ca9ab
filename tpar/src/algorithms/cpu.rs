//! The CPU backend's dispatch: one chunk of a call to the algorithm's CPU body, behind the
//! registry's gate.

use super::call::Call;
use super::registry;
use super::{gather_bcast, oneshot_pull, oneshot_push, twoshot_pull, twoshot_push};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::kinds::{Algorithm, Collective};
use crate::protocol::{Wait, Word};

/// Runs one chunk of `algo` on the CPU backend: `input` is this rank's part of the call (at
/// most `layout.cap` words of it), `out` receives the reduced elements (same length).
pub(crate) fn run_chunk<W: Word, S: Wait, T: Element>(
    algo: Algorithm,
    call: &mut Call<'_, '_, W, S>,
    input: &[T],
    out: &mut [T],
) -> Result<()> {
    // The registry is the gate: what it says the CPU backend runs, this runs; the rest is
    // refused with the registry's reason.
    if input.len() != out.len() || input.len().div_ceil(T::LANES) > call.ws.layout.cap {
        return Err(Error::invalid("chunk", format!("{} in, {} out, capacity {} words", input.len(), out.len(), call.ws.layout.cap)));
    }
    registry::runnable(algo, crate::kinds::Backend::Cpu, crate::kinds::Transport::Shm)
        .map_err(|reason| Error::Unsupported { what: format!("{algo} on the CPU shared-memory backend"), reason })?;
    match algo {
        Algorithm::OneshotPush => oneshot_push::run(call, input, out),
        Algorithm::OneshotPull => oneshot_pull::run(call, input, out),
        Algorithm::TwoshotPush => twoshot_push::run(call, input, out),
        Algorithm::TwoshotPull => twoshot_pull::run(call, input, out),
        Algorithm::GatherBcast => gather_bcast::run(call, input, out),
        Algorithm::StagedPush | Algorithm::Hierarchical | Algorithm::Nccl | Algorithm::CeRing => Err(Error::Unsupported {
            what: format!("{algo} on the CPU shared-memory backend"),
            reason: "the registry lists a CPU body this dispatch lacks".into(),
        }),
    }
}


/// Runs one chunk of an all-gather or a reduce-scatter with `algo` on the CPU backend: as
/// [`run_chunk`], behind the registry's gate (the collectives `algo` computes). All-gather:
/// `input` is my chunk, rank s's lands at `out[s * stride + offset ..]`. Reduce-scatter:
/// owner j's piece of the chunk is `input[j * stride + offset ..]`, `out.len()` elements.
pub(crate) fn run_gather_scatter<W: Word, S: Wait, T: Element>(
    collective: Collective,
    algo: Algorithm,
    call: &mut Call<'_, '_, W, S>,
    (input, out): (&[T], &mut [T]),
    (stride, offset): (usize, usize),
) -> Result<()> {
    let world = call.world();
    let n = match collective {
        Collective::AllGather => input.len(),
        _ => out.len(),
    };
    let fits = match collective {
        Collective::AllGather => (world - 1) * stride + offset + n <= out.len(),
        Collective::ReduceScatter => (world - 1) * stride + offset + n <= input.len(),
        Collective::AllReduce => false,
    };
    let cap = if algo == Algorithm::OneshotPull { oneshot_pull::exposed_elems(collective, call.ws.layout.cap * T::LANES, world, T::LANES) } else { call.ws.layout.cap * T::LANES };
    if !fits || n > cap {
        return Err(Error::invalid("chunk", format!("{collective}: {} in, {} out, chunk {n} at {offset} of {stride}, capacity {} words", input.len(), out.len(), call.ws.layout.cap)));
    }
    registry::computes(algo, collective).map_err(|reason| Error::Unsupported { what: format!("{collective} with {algo}"), reason })?;
    registry::runnable(algo, crate::kinds::Backend::Cpu, crate::kinds::Transport::Shm)
        .map_err(|reason| Error::Unsupported { what: format!("{algo} on the CPU shared-memory backend"), reason })?;
    match (collective, algo) {
        (Collective::AllGather, Algorithm::OneshotPush) => oneshot_push::all_gather(call, input, out, stride, offset),
        (Collective::ReduceScatter, Algorithm::OneshotPush) => oneshot_push::reduce_scatter(call, input, stride, offset, out),
        (Collective::AllGather, Algorithm::OneshotPull) => oneshot_pull::all_gather(call, input, out, stride, offset),
        (Collective::ReduceScatter, Algorithm::OneshotPull) => oneshot_pull::reduce_scatter(call, input, stride, offset, out),
        _ => Err(Error::Unsupported { what: format!("{collective} with {algo} on the CPU shared-memory backend"), reason: "the registry lists a CPU body this dispatch lacks".into() }),
    }
}

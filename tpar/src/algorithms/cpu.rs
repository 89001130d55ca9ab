//! The CPU backend's dispatch: one chunk of a call to the algorithm's CPU body, behind the
//! registry's gate.

use super::call::Call;
use super::registry;
use super::{gather_bcast, oneshot_pull, oneshot_push, twoshot_pull, twoshot_push};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::kinds::Algorithm;
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


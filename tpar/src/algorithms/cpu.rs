//! The CPU backend's dispatch: one chunk of a call to the algorithm's CPU body, behind the
//! registry's gate.

use super::call::Call;
use super::registry;
use super::{gather_bcast, oneshot_pull, oneshot_push, twoshot_pull, twoshot_push};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::kinds::Algorithm;
use crate::protocol::{Wait, Word};

/// Runs one chunk of `algo` on the CPU backend: `packed` is this rank's input packed into
/// words (at most `layout.cap`), `out` receives the reduced elements.
pub(crate) fn run_chunk<W: Word, S: Wait, T: Element>(
    algo: Algorithm,
    call: &mut Call<'_, '_, W, S>,
    packed: &[u64],
    out: &mut [T],
) -> Result<()> {
    // The registry is the gate: what it says the CPU backend runs, this runs; the rest is
    // refused with the registry's reason.
    registry::runnable(algo, crate::Backend::Cpu, crate::Transport::Shm)
        .map_err(|reason| Error::Unsupported { what: format!("{algo} on the CPU shared-memory backend"), reason })?;
    match algo {
        Algorithm::OneshotPush => oneshot_push::run(call, packed, out),
        Algorithm::OneshotPull => oneshot_pull::run(call, packed, out),
        Algorithm::TwoshotPush => twoshot_push::run(call, packed, out),
        Algorithm::TwoshotPull => twoshot_pull::run(call, packed, out),
        Algorithm::GatherBcast => gather_bcast::run(call, packed, out),
        Algorithm::StagedPush | Algorithm::Hierarchical | Algorithm::Nccl => Err(Error::Unsupported {
            what: format!("{algo} on the CPU shared-memory backend"),
            reason: "the registry lists a CPU body this dispatch lacks".into(),
        }),
    }
}


#!/usr/bin/env bash
# The host transport across rank processes on one GPU (GpuCommunicator, one shared host
# segment registered with CUDA in every rank): correctness sweeps at 2 and 4 ranks, the plan
# choosing the host transport by itself on a no-P2P preset, a SIGKILLed rank (PeerDied on the
# others, nothing left in /dev/shm), and 42 KiB timings in processes vs emulated ranks.
#
#   scripts/gpu-host-procs.sh ./tpar        (writes $OUT/host-procs.log and $OUT/summary.txt)
#
# Rank processes sharing one GPU are time-sliced by the GPU (no MPS): their timings measure
# that scheduling, not a fabric. Takes about 60-90 s on one H200 (warm machine).
set -u
BIN=$(realpath "${1:?usage: gpu-host-procs.sh TPAR_BINARY}")
OUT=${OUT:-/tmp/gpu-host-procs}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=0
export TPAR_CACHE_DIR=${TPAR_CACHE_DIR:-/tmp/tpar-host-procs-cache}
LOG=$OUT/host-procs.log
SUM=$OUT/summary.txt
: >"$LOG"
: >"$SUM"
TOPO=rtx4090-nop2p-4
FAIL=0

leftovers() { ls /dev/shm 2>/dev/null | grep -c '^tpar-' || true; }

step() {
  local name=$1 limit=$2
  shift 2
  echo "=== $name: $*" >>"$LOG"
  local t0=$SECONDS
  timeout "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  echo "$name: rc=$rc, $((SECONDS - t0)) s, tpar segments in /dev/shm after: $(leftovers)" >>"$SUM"
  [ "$rc" = 0 ] || FAIL=1
  return 0
}

{
  echo "date: $(date -u +%FT%TZ)"
  nvidia-smi -L 2>&1 | head -2
  df -k /dev/shm | tail -1
  echo "tpar segments in /dev/shm before: $(leftovers)"
} >>"$SUM"
# /dev/shm must hold world x (21 slots + flags) of the largest call: 84 MiB at 4 ranks x 1 MiB.
AVAIL=$(df -k /dev/shm | awk 'NR==2 {print $4}')
E4=1M
[ "${AVAIL:-0}" -gt 200000 ] || E4=256K
echo "largest call at 4 ranks: $E4 (/dev/shm has ${AVAIL} KiB free)" >>"$SUM"

# 0. Fill the cubin cache once (emulated ranks over host compile the push kernels).
step warm-cache 25 "$BIN" check --emulate-ranks 2 --transport host --calls 0 -e 1K -d all --quiet
# 1. Every algorithm that runs over host, forced, every dtype, 1 B..1 MiB with odd counts, then
#    random calls; every output checked bitwise and across ranks.
step check-w2-forced 30 "$BIN" check --backend cuda --world 2 --transport host --plan-topology "$TOPO" \
  --algo oneshot-push,twoshot-push -e 1M -d all --calls 150
step check-w4-forced 40 "$BIN" check --backend cuda --world 4 --transport host --plan-topology "$TOPO" \
  --algo oneshot-push,twoshot-push -e "$E4" -d all --calls 150
# 2. A rank SIGKILLed mid-sequence: the others get PeerDied (then Poisoned); nothing left.
step kill-rank-w4-last 20 env TPAR_TIMEOUT_MS=3000 "$BIN" selftest kill-rank --world 4 --plan-topology "$TOPO" -e 42K
# 3. Timings, 4 ranks x 42 KiB bf16: processes (time-sliced) vs emulated ranks, eager and graph.
step bench-procs-w4 25 "$BIN" bench --backend cuda --world 4 --transport host --plan-topology "$TOPO" \
  --algo oneshot-push,twoshot-push -b 42K -e 42K -d bfloat16 --mode both -n 20 -w 3 --graph-inner 20
step bench-emulated-w4 15 "$BIN" bench --emulate-ranks 4 --transport host \
  --algo oneshot-push,twoshot-push -b 42K -e 42K -d bfloat16 --mode both -n 20 -w 3 --graph-inner 20
# 4. No --transport: on a preset without P2P the communicator takes the host transport itself
#    and the plan sends calls to it (below the NCCL threshold: 256 KiB at 4 ranks).
step check-w4-plan 25 "$BIN" check --backend cuda --world 4 --plan-topology "$TOPO" --algo auto -e 256K -d all --calls 100
# 5. The rank that created the segment SIGKILLed.
step kill-rank-w4-creator 20 env TPAR_TIMEOUT_MS=3000 "$BIN" selftest kill-rank --world 4 --rank 0 --plan-topology "$TOPO" -e 42K
grep -E 'fault test|^PASS: rank' "$LOG" | tail -12 >>"$SUM"
{
  echo "--- verdicts"
  grep -E '^(PASS|FAIL)|^tpar: error|left in /dev/shm after init' "$LOG" | head -24
  echo "--- timings, 43008 B bf16 (us per call; processes are time-sliced)"
  grep -E '^# algorithm:|^ +43008|^# *mode|^=== bench' "$LOG" | tail -24
  echo "tpar segments in /dev/shm at the end: $(leftovers)"
  echo "overall: $([ $FAIL = 0 ] && echo PASS || echo FAIL)"
} >>"$SUM"
cat "$SUM"
exit $FAIL

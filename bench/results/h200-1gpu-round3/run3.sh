#!/usr/bin/env bash
# Third call of the round: the merged head after the host transport's flag protocol
# (hostproto) landed. `run` with carry [".gpu-r3"], `bash bench/results/h200-1gpu-round3/run3.sh`.
set -uo pipefail
OUT="${OUT:-./gpu-out}"; mkdir -p "$OUT"
D=.gpu-r3; B=$D/tpar; W=$(mktemp -d); LOG="$W/run3.log"; : >"$LOG"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0 XDG_CACHE_HOME=/tmp/r3cache
T0=$SECONDS; BUDGET=200; summary=()
step() {
  local name="$1" limit="$2" expect=pass; shift 2
  [ "$1" = expect_fail ] && { expect=fail; shift; }
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  local el=$((SECONDS - T0))
  if [ $((el + limit / 3)) -gt $BUDGET ]; then summary+=("SKIP  $name (out of time at ${el} s)"); return; fi
  echo "=== $name (t=${el}s): ${envs[*]} $*" >>"$LOG"
  local t=$SECONDS; env "${envs[@]}" timeout "$limit" "$@" >>"$LOG" 2>&1; local rc=$?
  echo "=== $name: rc=$rc ($((SECONDS - t)) s)" >>"$LOG"
  if [ $expect = pass ]; then [ $rc -eq 0 ] && summary+=("PASS  $name ($((SECONDS - t)) s)") || summary+=("FAIL  $name rc=$rc ($((SECONDS - t)) s)")
  else [ $rc -ne 0 ] && summary+=("PASS  $name: failed as it must, rc=$rc ($((SECONDS - t)) s)") || summary+=("FAIL  $name: passed where it must fail"); fi
}
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "tpar $(sha256sum $B | cut -c1-16)"; } >>"$LOG" 2>&1
# host transport: the protocol auto picks (sentinel at 2-3 ranks, flags from 4), every kernel
step host-auto 50 -- $B check --emulate-ranks 2,3,4,8 --transport host -e 1M --calls 150 -d all --algo all
step host-flags-forced 30 TPAR_HOST_PROTOCOL=flags -- $B check --emulate-ranks 2,3 --transport host -e 256K --calls 100 -d all --algo all
step host-skew 30 -- $B check --emulate-ranks 4,8 --transport host --calls 400 --skew-ns 20000 -e 256K -d all --algo all
step host-graph-skew 30 -- $B selftest graph --emulate-ranks 4,8 --transport host --replays 10 --skew-ns 20000 --sequence 122x42K -d bfloat16
step host-unguarded 40 expect_fail TPAR_TEST_UNSAFE_TWO_BUFFERS=1 TPAR_TIMEOUT_MS=300 XDG_CACHE_HOME=/tmp/r3unsafe -- $B selftest graph --emulate-ranks 4 --transport host --replays 30 --skew-ns 5000 --sequence 122x64K -d bfloat16
step host-timeout 20 TPAR_TIMEOUT_MS=200 -- $B selftest timeout --emulate-ranks 4 --transport host
step host-mismatch 45 TPAR_TIMEOUT_MS=1000 -- $B selftest mismatch --emulate-ranks 4 --transport host
step procs-host 40 -- $B check --backend cuda --world 4 --transport host --plan-topology h200-nvswitch-8 -e 1M --calls 100 -d all --algo oneshot-push,twoshot-push
# p2p unchanged: the sweep and the graph skew once more
step p2p-check 50 -- $B check --emulate-ranks 2,8 -e 1M --calls 200 -d all --algo all
step host-seq 25 -- $B bench --emulate-ranks 4,8 --transport host --mode graph --sequence 122x42K -b 42K -e 42K -n 30 -w 3 -d bfloat16 --algo oneshot-push,twoshot-push
{ echo "# ---- summary ($((SECONDS - T0)) s) ----"; printf '%s\n' "${summary[@]}"; grep -E "^   graph |protocol" "$LOG" | sort | uniq | head -20; } | tee -a "$LOG" >"$OUT/summary3.txt"
cp "$LOG" "$OUT/run3.log"
cat "$OUT/summary3.txt"

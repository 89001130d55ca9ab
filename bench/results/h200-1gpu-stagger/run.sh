#!/usr/bin/env bash
# TPAR_POLL_STAGGER (the sentinel poll's staggered tail) on one H200, in one call:
# `run` with carry [".gpu-stagger"], `bash .gpu-stagger/run.sh`.
# .gpu-stagger/ holds `tpar` (release, branch stagger) and this script; builds nothing.
# 1. timings (graph, bf16, emulated ranks) for TPAR_POLL_STAGGER 0 (today's loop), 100, 200,
#    400, twice (second pass in reverse order); 2. the best non-zero value at 4 and 8 ranks
#    (one-shot push, 122x42K) picked from them; 3. the correctness steps for that value,
#    then for the other non-zero values while time is left. $OUT/summary.txt, timings.txt,
#    stagger.log.gz come back.
set -uo pipefail
OUT="${OUT:-./gpu-out}"; mkdir -p "$OUT"
D=.gpu-stagger; B=$D/tpar; LOG="$OUT/stagger.log"; : >"$LOG"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
export XDG_CACHE_HOME=/tmp/stcache
T0=$SECONDS; BUDGET=${BUDGET:-235}; summary=()
# step NAME LIMIT [expect_fail] [ENV=V ...] -- CMD ARGS...
step() {
  local name="$1" limit="$2" expect=pass; shift 2
  [ "$1" = expect_fail ] && { expect=fail; shift; }
  local envs=(X=1); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  local el=$((SECONDS - T0))
  if [ $((el + limit / 3)) -gt $BUDGET ]; then summary+=("SKIP  $name (out of time at ${el} s)"); return; fi
  echo "=== $name (t=${el}s): ${envs[*]} $*" >>"$LOG"
  local t=$SECONDS; env "${envs[@]}" timeout "$limit" "$@" >>"$LOG" 2>&1; local rc=$?
  echo "=== $name: rc=$rc ($((SECONDS - t)) s)" >>"$LOG"
  if [ $expect = pass ]; then [ $rc -eq 0 ] && summary+=("PASS  $name ($((SECONDS - t)) s)") || summary+=("FAIL  $name rc=$rc ($((SECONDS - t)) s)")
  else [ $rc -ne 0 ] && summary+=("PASS  $name: failed as it must, rc=$rc ($((SECONDS - t)) s)") || summary+=("FAIL  $name: passed where it must fail"); fi
}
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "tpar $(sha256sum $B | cut -c1-16)"; $B --version; } >>"$LOG" 2>&1
SEQ=(bench --emulate-ranks 2,4,8 --mode graph --sequence 122x42K -b 42K -e 42K -n 50 -w 5 -d bfloat16 --algo oneshot-push,staged-push,twoshot-push)
SZ=(bench --emulate-ranks 8 --mode graph -b 1K -e 64K -f 4 -n 40 -w 5 -d bfloat16 --algo oneshot-push,twoshot-push)
for s in 0 100 200 400 400 200 100 0; do
  step "seq-s$s" 40 TPAR_POLL_STAGGER=$s -- $B "${SEQ[@]}"
  step "sizes-s$s" 40 TPAR_POLL_STAGGER=$s -- $B "${SZ[@]}"
done
awk '/^=== (seq|sizes)-/ {s=1} /^=== / && !/^=== (seq|sizes)-/ {s=0} s' "$LOG" >"$OUT/timings.txt"
# per-call us of the Sequence lines, by stagger, ranks and algorithm (median of the two passes' mean)
python3 - "$OUT/timings.txt" >"$OUT/seq-table.txt" <<'PY'
import re, sys, collections
cur = None; ranks = None; res = collections.defaultdict(list)
for line in open(sys.argv[1]):
    m = re.match(r"=== seq-s(\d+) \(", line)
    if m: cur = int(m.group(1)); continue
    if line.startswith("=== sizes"): cur = None
    m = re.match(r"# group: (\d+) emulated", line)
    if m: ranks = int(m.group(1))
    m = re.match(r"\s+graph\s+(\S+)\s+[\d.]+ us .* ([\d.]+) us per call", line)
    if m and cur is not None: res[(cur, ranks, m.group(1))].append(float(m.group(2)))
algos = sorted({k[2] for k in res}); best = None
print("stagger ranks " + " ".join(f"{a:>24}" for a in algos))
for s in sorted({k[0] for k in res}):
    for r in sorted({k[1] for k in res}):
        print(f"{s:>7} {r:>5} " + " ".join(f"{' / '.join(f'{v:.2f}' for v in res[(s, r, a)]):>24}" for a in algos))
score = {s: sum(sum(res[(s, r, "oneshot-push")]) / max(1, len(res[(s, r, "oneshot-push")])) for r in (4, 8)) for s in sorted({k[0] for k in res})}
print("score (one-shot push, mean 4 + 8 ranks):", score)
nz = [s for s in score if s]
print("BEST", min(nz, key=lambda s: score[s]) if nz else 200)
PY
cat "$OUT/seq-table.txt" >>"$LOG"
BEST=$(awk '/^BEST/ {print $2}' "$OUT/seq-table.txt"); BEST=${BEST:-200}
ORDER="$BEST $(echo 100 200 400 | tr ' ' '\n' | grep -vx "$BEST" | tr '\n' ' ')"
for s in $ORDER; do
  E=(TPAR_POLL_STAGGER=$s)
  step "s$s-check-emulated" 60 "${E[@]}" -- $B check --emulate-ranks 2,3,8 -e 1M --calls 200 -d all --algo all
  step "s$s-check-skew" 40 "${E[@]}" -- $B check --emulate-ranks 8 --calls 1000 --skew-ns 20000 -e 256K -d all
  step "s$s-graph-skew" 40 "${E[@]}" -- $B selftest graph --emulate-ranks 2,8 --replays 20 --skew-ns 20000 --sequence 122x42K -d all
  step "s$s-timeout" 25 "${E[@]}" TPAR_TIMEOUT_MS=200 -- $B selftest timeout --emulate-ranks 2,8
  step "s$s-mismatch" 25 "${E[@]}" TPAR_TIMEOUT_MS=2000 -- $B selftest mismatch --emulate-ranks 2,8
  step "s$s-guard-2buf" 20 expect_fail "${E[@]}" TPAR_TEST_UNSAFE_TWO_BUFFERS=1 TPAR_TIMEOUT_MS=500 XDG_CACHE_HOME=/tmp/stu2 -- $B selftest graph --emulate-ranks 8 --replays 20 --skew-ns 20000 --sequence 122x42K -d bfloat16
  step "s$s-check-host" 30 "${E[@]}" -- $B check --emulate-ranks 2 --transport host -e 1M --calls 100 -d all
  step "s$s-procs-check" 40 "${E[@]}" -- $B check --backend cuda --world 4 --plan-topology h200-nvswitch-8 -e 1M --calls 100 -d all
done
step bad-knob 10 expect_fail TPAR_POLL_STAGGER=fast -- $B check --emulate-ranks 2 -e 4K --calls 2 -d bfloat16 --algo oneshot-push
{ echo "# ---- summary ($((SECONDS - T0)) s, best non-zero $BEST) ----"; printf '%s\n' "${summary[@]}"; cat "$OUT/seq-table.txt"; } | tee -a "$LOG" >"$OUT/summary.txt"
gzip -kf "$LOG"; rm -f "$LOG"
cat "$OUT/summary.txt"

#!/usr/bin/env bash
# Round 8, call 1 (one H200): the engines' own code at 2/4/8 rank processes after the liveness
# fix (kill stage) and the external_launcher fix (vLLM 4/8), the batch-invariant run on a PCIe
# preset; the fused one-shot kernels with and without the row wait (where the +1.7 us goes).
set -u
T0=$SECONDS; BUDGET=540
mkdir -p /tmp/b; for x in tpar tpar-nowait; do gunzip -c .gpu/c1/$x.gz > /tmp/b/$x; chmod +x /tmp/b/$x; done
B=/tmp/b/tpar
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
mkdir -p "$OUT/eng" "$OUT/fused"
echo "## $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) tpar $(sha256sum $B | cut -c1-16)"
S=()
st() { # NAME LIMIT FILE [ENV=V..] -- CMD..
  local name=$1 lim=$2 f=$3; shift 3; local envs=(X=1); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  local left=$((BUDGET - (SECONDS - T0))); [ $left -lt 15 ] && { S+=("SKIP $name (out of time)"); return; }
  [ $lim -gt $left ] && lim=$left
  local t=$SECONDS; env "${envs[@]}" timeout $lim "$@" > "$f" 2>&1; local rc=$?
  S+=("rc=$rc $name ($((SECONDS - t)) s): $(grep -m1 -E 'PASS|FAIL|wrong|error' "$f" | cut -c1-200)")
}
FB=(bench --fused --emulate-ranks 8 -d bfloat16 --algo oneshot-pull,oneshot-push --mode graph --hidden 7168 --rows 1,3,8 -n 50 -w 5)
st fused-base 60 "$OUT/fused/base.txt" -- $B "${FB[@]}"
st fused-nowait 60 "$OUT/fused/nowait.txt" -- /tmp/b/tpar-nowait "${FB[@]}"
st engines 330 "$OUT/eng/stdout.txt" OUT="$OUT/eng" WORLDS="2 4 8" -- bash scripts/gpu-engines.sh .gpu/kw .gpu/engines
st fused-base2 60 "$OUT/fused/base2.txt" -- $B "${FB[@]}"
printf '%s\n' "${S[@]}" | tee "$OUT/summary.txt"
echo; tail -40 "$OUT/eng/stdout.txt"; echo "end at $((SECONDS - T0)) s"
cd "$OUT" && tar czf all.tgz eng fused summary.txt && rm -rf eng fused

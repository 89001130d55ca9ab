#!/usr/bin/env bash
# Round 12, call 2 (one H200): how the fused one-shot kernels bring the first vector's
# residual and weight in before the all-reduce (TPAR_FUSED_EARLY: 0 L1 prefetch, 1 registers,
# 2 cp.async into shared memory), with and without the cluster exchange of the row's sums
# (TPAR_FUSED_CLUSTER). Binaries: `old` = 686f732; `exp` = the candidate + an NVRTC hook
# reading extra defines from TPAR_EXP_DEFINES (exp-hook.diff, not committed); `new` = the
# candidate (TPAR_FUSED_EARLY 2 and clusters by default). Alternating, twice; then the
# phases; then the candidate's correctness (the selftest steps of scripts/gpu-fused.sh).
set -u
T0=$SECONDS; BUDGET=${BUDGET:-560}
D=/tmp/k; mkdir -p $D; C=.gpu/r12
for b in old exp; do gunzip -c $C/tpar-$b.gz > $D/$b; done; gunzip -c $C/tpar.gz > $D/new; chmod +x $D/*
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
export XDG_CACHE_HOME=/tmp/r12-cache TPAR_TIMEOUT_MS=10000
echo "## $(date -u +%FT%TZ) old $(sha256sum $D/old | cut -c1-16) exp $(sha256sum $D/exp | cut -c1-16) new $(sha256sum $D/new | cut -c1-16)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
mkdir -p "$OUT/f" "$OUT/c"
S=()
st() { # NAME LIMIT FILE [ENV=V..] -- CMD..
  local name=$1 lim=$2 f=$3; shift 3; local envs=(X=1); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  local left=$((BUDGET - (SECONDS - T0))); [ $left -lt 15 ] && { S+=("SKIP $name (out of time)"); return; }
  [ $lim -gt $left ] && lim=$left
  local t=$SECONDS; env "${envs[@]}" timeout $lim "$@" > "$f" 2>&1; local rc=$?
  S+=("rc=$rc $name ($((SECONDS - t)) s): $(grep -m1 -E 'PASS|FAIL|wrong|rror' "$f" | cut -c1-200)")
}
FB=(bench --fused --emulate-ranks 8 -d bfloat16 --mode graph --hidden 4096,7168,8192 --rows 1,3,8 -n 50 -w 5 --algo oneshot-pull,oneshot-push)
for i in 1 2; do
  st old-$i 90 "$OUT/f/old-$i.txt" -- $D/old "${FB[@]}"
  st e0c0-$i 90 "$OUT/f/e0c0-$i.txt" TPAR_EXP_DEFINES=-DTPAR_FUSED_EARLY=0 TPAR_FUSED_CLUSTER=0 -- $D/exp "${FB[@]}"
  st e0c1-$i 90 "$OUT/f/e0c1-$i.txt" TPAR_EXP_DEFINES=-DTPAR_FUSED_EARLY=0 -- $D/exp "${FB[@]}"
  st e1c1-$i 90 "$OUT/f/e1c1-$i.txt" TPAR_EXP_DEFINES=-DTPAR_FUSED_EARLY=1 -- $D/exp "${FB[@]}"
  st e2c0-$i 90 "$OUT/f/e2c0-$i.txt" TPAR_FUSED_CLUSTER=0 -- $D/exp "${FB[@]}"
  st e2c1-$i 90 "$OUT/f/e2c1-$i.txt" -- $D/new "${FB[@]}"
done
FS=(bench --fused --emulate-ranks 8 -d bfloat16 --mode graph --hidden 7168 --rows 1,3,8 -n 30 -w 5 --algo oneshot-pull)
st stamps-e2c1 60 "$OUT/f/stamps-e2c1.txt" TPAR_TEST_STAMPS=1 -- $D/new "${FS[@]}"
st stamps-e0c1 60 "$OUT/f/stamps-e0c1.txt" TPAR_TEST_STAMPS=1 TPAR_EXP_DEFINES=-DTPAR_FUSED_EARLY=0 -- $D/exp "${FS[@]}"
SF=($D/new selftest fused)
st sf-8 150 "$OUT/c/sf-8.txt" -- "${SF[@]}" --emulate-ranks 8 -d all --hidden 1024,2880,4096,7168,8192,16384 --rows 1,2,3,5,8,13,32,33,63,64 --seq-calls 24
st sf-24 90 "$OUT/c/sf-24.txt" -- "${SF[@]}" --emulate-ranks 2,4 -d bfloat16,half --hidden 1024,4096,7168,8192 --rows 1,3,4,8,9,64 --seq-calls 12
st sf-host 90 "$OUT/c/sf-host.txt" -- "${SF[@]}" --emulate-ranks 2,4 --transport host -d bfloat16,float --hidden 4096,7168 --rows 1,3,8,33 --seq-calls 12
st sf-skew 60 "$OUT/c/sf-skew.txt" -- "${SF[@]}" --emulate-ranks 8 --skew-ns 20000 --mode graph -d bfloat16 --hidden 7168 --rows 1,3,8 --replays 3 --seq-calls 48
st sf-wrap 40 "$OUT/c/sf-wrap.txt" -- "${SF[@]}" --emulate-ranks 4 --epoch-start 4294967290 -d bfloat16 --hidden 7168 --rows 1,3,8 --unfused-every 0 --seq-calls 12
printf '%s\n' "${S[@]}" | tee "$OUT/summary.txt"
for f in old e0c0 e0c1 e1c1 e2c0 e2c1; do for i in 1 2; do echo "== $f-$i $(grep -E '^ +[0-9]+ +[0-9]+ +[0-9]+ +oneshot-pull' "$OUT/f/$f-$i.txt" | awk '{printf "%s", $13 " "}')"; done; done
grep -h "rank 0:" "$OUT/f/stamps-e2c1.txt" "$OUT/f/stamps-e0c1.txt" | grep fused | cut -c1-220
for f in "$OUT"/c/*.txt; do echo "== $(basename $f) $(tail -1 "$f" | cut -c1-200)"; done
echo "end at $((SECONDS - T0)) s"
cd "$OUT" && tar czf all.tgz f c summary.txt && rm -rf f c

#!/usr/bin/env bash
# The first-use tune on one GPU, in one call (issue 23, "measured on first use").
#
#   OUT=/some/dir bash scripts/gpu-tune.sh BIN WHEELDIR
#
# BIN: a release `tpar` built elsewhere (target/release/tpar); WHEELDIR: a folder with the
# abi3 wheel (tpar-*.whl). Builds nothing. Runs the tune's whole mechanism where one GPU can:
#  emulated ranks (2, 4, 8 as streams of the GPU; `tpar tune --emulate-ranks N --cache`, the
#  start a communicator runs):
#   - a first start tunes (its time, the first-use budget up to 8 MiB), a second reads the cache;
#   - two jobs starting at once tune once; a tuner killed mid-tune leaves a usable cache (the
#     next start re-tunes, the one after reads); TPAR_TUNE=off keeps the defaults and says so;
#     TPAR_TUNE=force re-tunes;
#  rank processes sharing the GPU through tpar.torch (scripts/gpu_tune_torch.py, preset
#  h200-nvswitch-8, tpar joining no NCCL, as the engine drop-ins):
#   - 4 ranks: a first start tunes, a second reads the cache (constructor times), each then
#     checks a 42 KiB bf16 all-reduce bitwise; TPAR_TUNE=off; two jobs of 2 ranks at once.
# Writes $OUT/gpu-tune.log (everything), $OUT/tune-table.md (the short table), the torch
# ranks' JSON, and exits non-zero on any failure (a candidate rejected by the bit-exact
# screen is a failure: a kernel computed a wrong sum).
set -uo pipefail
BIN="${1:-target/release/tpar}"
WHEELS="${2:-.gpu}"
OUT="${OUT:-./gpu-out}"
HERE="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$OUT"
LOG="$OUT/gpu-tune.log"
: >"$LOG"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0
unset TPAR_TUNE TPAR_ALGO TPAR_PROFILE TPAR_DISABLE TPAR_TOPOLOGY
failed=0
rows=()
row() { rows+=("| $1 | $2 | $3 |"); }
bad() { failed=1; row "$1" "**FAIL**" "$2"; }
log() { echo "$*" | tee -a "$LOG"; }
# The numbers of the start lines in a file: "tuned ... in X s" and "read ... in Y ms".
tuned_s() { grep -o 'tuned this machine in [0-9.]* s' "$1" | awk '{print $5}' | paste -sd/ -; }
read_ms() { grep -o 'read from the cache in [0-9.]* ms' "$1" | awk '{print $6}' | paste -sd/ -; }
count() { grep -c "$2" "$1"; }
wall() { local t0=$1; echo "$(( ($(date +%s%N) - t0) / 1000000 ))"; }

{
    echo "# date: $(date -u +%FT%TZ)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
    echo "# binary: $(sha256sum "$BIN" | cut -c1-16)"
} 2>&1 | tee -a "$LOG"

# ---------------------------------------------------------------- emulated ranks
E1="$OUT/cache-emulated"
rm -rf "$E1"
emu() { # NAME CACHE LIMIT ARGS...: one start of emulated ranks; its output in $OUT/NAME.out
    local name=$1 cache=$2 limit=$3
    shift 3
    log "=== $name: TPAR_CACHE_DIR=$cache $BIN tune $*"
    local t0
    t0=$(date +%s%N)
    TPAR_CACHE_DIR="$cache" timeout "$limit" "$BIN" tune "$@" >"$OUT/$name.out" 2>&1
    local rc=$?
    cat "$OUT/$name.out" >>"$LOG"
    log "=== $name: rc=$rc in $(wall "$t0") ms"
    return $rc
}
t0=$(date +%s%N)
if emu emu-first "$E1" 400 --emulate-ranks 2,4,8 --cache -e 8M; then
    ms=$(wall "$t0")
    if [ "$(count "$OUT/emu-first.out" 'tuned this machine in')" -eq 3 ]; then
        row "emulated 2/4/8: first start tunes (first-use budget, up to 8 MiB, eager+graph)" "PASS" "tune $(tuned_s "$OUT/emu-first.out") s; process ${ms} ms"
    else bad "emulated first start tunes" "$(grep -c 'tpar:' "$OUT/emu-first.out") start lines, not 3 tunes"; fi
    if grep -q "rejected by the bit-exact screen" "$OUT/emu-first.out"; then bad "emulated screen" "$(grep -o 'rejected by the bit-exact screen[^;]*' "$OUT/emu-first.out" | head -3)"; fi
    grep -o '[0-9]* screens, [0-9]* points' "$OUT/emu-first.out" | paste -sd' ' - | sed 's/^/# budget (2\/4\/8 ranks): /' | tee -a "$LOG"
else bad "emulated first start tunes" "rc!=0 (see emu-first.out)"; fi
t0=$(date +%s%N)
if emu emu-second "$E1" 60 --emulate-ranks 2,4,8 --cache -e 8M && [ "$(count "$OUT/emu-second.out" 'read from the cache in')" -eq 3 ]; then
    row "emulated 2/4/8: second start reads the cache" "PASS" "read $(read_ms "$OUT/emu-second.out") ms; process $(wall "$t0") ms (CUDA start, groups)"
else bad "emulated second start reads the cache" "see emu-second.out"; fi
TPAR_TUNE=off emu emu-off "$E1" 60 --emulate-ranks 4 --cache -e 8M
if grep -q "no tune (TPAR_TUNE=off): the plan's defaults are in force" "$OUT/emu-off.out"; then
    row "emulated: TPAR_TUNE=off" "PASS" "$(grep -o "no tune (TPAR_TUNE=off)[^,]*" "$OUT/emu-off.out" | head -1)"
else bad "emulated: TPAR_TUNE=off says so" "see emu-off.out"; fi
TPAR_TUNE=force emu emu-force "$E1" 200 --emulate-ranks 2 --cache -e 8M
if grep -q "(TPAR_TUNE=force;" "$OUT/emu-force.out"; then row "emulated: TPAR_TUNE=force re-tunes" "PASS" "tune $(tuned_s "$OUT/emu-force.out") s"; else bad "emulated: TPAR_TUNE=force" "see emu-force.out"; fi

# Two jobs at once, one cache.
E2="$OUT/cache-concurrent"
rm -rf "$E2"
log "=== concurrent: two jobs of 4 emulated ranks at once"
for j in a b; do (TPAR_CACHE_DIR="$E2" timeout 200 "$BIN" tune --emulate-ranks 4 --cache -e 1M >"$OUT/emu-conc-$j.out" 2>&1; echo "rc=$?" >>"$OUT/emu-conc-$j.out") & done
wait
cat "$OUT"/emu-conc-*.out >>"$LOG"
nt=$(cat "$OUT"/emu-conc-*.out | grep -c 'tuned this machine in')
nc=$(cat "$OUT"/emu-conc-*.out | grep -c 'read from the cache in')
ne=$(ls "$E2/profiles" 2>/dev/null | grep -c '\.toml$')
if [ "$nt" -eq 1 ] && [ "$nc" -eq 1 ] && [ "$ne" -eq 1 ] && ! grep -q "rc=[1-9]" "$OUT"/emu-conc-*.out; then
    row "emulated: two jobs at once" "PASS" "1 tuned, 1 read the cache (after waiting for the lock); 1 entry"
else bad "emulated: two jobs at once" "tuned=$nt cached=$nc entries=$ne"; fi

# A tuner killed mid-tune.
E3="$OUT/cache-killed"
rm -rf "$E3"
log "=== killed: a start of 8 emulated ranks, SIGKILLed once it holds the tune lock"
TPAR_CACHE_DIR="$E3" "$BIN" tune --emulate-ranks 8 --cache -e 8M >"$OUT/emu-killed.out" 2>&1 &
job=$!
pid=""
for _ in $(seq 1 600); do
    pid=$(cat "$E3"/profiles/*.lock 2>/dev/null | head -c 16)
    [ -n "$pid" ] && break
    sleep 0.05
done
sleep 0.5
if [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; then
    wait "$job" 2>/dev/null
    left=$(ls "$E3/profiles" | grep -c '\.toml$')
    emu emu-after-kill "$E3" 200 --emulate-ranks 8 --cache -e 8M
    emu emu-after-kill2 "$E3" 60 --emulate-ranks 8 --cache -e 8M
    if [ "$left" -eq 0 ] && grep -q 'tuned this machine in' "$OUT/emu-after-kill.out" && grep -q 'read from the cache in' "$OUT/emu-after-kill2.out"; then
        row "emulated: a tuner killed mid-tune" "PASS" "no entry left; next start re-tuned ($(tuned_s "$OUT/emu-after-kill.out") s), the one after read it ($(read_ms "$OUT/emu-after-kill2.out") ms)"
    else bad "emulated: a tuner killed mid-tune" "entries left=$left; see emu-after-kill*.out"; fi
else
    wait "$job" 2>/dev/null
    bad "emulated: a tuner killed mid-tune" "no lock holder seen (pid='$pid'); see emu-killed.out"
fi

# ---------------------------------------------------------------- tpar.torch, shared GPU
SITE=/tmp/tpar-tune-site
rm -rf "$SITE"
if python3 -m pip install --quiet --no-index --no-deps --target "$SITE" "$WHEELS"/tpar-*.whl >>"$LOG" 2>&1; then
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    T1="$OUT/cache-torch"
    rm -rf "$T1"
    torch_run() { # TAG WORLD JOBS [env...]
        local tag=$1 w=$2 j=$3
        shift 3
        log "=== torch $tag: $w ranks x $j job(s) sharing GPU 0 $*"
        env "$@" TPAR_TOPOLOGY=h200-nvswitch-8 DEADLINE_S=150 timeout 170 python3 "$HERE/gpu_tune_torch.py" "$w" "$j" "$tag" --out "$OUT" >"$OUT/torch-$tag.out" 2>&1
        cat "$OUT/torch-$tag.out" >>"$LOG"
    }
    torch_run first 4 1 TPAR_CACHE_DIR="$T1"
    if grep -q "RESULT first job=0 world=4 start=tuned .*PASS" "$OUT/torch-first.out"; then
        row "tpar.torch 4 ranks: first start tunes" "PASS" "$(grep -o 'init_s=[0-9.]*' "$OUT/torch-first.out" | head -1) (constructor, tune included); $(grep -o 'tuned this machine in [0-9.]* s' "$OUT/torch-first.out" | head -1); 42 KiB bitwise OK"
    else bad "tpar.torch 4 ranks: first start tunes" "$(grep -E 'RESULT|LINE' "$OUT/torch-first.out" | head -2 | tr '\n' ' ')"; fi
    torch_run second 4 1 TPAR_CACHE_DIR="$T1"
    if grep -q "RESULT second job=0 world=4 start=cached .*PASS" "$OUT/torch-second.out"; then
        row "tpar.torch 4 ranks: second start reads the cache" "PASS" "$(grep -o 'init_s=[0-9.]*' "$OUT/torch-second.out" | head -1); $(grep -o 'read from the cache in [0-9.]* ms' "$OUT/torch-second.out" | head -1)"
    else bad "tpar.torch 4 ranks: second start reads the cache" "$(grep -E 'RESULT|LINE' "$OUT/torch-second.out" | head -2 | tr '\n' ' ')"; fi
    torch_run off 4 1 TPAR_CACHE_DIR="$T1" TPAR_TUNE=off
    if grep -q "RESULT off .*PASS" "$OUT/torch-off.out" && grep -q "no tune (TPAR_TUNE=off): the plan's defaults are in force" "$OUT/torch-off.out"; then
        row "tpar.torch: TPAR_TUNE=off" "PASS" "defaults, said on start; 42 KiB bitwise OK"
    else bad "tpar.torch: TPAR_TUNE=off" "see torch-off.out"; fi
    T2="$OUT/cache-torch-concurrent"
    rm -rf "$T2"
    torch_run concurrent 2 2 TPAR_CACHE_DIR="$T2"
    nt=$(grep -c "RESULT concurrent .*start=tuned .*PASS" "$OUT/torch-concurrent.out")
    nc=$(grep -c "RESULT concurrent .*start=cached .*PASS" "$OUT/torch-concurrent.out")
    if [ "$nt" -eq 1 ] && [ "$nc" -eq 1 ]; then row "tpar.torch: two jobs of 2 ranks at once" "PASS" "1 tuned, 1 read the cache"; else bad "tpar.torch: two jobs at once" "tuned=$nt cached=$nc"; fi
else
    bad "tpar.torch" "the wheel in $WHEELS did not install"
fi

{
    echo
    echo "## first-use tune on one $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) ($(date -u +%F))"
    echo
    echo "| check | result | figures |"
    echo "|---|---|---|"
    for r in "${rows[@]}"; do echo "$r"; done
    echo
    [ "$failed" -eq 0 ] && echo "ALL PASS" || echo "SOME FAILED"
} | tee "$OUT/tune-table.md" | tee -a "$LOG"
exit "$failed"

#!/usr/bin/env bash
# Round 8, call 2 (one H200): the kill stage after the liveness fallback (with a snapshot of
# what the survivors' check sees), the CPU dead-rank-with-a-forked-child test on this machine,
# and where the fused kernel's time goes (ablations, experiment build; not for results).
set -u
T0=$SECONDS; BUDGET=560
mkdir -p /tmp/b; for x in tpar tpar-exp tpar-rows; do gunzip -c .gpu/c2/$x.gz > /tmp/b/$x; chmod +x /tmp/b/$x; done
B=/tmp/b/tpar; X=/tmp/b/tpar-exp; R=/tmp/b/tpar-rows
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
mkdir -p "$OUT/eng" "$OUT/fused" "$OUT/diag"
echo "## $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) tpar $(sha256sum $B | cut -c1-16)"
S=()
st() { # NAME LIMIT FILE [ENV=V..] -- CMD..
  local name=$1 lim=$2 f=$3; shift 3; local envs=(X=1); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  local left=$((BUDGET - (SECONDS - T0))); [ $left -lt 15 ] && { S+=("SKIP $name (out of time)"); return; }
  [ $lim -gt $left ] && lim=$left
  local t=$SECONDS; env "${envs[@]}" timeout $lim "$@" > "$f" 2>&1; local rc=$?
  S+=("rc=$rc $name ($((SECONDS - t)) s): $(grep -m1 -E 'PASS|FAIL|wrong|error' "$f" | cut -c1-200)")
}
python3 - > "$OUT/diag/ns.txt" 2>&1 <<'PY'
import os
for p in ("/proc/self/ns/pid", "/proc/self/ns"):
    try: print(p, "readlink:", os.readlink(p) if os.path.islink(p) else os.listdir(p))
    except OSError as e: print(p, "readlink error:", repr(e))
    try: print(p, "stat ino:", os.stat(p).st_ino)
    except OSError as e: print(p, "stat error:", repr(e))
print("uname:", os.uname())
print("self/stat:", open("/proc/self/stat").read()[:200])
PY
SITE=/tmp/tpar-site-t; python3 -m pip install --quiet --no-index --no-deps --no-compile --target $SITE .gpu/kw/*.whl > "$OUT/diag/pip.txt" 2>&1
st cpu-dead-fork 90 "$OUT/diag/cpu-dead-fork.txt" PYTHONPATH=$SITE:python/tests -- python3 -c "
import json, ranks
for fork in (False, True):
    recs = ranks.run_ranks(3, 'dead_rank', env={'TPAR_TIMEOUT_MS': '3000'}, fork_child=fork)
    print('fork_child', fork, json.dumps([{k: r.get(k) for k in ('rank','returncode','ok','error_type','message','seconds','result')} for r in recs])[:1500])
"
FB=(bench --fused --emulate-ranks 8 -d bfloat16 --algo oneshot-pull,oneshot-push --mode graph --hidden 7168 --rows 1,3,8 -n 50 -w 5)
st fused-base 60 "$OUT/fused/base.txt" -- $B "${FB[@]}"
for e in NORES NONORM NOWAIT NOPF; do st fused-$e 40 "$OUT/fused/$e.txt" TPAR_EXP_DEFINES=-DEXP_$e -- $X "${FB[@]}"; done
st fused-base-pdl0 40 "$OUT/fused/base-pdl0.txt" TPAR_PDL=0 -- $B "${FB[@]}"
st rows-bench 60 "$OUT/fused/rows.txt" -- $R "${FB[@]}"
SF=($R selftest fused)
st rows-sf8 90 "$OUT/fused/rows-sf8.txt" -- "${SF[@]}" --emulate-ranks 2,8 -d all --hidden 4096,7168,8192 --rows 1,3,8,33,64 --seq-calls 12
st rows-host 40 "$OUT/fused/rows-host.txt" -- "${SF[@]}" --emulate-ranks 2,4 --transport host -d bfloat16 --hidden 7168 --rows 1,3,8,33 --seq-calls 8
st rows-skew 40 "$OUT/fused/rows-skew.txt" -- "${SF[@]}" --emulate-ranks 8 --skew-ns 20000 --mode graph -d bfloat16 --hidden 7168 --rows 1,3,8 --replays 3 --seq-calls 24
st engines 300 "$OUT/eng/stdout.txt" OUT="$OUT/eng" WORLDS="2 4 8" -- bash scripts/gpu-engines.sh .gpu/kw .gpu/engines
printf '%s\n' "${S[@]}" | tee "$OUT/summary.txt"
echo; cat "$OUT/diag/ns.txt"; cat "$OUT/diag/cpu-dead-fork.txt" | cut -c1-700
for f in base NORES NONORM NOWAIT NOPF base-pdl0 rows; do echo "== $f"; grep -E "^ +7168" "$OUT/fused/$f.txt" | awk '{print $2, $4, $5, $7, $13, $14}'; done
for f in rows-sf8 rows-host rows-skew; do echo "== $f"; tail -4 "$OUT/fused/$f.txt" | cut -c1-300; done
grep -E "kill|batchinv" "$OUT/eng/stdout.txt" | tail -8 | cut -c1-400
echo "end at $((SECONDS - T0)) s"
cd "$OUT" && tar czf all.tgz eng fused diag summary.txt && rm -rf eng fused diag

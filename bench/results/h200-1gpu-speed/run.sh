#!/usr/bin/env bash
# The speed branch's last GPU call (one H200): timings before/after in the same call, then the
# correctness sweep on the final binary. `run` with carry [".gpu-speed"]:
#   bash .gpu-speed/run.sh        (.gpu-speed/tpar-final = this branch, tpar-main = main's kernels)
set -uo pipefail
OUT="${OUT:-./gpu-out}"; mkdir -p "$OUT"
cd "$(dirname "$0")"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0 XDG_CACHE_HOME=/tmp/speedcache
NEW=./tpar-final; OLD=./tpar-main
LOG="$OUT/final.log"; : >"$LOG"
K="oneshot-push,oneshot-pull,twoshot-push,twoshot-pull,staged-push"
K4="oneshot-push,oneshot-pull,twoshot-push,twoshot-pull"
T0=$SECONDS; summary=()
# step NAME LIMIT [expect_fail] ENV... -- BIN ARGS
step() {
  local name="$1" limit="$2" expect=pass; shift 2
  [ "$1" = expect_fail ] && { expect=fail; shift; }
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  if [ $((SECONDS - T0 + limit / 4)) -gt 146 ]; then summary+=("SKIP  $name (time)"); return; fi
  echo "=== $name: ${envs[*]} $*" >>"$LOG"
  local t=$SECONDS; env "${envs[@]}" timeout "$limit" "$@" >>"$LOG" 2>&1; local rc=$?
  echo "=== $name: rc=$rc ($((SECONDS - t)) s)" >>"$LOG"
  if [ $expect = pass ]; then [ $rc -eq 0 ] && summary+=("PASS  $name ($((SECONDS - t)) s)") || summary+=("FAIL  $name rc=$rc")
  else [ $rc -ne 0 ] && summary+=("PASS  $name: caught as expected, rc=$rc ($((SECONDS - t)) s)") || summary+=("FAIL  $name: the guard-removed kernels passed"); fi
}
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "new $(sha256sum $NEW | cut -c1-16) old $(sha256sum $OLD | cut -c1-16)"; } >>"$LOG"
# Timings, before (OLD) and after (NEW), same call.
SEQ=(bench --emulate-ranks 2,4,8 --mode graph --sequence 122x42K -b 42K -e 42K -n 50 -w 5 -d bfloat16 --algo "$K")
GR=(bench --emulate-ranks 8 --mode graph -b 1K -e 4M -f 4 -n 50 -w 5 -d bfloat16 --algo "$K4")
HS=(bench --emulate-ranks 4 --transport host --mode graph --sequence 122x42K -b 42K -e 42K -n 30 -w 3 -d bfloat16)
step seq-old 30 -- $OLD "${SEQ[@]}"
step seq-new 30 -- $NEW "${SEQ[@]}"
step graph-old 40 -- $OLD "${GR[@]}"
step graph-new 40 -- $NEW "${GR[@]}"
step host-old 20 -- $OLD "${HS[@]}"
step host-new 20 -- $NEW "${HS[@]}"
step seq-new-nopdl 20 TPAR_PDL=0 -- $NEW bench --emulate-ranks 4,8 --mode graph --sequence 122x42K -b 42K -e 42K -n 50 -w 5 -d bfloat16 --algo "$K4"
# Correctness of the final binary.
step check-emulated 60 -- $NEW check --emulate-ranks 2,3,8 -e 1M --calls 300 -d all --algo all
step check-host 30 -- $NEW check --emulate-ranks 2,4 --transport host -e 1M --calls 100 -d all
step check-skew 30 -- $NEW check --emulate-ranks 8 --calls 1500 --skew-ns 20000 -e 256K -d all --algo "$K"
step graph-skew 40 -- $NEW selftest graph --emulate-ranks 2,8 --replays 20 --skew-ns 20000 --sequence 122x42K -d all
step graph-skew-nopdl 20 TPAR_PDL=0 -- $NEW selftest graph --emulate-ranks 4 --replays 20 --skew-ns 20000 --sequence 122x42K -d bfloat16
step unguarded-skew 30 expect_fail TPAR_TEST_UNSAFE_TWO_BUFFERS=1 TPAR_TIMEOUT_MS=300 XDG_CACHE_HOME=/tmp/speedcache-unsafe -- $NEW selftest graph --emulate-ranks 2,8 --replays 50 --skew-ns 5000 --sequence 122x256K -d bfloat16
step epoch-wrap 20 -- $NEW selftest epoch-wrap --emulate-ranks 4 --epoch-start 4294967290 -e 64K -d all
step timeout 20 TPAR_TIMEOUT_MS=200 -- $NEW selftest timeout --emulate-ranks 2,8
step mismatch 20 TPAR_TIMEOUT_MS=2000 -- $NEW selftest mismatch --emulate-ranks 2,8
step ipc 20 -- $NEW selftest ipc -e 1M -n 20 -w 2 --graph-inner 5 -d bfloat16
step procs-check 30 -- $NEW check --backend cuda --world 4 --plan-topology h200-nvswitch-8 -e 1M --calls 200 -d all
{ echo "# ---- summary ($((SECONDS - T0)) s) ----"; printf '%s\n' "${summary[@]}"; } | tee -a "$LOG" >"$OUT/summary.txt"
gzip -kf "$LOG"
# compact timing extract for the report
awk '/^=== (seq|graph|host)-(old|new)/ {s=$2} /^# algorithm:/ {a=$3; r=$0; sub(/.*ranks: /,"",r); sub(/ .*/,"",r)}
     /launch floor \(graph\)/ {n=split($0,f,"collective: "); split(f[2],g," "); print s, "floor", g[1]}
     /^ +[0-9]+ +[0-9]+ / && NF>=10 {print s, a, "w" r, $1, $5, "[" $6 "-" $7 "]", "wrong", $NF}' "$LOG" >"$OUT/timings.txt"
cat "$OUT/summary.txt"; grep -v floor "$OUT/timings.txt" | grep -E "w8 (1024|43008|4194304)|w4 43008" 

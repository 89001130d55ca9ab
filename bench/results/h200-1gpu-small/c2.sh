#!/usr/bin/env bash
# small branch, device call 2 (the last): (A) exploration of the send side of one-shot push
# (split sends, thread counts, store/load scopes, traces); (B) before/after timings, old =
# main's binary, new = this branch's binary with the candidate (-DTPAR_EXP_SPLIT +
# TPAR_EXP_PUSH_THREADS=1); (C) the correctness sweep of the candidate.
set -uo pipefail
OUT="${OUT:-./gpu-out}"; mkdir -p "$OUT"
cd "$(dirname "$0")"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0 XDG_CACHE_HOME=/tmp/smallcache
NEW=./tpar; OLD=./tpar-main
LOG="$OUT/c2.log"; SUM="$OUT/c2-summary.txt"; : >"$LOG"; : >"$SUM"
K="oneshot-push,oneshot-pull,twoshot-push,twoshot-pull,staged-push"
CAND=(TPAR_EXP_DEFINES=-DTPAR_EXP_SPLIT TPAR_EXP_PUSH_THREADS=1)
T0=$SECONDS; summary=()
# R LABEL ENV... -- BIN ARGS : a timing, summarised per row
R() {
  local label="$1"; shift; local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  if [ $((SECONDS - T0)) -gt 175 ]; then echo "SKIP $label" >>"$SUM"; return; fi
  echo "=== $label [$((SECONDS - T0))s]: ${envs[*]} $*" >>"$LOG"
  env "${envs[@]}" timeout 30 "$@" >"$OUT/.s" 2>&1; local rc=$?
  cat "$OUT/.s" >>"$LOG"
  awk -v L="$label" -v rc=$rc '
    /^# algorithm:/ {a=$3; sub(",","",a); r=$0; sub(/.*ranks: /,"",r); sub(/ .*/,"",r)}
    /launch floor \(graph\)/ {n=split($0,f,"collective: "); split(f[2],g," "); printf "%s floor-next-group %s\n", L, g[1]}
    /^ +[0-9]+ +[0-9]+ / && NF>=10 {printf "%s %s w%s %s %s [%s-%s] wrong %s\n", L, a, r, $1, $5, $6, $7, $NF}
    $1=="graph" && /us per call/ {printf "%s seq w%s %s %s [%s]\n", L, r, $2, $(NF-3), $4}
    END { if (rc != 0) printf "%s RC=%d\n", L, rc }' "$OUT/.s" >>"$SUM"
}
# step NAME LIMIT [expect_fail] ENV... -- BIN ARGS : a correctness step
step() {
  local name="$1" limit="$2" expect=pass; shift 2
  [ "$1" = expect_fail ] && { expect=fail; shift; }
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  if [ $((SECONDS - T0 + limit / 4)) -gt 200 ]; then summary+=("SKIP  $name (time)"); echo "SKIP  $name (time)" >>"$SUM"; return; fi
  echo "=== $name: ${envs[*]} $*" >>"$LOG"
  local t=$SECONDS; env "${envs[@]}" timeout "$limit" "$@" >>"$LOG" 2>&1; local rc=$?
  echo "=== $name: rc=$rc ($((SECONDS - t)) s)" >>"$LOG"
  if [ $expect = pass ]; then [ $rc -eq 0 ] && summary+=("PASS  $name ($((SECONDS - t)) s)") || summary+=("FAIL  $name rc=$rc")
  else [ $rc -ne 0 ] && summary+=("PASS  $name: caught as expected, rc=$rc ($((SECONDS - t)) s)") || summary+=("FAIL  $name: the guard-removed kernels passed"); fi
  echo "${summary[-1]}" >>"$SUM"
}
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "new $(sha256sum $NEW | cut -c1-16) old $(sha256sum $OLD | cut -c1-16)"; } | tee -a "$LOG" >>"$SUM"
B=(bench --emulate-ranks 2,4,8 --mode graph -n 30 -w 3 -c 0 -d bfloat16 -b 1K -e 42K -f 42 --sequence 122x42K)
# (A) exploration
R base -- $NEW "${B[@]}" --algo oneshot-push,oneshot-pull
R split TPAR_EXP_DEFINES=-DTPAR_EXP_SPLIT -- $NEW "${B[@]}" --algo oneshot-push
R split-pt "${CAND[@]}" -- $NEW "${B[@]}" --algo oneshot-push
R split-b32 TPAR_EXP_DEFINES=-DTPAR_EXP_SPLIT TPAR_BLOCKS=32 -- $NEW bench --emulate-ranks 4,8 --mode graph -n 30 -w 3 -c 0 -d bfloat16 -b 42K -e 42K --sequence 122x42K --algo oneshot-push
R split-b16t256 TPAR_EXP_DEFINES=-DTPAR_EXP_SPLIT TPAR_BLOCKS=16 TPAR_EXP_THREADS=256 -- $NEW bench --emulate-ranks 4,8 --mode graph -n 30 -w 3 -c 0 -d bfloat16 -b 42K -e 42K --sequence 122x42K --algo oneshot-push
mkdir -p "$OUT/traces"
for v in base:-DTPAR_EXP_TRACE split-pt:"-DTPAR_EXP_TRACE -DTPAR_EXP_SPLIT" sendgpu:"-DTPAR_EXP_TRACE -DTPAR_EXP_SEND_GPU" pollgpu:"-DTPAR_EXP_TRACE -DTPAR_EXP_POLL_GPU" sendweak:"-DTPAR_EXP_TRACE -DTPAR_EXP_SEND_WEAK"; do
  n=${v%%:*}; d=${v#*:}; mkdir -p "$OUT/traces/$n"
  R trace-$n TPAR_EXP_PUSH_THREADS=$([ $n = split-pt ] && echo 1 || echo "") "TPAR_EXP_DEFINES=$d" TPAR_EXP_TRACE="$OUT/traces/$n" -- $NEW "${B[@]}" --algo oneshot-push
done
(cd "$OUT" && tar czf traces.tgz traces && rm -rf traces)
# (B) before/after, same call
SEQ=(bench --emulate-ranks 2,4,8 --mode graph --sequence 122x42K -b 42K -e 42K -n 50 -w 5 -d bfloat16 --algo "$K")
SW=(bench --emulate-ranks 2,4,8 --mode graph -b 1K -e 64K -f 4 -n 50 -w 5 -d bfloat16 --algo oneshot-push,oneshot-pull,twoshot-push,twoshot-pull)
R seq-old -- $OLD "${SEQ[@]}"
R seq-new "${CAND[@]}" -- $NEW "${SEQ[@]}"
R sweep-old -- $OLD "${SW[@]}"
R sweep-new "${CAND[@]}" -- $NEW "${SW[@]}"
echo "timings done at $((SECONDS - T0)) s" >>"$SUM"
# (C) correctness of the candidate
step check-emulated 60 "${CAND[@]}" -- $NEW check --emulate-ranks 2,3,8 -e 1M --calls 300 -d all --algo all
step check-split-default 30 TPAR_EXP_DEFINES=-DTPAR_EXP_SPLIT -- $NEW check --emulate-ranks 2,3,8 -e 1M --calls 200 -d all --algo oneshot-push
step check-skew 30 "${CAND[@]}" -- $NEW check --emulate-ranks 8 --calls 1500 --skew-ns 20000 -e 256K -d all --algo "$K"
step graph-skew 40 "${CAND[@]}" -- $NEW selftest graph --emulate-ranks 2,8 --replays 20 --skew-ns 20000 --sequence 122x42K -d all
step graph-skew-1k 30 "${CAND[@]}" -- $NEW selftest graph --emulate-ranks 8 --replays 20 --skew-ns 20000 --sequence 122x1K -d all
step graph-skew-nopdl 20 "${CAND[@]}" TPAR_PDL=0 -- $NEW selftest graph --emulate-ranks 4 --replays 20 --skew-ns 20000 --sequence 122x42K -d bfloat16
step unguarded-skew 30 expect_fail "${CAND[@]}" TPAR_TEST_UNSAFE_TWO_BUFFERS=1 TPAR_TIMEOUT_MS=300 XDG_CACHE_HOME=/tmp/smallcache-unsafe -- $NEW selftest graph --emulate-ranks 2,8 --replays 50 --skew-ns 5000 --sequence 122x256K -d bfloat16
step timeout 20 "${CAND[@]}" TPAR_TIMEOUT_MS=200 -- $NEW selftest timeout --emulate-ranks 2,8
step mismatch 20 "${CAND[@]}" TPAR_TIMEOUT_MS=2000 -- $NEW selftest mismatch --emulate-ranks 2,8
step procs-check 30 "${CAND[@]}" -- $NEW check --backend cuda --world 4 --plan-topology h200-nvswitch-8 -e 1M --calls 200 -d all
step ipc 20 "${CAND[@]}" -- $NEW selftest ipc -e 1M -n 20 -w 2 --graph-inner 5 -d bfloat16
echo "# ---- correctness done ($((SECONDS - T0)) s) ----" | tee -a "$LOG" >>"$SUM"
rm -f "$OUT/.s"
gzip -f "$LOG"
cat "$SUM"

#!/usr/bin/env bash
# Round 16, call 6 (one H200): `new4` = the head's kernels: two-shot pull's fused norm spread
# over the grid with release/acquire tiles only where 2 cvec <= grid threads, else the
# previous publication and mapping exactly (call 5: the release/acquire publication itself
# cost 1-3 us at 32-64 rows). `old` = the previous head's kernels. Once each (the device
# time left), TPAR_ZERO_COPY=0, 2 / 4 / 8 emulated ranks, 7168 x 1-64 bf16, graphs, two-shot
# pull; selftest fused two-shot pull (8 ranks every dtype; 2 and 4 ranks; skewed graphs);
# tpar.torch, 2 rank processes, two-shot pull under TPAR_FUSED=1 (new4's wheel).
# Binaries (git-ignored, rebuild them): .gpu/r16b/tpar-old.gz = 5fb4b03's release tpar
# gzipped, .gpu/r16b/tpar-new4.gz = the head's (d1bf56b's kernels: 2199de0's with publish_tile
# shared; the run of 2026-12-03 18:02 used a build at 4f9143a, sha256 32dc5cb5cf973906: no
# kernel or Rust source changed after d1bf56b), .gpu/r16w/ = the same commit's wheel
# (maturin build --release).
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; C=.gpu/r16b
for b in old new4; do gunzip -c $C/tpar-$b.gz > $D/$b; chmod +x $D/$b; done
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
export XDG_CACHE_HOME=/tmp/r16-cache6 TPAR_TIMEOUT_MS=10000
echo "## $(date -u +%FT%TZ) $(for b in old new4; do echo -n "$b $(sha256sum $D/$b | cut -c1-16) "; done)"
mkdir -p "$OUT/f"
TS=(bench --fused --emulate-ranks 2,4,8 -d bfloat16 --mode graph --hidden 7168 --rows 1,3,8,16,32,64 -n 30 -w 5 --algo twoshot-pull)
TPAR_FUSED_ROWS=0 TPAR_ZERO_COPY=0 timeout 60 $D/old "${TS[@]}" > "$OUT/f/ts-old.txt" 2>&1; echo "ts-old rc=$? t=$((SECONDS-T0))"
TPAR_ZERO_COPY=0 timeout 60 $D/new4 "${TS[@]}" > "$OUT/f/ts-new4.txt" 2>&1; echo "ts-new4 rc=$? t=$((SECONDS-T0))"
SF=($D/new4 selftest fused --algo twoshot-pull)
run() { local n="$1"; shift; timeout 100 "$@" > "$OUT/f/$n.txt" 2>&1; echo "$n rc=$? t=$((SECONDS-T0)) $(grep -E '^(PASS|FAIL)' $OUT/f/$n.txt | head -2 | tr '\n' ' ')"; }
run sf8 "${SF[@]}" --emulate-ranks 8 -d all --hidden 1024,7168,16384 --rows 1,3,8,13,32,33,64 --seq-calls 24
run sf24 "${SF[@]}" --emulate-ranks 2,4 -d bfloat16,half --hidden 1024,4096,7168,8192 --rows 1,3,8,9,64 --seq-calls 12
run sfskew "${SF[@]}" --emulate-ranks 8 --skew-ns 20000 --mode graph -d bfloat16 --hidden 7168 --rows 1,3,8,16,64 --replays 3 --seq-calls 48
SITE=/tmp/site6; rm -rf $SITE; python3 -m pip install --quiet --no-index --no-deps --target $SITE .gpu/r16w/tpar-*.whl
run py2 env PYTHONPATH=$SITE TPAR_TOPOLOGY=h200-nvswitch-8 DEADLINE_S=100 TPAR_ALGO=twoshot-pull TPAR_FUSED=1 EXPECT_PATH=fused python3 scripts/gpu_fused_check.py 2 --out "$OUT/f"
grep RESULT "$OUT/f/py2.txt"
for b in old new4; do echo "== $b"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ +(one|two)|^# [0-9]+ emulated" "$OUT/f/ts-$b.txt" | awk '/^# [0-9]+ emulated/{printf "\n r%s:", $2; next} {printf " %s:%s/%s", $2,$7,$9}'; echo; done
echo "end at $((SECONDS - T0)) s"
cd "$OUT" && tar czf all.tgz f && rm -rf f

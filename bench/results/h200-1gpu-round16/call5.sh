#!/usr/bin/env bash
# Round 16, call 5 (one H200): `new3` = the spread norm only where the chunk mapping leaves at
# least half the grid idle (2 cvec <= grid threads; else each thread normalises its own puts,
# as before, with the same release/acquire publication); `new2` = call 4's (always spread),
# `old` = the previous head's kernels. Alternating twice, TPAR_ZERO_COPY=0, 2 / 4 / 8
# emulated ranks, 7168 x 1, 3, 8, 16, 32, 64 bf16, graphs, two-shot pull; then new3's
# correctness: selftest fused two-shot pull (8 ranks every dtype, hidden 1K-16K x rows 1-64;
# 2 and 4 ranks; skewed graphs; epoch wrap; two-shot pull has no host-transport kernel);
# tpar.torch, 2 and 4 rank processes, two-shot pull under TPAR_FUSED=1 (new3's wheel).
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; C=.gpu/r16b
for b in old new2 new3; do gunzip -c $C/tpar-$b.gz > $D/$b; chmod +x $D/$b; done
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
export XDG_CACHE_HOME=/tmp/r16-cache5 TPAR_TIMEOUT_MS=10000
echo "## $(date -u +%FT%TZ) $(for b in old new2 new3; do echo -n "$b $(sha256sum $D/$b | cut -c1-16) "; done)"
nvidia-smi --query-gpu=name,uuid,pci.bus_id,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
mkdir -p "$OUT/f"
TS=(bench --fused --emulate-ranks 2,4,8 -d bfloat16 --mode graph --hidden 7168 --rows 1,3,8,16,32,64 -n 30 -w 5 --algo twoshot-pull)
for i in 1 2; do
  TPAR_FUSED_ROWS=0 TPAR_ZERO_COPY=0 timeout 90 $D/old "${TS[@]}" > "$OUT/f/ts-old-$i.txt" 2>&1; echo "ts-old-$i rc=$? t=$((SECONDS-T0))"
  for b in new2 new3; do TPAR_ZERO_COPY=0 timeout 90 $D/$b "${TS[@]}" > "$OUT/f/ts-$b-$i.txt" 2>&1; echo "ts-$b-$i rc=$? t=$((SECONDS-T0))"; done
done
SF=($D/new3 selftest fused --algo twoshot-pull)
run() { local n="$1"; shift; timeout 150 "$@" > "$OUT/f/$n.txt" 2>&1; echo "$n rc=$? t=$((SECONDS-T0)) $(grep -E '^(PASS|FAIL)' $OUT/f/$n.txt | head -2 | tr '\n' ' ')"; }
run sf8 "${SF[@]}" --emulate-ranks 8 -d all --hidden 1024,4096,7168,8192,16384 --rows 1,2,3,5,8,13,32,33,63,64 --seq-calls 24
run sf24 "${SF[@]}" --emulate-ranks 2,4 -d bfloat16,half --hidden 1024,4096,7168,8192 --rows 1,3,4,8,9,64 --seq-calls 12
run sfskew "${SF[@]}" --emulate-ranks 8 --skew-ns 20000 --mode graph -d bfloat16 --hidden 7168 --rows 1,3,8,16,64 --replays 3 --seq-calls 48
run sfwrap "${SF[@]}" --emulate-ranks 4 --epoch-start 4294967290 -d bfloat16 --hidden 7168 --rows 1,3,8,33 --unfused-every 0 --seq-calls 12
# tpar.torch, rank processes sharing the GPU (correctness only), two-shot pull forced fused
SITE=/tmp/site5; rm -rf $SITE; python3 -m pip install --quiet --no-index --no-deps --target $SITE .gpu/r16w/tpar-*.whl
for n in 2 4; do
  run py$n env PYTHONPATH=$SITE TPAR_TOPOLOGY=h200-nvswitch-8 DEADLINE_S=100 TPAR_ALGO=twoshot-pull TPAR_FUSED=1 EXPECT_PATH=fused python3 scripts/gpu_fused_check.py $n --out "$OUT/f"
  tail -3 "$OUT/f/py$n.txt"
done
for b in old new2 new3; do for i in 1 2; do echo "== $b-$i"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ +(one|two)|^# [0-9]+ emulated" "$OUT/f/ts-$b-$i.txt" | awk '/^# [0-9]+ emulated/{printf "\n r%s:", $2; next} {printf " %s:%s/%s", $2,$7,$9}'; echo; done; done
echo "end at $((SECONDS - T0)) s"
cd "$OUT" && tar czf all.tgz f && rm -rf f

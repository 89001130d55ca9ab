#!/usr/bin/env bash
# Round 16, call 4 (one H200): the spread norm's row waits with acquire loads instead of
# relaxed polls and a fence (`new2`; call 3's `new` fenced after every row wait, which
# waits for the thread's own stores first). `old` / `new` / `new2` alternating twice,
# TPAR_ZERO_COPY=0, 2 / 4 / 8 emulated ranks, 7168 x 1, 3, 8, 16, 32, 64 bf16, graphs, two-shot
# pull; then new2's correctness: selftest fused two-shot pull (8 ranks every dtype, hidden
# 1K-16K x rows 1-64; 2 and 4 ranks; host; skewed graphs; epoch wrap).
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; C=.gpu/r16b
for b in old new new2; do gunzip -c $C/tpar-$b.gz > $D/$b; chmod +x $D/$b; done
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
export XDG_CACHE_HOME=/tmp/r16-cache4 TPAR_TIMEOUT_MS=10000
echo "## $(date -u +%FT%TZ) $(for b in old new new2; do echo -n "$b $(sha256sum $D/$b | cut -c1-16) "; done)"
nvidia-smi --query-gpu=name,uuid,pci.bus_id,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
mkdir -p "$OUT/f"
TS=(bench --fused --emulate-ranks 2,4,8 -d bfloat16 --mode graph --hidden 7168 --rows 1,3,8,16,32,64 -n 30 -w 5 --algo twoshot-pull)
for i in 1 2; do
  TPAR_FUSED_ROWS=0 TPAR_ZERO_COPY=0 timeout 90 $D/old "${TS[@]}" > "$OUT/f/ts-old-$i.txt" 2>&1; echo "ts-old-$i rc=$? t=$((SECONDS-T0))"
  for b in new new2; do TPAR_ZERO_COPY=0 timeout 90 $D/$b "${TS[@]}" > "$OUT/f/ts-$b-$i.txt" 2>&1; echo "ts-$b-$i rc=$? t=$((SECONDS-T0))"; done
done
SF=($D/new2 selftest fused --algo twoshot-pull)
run() { local n="$1"; shift; timeout 150 "$@" > "$OUT/f/$n.txt" 2>&1; echo "$n rc=$? t=$((SECONDS-T0)) $(grep -E '^(PASS|FAIL)' $OUT/f/$n.txt | head -2 | tr '\n' ' ')"; }
run sf8 "${SF[@]}" --emulate-ranks 8 -d all --hidden 1024,4096,7168,8192,16384 --rows 1,2,3,5,8,13,32,33,63,64 --seq-calls 24
run sf24 "${SF[@]}" --emulate-ranks 2,4 -d bfloat16,half --hidden 1024,4096,7168,8192 --rows 1,3,4,8,9,64 --seq-calls 12
run sfhost "${SF[@]}" --emulate-ranks 2,4 --transport host -d bfloat16,float --hidden 4096,7168 --rows 1,3,8,33 --seq-calls 12
run sfskew "${SF[@]}" --emulate-ranks 8 --skew-ns 20000 --mode graph -d bfloat16 --hidden 7168 --rows 1,3,8,16,64 --replays 3 --seq-calls 48
run sfwrap "${SF[@]}" --emulate-ranks 4 --epoch-start 4294967290 -d bfloat16 --hidden 7168 --rows 1,3,8,33 --unfused-every 0 --seq-calls 12
for b in old new new2; do for i in 1 2; do echo "== $b-$i"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ +(one|two)|^# [0-9]+ emulated" "$OUT/f/ts-$b-$i.txt" | awk '/^# [0-9]+ emulated/{printf "\n r%s:", $2; next} {printf " %s:%s/%s", $2,$7,$9}'; echo; done; done
echo "end at $((SECONDS - T0)) s"
cd "$OUT" && tar czf all.tgz f && rm -rf f

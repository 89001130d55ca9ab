#!/usr/bin/env bash
# Round 16, call 8 (one H200, a fresh start after calls 6-7): does the head (`new4`) lose
# anything where two-shot pull's fused norm is NOT spread (2 cvec > grid threads: 2 ranks x
# 32 / 64 rows, 4 and 8 ranks x 64)? Call 6 had one run each and 4 x 64 read +0.39 us. Here
# `old` and `new4` alternate three times (ABABAB), TPAR_ZERO_COPY=0, 7168 bf16, graphs,
# rows 16 / 32 / 64 (16: spread at every world, as a control). Same binaries as call 6
# (.gpu/r16b/, git-ignored: see call6.sh). Printed per rows: all-reduce / fused / all-reduce + add-RMSNorm.
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; C=.gpu/r16b
for b in old new4; do gunzip -c $C/tpar-$b.gz > $D/$b; chmod +x $D/$b; done
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
export XDG_CACHE_HOME=/tmp/r16-cache8 TPAR_TIMEOUT_MS=10000
echo "## $(date -u +%FT%TZ) $(for b in old new4; do echo -n "$b $(sha256sum $D/$b | cut -c1-16) "; done)"
mkdir -p "$OUT/f"
TS=(bench --fused --emulate-ranks 2,4,8 -d bfloat16 --mode graph --hidden 7168 --rows 16,32,64 -n 30 -w 5 --algo twoshot-pull)
for i in 1 2 3; do
  TPAR_FUSED_ROWS=0 TPAR_ZERO_COPY=0 timeout 60 $D/old "${TS[@]}" > "$OUT/f/ts-old-$i.txt" 2>&1; echo "old-$i rc=$? t=$((SECONDS-T0))"
  TPAR_ZERO_COPY=0 timeout 60 $D/new4 "${TS[@]}" > "$OUT/f/ts-new4-$i.txt" 2>&1; echo "new4-$i rc=$? t=$((SECONDS-T0))"
done
for b in old new4; do for i in 1 2 3; do echo -n "== $b-$i"; grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ +two|^# [0-9]+ emulated" "$OUT/f/ts-$b-$i.txt" | awk '/^# [0-9]+ emulated/{printf "\n r%s:", $2; next} {printf " %s:%s/%s/%s", $2,$5,$7,$9}'; echo; done; done
echo "end at $((SECONDS - T0)) s"
cd "$OUT" && tar czf all.tgz f && rm -rf f

#!/usr/bin/env bash
# Round 10, call 6: where the time goes, from inside the kernels: per-block %globaltimer
# stamps (EXP_STAMPS, call6-exp.diff on head 4538a4a+): entry, after the frame (pdl wait,
# state), after the start barrier, after the reduce (block-wide), after the end barrier /
# the norm; the bench prints, for the last call timed, per rank the median over blocks of
# each stamp minus the entry, and the spread of entries and last stamps over all blocks.
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; C=.gpu/r10
gunzip -c $C/tpar-exp5.gz > $D/x; chmod +x $D/x; X=$D/x
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0 EXP_STAMPS_PRINT=1
echo "## $(date -u +%FT%TZ) exp5 $(sha256sum $X | cut -c1-16)"
mkdir -p "$OUT/t"
for pdl in 1 0; do
for s in "" "-DEXP_STAMPS"; do
  n=zc-pdl$pdl${s:+-stamps}
  TPAR_PDL=$pdl TPAR_ZERO_COPY=1 TPAR_EXP_DEFINES="$s" timeout 60 $X bench --mode graph -b 256K -e 4M -f 4 -d bfloat16 -n 30 -w 5 --algo oneshot-pull,twoshot-pull --emulate-ranks 2,4 > "$OUT/t/$n.txt" 2>&1; echo "$n rc=$? t=$((SECONDS-T0))"
done; done
for s in "" "-DEXP_STAMPS"; do
  n=fused${s:+-stamps}
  TPAR_EXP_DEFINES="$s" timeout 60 $X bench --fused --emulate-ranks 8 -d bfloat16 --algo oneshot-pull --mode graph --hidden 7168 --rows 1,3,8 -n 50 -w 5 > "$OUT/t/$n.txt" 2>&1; echo "$n rc=$? t=$((SECONDS-T0))"
done
for f in "$OUT"/t/zc*.txt; do echo "== $(basename $f .txt)"; awk '/^# algorithm:/ {printf "\n%s/%s ", $3, $9} /^ +[0-9]+ +[0-9]+ bfloat16/ {printf "%s=%s ", $1, $5}' "$f"; echo; grep "^# stamps" "$f" | grep -v "rank [1-9]:" ; done 2>/dev/null | grep -v "^$" | cut -c1-230
for f in "$OUT"/t/fused*.txt; do echo "== $(basename $f .txt)"; grep -E "^ +7168|^# stamps" "$f" | grep -v "rank [1-9]:" | cut -c1-230; done
cd "$OUT" && tar czf t.tgz t && rm -rf t
echo "end at $((SECONDS - T0)) s"

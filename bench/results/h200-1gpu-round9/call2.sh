#!/usr/bin/env bash
# Round 9, call 2: large messages. exp64 = 64 blocks a rank (TPAR_MAX_BLOCKS 64), exp = 32
# with TPAR_IO_SLOTS variants of the registered reduce (io.cuh); vLLM beside.
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; C=.gpu/c2
gunzip -c $C/tpar-exp.gz > $D/tpar-exp; gunzip -c $C/tpar-exp64.gz > $D/tpar-exp64; chmod +x $D/tpar-exp*
X=$D/tpar-exp; X64=$D/tpar-exp64
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
mkdir -p "$OUT/t"
echo "## $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) exp $(sha256sum $X | cut -c1-16) exp64 $(sha256sum $X64 | cut -c1-16)"
bash bench/compare/vllm.sh build $C/vllm-src > "$OUT/t/nvcc.log" 2>&1; echo "vllm build rc=$?"
LIB=$PWD/.gpu/vllm-build/libtpar_vllm_ar.so
L=(bench --mode graph -b 256K -e 16M -f 4 -d bfloat16 --algo oneshot-pull,twoshot-pull -n 20 -w 3)
timeout 80 $X64 "${L[@]}" --emulate-ranks 2,4,8 --compare "vllm=$LIB" --json "$OUT/t/b64-auto.json" > "$OUT/t/b64-auto.txt" 2>&1; echo "b64 auto rc=$? t=$((SECONDS-T0))"
for b in 40 48 56 64; do
  TPAR_BLOCKS=$b timeout 60 $X64 "${L[@]}" --emulate-ranks 2 --json "$OUT/t/b64-w2-b$b.json" > "$OUT/t/b64-w2-b$b.txt" 2>&1; echo "b64 w2 blocks=$b rc=$? t=$((SECONDS-T0))"
done
TPAR_BLOCKS=64 TPAR_PDL=0 timeout 60 $X64 "${L[@]}" --emulate-ranks 2 --json "$OUT/t/b64-w2-b64-nopdl.json" > "$OUT/t/b64-w2-b64-nopdl.txt" 2>&1; echo "b64 w2 blocks=64 nopdl rc=$? t=$((SECONDS-T0))"
for s in 4 8; do
  TPAR_EXP_DEFINES="-DTPAR_IO_SLOTS=$s" timeout 70 $X "${L[@]}" --emulate-ranks 2,4,8 --json "$OUT/t/slots$s.json" > "$OUT/t/slots$s.txt" 2>&1; echo "slots=$s rc=$? t=$((SECONDS-T0))"
done
TPAR_EXP_DEFINES="-DTPAR_IO_SLOTS=8" timeout 70 $X64 "${L[@]}" --emulate-ranks 2,4,8 --json "$OUT/t/b64-slots8.json" > "$OUT/t/b64-slots8.txt" 2>&1; echo "b64 slots=8 rc=$? t=$((SECONDS-T0))"
for f in "$OUT"/t/*.txt; do echo "== $(basename $f)"; grep -E "^# algorithm|^ +[0-9]+ +[0-9]+ bfloat16" "$f" | awk '/^#/ {printf "%s %s ", $3, $9; next} {printf "%s ", $5} END {print ""}' | sed 's/# algorithm/\n/g'; done 2>/dev/null | cut -c1-300
echo "end at $((SECONDS - T0)) s"
cd "$OUT" && tar czf all.tgz t && rm -rf t

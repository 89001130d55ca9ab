#!/usr/bin/env bash
# Round 14, call 2 (one H200): `merge` (call 1's: frame.cuh's barrier_block as
# barrier_block_then with nothing between; kept, c1 dropped):
#  - the fused two-shot calls where the plan picks two-shot pull (graphs: above 128 KiB at 8
#    ranks, 256 KiB at 4), against the copy-path all-reduce a GpuCommunicator runs
#    (TPAR_ZERO_COPY=0) and the unfused path: 4 and 8 emulated ranks, 7168 x 10-64 rows;
#  - every correctness step of scripts/gpu-kernels.sh (verify) on `merge`, binary and wheel
#    (its plain one-shot and two-shot pull variants changed instruction order).
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; C=.gpu/r14
gunzip -c $C/tpar-merge.gz > $D/tpar; chmod +x $D/tpar
cp $C/merge/tpar-*.whl $D/; cp scripts/gpu_python_check.py $D/
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
echo "## $(date -u +%FT%TZ) merge $(sha256sum $D/tpar | cut -c1-16) wheel $(ls $D/*.whl | xargs -n1 basename)"
nvidia-smi --query-gpu=name,uuid,pci.bus_id,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
mkdir -p "$OUT/f"
TS=(bench --fused --emulate-ranks 4,8 -d bfloat16 --mode graph --hidden 7168 --rows 10,16,24,32,48,64 -n 50 -w 5 --algo oneshot-pull,twoshot-pull,twoshot-push)
XDG_CACHE_HOME=/tmp/r14-cache2 TPAR_ZERO_COPY=0 timeout 150 $D/tpar "${TS[@]}" > "$OUT/f/ts-copy-rows.txt" 2>&1; echo "ts-copy-rows rc=$? t=$((SECONDS-T0))"
grep -E "emulated ranks, transport|^ +[0-9]+ +[0-9]+ +[0-9]+ +(one|two)" "$OUT/f/ts-copy-rows.txt" | awk '/^#/{print; next} {printf "%s/%s %s AR %s F %s U %s f-AR %s U-f %s w%s\n", $1,$2,$4,$5,$7,$9,$13,$14,$15}'
OUT="$OUT/gk" BUDGET=$((560 - (SECONDS - T0))) bash scripts/gpu-kernels.sh $D verify > /dev/null 2>&1; echo "gpu-kernels verify rc=$? t=$((SECONDS-T0))"
cat "$OUT/gk/summary.txt" 2>/dev/null
echo "end at $((SECONDS - T0)) s"
cd "$OUT" && tar czf all.tgz f gk && rm -rf f gk

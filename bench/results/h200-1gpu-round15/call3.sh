#!/usr/bin/env bash
# Round 15, call 3 (one H200): every correctness step of scripts/gpu-kernels.sh (verify) on
# the head (b93b668: round 14's plain kernels, PTX unchanged; the staged fused variants;
# the settings parsers of e9c8066 and the fused route of aed3d6d / 005399b, last verified
# by gpu-kernels.sh before them), binary and wheel.
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; C=.gpu/r15c
gunzip -c $C/tpar.gz > $D/tpar; chmod +x $D/tpar
cp $C/tpar-*.whl $D/; cp scripts/gpu_python_check.py $D/
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
echo "## $(date -u +%FT%TZ) head $(sha256sum $D/tpar | cut -c1-16) wheel $(ls $D/*.whl | xargs -n1 basename)"
nvidia-smi --query-gpu=name,uuid,pci.bus_id,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
OUT="$OUT/gk" BUDGET=560 bash scripts/gpu-kernels.sh $D verify > /dev/null 2>&1; echo "gpu-kernels verify rc=$? t=$((SECONDS-T0))"
cat "$OUT/gk/summary.txt" 2>/dev/null
echo "end at $((SECONDS - T0)) s"
cd "$OUT" && tar czf all.tgz gk && rm -rf gk

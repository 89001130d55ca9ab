#!/usr/bin/env bash
# Round 14, call 3 (one H200): scripts/gpu-fused.sh on the head (call 2's `merge` + the fused
# route's rule: two-shot pull's fused kernel only under TPAR_FUSED=1, TPAR_FUSED=0 sends
# every call unfused; cuda/fused.rs fused_declined), binary and wheel. Its tpar.torch steps
# check the path each setting takes (EXPECT_PATH) beside the bits.
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; C=.gpu/r14h
gunzip -c $C/tpar.gz > $D/tpar; chmod +x $D/tpar; cp $C/tpar-*.whl $D/
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0
echo "## $(date -u +%FT%TZ) head $(sha256sum $D/tpar | cut -c1-16) wheel $(ls $D/*.whl | xargs -n1 basename)"
nvidia-smi --query-gpu=name,uuid,pci.bus_id,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
OUT="$OUT/gf" BUDGET=$((570 - (SECONDS - T0))) bash scripts/gpu-fused.sh $D > /dev/null 2>&1; echo "gpu-fused rc=$? t=$((SECONDS-T0))"
cat "$OUT/gf/summary.txt" 2>/dev/null; cat "$OUT/gf/table.txt" 2>/dev/null | head -16
zcat "$OUT/gf/fused.log.gz" 2>/dev/null | grep "^RESULT fused" | cut -c1-400
echo "end at $((SECONDS - T0)) s"
cd "$OUT" && tar czf all.tgz gf && rm -rf gf

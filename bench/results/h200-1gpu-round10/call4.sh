#!/usr/bin/env bash
# Round 10, call 4: does vLLM's one-stage kernel read through the non-coherent path
# (LDG...CONSTANT)? Its SASS (cuobjdump of the harness library) beside tpar's one-shot pull
# (the cubin NVRTC left in the kernel cache); then tpar's registered reduce with
# ld.global.nc (EXP_IO_NC) or plain loads (EXP_IO_PLAIN) for every rank (call4-exp.diff:
# timing only; .nc is not safe under PDL, see README).
set -u
T0=$SECONDS
D=/tmp/k; mkdir -p $D; C=.gpu/r10
gunzip -c $C/tpar-exp3.gz > $D/x; chmod +x $D/x; X=$D/x
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" NCCL_NVLS_ENABLE=0 XDG_CACHE_HOME=/tmp/k/cache
echo "## $(date -u +%FT%TZ) exp3 $(sha256sum $X | cut -c1-16)"
bash bench/compare/vllm.sh build $C/vllm-src > /dev/null 2>&1; echo "vllm build rc=$?"
LIB=$PWD/.gpu/vllm-build/libtpar_vllm_ar.so
CO=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
$CO -sass "$LIB" > "$OUT/vllm.sass" 2>&1; echo "vllm sass rc=$? $(wc -l < $OUT/vllm.sass) lines"
awk '/Function : .*1stage.*nv_bfloat16.*Li2E/ {p=1} /Function : / && !/1stage.*nv_bfloat16.*Li2E/ {p=0} p' "$OUT/vllm.sass" > "$OUT/vllm-1stage-bf16-2.sass"
echo "vLLM 1stage bf16 2 ranks: $(wc -l < $OUT/vllm-1stage-bf16-2.sass) lines; loads:"; grep -oE "LDG[.A-Z0-9]*|LD\.[.A-Z0-9]*" "$OUT/vllm-1stage-bf16-2.sass" | sort | uniq -c
mkdir -p "$OUT/t"
L=(bench --mode graph -b 256K -e 4M -f 4 -d bfloat16 -n 30 -w 5 --algo oneshot-pull,twoshot-pull --compare "vllm=$LIB")
run() { local name=$1 ranks=$2; shift 2; env TPAR_ZERO_COPY=1 "$@" timeout 60 $X "${L[@]}" --emulate-ranks $ranks > "$OUT/t/$name.txt" 2>&1; echo "$name rc=$? t=$((SECONDS-T0))"; }
run base 2,4,8 TPAR_EXP_DEFINES=""
run nc 2,4,8 TPAR_EXP_DEFINES="-DEXP_IO_NC"
run plain 2,4,8 TPAR_EXP_DEFINES="-DEXP_IO_PLAIN"
run nc-pdl0 2,4,8 TPAR_PDL=0 TPAR_EXP_DEFINES="-DEXP_IO_NC"
run base-pdl0 2,4,8 TPAR_PDL=0 TPAR_EXP_DEFINES=""
for f in "$OUT"/t/*.txt; do echo "== $(basename $f .txt)"; awk '/^# algorithm:/ {printf "\n%s/%s ", $3, $9} /^ +[0-9]+ +[0-9]+ bfloat16/ {printf "%s=%s ", $1, $5}' "$f"; echo; done 2>/dev/null | grep -v "^$" | cut -c1-200
ls -R /tmp/k/cache | head -20; n=0
for f in $(find /tmp/k/cache -type f | head -400); do if $CO -sass "$f" 2>/dev/null | grep -q "oneshot_pull_bf16"; then n=$((n+1)); echo "tpar cubin $n: $f"; $CO -sass "$f" > "$OUT/tpar-oneshot-pull-$n.sass" 2>&1; echo "loads:"; grep -oE "LDG[.A-Z0-9]*|LD\.[.A-Z0-9]*" "$OUT/tpar-oneshot-pull-$n.sass" | sort | uniq -c; fi; done
gzip -f "$OUT"/*.sass; cd "$OUT" && tar czf t.tgz t && rm -rf t
echo "end at $((SECONDS - T0)) s"

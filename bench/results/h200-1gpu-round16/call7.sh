#!/usr/bin/env bash
# Round 16, call 7 (one H200, right after call 6 on the same start): `scripts/gpu-fused.sh` on
# the head's release binary and wheel (the `new4` of call 6: sha256 32dc5cb5cf973906, built
# at 4f9143a, whose kernels are d1bf56b's), copied uncompressed into .gpu/r17/ (git-ignored:
# `cargo build --release -p tpar-cli`, `maturin build --release -o .gpu/r17`), carry [".gpu"].
# The command as run (device tool, timeout 600 s):
mkdir -p $OUT/gf
OUT=$OUT/gf BUDGET=560 bash scripts/gpu-fused.sh .gpu/r17 > $OUT/gf/stdout.txt 2>&1; echo rc=$?
cat $OUT/gf/summary.txt; cat $OUT/gf/table.txt
# gpu-fused.sh then left 16 files in $OUT/gf; the device tool brings back at most 8, so
# summary.txt, table.txt, fused.log.gz and four JSON records stayed behind (gpu-fused.sh now
# archives them: c2ec676). call7/all.tgz holds the 8 JSON files that came back and the
# printed summary and table (printed.txt, copied from the call's output).

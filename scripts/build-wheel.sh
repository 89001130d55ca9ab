#!/usr/bin/env bash
# Builds tpar's Python wheel (release, abi3: one file for every CPython >= 3.9 on x86_64 Linux)
# into target/wheels/, for engine users to install with pip on machines without Rust:
#
#   scripts/build-wheel.sh                 # prints the wheel's path on its last line
#   pip install target/wheels/tpar-*.whl   # on the serving box (torch: the engine's own)
#
# Needs Rust (cargo) and Python 3 with pip. maturin is taken from .venv/ when
# scripts/install-python.sh made one, else pip installs it into the git-ignored
# .wheel-tools/ (a venv of its own; nothing outside the clone changes).
#
# The manylinux tag: the wheel's native module is linked against this machine's glibc, so the
# tag says which glibc it needs at least; maturin reads the symbol versions it uses and
# names the lowest tag they allow (`--compatibility` may not claim lower). Built on glibc
# 2.36 that is manylinux_2_34 (Rust's standard library calls glibc 2.34's versions of the
# pthread and start-up symbols): it installs on Ubuntu 22.04 (2.35) and RHEL 9 (2.34), not on
# RHEL 8 (2.28). docs/python.md says how to go lower.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
out="$root/target/wheels"

if [ -x .venv/bin/maturin ]; then
    maturin=.venv/bin/maturin
else
    tools=.wheel-tools
    if [ ! -x "$tools/bin/maturin" ]; then
        echo "installing maturin into $tools/" >&2
        python3 -m venv "$tools"
        "$tools/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir "maturin>=1.9.3,<2" >&2
    fi
    maturin="$tools/bin/maturin"
fi
command -v cargo >/dev/null || { echo "build-wheel.sh: cargo not found: building the wheel needs Rust (rust-version in Cargo.toml)" >&2; exit 1; }

mkdir -p "$out"
# Only this build's wheel in the folder's listing below: an older one of the same version is
# replaced by maturin, others stay.
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
"$maturin" build --release --locked --out "$out" 2>&1 | tee "$log" >&2
wheel="$(sed -n 's/.*Built wheel for abi3 Python ≥ [0-9.]* to \(.*\.whl\).*/\1/p' "$log" | tail -1)"
if [ -z "$wheel" ] || [ ! -f "$wheel" ]; then
    wheel="$(ls -t "$out"/tpar-*.whl 2>/dev/null | head -1)"
fi
[ -n "$wheel" ] && [ -f "$wheel" ] || { echo "build-wheel.sh: no wheel in $out" >&2; exit 1; }
echo "wheel: $(basename "$wheel") ($(du -h "$wheel" | cut -f1))" >&2
echo "$wheel"

#!/usr/bin/env bash
# Builds tpar's Python wheel (release, abi3: one file for every CPython >= 3.9 on x86_64 Linux)
# into target/wheels/, for engine users to install with pip on machines without Rust:
#
#   scripts/build-wheel.sh [--native]      # prints the wheel's path on its last line
#   pip install target/wheels/tpar-*.whl   # on the serving box (torch: the engine's own)
#
# Needs Rust (cargo) and Python 3 with pip: pip installs maturin and ziglang into the
# git-ignored .wheel-tools/ (a venv of its own; nothing outside the clone changes).
#
# The manylinux tag says which glibc the wheel needs at least: the native module is linked
# against a glibc, and maturin names the lowest tag its symbol versions allow (and refuses a
# lower --compatibility). Linked against this machine's glibc (2.36), the symbols are 2.34's
# (glibc 2.34 moved pthread_*, dlopen and shm_open into libc.so.6 with new versions):
# manylinux_2_34, which RHEL 8 (2.28) cannot install. So by default the module is linked with
# zig against glibc 2.28's symbol stubs (`maturin --zig`): manylinux_2_28, for RHEL 8 and
# newer, Ubuntu 22.04 and RHEL 9 included. `--native` links with the system's linker instead
# (no zig; the tag is then whatever this machine's glibc gives, manylinux_2_34 here).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
out="$root/target/wheels"
native=0
case "${1:-}" in
    --native) native=1 ;;
    "") ;;
    *) echo "usage: scripts/build-wheel.sh [--native]" >&2; exit 2 ;;
esac
command -v cargo >/dev/null || { echo "build-wheel.sh: cargo not found: building the wheel needs Rust (rust-version in Cargo.toml)" >&2; exit 1; }

tools="$root/.wheel-tools"
want=("maturin>=1.9.3,<2")
[ "$native" -eq 0 ] && want+=("ziglang>=0.13")
stamp="$tools/.complete-$native"
if [ ! -f "$stamp" ]; then
    echo "installing ${want[*]} into .wheel-tools/" >&2
    [ -x "$tools/bin/python" ] || python3 -m venv "$tools"
    "$tools/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir "${want[@]}" >&2
    touch "$stamp"
fi
# maturin finds zig as `python3 -m ziglang` of the python3 on PATH: the tools' own.
export PATH="$tools/bin:$PATH"
args=(build --release --locked --out "$out")
[ "$native" -eq 0 ] && args+=(--zig --compatibility manylinux_2_28)

mkdir -p "$out"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
"$tools/bin/maturin" "${args[@]}" 2>&1 | tee "$log" >&2
wheel="$(sed -n 's/.*Built wheel for abi3 Python ≥ [0-9.]* to \(.*\.whl\).*/\1/p' "$log" | tail -1)"
if [ -z "$wheel" ] || [ ! -f "$wheel" ]; then
    wheel="$(ls -t "$out"/tpar-*.whl 2>/dev/null | head -1)"
fi
[ -n "$wheel" ] && [ -f "$wheel" ] || { echo "build-wheel.sh: no wheel in $out" >&2; exit 1; }
echo "wheel: $(basename "$wheel") ($(du -h "$wheel" | cut -f1))" >&2
echo "$wheel"

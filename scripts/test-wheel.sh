#!/usr/bin/env bash
# The engine user's first hour, without Rust: the release wheel (scripts/build-wheel.sh, or
# the file given as $1) goes into a fresh venv (the git-ignored .wheel-venv/) with pip alone,
# and every step after the build runs with no cargo or rustc on PATH: `import tpar`,
# `python -m tpar.doctor`, and the README's CPU example (examples/tp_decode.py on two CPU
# ranks, gloo against tpar, bitwise). Exits non-zero on any failure; the closing line is
# `wheel: N passed, M failed`.
#
# torch is the engine's own, never the wheel's: here, the project's .venv/
# (scripts/install-python.sh), made visible to the fresh venv through a .pth file, after the
# venv's own site-packages (so the tpar imported is the wheel's, which step 3 checks). Without
# .venv/ the example's step fails and says why.
set -uo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
venv="$root/.wheel-venv"
passed=0
failed=0
step() { # step NAME COMMAND...: runs it, counts it, shows its output on failure
    local name="$1" out rc
    shift
    out="$("$@" 2>&1)"
    rc=$?
    if [ $rc -eq 0 ]; then
        passed=$((passed + 1))
        echo "ok   $name"
        [ -n "${WHEEL_VERBOSE:-}" ] && printf '%s\n' "$out" | sed 's/^/     /'
    else
        failed=$((failed + 1))
        echo "FAIL $name (exit $rc)"
        printf '%s\n' "$out" | tail -40 | sed 's/^/     /'
    fi
    return 0
}
finish() {
    echo "wheel: $passed passed, $failed failed"
    [ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
    exit $?
}

# 1. The wheel (built with Rust: the one step that may use it).
wheel="${1:-}"
if [ -z "$wheel" ]; then
    if wheel="$(scripts/build-wheel.sh | tail -1)" && [ -f "$wheel" ]; then
        passed=$((passed + 1)); echo "ok   build: $(basename "$wheel")"
    else
        failed=$((failed + 1)); echo "FAIL build: scripts/build-wheel.sh"; finish
    fi
fi
wheel="$(cd "$(dirname "$wheel")" && pwd)/$(basename "$wheel")"
echo "     $(basename "$wheel") $(du -h "$wheel" | cut -f1)"

# 2. A fresh venv, and a PATH of the venv and the system's programs less any Rust tool.
rm -rf "$venv"
python="$(command -v python3)"
"$python" -m venv "$venv" || { failed=$((failed + 1)); echo "FAIL venv: $python -m venv"; finish; }
sysbin="$venv/system-bin" # /usr/bin and /bin, less cargo, rustc, rustup and their kin
mkdir -p "$sysbin"
for d in /usr/bin /bin; do
    for f in "$d"/*; do
        n="${f##*/}"
        case "$n" in cargo | cargo-* | rustc | rustup | rustdoc | rust-* | rustfmt | clippy-driver) continue ;; esac
        [ -e "$sysbin/$n" ] || ln -s "$f" "$sysbin/$n"
    done
done
export PATH="$venv/bin:$sysbin"
unset CARGO_HOME RUSTUP_HOME CARGO_TARGET_DIR VIRTUAL_ENV PYTHONPATH
hash -r
no_rust() { ! command -v cargo && ! command -v rustc && echo "no cargo, no rustc on PATH=$PATH"; }
step "no cargo or rustc on PATH" no_rust

# 3. pip, from the wheel alone (before torch's site-packages become visible: pip would
# otherwise find the project's own tpar there and install nothing).
py="$venv/bin/python"
step "pip install --no-index --find-links $(basename "$(dirname "$wheel")") $(basename "$wheel")" \
    "$py" -m pip install --quiet --disable-pip-version-check --no-cache-dir --no-index --find-links "$(dirname "$wheel")" "$wheel"
# torch, the engine's: the project's .venv (its site-packages after the venv's own).
site="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
torch_site="$(ls -d "$root"/.venv/lib/python3*/site-packages 2>/dev/null | head -1)"
if [ -n "$torch_site" ] && [ -d "$torch_site/torch" ]; then
    echo "$torch_site" >"$site/zz-engine-torch.pth"
fi

step "import tpar (the wheel's, in the fresh venv)" "$py" -c "
import os, sys, tpar
where = os.path.realpath(tpar.__file__)
assert where.startswith(os.path.realpath('$venv') + os.sep), 'tpar imported from ' + where
print('tpar', tpar.__version__, 'from', where)
"
step "python -m tpar.doctor" "$py" -m tpar.doctor

# 4. The CPU example (README): two CPU ranks, gloo, then tpar compared bitwise.
example() {
    [ -n "$torch_site" ] && [ -d "$torch_site/torch" ] || { echo "no torch: the project's .venv/ is missing (scripts/install-python.sh makes it)"; return 1; }
    local tmp rc out
    tmp="$(mktemp -d)"
    run() { (cd "$tmp" && OMP_NUM_THREADS=1 "$py" -m torch.distributed.run --standalone --nproc-per-node 2 "$root/examples/tp_decode.py" \
        --device cpu --preset tiny --layers 2 --iters 2 "$@"); }
    out="$(run --allreduce gloo --save "$tmp/gloo.pt" 2>&1)" && out="$out
$(run --allreduce tpar --compare "$tmp/gloo.pt" 2>&1)"
    rc=$?
    rm -rf "$tmp"
    printf '%s\n' "$out"
    [ $rc -eq 0 ] && grep -q "tpar on cpu" <<<"$out" && grep -q "bitwise equal True" <<<"$out"
}
step "examples/tp_decode.py --device cpu (gloo, then tpar: bitwise equal)" example
finish

#!/usr/bin/env bash
# tpar's CPU backend against Open MPI's MPI_Allreduce, both measured in the same run.
#
#   bench/compare/vs-mpi.sh                      # 2 and 4 ranks, 8 B .. 8 MiB by x4, 5 repetitions
#   bench/compare/vs-mpi.sh --world 2 --reps 3 -b 1K -e 1M -f 2 --algo auto
#   bench/compare/vs-mpi.sh --tpar /path/to/another/tpar      # e.g. an older build, for a before/after
#   bench/compare/vs-mpi.sh --busy 1             # with one busy process (`yes`) beside each job
#
# For each world size and repetition it runs MPI_Allreduce (float, bench/compare/mpi_allreduce.c)
# and `tpar bench` (float and bfloat16; the plan's pick per size unless --algo says otherwise)
# one after the other, so both see the same machine load, then prints one table per world:
# the median over repetitions of each run's median per-call time, the spread of those
# medians (min-max), and MPI / tpar (above 1: tpar is faster). bfloat16 is compared with
# MPI's float at the same byte count (MPI has no bfloat16 sum). Both sides time calls the
# same way: back to back after a barrier, the slowest rank per iteration, median.
# --busy N starts N busy processes (`yes > /dev/null`) before each MPI and each tpar job
# and ends them after it: cores shared with another program, as on CI machines and laptops.
#
# Needs: mpicc and mpirun (installed with apt-get from the system's packages if missing),
# cargo, python3. Not part of the test command. Runs as root with --allow-run-as-root.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
worlds="2 4"; reps=5; busy=0; minb=8; maxb=8M; factor=4; iters=50; warmup=10; algo=auto; keep=""; tpar=""
while [ $# -gt 0 ]; do
    case "$1" in
        --world) worlds="$2"; shift 2 ;;
        --reps) reps="$2"; shift 2 ;;
        -b) minb="$2"; shift 2 ;;
        -e) maxb="$2"; shift 2 ;;
        -f) factor="$2"; shift 2 ;;
        -n) iters="$2"; shift 2 ;;
        -w) warmup="$2"; shift 2 ;;
        --algo) algo="$2"; shift 2 ;;
        --keep) keep="$2"; shift 2 ;;
        --tpar) tpar="$2"; shift 2 ;;
        --busy) busy="$2"; shift 2 ;;
        -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
        *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
    echo "# installing Open MPI from the system's packages (openmpi-bin libopenmpi-dev)" >&2
    if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
    $sudo apt-get install -y openmpi-bin libopenmpi-dev >/dev/null
fi
work=${keep:-$(mktemp -d)}
mkdir -p "$work"
[ -n "$keep" ] || trap 'rm -rf "$work"' EXIT
mpicc -O2 -o "$work/mpi_allreduce" "$here/mpi_allreduce.c" -lm
built_here=""
if [ -z "$tpar" ]; then
    built_here=1
    (cd "$root" && cargo build --release -q -p tpar-cli)
    tpar="${CARGO_TARGET_DIR:-$root/target}/release/tpar"  # where cargo just built it
fi
mpirun_flags="--allow-run-as-root --oversubscribe --bind-to none"

echo "# machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(uname -r)"
echo "# Open MPI $(mpirun --version 2>/dev/null | head -1 | awk '{print $NF}'), tpar: $tpar${built_here:+ (built from $(cd "$root" && git rev-parse --short HEAD 2>/dev/null || echo '?'))}"
echo "# load at start: $(cut -d' ' -f1-3 /proc/loadavg)$([ "$busy" -gt 0 ] && echo "; busy processes beside each job: $busy")"
busy_pids=""
start_busy() {
    busy_pids=""
    for _ in $(seq 1 "$busy"); do
        yes >/dev/null &
        busy_pids="$busy_pids $!"
    done
}
stop_busy() {
    for p in $busy_pids; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    busy_pids=""
}
trap 'stop_busy; [ -n "$keep" ] || rm -rf "$work"' EXIT
for w in $worlds; do
    for r in $(seq 1 "$reps"); do
        start_busy
        mpirun $mpirun_flags -np "$w" "$work/mpi_allreduce" -b "$minb" -e "$maxb" -f "$factor" -n "$iters" -w "$warmup" \
            > "$work/mpi.$w.$r.txt"
        stop_busy
        start_busy
        "$tpar" bench --backend cpu --world "$w" -b "$minb" -e "$maxb" -f "$factor" -n "$iters" -w "$warmup" \
            -d float,bfloat16 --algo "$algo" --json "$work/tpar.$w.$r.json" > "$work/tpar.$w.$r.txt"
        stop_busy
    done
done
echo "# load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$work" "$worlds" "$reps" <<'PY'
import json, statistics, sys
work, worlds, reps = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
def spread(xs):
    return statistics.median(xs), min(xs), max(xs)
for w in worlds:
    mpi, tp = {}, {}
    for r in range(1, reps + 1):
        for line in open(f"{work}/mpi.{w}.{r}.txt"):
            if line.startswith("#"):
                continue
            b, _c, med, _p10, _p90, wrong = line.split()
            if int(wrong):
                print(f"# MPI: {wrong} wrong elements at {b} B, {w} ranks")
            mpi.setdefault(int(b), []).append(float(med))
        for rec in json.load(open(f"{work}/tpar.{w}.{r}.json")):
            if rec.get("wrong"):
                print(f"# tpar: {rec['wrong']} wrong elements at {rec['bytes']} B {rec['dtype']}, {w} ranks")
            tp.setdefault((rec["dtype"], rec["bytes"]), []).append((rec["time_us"], rec["algorithm"]))
    print(f"#\n# {w} ranks: median of {reps} runs' medians (us per call), [min-max of those]; ratio = MPI / tpar (> 1: tpar faster)")
    print(f"# {'size (B)':>10} {'MPI float':>10} {'[min-max]':>19} {'tpar float':>10} {'[min-max]':>19} {'ratio':>6} {'tpar bf16':>10} {'[min-max]':>19} {'ratio':>6}  algorithm (float / bf16)")
    for b in sorted(mpi):
        m, mlo, mhi = spread(mpi[b])
        cols = [f"  {b:>10} {m:>10.2f} {f'[{mlo:.2f}-{mhi:.2f}]':>19}"]
        algos = []
        for d in ("float", "bfloat16"):
            runs = tp.get((d, b))
            if not runs:
                cols.append(f"{'-':>10} {'':>19} {'-':>6}")
                continue
            t, lo, hi = spread([x for x, _ in runs])
            cols.append(f"{t:>10.2f} {f'[{lo:.2f}-{hi:.2f}]':>19} {m / t:>6.2f}")
            algos.append("/".join(sorted({a for _, a in runs})))
        print(" ".join(cols) + "  " + " / ".join(algos))
PY

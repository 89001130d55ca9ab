#!/usr/bin/env python3
"""Compares the head with the commit before it from `scripts/gpu-kernels.sh DIR ab`'s ab.txt
(or any `tpar bench` tables under "=== {sweep,seq,eager,small}-{after,before}-REP" headers):
per (mode, ranks, algorithm, size), the median over repetitions of each binary's median per
call, and after / before. Prints one line per point, then the ratios' range and median.

    python3 scripts/ab_compare.py ab.txt [--over 0.03]   # --over: mark ratios beyond 1 +- x
"""
import argparse
import collections
import re
import statistics


def parse(text):
    res = collections.defaultdict(lambda: collections.defaultdict(list))
    mode = who = algo = world = None
    for line in text.splitlines():
        m = re.match(r"=== (sweep|seq|eager|small)-(after|before)-(\d+)", line)
        if m:
            mode, who, _ = m.groups()
            continue
        m = re.match(r"# algorithm: (\S+), transport: \S+, ranks: (\d+)", line)
        if m:
            algo, world = m.group(1).rstrip(","), int(m.group(2))
            continue
        m = re.match(r"\s+(\d+)\s+\d+\s+\S+\s+sum\s+([\d.]+)", line)
        if m and mode and algo:
            res[(mode, world, algo, int(m.group(1)))][who].append(float(m.group(2)))
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--over", type=float, default=0.03)
    a = ap.parse_args()
    with open(a.file) as f:
        res = parse(f.read())
    ratios = []
    for k in sorted(res):
        after, before = res[k]["after"], res[k]["before"]
        if not after or not before:
            continue
        r = statistics.median(after) / statistics.median(before)
        ratios.append(r)
        mark = "  <--" if abs(r - 1) > a.over else ""
        print(f"{k[0]:5} {k[1]:2} {k[2]:13} {k[3]:>9} B  after {statistics.median(after):9.2f}  before {statistics.median(before):9.2f}  ratio {r:.3f}{mark}")
    if not ratios:
        raise SystemExit("no point has both an after and a before figure")
    print(f"points {len(ratios)}: after/before {min(ratios):.3f}-{max(ratios):.3f}, median {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Decodes the `# raw` lines of trace.diff's build (TPAR_TEST_STAMPS=1, `tpar bench --fused`):
per block, 16 u32 words = thread 0's 32-bit %clock at the trace points (0 entry, 1 frame,
2 input copied, 3 start barrier passed, 4 sum, 5 residual added, 6 tile summed, 7 tile sent
(cluster), 8 put done, 9 loop done, 10 row tiles waited for, 11 1/rms, 12 output computed,
13 end) and %globaltimer's low word at entry (14) and end (15). Prints, per world, op and
rows, the median and max over blocks of each point's cycles after point 1 (the PDL wait
passed), and the SM clock (cycles / ns over entry..end).
Usage: decode.py FILE [--segments]   (--segments: each point minus the one before, medians)"""
import re
import statistics as st
import sys

NAMES = {0: "entry", 1: "frame", 2: "copied", 3: "barrier", 4: "sum", 5: "+resid", 6: "tile", 7: "sent",
         8: "put", 9: "loop", 10: "waited", 11: "inv", 12: "out", 13: "end"}


def groups(path):
    world, out = None, {}
    for line in open(path):
        m = re.match(r"# (\d+) emulated ranks", line)
        if m:
            world = int(m.group(1))
            continue
        if not line.startswith("# raw"):
            continue
        p = line.split()
        i = p.index("x")
        label, rows = " ".join(p[2:i - 1]), int(p[i - 1])
        words = list(map(int, p[i + 4:]))
        out.setdefault((world, label, rows), []).append(words)
    return out


def main():
    path, seg = sys.argv[1], "--segments" in sys.argv
    for (world, label, rows), blocks in groups(path).items():
        if "add-rmsnorm" in label:
            continue
        ks = [k for k in range(2, 14) if all(w[k] != 0 for w in blocks)]
        ghz = st.median([((w[13] - w[0]) % 2**32) / max(1, (w[15] - w[14]) % 2**32) for w in blocks])
        cells = []
        prev = 1
        for k in ks:
            if seg:
                d = [((w[k] - w[prev]) % 2**32) for w in blocks]
                cells.append(f"{NAMES[prev]}->{NAMES[k]} {int(st.median(d))}")
                prev = k
            else:
                d = [((w[k] - w[1]) % 2**32) for w in blocks]
                cells.append(f"{NAMES[k]} {int(st.median(d))}/{max(d)}")
        what = "segments, median cycles" if seg else "cycles after the PDL wait, median/max"
        print(f"{world} ranks {label} x {rows}: {len(blocks)} blocks, SM {ghz:.2f} GHz; {what}: " + ", ".join(cells))


if __name__ == "__main__":
    main()

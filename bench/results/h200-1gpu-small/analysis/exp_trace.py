# Analyses the EXPERIMENT traces: per rank 256 records of 8 u64 (t0 entry, t1 after
# griddepcontrol.wait, t2 state+input loaded, t3 sends issued (push) / barrier passed (pull),
# t4 first vector reduced, t5 before frame_end, t6 clock64 cycles t1..t5, t7 epoch | rank<<32).
import struct, sys, os, statistics as st, collections
def med(x): return st.median(x) if x else float('nan')
def load(path):
    b = open(path, 'rb').read()
    n = len(b) // 8
    w = struct.unpack('<%dQ' % n, b)
    per = 256 * 8
    R = n // per
    recs = []
    for r in range(R):
        d = {}
        for s in range(256):
            rec = w[r * per + s * 8: r * per + s * 8 + 8]
            if rec[7] == 0 and rec[0] == 0: continue
            e = rec[7] & 0xffffffff
            if (rec[7] >> 32) != r: continue
            d[e] = rec
        recs.append(d)
    return R, recs
def analyse(path):
    R, recs = load(path)
    common = sorted(set.intersection(*[set(d) for d in recs]))
    # steady state: epochs with a previous and next epoch present
    es = [e for e in common if e - 1 in common and e + 1 in common]
    if not es:
        return "%s: no common epochs" % os.path.basename(path)
    out = []
    period = [recs[r][e + 1][1] - recs[r][e][1] for e in es for r in range(R)]
    spread1 = [max(recs[r][e][1] for r in range(R)) - min(recs[r][e][1] for r in range(R)) for e in es]
    spread0 = [max(recs[r][e][0] for r in range(R)) - min(recs[r][e][0] for r in range(R)) for e in es]
    spread5 = [max(recs[r][e][5] for r in range(R)) - min(recs[r][e][5] for r in range(R)) for e in es]
    early = [recs[r][e][0] - recs[r][e - 1][5] for e in es for r in range(R)]
    rel = [recs[r][e][1] - recs[r][e - 1][5] for e in es for r in range(R)]
    # release time of the last rank minus the last end of the previous call (any rank)
    rel_last = [max(recs[r][e][1] for r in range(R)) - max(recs[r][e - 1][5] for r in range(R)) for e in es]
    rel_first = [min(recs[r][e][1] for r in range(R)) - max(recs[r][e - 1][5] for r in range(R)) for e in es]
    load_ = [recs[r][e][2] - recs[r][e][1] for e in es for r in range(R)]
    snd = [recs[r][e][3] - recs[r][e][2] for e in es for r in range(R)]
    polled = [recs[r][e][4] - recs[r][e][1] for e in es for r in range(R) if recs[r][e][4]]
    # data of the last peer: reduced minus the latest t3 of any other rank
    vis = [recs[r][e][4] - max(recs[q][e][3] for q in range(R) if q != r) for e in es for r in range(R) if recs[r][e][4]]
    tail = [recs[r][e][5] - recs[r][e][4] for e in es for r in range(R) if recs[r][e][4]]
    cyc = [recs[r][e][6] for e in es for r in range(R)]
    dur = [recs[r][e][5] - recs[r][e][1] for e in es for r in range(R)]
    order = collections.Counter(tuple(sorted(range(R), key=lambda r: recs[r][e][1])) for e in es).most_common(2)
    lastrank = collections.Counter(max(range(R), key=lambda r: recs[r][e][1]) for e in es).most_common(3)
    vals = [recs[r][e][i] for e in es for r in range(R) for i in (0, 1, 2, 5)]
    gran = "all %% 1000 == 0" if all(v % 1000 == 0 for v in vals) else ("all %% 32 == 0" if all(v % 32 == 0 for v in vals) else "fine")
    f = lambda x: "%.0f" % med(x)
    out.append("%s: %d ranks, %d calls; timer %s" % (os.path.basename(path), R, len(es), gran))
    out.append("  period t1->t1 %s ns | t1 spread across ranks %s (t0 spread %s, t5 spread %s)" % (f(period), f(spread1), f(spread0), f(spread5)))
    out.append("  entry - prev end (same rank) %s | wait release - prev end (same rank) %s | first release - last prev end %s | last release - last prev end %s" % (f(early), f(rel), f(rel_first), f(rel_last)))
    out.append("  t1->t2 load %s | t2->t3 %s | t1->t4 reduced %s | t4 - latest peer t3 %s | t4->t5 %s | t1->t5 %s ns (clock64 %s cyc)" % (f(load_), f(snd), f(polled), f(vis), f(tail), f(dur), f(cyc)))
    out.append("  release order (most common): %s ; last released rank: %s" % (order, lastrank))
    return "\n".join(out)
if __name__ == '__main__':
    for p in sorted(sys.argv[1:]):
        try: print(analyse(p))
        except Exception as ex: print(p, "error", ex)

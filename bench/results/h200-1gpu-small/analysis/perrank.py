import sys, statistics as st
sys.path.insert(0, __import__('os').path.dirname(__import__('os').path.abspath(__file__)))
from exp_trace import load
for p in sys.argv[1:]:
    R, recs = load(p)
    common = sorted(set.intersection(*[set(d) for d in recs]))
    es = [e for e in common if e - 1 in common and e + 1 in common]
    print(p.split('/')[-1], "per rank medians, ns relative to the call's earliest t1 (t0 entry, t1 released, t2 loaded, t3 sent/barrier, t4 reduced, t5 end)")
    for r in range(R):
        row = []
        for i in range(6):
            row.append(st.median(recs[r][e][i] - min(recs[q][e][1] for q in range(R)) for e in es if recs[r][e][i]) if any(recs[r][e][i] for e in es) else float('nan'))
        print("  rank %d: " % r + " ".join("%6.0f" % x for x in row))

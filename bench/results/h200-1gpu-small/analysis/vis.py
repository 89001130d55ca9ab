import sys, statistics as st
sys.path.insert(0, __import__('os').path.dirname(__import__('os').path.abspath(__file__)))
from exp_trace import load
for p in sys.argv[1:]:
    R, recs = load(p)
    common = sorted(set.intersection(*[set(d) for d in recs]))
    es = [e for e in common if e - 1 in common and e + 1 in common]
    print(p.split('/')[-1])
    for r in range(R):
        d_last = [recs[r][e][4] - max(recs[q][e][3] for q in range(R) if q != r) for e in es]
        d_own = [recs[r][e][4] - recs[r][e][3] for e in es]
        qs = lambda x: "p10 %5.0f p50 %5.0f p90 %5.0f" % (sorted(x)[len(x)//10], st.median(x), sorted(x)[9*len(x)//10])
        print("  rank %d: t4 - latest peer t3: %s | t4 - own t3: %s" % (r, qs(d_last), qs(d_own)))
    # example consecutive calls
    e0 = es[len(es)//2]
    for e in range(e0, e0 + 3):
        base = min(recs[q][e][1] for q in range(R))
        print("  call", e, " ".join("r%d:%s" % (q, ",".join("%d" % (recs[q][e][i] - base) for i in range(6))) for q in range(R)))

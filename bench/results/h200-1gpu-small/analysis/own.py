import sys, statistics as st, glob
sys.path.insert(0, __import__('os').path.dirname(__import__('os').path.abspath(__file__)))
from exp_trace import load
for p in sys.argv[1:]:
    R, recs = load(p)
    common = sorted(set.intersection(*[set(d) for d in recs]))
    es = [e for e in common if e - 1 in common and e + 1 in common]
    m = lambda i, j: st.median(recs[r][e][j] - recs[r][e][i] for e in es for r in range(R))
    late = st.median(recs[r][e][4] - max(recs[q][e][3] for q in range(R) if q != r) for e in es for r in range(R))
    per = st.median(recs[0][e+1][1] - recs[0][e][1] for e in es)
    print("%-40s period %5.0f | rel(prev t5->t1) %4.0f | t1->t2 %4.0f | t2->t3 %4.0f | t3->t4 %5.0f | t4-latest peer t3 %5.0f | t4->t5 %4.0f" % (p.split('/')[-1], per, st.median(recs[r][e][1]-recs[r][e-1][5] for e in es for r in range(R)), m(1,2), m(2,3), m(3,4), late, m(4,5)))

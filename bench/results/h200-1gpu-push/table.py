import re, sys, collections, signal
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
lab = None; world = None; res = collections.OrderedDict(); graph = collections.OrderedDict()
algo = None; glab = None
for line in open(sys.argv[1], errors='replace'):
    m = re.match(r'@@ (\S+)', line)
    if m: lab = m.group(1); continue
    if 'rc=' in line and line.startswith('==='): glab = None
    m = re.match(r'=== (graph-\w+): ', line)
    if m and 'rc=' not in line and 'skew' not in m.group(1): glab = m.group(1); lab = None; continue
    m = re.match(r'# group: (\d+) emulated ranks', line)
    if m: world = int(m.group(1)); continue
    m = re.match(r'\s+graph\s+(\S+)\s+[\d.]+ us \[.*\]\s+([\d.]+) us per call', line)
    if m and lab: res[(lab, world, m.group(1))] = m.group(2); continue
    m = re.match(r'\s+(\S+-p\w+|floor\(empty\))\s+bfloat16\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+([\d.]+)\s', line)
    if m and lab == 'before': res[(lab, world, m.group(1))] = m.group(2); continue
    m = re.match(r'# algorithm:? (\S+?),? ', line)
    if m: algo = m.group(1); continue
    m = re.match(r'\s+(\d+)\s+\d+\s+bfloat16\s+sum\s+([\d.]+)', line)
    if m and glab and algo: graph[(glab, algo, int(m.group(1)))] = m.group(2)
labs = list(dict.fromkeys(k[0] for k in res))
algos = ['oneshot-push','staged-push','twoshot-push','oneshot-pull','twoshot-pull']
print("122x42K us/call: " + " / ".join(labs))
for w in (2,4,8):
    for a in algos:
        print(f"w{w} {a:13s} " + " ".join(f"{res.get((l,w,a),'-'):>6s}" for l in labs))
glabs = list(dict.fromkeys(k[0] for k in graph))
print("8 ranks graph bench us: " + " / ".join(glabs))
for a in algos:
    for b in sorted(set(k[2] for k in graph)):
        print(f"{a:13s} {b:8d} " + " ".join(f"{graph.get((g,a,b),'-'):>8s}" for g in glabs))

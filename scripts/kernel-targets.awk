# Issue 11's figures, extracted from the timing steps of scripts/gpu-kernels.sh (its
# timings.txt: `tpar bench` output under "=== STEP" headers; STEP seq-, sizes-, host- with
# -after / -before, small- (1 KiB at 2, 4, 8 ranks), seq-16-after, first-call-*). POSIX awk. Prints one line per target:
# the after figure, then the before figure where the run had one. Every figure is a median
# in us per call of the 122-call graph or of graph mode (bf16, emulated ranks on one GPU).
#
#   awk -f scripts/kernel-targets.awk timings.txt
function num(s) { return s + 0 }
# The number just before `suffix` in the line, or "" when the line lacks it.
function before_suffix(line, suffix,    i, head, n, parts) {
    i = index(line, suffix)
    if (i == 0) return ""
    head = substr(line, 1, i - 1)
    n = split(head, parts, /[ :(]+/)
    while (n > 0 && parts[n] == "") n--
    return parts[n]
}
/^=== / {
    step = $2
    sub(/:$/, "", step)
    who = (step ~ /-before$/) ? "before" : "after"
    kind = step; sub(/-(before|after)$/, "", kind)
    next
}
/^# group: [0-9]+ emulated ranks/ { ranks = $3; next }
/^# algorithm: / { algo = $3; sub(/,$/, "", algo); next }
/launch floor \(graph\)/ { floor[who, kind, ranks] = before_suffix($0, " us per call"); next }
# A sequence row: "graph  ALGO  278.7 us [..]  2.28 us per call".
$1 == "graph" && / us per call$/ {
    seq[who, kind, ranks, $2] = num($(NF - 3))
    next
}
# The summary's pick row: "graph  TYPE  SIZE  PICK  US  FASTEST  US ...".
$1 == "graph" && $3 ~ /^[0-9]+$/ && NF >= 7 {
    pick[who, kind, ranks, $3] = $4
    pickus[who, kind, ranks, $3] = num($5)
    next
}
# A size row of the nccl-tests table: SIZE COUNT TYPE REDOP TIME P10 P90 ...
$1 ~ /^[0-9]+$/ && $4 == "sum" && kind == "sizes" {
    t[who, algo, $1] = num($5)
    algos[algo] = 1
    next
}
# The 1 KiB step at 2, 4, 8 ranks: the best per rank count.
$1 ~ /^[0-9]+$/ && $4 == "sum" && kind == "small" {
    if (!((who, ranks) in small) || num($5) < small[who, ranks]) { small[who, ranks] = num($5); smalla[who, ranks] = algo }
    next
}
/^first call: / {
    v = before_suffix($0, " ms from main")
    if (step == "first-call-cold") cold = v
    if (step == "first-call-warm") warm = v
    if (step == "first-call-corrupt") corrupt = v
    next
}
function best(w, size, prefix,    a, b, ba) {
    b = ""
    for (a in algos) {
        if (prefix != "" && index(a, prefix) != 1) continue
        if (((w, a, size) in t) && (b == "" || t[w, a, size] < b)) { b = t[w, a, size]; ba = a }
    }
    return b == "" ? "-" : sprintf("%.2f (%s)", b, ba)
}
function seqbest(w, k, r,    key, b, ba, parts) {
    b = ""
    for (key in seq) {
        split(key, parts, SUBSEP)
        if (parts[1] == w && parts[2] == k && parts[3] == r && (b == "" || seq[key] < b)) { b = seq[key]; ba = parts[4] }
    }
    return b == "" ? "-" : sprintf("%.2f (%s)", b, ba)
}
function seqpick(w, k, r,    key, parts) {
    for (key in pick) {
        split(key, parts, SUBSEP)
        if (parts[1] == w && parts[2] == k && parts[3] == r) return sprintf("%.2f (%s)", pickus[key], pick[key])
    }
    return "-"
}
function both(a, b) { return b == "-" || b == "" ? a : a "  | before " b }
END {
    print "# issue 11 targets: after | before (median us per call; graph, bf16, emulated ranks on one GPU)"
    print "8 ranks x 42 KiB, 122-call graph, plan's pick (<= 3.0):  " both(seqpick("after", "seq", 8), seqpick("before", "seq", 8))
    print "4 ranks x 42 KiB, plan's pick (<= 2.5):                  " both(seqpick("after", "seq", 4), seqpick("before", "seq", 4))
    print "2 ranks x 42 KiB, plan's pick:                           " both(seqpick("after", "seq", 2), seqpick("before", "seq", 2))
    print "16 ranks x 42 KiB, plan's pick:                          " seqpick("after", "seq-16", 16)
    f = floor["after", "sizes", 8]
    b1 = best("after", 1024, "")
    line = "8 ranks 1 KiB, best (<= graph floor + 1.5):             " b1 "; floor " (f == "" ? "-" : f)
    if (f != "" && b1 != "-") line = line sprintf("; +%.2f", num(b1) - num(f))
    print both(line, best("before", 1024, ""))
    for (w = 1; w <= 2; w++) {
        ww = w == 1 ? "after" : "before"
        if (!((ww, 2) in small)) continue
        line = "1 KiB, best at 2 / 4 / 8 ranks (" ww "; per extra rank near 0):"
        for (r = 2; r <= 8; r *= 2) line = line sprintf(" %.2f (%s, floor %s)", small[ww, r], smalla[ww, r], floor[ww, "small", r])
        print line
    }
    print "8 ranks 4 MiB, best (<= 45):                             " both(best("after", 4194304, ""), best("before", 4194304, ""))
    split("262144 1048576 4194304", S, " ")
    for (i = 1; i <= 3; i++)
        print "8 ranks " S[i] " B, one-shot best vs two-shot best:    " best("after", S[i], "oneshot") " vs " best("after", S[i], "twoshot")
    print "host, 4 ranks x 42 KiB, best (<= 12):                    " both(seqbest("after", "host", 4), seqbest("before", "host", 4))
    print "host, 3 and 8 ranks x 42 KiB, best:                      " seqbest("after", "host", 3) ", " seqbest("after", "host", 8)
    print "first call, cold cache (<= 2000 ms):                     " (cold == "" ? "-" : cold " ms")
    print "first call, warm cache (<= 300 ms):                      " (warm == "" ? "-" : warm " ms") "; after corrupting every entry: " (corrupt == "" ? "-" : corrupt " ms")
}

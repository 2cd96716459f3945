#!/bin/sh
# C churn, side by side: bare glibc, mtrace lossless, mtrace sampling, mtrace
# loaded but disabled (from the start, and after recording the live window),
# and heaptrack when installed; with 1 thread also the builds of mtrace.so
# that each leave one part out (table, stacks, lock), whose difference to
# lossless is what that part costs a pair.
# Each round runs every variant at once in lockstep (bench/lockstep.h): one
# process each, taking turns a slice of a few milliseconds long, in an order
# shuffled every turn, the 1-thread ones all on one processor, each slice
# after an untimed warm-up.  A ratio
# compares slices of the same turn, so what the machine does over seconds
# (whole runs here vary by a tenth or more) falls on both alike; new
# processes each round average out what one process's memory layout gives
# it.  Each cell is the median over all turns of all rounds of the ns per
# malloc/free pair and of the ratio to bare glibc in that turn.  Bare glibc
# runs twice: the reference is the mean of the two, and the second against
# the first is the noise line.  heaptrack, whose reader process works
# beside the one it traces, cannot take turns: it runs whole, a quarter of
# the pairs, right after a bare run of the same.
#   sh bench/churn.sh BUILD PRIV [ROUNDS] [PAIRS_PER_THREAD]
set -eu
build=$1 priv=$(cd "$2" && pwd)
rounds=${3:-5} pairs=${4:-4000000}
slices=40 # turns a round: 100,000 pairs a slice at the default
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mtrace-churn.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lockstep.sh"
BUILD=$build
export BUILD

pre="LD_PRELOAD=$priv/mtrace.so"
variants="glibc lossless sampling disabled held"
command -v heaptrack >/dev/null 2>&1 && variants="$variants heaptrack"
# Builds of mtrace.so that each leave one part out (c_src/build.mk), run with
# 1 thread: what that part costs a lossless pair is the difference.
leave_out=$(cd "$build" && pwd)/leave-out
parts=""
for p in table stacks lock; do
    [ -f "$leave_out/$p/mtrace.so" ] && parts="$parts no-$p"
done
last_cpu=$(($( (nproc || getconf _NPROCESSORS_ONLN || echo 1) 2>/dev/null) - 1))

whole() { # whole THREADS PAIRS [heaptrack]: one whole run's ns per pair
    if [ $# -gt 2 ]; then
        heaptrack -o "$tmp/ht" "$build/churn" "$1" "$2" 2>/dev/null && rm -f "$tmp"/ht*
    else
        "$build/churn" "$1" "$2"
    fi | awk '/^ns_per_pair/ { print $2 }'
}

r=1
while [ "$r" -le "$rounds" ]; do
    for t in 1 2; do
        set -- glibc= glibc-again= "lossless=$pre" "sampling=$pre MTRACE_SAMPLE_BYTES=524288" \
            "disabled=$pre MODE=disabled" "held=$pre MODE=disabled-after"
        cpus=""
        if [ "$t" = 1 ]; then
            for p in $parts; do set -- "$@" "$p=LD_PRELOAD=$leave_out/${p#no-}/mtrace.so"; done
            cpus=$last_cpu
        fi
        lockstep_ring "$tmp/ring" "$slices" "$t" "$pairs" "$cpus" "$@"
        awk -v r="$r" -v t="$t" '{ print r, t, $1, $2, $3 }' "$tmp/ring" >>"$tmp/samples"
        if command -v heaptrack >/dev/null 2>&1; then
            bare=$(whole "$t" $((pairs / 4)))
            ht=$(whole "$t" $((pairs / 4)) heaptrack)
            [ -n "$ht" ] || { echo "bench/churn.sh: heaptrack with $t threads printed nothing" >&2; exit 1; }
            echo "$r $t 0 heaptrack $ht $bare" >>"$tmp/samples"
        fi
    done
    r=$((r + 1))
done

# Medians as markdown: per (threads, variant) of ns and of the ratios to bare
# glibc in the same turn, over all turns of all rounds.
awk -v variants="$variants" -v parts="$parts" -v rounds="$rounds" -v slices="$slices" \
    -v pairs="$pairs" '
$4 == "heaptrack" { ht_n[$2]++; ht[$2, ht_n[$2]] = $5; htr[$2, ht_n[$2]] = $5 / $6; next }
{ ns[$1, $2, $3, $4] = $5 }
function bare(r, t, k) { return (ns[r, t, k, "glibc"] + ns[r, t, k, "glibc-again"]) / 2 }
function of(r, t, k, v) { return v == "glibc" ? bare(r, t, k) : ns[r, t, k, v] }
function median(a, n,    i, j, x) {
    for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { x = a[j]; a[j] = a[j - 1]; a[j - 1] = x }
    return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
# Medians over every turn of every round (m_ns, m_ratio), or over the turns
# of round r alone (r > 0).
function cell(t, v, r,    q, k, n, a, b) {
    n = 0
    for (q = (r ? r : 1); q <= (r ? r : rounds); q++)
        for (k = 1; k <= slices; k++) { n++; a[n] = of(q, t, k, v); b[n] = a[n] / bare(q, t, k) }
    m_ns = median(a, n); m_ratio = median(b, n)
}
function part_label(x) {
    if (x == "no-table") return "without the table (recording and forgetting return at once)"
    if (x == "no-stacks") return "without taking stacks"
    if (x == "no-lock") return "without the shard lock'"'"'s atomic exchange (a plain store)"
    return x
}
function label(x) {
    if (x == "lossless") return "mtrace lossless"
    if (x == "sampling") return "mtrace sampling 512 KiB"
    if (x == "disabled") return "mtrace disabled"
    if (x == "held") return "mtrace disabled, blocks held"
    return x
}
END {
    nv = split(variants, names, " ")
    head = "| C churn, ns per malloc+free pair (ratio to glibc) |"; line = "|---|"
    for (i = 1; i <= nv; i++) { head = head " " label(names[i]) " |"; line = line "---|" }
    print head; print line
    for (t = 1; t <= 2; t++) {
        row = "| " t " thread" (t > 1 ? "s" : "") " |"
        for (i = 1; i <= nv; i++) {
            if (names[i] == "heaptrack") {
                for (k = 1; k <= ht_n[t]; k++) { a[k] = ht[t, k]; b[k] = htr[t, k] }
                m_ns = median(a, ht_n[t]); m_ratio = median(b, ht_n[t])
            } else
                cell(t, names[i], 0)
            row = row sprintf(" %.0f ns (%.2fx) |", m_ns, m_ratio)
            ns1[t, names[i]] = m_ns; ratio1[t, names[i]] = m_ratio
        }
        print row
    }
    # The gain of each variant from 1 to 2 threads, and that gain against
    # glibc'"'"'s: the two rings run apart, so their ratios, not their times, are
    # compared (round by round, the median of the rounds).
    row = "| 1 -> 2 threads: throughput gain (share of glibc'"'"'s) |"
    for (i = 1; i <= nv; i++) {
        v = names[i]
        if (v == "heaptrack") {
            for (k = 1; k <= ht_n[1] && k <= ht_n[2]; k++) b[k] = htr[1, k] / htr[2, k]
            share = median(b, k - 1)
        } else {
            for (r = 1; r <= rounds; r++) { cell(1, v, r); x = m_ratio; cell(2, v, r); b[r] = x / m_ratio }
            share = median(b, rounds)
        }
        row = row sprintf(" %.2fx (%.2f) |", 2 * ns1[1, v] / ns1[2, v], share)
    }
    print row
    printf "\nMedians over %d turns x %d rounds: each round, all variants at once in lockstep, a slice of " \
        "%d pairs a turn each after %d untimed, the order shuffled every turn (1 thread: all on one processor); glibc is the " \
        "mean of its two runs in the turn; heaptrack: whole runs of %d pairs against a bare run each. " \
        "16-1040 byte blocks, live window 4096, call depth 12.\n", slices, rounds, pairs / slices, pairs / slices / 2, pairs / 4
    printf "\nNoise: bare glibc'"'"'s second run against its first in the same turn: "
    for (t = 1; t <= 2; t++) {
        n = 0
        for (r = 1; r <= rounds; r++) {
            for (k = 1; k <= slices; k++) { n++; a[n] = ns[r, t, k, "glibc-again"] / ns[r, t, k, "glibc"] }
            cell(t, "glibc-again", r); b[r] = m_ratio
        }
        m = median(a, n); median(b, rounds) # sorts b
        printf "%s %.3fx (rounds %.3fx-%.3fx)", (t == 1 ? "1 thread" : "; 2 threads"), m, b[1], b[rounds]
    }
    print "; a round'"'"'s figure varies with its processes'"'"' memory more than with the machine."
    if (parts == "") exit
    print ""
    print "| A lossless pair taken apart, 1 thread: builds that leave one part out | ns per pair | that part costs |"
    print "|---|---|---|"
    cell(1, "lossless", 0); printf "| mtrace lossless | %.0f ns | |\n", m_ns
    np = split(parts, pn, " ")
    for (i = 1; i <= np; i++) {
        n = 0
        for (r = 1; r <= rounds; r++) for (k = 1; k <= slices; k++) { n++; a[n] = ns[r, 1, k, "lossless"] - ns[r, 1, k, pn[i]] }
        d = median(a, n)
        cell(1, pn[i], 0)
        printf "| %s | %.0f ns | %.0f ns |\n", part_label(pn[i]), m_ns, d
    }
    cell(1, "glibc", 0); printf "| glibc alone, no preload | %.0f ns | |\n", m_ns
    printf "\nMedians over the same turns as the table above.\n"
}' "$tmp/samples"

#!/bin/sh
# C churn, side by side: bare glibc, mtrace lossless, mtrace sampling, mtrace
# loaded but disabled (from the start, and after recording the live window),
# and heaptrack when installed; with 1 thread also the builds of mtrace.so
# that each leave one part out (table, stacks, lock), whose difference to
# lossless is what that part costs a pair.  Variants are
# interleaved for ROUNDS rounds, each round's order rotated one further
# (A B C, B C A, C A B, ...); each cell is the median ns per malloc/free
# pair and the median of the per-round ratios to bare glibc (a ratio
# compares runs made seconds apart, so machine drift cancels out).  Bare
# glibc runs twice a round: the reference is the mean of the two, and the
# second against the first is the noise line.
#   sh bench/churn.sh BUILD PRIV [ROUNDS] [PAIRS_PER_THREAD]
set -eu
build=$1 priv=$(cd "$2" && pwd)
rounds=${3:-5} pairs=${4:-4000000}
churn=$build/churn
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mtrace-churn.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

variants="glibc lossless sampling disabled held"
command -v heaptrack >/dev/null 2>&1 && variants="$variants heaptrack"
# Bare glibc twice in each round: the ratio of the second run to the first
# is the machine's own noise, which the figures must exceed to mean
# anything.
control=glibc-again
# Builds of mtrace.so that each leave one part out (c_src/build.mk), run with
# 1 thread: what that part costs a lossless pair is the difference.
leave_out=$(cd "$build" && pwd)/leave-out
parts=""
for p in table stacks lock; do
    [ -f "$leave_out/$p/mtrace.so" ] && parts="$parts no-$p"
done

run() { # run VARIANT THREADS -> prints ns per pair
    case $1 in
    glibc | glibc-again) "$churn" "$2" "$pairs" ;;
    lossless) LD_PRELOAD=$priv/mtrace.so MTRACE_PROGRAMS=churn "$churn" "$2" "$pairs" ;;
    sampling) LD_PRELOAD=$priv/mtrace.so MTRACE_PROGRAMS=churn MTRACE_SAMPLE_BYTES=524288 \
        "$churn" "$2" "$pairs" ;;
    disabled) LD_PRELOAD=$priv/mtrace.so MTRACE_PROGRAMS=churn "$churn" "$2" "$pairs" disabled ;;
    held) LD_PRELOAD=$priv/mtrace.so MTRACE_PROGRAMS=churn "$churn" "$2" "$pairs" disabled-after ;;
    no-*) LD_PRELOAD=$leave_out/${1#no-}/mtrace.so MTRACE_PROGRAMS=churn "$churn" "$2" "$pairs" ;;
    heaptrack) heaptrack -o "$tmp/ht" "$churn" "$2" "$pairs" 2>/dev/null && rm -f "$tmp"/ht* ;;
    esac | awk '/^ns_per_pair/ { print $2 }'
}

. "$(dirname "$0")/rotate.sh"

# Each round starts its list one variant further on, so that every variant
# takes every place in a round: with one fixed order, bare glibc run again
# at the end of each round came out at 0.97x (1 thread) and 0.88x (2
# threads) of its first run (5 rounds).
r=1
while [ "$r" -le "$rounds" ]; do
    for t in 1 2; do
        vs="$variants $control"
        [ "$t" = 1 ] && vs="$vs $parts"
        for v in $(rotate "$r" $vs); do
            ns=$(run "$v" "$t")
            [ -n "$ns" ] || { echo "bench/churn.sh: $v with $t threads printed nothing" >&2; exit 1; }
            echo "$r $t $v $ns" >>"$tmp/samples"
        done
    done
    r=$((r + 1))
done

# Medians per (threads, variant) of ns and of per-round ratios, as markdown.
awk -v variants="$variants" -v parts="$parts" -v rounds="$rounds" -v control="$control" '
{ ns[$1, $2, $3] = $4 }
# Bare glibc in round r with t threads: the mean of its two runs, which
# halves the noise every ratio of the round takes from its reference.
function bare(r, t) { return (ns[r, t, "glibc"] + ns[r, t, control]) / 2 }
function of(r, t, v) { return v == "glibc" ? bare(r, t) : ns[r, t, v] }
function median(a, n,    i, j, t) {
    for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
    return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
function part_label(x) {
    if (x == "no-table") return "without the table (recording and forgetting return at once)"
    if (x == "no-stacks") return "without taking stacks"
    if (x == "no-lock") return "without the shard lock'"'"'s atomic exchange (a plain store)"
    return x
}
function ns_of(v,    r, a) { for (r = 1; r <= rounds; r++) a[r] = of(r, 1, v); return median(a, rounds) }
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
            for (r = 1; r <= rounds; r++) { a[r] = of(r, t, names[i]); b[r] = a[r] / bare(r, t) }
            row = row sprintf(" %.0f ns (%.2fx) |", median(a, rounds), median(b, rounds))
        }
        print row
    }
    row = "| 1 -> 2 threads: throughput gain (share of glibc'"'"'s) |"
    for (i = 1; i <= nv; i++) {
        for (r = 1; r <= rounds; r++) {
            a[r] = 2 * of(r, 1, names[i]) / of(r, 2, names[i])
            b[r] = a[r] / (2 * bare(r, 1) / bare(r, 2))
        }
        row = row sprintf(" %.2fx (%.2f) |", median(a, rounds), median(b, rounds))
    }
    print row
    printf "\nMedian of %d interleaved rounds, each in its own order; glibc is the mean of its two runs in " \
        "the round; 16-1040 byte blocks, live window 4096, call depth 12.\n", rounds
    printf "\nNoise: bare glibc'"'"'s second run in a round against its first: "
    for (t = 1; t <= 2; t++) {
        for (r = 1; r <= rounds; r++) b[r] = ns[r, t, control] / ns[r, t, "glibc"]
        m = median(b, rounds) # sorts b
        printf "%s %.2fx (middle half of the rounds %.2fx-%.2fx)", (t == 1 ? "1 thread" : "; 2 threads"),
            m, b[int(rounds / 4) + 1], b[rounds - int(rounds / 4)]
    }
    print "."
    if (parts == "") exit
    print ""
    print "| A lossless pair taken apart, 1 thread: builds that leave one part out | ns per pair | that part costs |"
    print "|---|---|---|"
    printf "| mtrace lossless | %.0f ns | |\n", ns_of("lossless")
    np = split(parts, pn, " ")
    for (i = 1; i <= np; i++) {
        for (r = 1; r <= rounds; r++) a[r] = ns[r, 1, "lossless"] - ns[r, 1, pn[i]]
        printf "| %s | %.0f ns | %.0f ns |\n", part_label(pn[i]), ns_of(pn[i]), median(a, rounds)
    }
    printf "| glibc alone, no preload | %.0f ns | |\n", ns_of("glibc")
    printf "\nMedian of %d interleaved rounds, in the same runs as the table above.\n", rounds
}' "$tmp/samples"

#!/bin/sh
# C churn, side by side: bare glibc, mtrace lossless, mtrace sampling, mtrace
# loaded but disabled, and heaptrack when installed.  Variants are
# interleaved (A B C ... A B C ...) for ROUNDS rounds; each cell is the median
# ns per malloc/free pair, with its ratio to bare glibc from the same run.
#   sh bench/churn.sh BUILD PRIV [ROUNDS] [PAIRS_PER_THREAD]
set -eu
build=$1 priv=$(cd "$2" && pwd)
rounds=${3:-5} pairs=${4:-4000000}
churn=$build/churn
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mtrace-churn.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

variants="glibc lossless sampling disabled"
command -v heaptrack >/dev/null 2>&1 && variants="$variants heaptrack"

run() { # run VARIANT THREADS -> prints ns per pair
    case $1 in
    glibc) "$churn" "$2" "$pairs" ;;
    lossless) LD_PRELOAD=$priv/mtrace.so MTRACE_PROGRAMS=churn "$churn" "$2" "$pairs" ;;
    sampling) LD_PRELOAD=$priv/mtrace.so MTRACE_PROGRAMS=churn MTRACE_SAMPLE_BYTES=524288 \
        "$churn" "$2" "$pairs" ;;
    disabled) LD_PRELOAD=$priv/mtrace.so MTRACE_PROGRAMS=churn "$churn" "$2" "$pairs" disabled ;;
    heaptrack) heaptrack -o "$tmp/ht" "$churn" "$2" "$pairs" 2>/dev/null && rm -f "$tmp"/ht* ;;
    esac | awk '/^ns_per_pair/ { print $2 }'
}

r=1
while [ "$r" -le "$rounds" ]; do
    for t in 1 2; do
        for v in $variants; do
            ns=$(run "$v" "$t")
            [ -n "$ns" ] || { echo "bench/churn.sh: $v with $t threads printed nothing" >&2; exit 1; }
            echo "$t $v $ns" >>"$tmp/samples"
        done
    done
    r=$((r + 1))
done

# Median per (threads, variant), then the markdown rows.
sort -k1,1n -k2,2 -k3,3g "$tmp/samples" | awk -v variants="$variants" -v rounds="$rounds" '
{ key = $1 " " $2; n[key]++; v[key, n[key]] = $3 }
END {
    nv = split(variants, names, " ")
    for (k in n) { c = n[k]; med[k] = (c % 2) ? v[k, (c + 1) / 2] : (v[k, c / 2] + v[k, c / 2 + 1]) / 2 }
    head = "| C churn, ns per malloc+free pair (ratio to glibc) |"; line = "|---|"
    for (i = 1; i <= nv; i++) { head = head " " label(names[i]) " |"; line = line "---|" }
    print head; print line
    for (t = 1; t <= 2; t++) {
        row = "| " t " thread" (t > 1 ? "s" : "") " |"
        for (i = 1; i <= nv; i++) {
            m = med[t " " names[i]]; base = med[t " glibc"]
            row = row sprintf(" %.0f ns (%.2fx) |", m, m / base)
        }
        print row
    }
    row = "| 1 -> 2 threads: throughput gain (share of glibc'"'"'s) |"
    for (i = 1; i <= nv; i++) {
        g = 2 * med["1 " names[i]] / med["2 " names[i]]
        gb = 2 * med["1 glibc"] / med["2 glibc"]
        row = row sprintf(" %.2fx (%.2f) |", g, g / gb)
    }
    print row
    printf "\nMedian of %d interleaved rounds; 16-1040 byte blocks, live window 4096, call depth 12.\n", rounds
}
function label(x) {
    if (x == "lossless") return "mtrace lossless"
    if (x == "sampling") return "mtrace sampling 512 KiB"
    if (x == "disabled") return "mtrace disabled"
    return x
}'

#!/bin/sh
# Compares builds or settings of the preload side by side, the way the
# figures of docs/performance.md are taken: the variants run interleaved,
# each round in an order rotated one further (bench/rotate.sh); every
# variant's time in a round is divided by the first variant's in that
# round, and the median of those ratios is printed with a 95% interval
# (2,000 resamples of the rounds).  A difference inside the interval of
# the noise (a variant run twice under two labels) is not a difference.
#   sh bench/compare.sh [-r ROUNDS] [-w churn|boot|release] [-t THREADS] [-p PAIRS] \
#       LABEL=SETTINGS LABEL=SETTINGS ...
# SETTINGS are environment assignments for that variant, separated by
# spaces (so no path in them may hold one); the empty string runs bare.
# churn (the default): ns a malloc/free pair of BUILD/churn (BUILD defaults
# to _build/c: make bench-build builds it), 4,000,000 pairs a thread, with
# MTRACE_PROGRAMS=churn; each round is one ring of all variants taking
# turns (bench/lockstep.h, as bench/churn.sh), 40 turns of 100,000 pairs.
# boot: ms to boot and halt a node (erl -noshell -eval 'halt().').  release: ms to boot and halt a copy of
# examples/leaky_app's release (built by bin/test) without its env.sh's
# LD_PRELOAD line, as bench/vm.sh does.  For example:
#   sh bench/compare.sh -r 41 glibc= lossless="LD_PRELOAD=$PWD/priv/mtrace.so" \
#       other="LD_PRELOAD=/tmp/other/priv/mtrace.so"
set -eu
here=$(cd "$(dirname "$0")" && pwd)
rounds=21 work=churn threads=1 pairs=4000000
usage() {
    echo "usage: sh bench/compare.sh [-r ROUNDS] [-w churn|boot|release] [-t THREADS] [-p PAIRS] LABEL=SETTINGS..." >&2
    exit 2
}
while getopts r:w:t:p: opt; do
    case $opt in
    r) rounds=$OPTARG ;;
    w) work=$OPTARG ;;
    t) threads=$OPTARG ;;
    p) pairs=$OPTARG ;;
    *) usage ;;
    esac
done
shift $((OPTIND - 1))
case $rounds in '' | *[!0-9]*) usage ;; esac
[ "$rounds" -ge 2 ] || { echo "bench/compare.sh: at least 2 rounds" >&2; exit 2; }
case $work in churn | boot | release) ;; *) usage ;; esac
[ $# -ge 2 ] || { echo "bench/compare.sh: at least 2 variants, the first the reference" >&2; exit 2; }
churn=${BUILD:-_build/c}/churn
if [ "$work" = churn ] && [ ! -x "$churn" ]; then
    echo "bench/compare.sh: $churn not built (make bench-build)" >&2
    exit 1
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/mtrace-compare.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
. "$here/release_boot.sh"
if [ "$work" = release ] && ! release_copy "$here" "$tmp/release"; then
    echo "bench/compare.sh: examples/leaky_app's release not built (bin/test builds it)" >&2
    exit 1
fi
labels=""
for v in "$@"; do
    label=${v%%=*}
    case $label in '' | *[!A-Za-z0-9_-]*) echo "bench/compare.sh: a label is letters, digits, - and _: $v" >&2; exit 2 ;; esac
    case $v in *=*) ;; *) echo "bench/compare.sh: LABEL=SETTINGS expected: $v" >&2; exit 2 ;; esac
    [ ! -e "$tmp/v.$label" ] || { echo "bench/compare.sh: label $label given twice" >&2; exit 2; }
    printf '%s\n' "${v#*=}" >"$tmp/v.$label"
    labels="$labels $label"
done

run() { # run LABEL -> prints the variant's time
    settings=$(cat "$tmp/v.$1")
    case $work in
    churn)
        # shellcheck disable=SC2086 # the settings are words on purpose
        env MTRACE_PROGRAMS=churn $settings "$churn" "$threads" "$pairs" | awk '/^ns_per_pair/ { print $2 }' ;;
    boot)
        t0=$(date +%s%N)
        # shellcheck disable=SC2086
        # A boot that failed (a preload that did not load, say) prints no
        # time: its few milliseconds would read as a ratio.
        env $settings erl -noshell -eval 'halt().' >/dev/null 2>&1 </dev/null || return 0
        echo $((($(date +%s%N) - t0) / 1000000)) ;;
    release)
        # shellcheck disable=SC2086
        release_boot_ms "$tmp/release" $settings ;;
    esac
}

. "$here/rotate.sh"
. "$here/lockstep.sh"
if [ "$work" = churn ]; then
    # Each round a ring: every variant at once, taking turns (bench/lockstep.h;
    # the 1-thread ones all on one processor).  A round's figure for a
    # variant is the median of its ratios to the first in the same turn,
    # times the first's median time, so that the ratios below are those.
    slices=40
    cpus=""
    [ "$threads" = 1 ] && cpus=$(($(nproc 2>/dev/null || echo 1) - 1))
    set --
    for label in $labels; do set -- "$@" "$label=$(cat "$tmp/v.$label")"; done
    r=1
    while [ "$r" -le "$rounds" ]; do
        BUILD=$(dirname "$churn") lockstep_ring "$tmp/ring" "$slices" "$threads" "$pairs" "$cpus" "$@"
        awk -v r="$r" -v first="${1%%=*}" '
        function median(a, n,    i, j, x) {
            for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { x = a[j]; a[j] = a[j - 1]; a[j - 1] = x }
            return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
        }
        { t[$1, $2] = $3; if (!($2 in seen)) { seen[$2]; order[++nl] = $2 }; if ($1 > nt) nt = $1 }
        END {
            for (k = 1; k <= nt; k++) a[k] = t[k, first]
            ref = median(a, nt)
            for (l = 1; l <= nl; l++) {
                for (k = 1; k <= nt; k++) a[k] = t[k, order[l]] / t[k, first]
                print r, order[l], ref * median(a, nt)
            }
        }' "$tmp/ring" >>"$tmp/samples"
        r=$((r + 1))
    done
else
    r=1
    while [ "$r" -le "$rounds" ]; do
        # shellcheck disable=SC2086
        for label in $(rotate "$r" $labels); do
            t=$(run "$label")
            [ -n "$t" ] || { echo "bench/compare.sh: $label printed no time" >&2; exit 1; }
            echo "$r $label $t" >>"$tmp/samples"
        done
        r=$((r + 1))
    done
fi

unit=$([ "$work" = churn ] && echo "ns a pair" || echo "ms a boot")
awk -v labels="$labels" -v rounds="$rounds" -v unit="$unit" '
{ t[$1, $2] = $3 }
function sort(a, n,    i, j, x) {
    for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { x = a[j]; a[j] = a[j - 1]; a[j - 1] = x }
}
function median(a, n,    b, i) {
    for (i = 1; i <= n; i++) b[i] = a[i]
    sort(b, n)
    return (n % 2) ? b[(n + 1) / 2] : (b[n / 2] + b[n / 2 + 1]) / 2
}
END {
    srand(1)
    nl = split(labels, name, " ")
    printf "%d %s; ratios to %s, with the 95%% interval of their median\n", rounds,
        (unit == "ns a pair" ? "rounds in lockstep" : "interleaved rounds"), name[1]
    for (l = 1; l <= nl; l++) {
        for (r = 1; r <= rounds; r++) { x[r] = t[r, name[l]]; q[r] = x[r] / t[r, name[1]] }
        for (k = 1; k <= 2000; k++) {
            for (r = 1; r <= rounds; r++) s[r] = q[1 + int(rand() * rounds)]
            m[k] = median(s, rounds)
        }
        sort(m, 2000)
        printf "%-16s %9.1f %s  %.3fx (%.3f-%.3f)\n", name[l], median(x, rounds), unit, median(q, rounds), m[51], m[1950]
    }
}' "$tmp/samples"

# Sourced by bench/churn.sh and bench/compare.sh.
# lockstep_ring OUT SLICES THREADS PAIRS CPUS LABEL=SETTINGS...: runs BUILD's
# churn once for each LABEL, all at once but taking turns (bench/lockstep.h),
# PAIRS pairs a thread in SLICES turns, and writes OUT: a line
# "TURN LABEL NS" for each slice (ns per pair).  Each slice runs half as
# many pairs again first, untimed: the processes between two turns of one
# take its lines out of the caches (10 processes of 2-4 MB in a 32 MB
# cache), and slices timed cold read up to twice as long and lossless at
# 2.2x instead of 3.0x.  SETTINGS are environment
# assignments (words, no path with a space), and MODE=disabled or
# MODE=disabled-after passes churn that argument.  CPUS, unless empty,
# is the list of processors all of them run on (taskset -c), so that a
# 1-thread ring is not moved between processors whose speeds differ.
lockstep_ring() {
    ls_out=$1 ls_slices=$2 ls_threads=$3 ls_pairs=$4 ls_cpus=$5
    shift 5
    ls_dir=$(mktemp -d "${TMPDIR:-/tmp}/mtrace-lockstep.XXXXXX")
    ls_n=$# ls_i=0
    while [ "$ls_i" -lt "$ls_n" ]; do
        mkfifo "$ls_dir/$ls_i"
        ls_i=$((ls_i + 1))
    done
    ls_pin=""
    [ -n "$ls_cpus" ] && command -v taskset >/dev/null 2>&1 && ls_pin="taskset -c $ls_cpus"
    ls_i=0 ls_pids=""
    for ls_v in "$@"; do
        ls_settings=${ls_v#*=} ls_mode=""
        case " $ls_settings " in
        *" MODE=disabled-after "*) ls_mode=disabled-after ;;
        *" MODE=disabled "*) ls_mode=disabled ;;
        esac
        # shellcheck disable=SC2046,SC2086 # the settings and the pinning are words on purpose
        env MTRACE_PROGRAMS=churn CHURN_RING="$ls_dir $ls_n $ls_i" \
            CHURN_SLICES="$ls_slices" CHURN_WARM=$((ls_pairs / ls_slices / 2)) \
            $(echo "$ls_settings" | sed 's/MODE=[^ ]*//') $ls_pin \
            "${BUILD:-_build/c}/churn" "$ls_threads" "$ls_pairs" $ls_mode >"$ls_dir/out.$ls_i" &
        ls_pids="$ls_pids $!"
        ls_i=$((ls_i + 1))
    done
    printf x >"$ls_dir/0"
    ls_failed=0
    for ls_p in $ls_pids; do
        wait "$ls_p" || ls_failed=1
    done
    ls_i=0
    : >"$ls_out"
    for ls_v in "$@"; do
        awk -v label="${ls_v%%=*}" '/^slices/ { for (i = 2; i <= NF; i++) print i - 1, label, $i; n++ }
            END { exit n != 1 }' "$ls_dir/out.$ls_i" >>"$ls_out" || ls_failed=1
        ls_i=$((ls_i + 1))
    done
    rm -rf "$ls_dir"
    [ "$ls_failed" = 0 ] || { echo "bench: a lockstep ring of churn failed ($*)" >&2; return 1; }
}

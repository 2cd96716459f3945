#!/bin/sh
# The preload inside a real node: a dirty NIF churning malloc/free next to
# ordinary Erlang processes (bench/vm_churn.erl, bench/vm_churn_nif.c), on a
# bare node, a preloaded one (mtrace's NIF loaded, Erlang frames off), the
# same with Erlang frames on, and a preloaded one in sampling mode; and the
# time to boot and halt a node and a release, bare and preloaded (a node's
# boot also sampling, and with the builds of mtrace.so that leave the table
# or the stacks out, as bench/churn.sh does).  Variants are interleaved
# for ROUNDS rounds, each round's order rotated one further; bare boots run
# twice each time, both the reference and, one against the other, the
# noise.  Prints markdown rows of medians with ratios to bare.
#   sh bench/vm.sh BUILD PRIV [ROUNDS] [PAIRS]
set -eu
build=$1 priv=$(cd "$2" && pwd)
rounds=${3:-5} pairs=${4:-30000000} boots=5
src=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$build"
build=$(cd "$build" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mtrace-vm.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# Inherited settings would change what the columns mean.
unset MTRACE_PROGRAMS MTRACE_ENABLED MTRACE_SAMPLE_BYTES MTRACE_ERLANG

# Compile the NIF and the module when missing or older than their sources
# (find -newer, as test -nt is not POSIX).
stale() { [ ! -f "$1" ] || [ -n "$(find "$2" -newer "$1")" ]; }
nif=$build/mtrace_bench_churn
if stale "$nif.so" "$src/vm_churn_nif.c"; then
    inc=${ERTS_INCLUDE_DIR:-$(erl -noshell -eval \
        'io:format("~ts", [filename:join([code:root_dir(), "erts-" ++ erlang:system_info(version), "include"])]), halt().')}
    ${CC:-cc} -std=gnu11 -O2 -g -fPIC -Wall -Wextra -Werror -shared -I"$inc" \
        -o "$nif.so" "$src/vm_churn_nif.c"
fi
if stale "$build/vm_churn.beam" "$src/vm_churn.erl"; then
    erlc -o "$build" "$src/vm_churn.erl"
fi
if stale "$build/vm_mixed.beam" "$src/vm_mixed.erl"; then
    erlc -o "$build" "$src/vm_mixed.erl"
fi
# The mixed row needs jiffy (Debian: erlang-jiffy); without it the row is left out.
mixed_rounds=40000
has_jiffy=$(erl -noshell -eval 'io:format("~p", [code:which(jiffy) =/= non_existing]), halt().')
# mtrace's NIF module, laid out as an application (mtrace/ebin, mtrace/priv)
# so that code:priv_dir(mtrace) finds the NIF built in PRIV.
app=$build/vm_app/mtrace
if stale "$app/ebin/Elixir.Mtrace.Native.beam" "$src/../lib/mtrace/native.ex"; then
    mkdir -p "$app/ebin"
    elixirc --ignore-module-conflict -o "$app/ebin" "$src/../lib/mtrace/native.ex" >/dev/null
fi
ln -sfn "$priv" "$app/priv"

pre="LD_PRELOAD=$priv/mtrace.so"
leave_out=$build/leave-out # mtrace.so without one part (c_src/build.mk), when built
churn() { # churn [ENV=VALUE...] -> prints the workload's wall ms
    env "$@" erl -noshell -pa "$build" -run vm_churn main "$nif" "$pairs" malloc |
        awk '/^wall_ms/ { print $2 }'
}
churn_enif() { # churn_enif ERL_FLAGS [ENV=VALUE...]: enif_alloc churn under those VM flags
    flags=$1
    shift
    env "$@" ERL_FLAGS="$flags" erl -noshell -pa "$build" -run vm_churn main "$nif" "$pairs" enif |
        awk '/^wall_ms/ { print $2 }'
}
churn_nif() { # churn_nif FRAMES [ENV=VALUE...]: with mtrace's NIF; FRAMES = true|false expected
    want=$1
    shift
    env "$@" erl -noshell -pa "$build" -run vm_churn main "$nif" "$pairs" malloc "$app/ebin" |
        awk -v want="$want" '
            /^erlang_frames/ { on = $2 }
            /^wall_ms/ { ms = $2 }
            END { if (on == want) print ms; else print "erlang_frames " on ", not " want > "/dev/stderr" }'
}
mixed() { # mixed [ENV=VALUE...] -> prints the mixed workload's wall ms
    env "$@" erl -noshell -pa "$build" -run vm_mixed main "$mixed_rounds" | awk '/^wall_ms/ { print $2 }'
}
mixed_nif() { # mixed_nif [ENV=VALUE...] -> the same with mtrace's NIF; mallocs go to the samples
    env "$@" erl -noshell -pa "$build" -run vm_mixed main "$mixed_rounds" "$app/ebin" >"$tmp/mixed.out"
    awk '/^mallocs/ { print "mixed_mallocs", $2 }' "$tmp/mixed.out" >>"$tmp/samples"
    awk '/^wall_ms/ { print $2 }' "$tmp/mixed.out"
}
boot() { # boot [ENV=VALUE...] -> prints ms from exec to exit, as a user sees it
    t0=$(date +%s%N)
    env "$@" erl -noshell -eval 'halt().'
    echo $((($(date +%s%N) - t0) / 1000000))
}
# A release boot: a copy of examples/leaky_app's release (built by bin/test)
# without its env.sh's LD_PRELOAD line, booted bare and with this build's
# preload.  Left out when the release has not been built.
. "$src/release_boot.sh"
has_release=false
release_copy "$src" "$tmp/release" && has_release=true
release_boot() { release_boot_ms "$tmp/release" "$@"; }
sample() { # sample NAME COMMAND... -> appends "NAME value" to the samples
    name=$1
    shift
    v=$("$@")
    [ -n "$v" ] || { echo "bench/vm.sh: $name printed nothing" >&2; exit 1; }
    echo "$name $v" >>"$tmp/samples"
}

. "$src/rotate.sh"
work="churn_bare churn_pre churn_erl churn_sampling enif_bare enif_routed enif_routed_pre"
[ "$has_jiffy" = true ] && work="$work mixed_bare mixed_pre mixed_sampling"
# Bare boots twice each time: the second against the first is the noise.
boot_kinds="boot_bare boot_bare_again boot_pre boot_sampling"
for part in table stacks; do
    [ -f "$leave_out/$part/mtrace.so" ] && boot_kinds="$boot_kinds boot_no_$part"
done
[ "$has_release" = true ] && boot_kinds="$boot_kinds release_bare release_bare_again release_pre"
run_variant() { # run_variant NAME: one sample of it
    case $1 in
    churn_bare) sample "$1" churn ;;
    churn_pre) sample "$1" churn_nif false "$pre" MTRACE_ERLANG=0 ;;
    churn_erl) sample "$1" churn_nif true "$pre" ;;
    churn_sampling) sample "$1" churn "$pre" MTRACE_SAMPLE_BYTES=524288 ;;
    enif_bare) sample "$1" churn_enif "" ;;
    enif_routed) sample "$1" churn_enif "+MRe false" ;;
    enif_routed_pre) sample "$1" churn_enif "+MRe false" "$pre" ;;
    mixed_bare) sample "$1" mixed ;;
    mixed_pre) sample "$1" mixed_nif "$pre" ;;
    mixed_sampling) sample "$1" mixed "$pre" MTRACE_SAMPLE_BYTES=524288 ;;
    boot_bare | boot_bare_again) sample "$1" boot ;;
    boot_pre) sample "$1" boot "$pre" ;;
    boot_sampling) sample "$1" boot "$pre" MTRACE_SAMPLE_BYTES=524288 ;;
    boot_no_*) sample "$1" boot "LD_PRELOAD=$leave_out/${1#boot_no_}/mtrace.so" ;;
    release_bare | release_bare_again) sample "$1" release_boot ;;
    release_pre) sample "$1" release_boot "$pre" ;;
    esac
}

r=1
while [ "$r" -le "$rounds" ]; do
    for v in $(rotate "$r" $work); do
        run_variant "$v"
    done
    b=1
    while [ "$b" -le "$boots" ]; do
        for v in $(rotate $((r * boots + b)) $boot_kinds); do
            run_variant "$v"
        done
        b=$((b + 1))
    done
    r=$((r + 1))
done

# Median per variant (every boot is a sample), then the markdown rows.
awk -v rounds="$rounds" -v boots="$boots" -v pairs="$pairs" \
    -v mixed_rounds="$mixed_rounds" '
function add(k, x) { n[k]++; v[k, n[k]] = x }
# Both bare boots of each time go into the reference ("boot_both").
{ add($1, $2); if ($1 ~ /^(boot|release)_bare/) add(substr($1, 1, index($1, "_bare") - 1) "_both", $2) }
END {
    for (k in n) {
        c = n[k]
        for (i = 2; i <= c; i++)
            for (j = i; j > 1 && v[k, j - 1] > v[k, j]; j--) { t = v[k, j]; v[k, j] = v[k, j - 1]; v[k, j - 1] = t }
        med[k] = (c % 2) ? v[k, (c + 1) / 2] : (v[k, c / 2] + v[k, c / 2 + 1]) / 2
    }
    print "| VM (bench/vm.sh), wall ms | bare | preloaded (ratio) |"
    print "|---|---|---|"
    row("dirty NIF churn + Erlang work", "churn_bare", "churn_pre")
    row("same, with Erlang frames (MTRACE_ERLANG on)", "churn_bare", "churn_erl")
    row("same, sampling (MTRACE_SAMPLE_BYTES=524288)", "churn_bare", "churn_sampling")
    row("node boot + halt", "boot_both", "boot_pre")
    row("same, sampling (MTRACE_SAMPLE_BYTES=524288)", "boot_both", "boot_sampling")
    if ("boot_no_table" in med)
        row("same, lossless without the table (a build that leaves it out)", "boot_both", "boot_no_table")
    if ("boot_no_stacks" in med)
        row("same, lossless without taking stacks (likewise)", "boot_both", "boot_no_stacks")
    row("noise: a bare node boot, its second run against its first", "boot_bare", "boot_bare_again")
    if ("release_bare" in med) {
        row("release boot + halt (examples/leaky_app)", "release_both", "release_pre")
        row("noise: a bare release boot, its second run against its first", "release_bare", "release_bare_again")
    }
    if ("mixed_bare" in med) {
        row("mixed node work, lossless", "mixed_bare", "mixed_pre")
        row("mixed node work, sampling (MTRACE_SAMPLE_BYTES=524288)", "mixed_bare", "mixed_sampling")
    }
    printf "\nMedian of %d interleaved rounds, each in its own order (boot: of all %d boots, bare: of " \
        "both bare boots each time). Churn: %d malloc/free pairs " \
        "(16-1040 bytes, live window 4096) in a dirty CPU NIF while 4 Erlang processes pass maps " \
        "and binaries until it ends; boot: erl -noshell -eval '"'"'halt().'"'"', exec to exit; " \
        "release boot: bin/leaky_app start with every application started, then halt.\n",
        rounds, rounds * boots, pairs
    if ("mixed_bare" in med)
        printf "\nMixed node work (bench/vm_mixed.erl): 4 processes x %d rounds of a JSON document " \
            "through jiffy, term_to_binary/binary_to_term, ETS insert/lookup/delete, crypto sha256 and " \
            "random bytes, zlib compress/uncompress and a message round trip; the preload saw %.0f " \
            "malloc-family calls in it, %.0f per second of the lossless run.\n",
            mixed_rounds, med["mixed_mallocs"], med["mixed_mallocs"] * 1000 / med["mixed_pre"]
    print ""
    print "| enif_alloc churn in a dirty NIF (bench/vm.sh), wall ms | driver_alloc | +MRe false (glibc malloc) | +MRe false, preloaded |"
    print "|---|---|---|---|"
    printf "| same pairs, same sizes | %.0f ms (1.00x) | %.0f ms (%.2fx) | %.0f ms (%.2fx) |\n", med["enif_bare"],
        med["enif_routed"], med["enif_routed"] / med["enif_bare"], med["enif_routed_pre"], med["enif_routed_pre"] / med["enif_bare"]
    print ""
    printf "Erlang frames cost %+.1f ns per malloc made in the NIF (median with them on minus off, " \
        "over %d malloc calls made under vm_churn:main/1).\n",
        (med["churn_erl"] - med["churn_pre"]) * 1e6 / pairs, pairs
}
function row(label, b, p) { printf "| %s | %.0f ms (1.00x) | %.0f ms (%.2fx) |\n", label, med[b], med[p], med[p] / med[b] }' "$tmp/samples"

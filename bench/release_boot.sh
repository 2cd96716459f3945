# Sourced by bench/vm.sh and bench/compare.sh: boots of examples/leaky_app's
# release (built by bin/test), bare or with a preload given in the
# environment.
# release_copy BENCH_DIR DIR: copies the release to DIR without its
# env.sh's LD_PRELOAD line, so that each boot preloads only what it is
# given; fails when the release has not been built.
release_copy() {
    built=$(cd "$1/.." && pwd)/examples/leaky_app/_build/prod/rel/leaky_app
    [ -x "$built/bin/leaky_app" ] || return 1
    cp -R "$built" "$2"
    sed -i.orig '/LD_PRELOAD/d' "$2"/releases/*/env.sh
}
# release_boot_ms DIR [ENV=VALUE...]: ms to boot the copy in DIR (every
# application started) and halt; prints nothing when the boot failed.
# Without distribution: a named node would start epmd, which the first boot
# pays for and which outlives the benchmark.
release_boot_ms() {
    dir=$1
    shift
    t0=$(date +%s%N)
    env "$@" ELIXIR_ERL_OPTIONS="-eval erlang:halt()" RELEASE_NODE="mtrace_bench_$$" RELEASE_DISTRIBUTION=none \
        RELEASE_TMP="$dir.tmp" "$dir/bin/leaky_app" start >/dev/null 2>&1 </dev/null || return 0
    echo $((($(date +%s%N) - t0) / 1000000))
}

# Sourced by bench/vm.sh and bench/compare.sh.
# rotate K ARGS...: ARGS from the (K mod count)-th on, then the ones before.
# Each round of a benchmark takes its variants in an order one further on,
# so that a run's place in the round, which changes its time, is every
# variant's in turn.
rotate() {
    k=$1
    shift
    k=$((k % $#))
    while [ "$k" -gt 0 ]; do
        set -- "$@" "$1"
        shift
        k=$((k - 1))
    done
    echo "$@"
}

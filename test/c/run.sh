#!/bin/sh
# Runs C test programs; each prints "N passed, M failed" last.  Tests named
# test_interpose* run with the preload active for every program.
#   sh test/c/run.sh BUILD PRIV TEST...
build=$1 priv=$2
shift 2
failed=0
for t in "$@"; do
    name=$(basename "$t")
    echo "== $name"
    case "$name" in
    test_interpose*)
        LD_PRELOAD="$(cd "$priv" && pwd)/mtrace.so" MTRACE_PROGRAMS="$name" \
            timeout 300 "$t" "$build" || failed=$((failed + 1)) ;;
    *) timeout 300 "$t" "$build" || failed=$((failed + 1)) ;;
    esac
done
echo "C test programs: $(($# - failed)) passed, $failed failed"
[ "$failed" -eq 0 ]

#!/bin/sh
# Runs C test programs; each prints "N passed, M failed" last.  Tests named
# test_interpose* run with the preload PRIV/mtrace.so active for every program
# they start (not for timeout: a preload built for musl cannot enter glibc's).
# With --valgrind, each runs under valgrind memcheck, and any error it reports
# (a definite leak included) fails the test.  Each test gets at most 300 s.
#   sh test/c/run.sh [--valgrind] BUILD PRIV TEST...
wrap=""
if [ "${1:-}" = "--valgrind" ]; then
    shift
    if ! command -v valgrind >/dev/null 2>&1; then
        echo "skipped: valgrind is not installed (Debian: apt-get install valgrind)"
        exit 0
    fi
    wrap="valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite"
fi
build=$1 priv=$2
shift 2
failed=0
for t in "$@"; do
    name=$(basename "$t")
    echo "== $name${wrap:+ (valgrind)}"
    case "$name" in
    test_interpose*)
        timeout 300 env LD_PRELOAD="$(cd "$priv" && pwd)/mtrace.so" MTRACE_PROGRAMS="$name" \
            $wrap "$t" "$build" || failed=$((failed + 1)) ;;
    *) timeout 300 $wrap "$t" "$build" || failed=$((failed + 1)) ;;
    esac
done
echo "C test programs: $(($# - failed)) passed, $failed failed"
[ "$failed" -eq 0 ]

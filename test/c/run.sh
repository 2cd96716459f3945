#!/bin/sh
# Runs C test programs; each prints "N passed, M failed" last.  Tests named
# test_interpose* run with the preload PRIV/mtrace.so active for every program
# they start (not for timeout: a preload built for musl cannot enter glibc's).
# With --valgrind, each runs under valgrind memcheck, and any error it reports
# (a definite leak included) fails the test.  With --emulator EMULATOR (one
# command, such as qemu-aarch64-static), a cross build's tests run under that
# user-mode emulator; the tests learn it from MTRACE_TEST_EMULATOR and start
# themselves again through it.  Each test gets at most 300 s.
#   sh test/c/run.sh [--valgrind | --emulator EMULATOR] BUILD PRIV TEST...
wrap=""
case "${1:-}" in
--valgrind)
    shift
    if ! command -v valgrind >/dev/null 2>&1; then
        echo "skipped: valgrind is not installed (Debian: apt-get install valgrind)"
        exit 0
    fi
    wrap="valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite"
    ;;
--emulator)
    wrap=$2
    shift 2
    if ! command -v "$wrap" >/dev/null 2>&1; then
        echo "skipped: $wrap is not installed (Debian: apt-get install qemu-user-static)"
        exit 0
    fi
    MTRACE_TEST_EMULATOR=$wrap
    export MTRACE_TEST_EMULATOR
    if [ -n "${MTRACE_STRESS:-}" ]; then
        echo "note: MTRACE_STRESS ignored under $wrap (the long variants would take hours)"
        unset MTRACE_STRESS
    fi
    ;;
esac
build=$1 priv=$2
shift 2
failed=0
for t in "$@"; do
    name=$(basename "$t")
    echo "== $name${wrap:+ (${wrap%% *})}"
    case "$name" in
    test_interpose*)
        # env sets the preload for the test only (not for timeout, nor for
        # a foreign-architecture emulator's loader).
        timeout 300 env LD_PRELOAD="$(cd "$priv" && pwd)/mtrace.so" MTRACE_PROGRAMS="$name" \
            $wrap "$t" "$build" || failed=$((failed + 1)) ;;
    tsan_tracker* | test_tracker_*) # the tracker built into the test: configured as if preloaded
        timeout 300 env MTRACE_PROGRAMS="$name" $wrap "$t" "$build" ${MTRACE_TSAN_SECONDS:-} ||
            failed=$((failed + 1)) ;;
    *) timeout 300 $wrap "$t" "$build" || failed=$((failed + 1)) ;;
    esac
done
echo "C test programs: $(($# - failed)) passed, $failed failed"
[ "$failed" -eq 0 ]

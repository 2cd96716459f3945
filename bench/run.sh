#!/bin/sh
# Runs every benchmark and prints the README's performance section: the
# machine, then markdown tables.  Figures are printed, never asserted.
#   sh bench/run.sh BUILD PRIV      (make bench / bmake -f Makefile.bsd bench)
# BENCH_ROUNDS (default 5) sets the interleaved rounds of the VM runs; the C
# churn runs three times as many rounds in lockstep (bench/churn.sh), each
# with new processes, since a process's memory layout alone moves its
# figures by a few hundredths.
set -eu
build=$1 priv=$(cd "$2" && pwd)
rounds=${BENCH_ROUNDS:-5}
here=$(cd "$(dirname "$0")" && pwd)

cpu=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo 2>/dev/null || echo unknown)
glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null || echo "libc unknown")
otp=$(erl -noshell -eval 'io:format("OTP ~s, ERTS ~s", [erlang:system_info(otp_release), erlang:system_info(version)]), halt().')
echo "Machine: $cpu, $(nproc) cores, Linux $(uname -r), $glibc, $otp."
echo

sh "$here/churn.sh" "$build" "$priv" $((3 * rounds))
echo
sh "$here/vm.sh" "$build" "$priv" "$rounds"
echo
echo "| Queries, 1,000,000 live allocations from 100 call sites (bench/query_bench.c) | |"
echo "|---|---|"
LD_PRELOAD="$priv/mtrace.so" MTRACE_PROGRAMS=query_bench "$build/query_bench" 1000000
echo
echo "| Symbolization (bench/symbols_bench.c) | |"
echo "|---|---|"
"$build/symbols_bench"

#!/bin/sh
# Runs mtrace's benchmarks and prints markdown rows for the README.
#   sh bench/run.sh BUILD PRIV      (make bench / bmake -f Makefile.bsd bench)
set -eu
build=$1 priv=$(cd "$2" && pwd)
echo "| Query cost with the preload active (bench/query_bench.c) | |"
echo "|---|---|"
LD_PRELOAD="$priv/mtrace.so" MTRACE_PROGRAMS=query_bench "$build/query_bench" 1000000

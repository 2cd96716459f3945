#!/bin/sh
# Release test: builds examples/leaky_app as an OTP release whose
# rel/env.sh.eex preloads mtrace (the documented LD_PRELOAD line), starts it
# as a daemon and checks that
#   1. the build probed the platform again (no stale makevars.mk),
#   2. Mtrace.preloaded?() is true (through `bin/leaky_app rpc`, as the rest),
#   3. Mtrace.olds(50) has a 4096-byte block whose frame 0 is the example's
#      leaky_app_cache_entry (the C function that called malloc),
#   4. its stack names the Erlang caller,
#   5. Mtrace.VM.nif_memory() answers,
#   6. `bin/leaky_app stop` stops the node.
# Works offline (mtrace is a path dependency) and without stdin:
#
#   sh test/release/run.sh            (from the repository root, or anywhere)
#
# Each run uses its own node name, cookie and RELEASE_TMP, so runs on other
# checkouts do not clash.  The node is stopped on any exit (trap).
set -eu

root=$(cd "$(dirname "$0")/../.." && pwd)
app="$root/examples/leaky_app"
rel="$app/_build/prod/rel/leaky_app"
bin="$rel/bin/leaky_app"
total=6
passed=0
failed=0
started=0
stopped=0
os_pid=""
tmp=""

say() { echo "release: $*"; }
pass() {
    passed=$((passed + 1))
    say "ok   - $*"
}
fail() {
    failed=$((failed + 1))
    say "FAIL - $*"
}
summary() { echo "release: $passed passed, $failed failed"; }

# die MESSAGE: a step the checks depend on failed; the unrun checks count as failed.
die() {
    say "FAIL - $*"
    failed=$((total - passed))
    summary
    exit 1
}

# Runs with a time limit where coreutils' timeout exists.
limit() {
    secs=$1
    shift
    if command -v timeout >/dev/null 2>&1; then
        timeout "$secs" "$@"
    else
        "$@"
    fi
}

rpc() { limit 60 "$bin" rpc "$1" </dev/null 2>&1; }

alive() { [ -n "$os_pid" ] && kill -0 "$os_pid" 2>/dev/null; }

# wait_gone SECONDS: waits for the node's OS process to exit.
wait_gone() {
    n=$(($1 * 5))
    while alive && [ "$n" -gt 0 ]; do
        sleep 0.2
        n=$((n - 1))
    done
    ! alive
}

show_log() {
    for f in "$tmp"/log/erlang.log.*; do
        [ -f "$f" ] || continue
        echo "---- last lines of the node's log ($f):"
        tail -n 40 "$f"
        echo "----"
    done
}

cleanup() {
    status=$?
    trap - EXIT INT TERM
    if [ "$started" = 1 ] && [ "$stopped" = 0 ]; then
        [ "$status" = 0 ] || show_log
        limit 30 "$bin" stop </dev/null >/dev/null 2>&1 || true
        if ! wait_gone 15 && alive; then
            say "node did not stop: killing OS pid $os_pid"
            kill "$os_pid" 2>/dev/null || true
            wait_gone 5 || kill -9 "$os_pid" 2>/dev/null || true
        fi
    fi
    [ -z "$tmp" ] || rm -rf "$tmp"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Settings from the caller's environment that would point the build or the
# release somewhere else.
unset MIX_BUILD_PATH MIX_BUILD_ROOT MIX_DEPS_PATH MIX_TARGET LD_PRELOAD \
    RELEASE_ROOT RELEASE_NAME RELEASE_VSN RELEASE_PROG RELEASE_COMMAND RELEASE_MODE \
    RELEASE_VM_ARGS RELEASE_REMOTE_VM_ARGS RELEASE_SYS_CONFIG RELEASE_BOOT_SCRIPT \
    RELEASE_BOOT_SCRIPT_CLEAN 2>/dev/null || true
export MIX_ENV=prod

tmp=$(mktemp -d "${TMPDIR:-/tmp}/mtrace-release.XXXXXX")

# ---- build -----------------------------------------------------------------
command -v mix >/dev/null 2>&1 || die "mix not found (install Elixir)"
say "building $rel"
# Build mtrace afresh, as after `mix deps.clean mtrace`: that removes the
# app's directory (lib/mtrace) but not mtrace's build directory (mtrace_c),
# whose probe of the platform (makevars.mk) may be from before libdw-dev was
# installed. A build with no library installed must probe again; a stale
# probe stands in for the old one here.
rm -rf "$rel" "$app/_build/prod/lib/mtrace" "$app/_build/prod/mtrace_c"
mkdir -p "$app/_build/prod/mtrace_c"
# (of this Erlang: a probe against another Erlang's headers is redone anyway)
erts_include=$(erl -noshell -eval 'io:format("~s", [filename:join([code:root_dir(),
    "erts-" ++ erlang:system_info(version), "include"])]), halt().')
printf '# stale probe left by test/release/run.sh\nERTS_INCLUDE = %s\n' "$erts_include" \
    >"$app/_build/prod/mtrace_c/makevars.mk"
if ! (cd "$app" && mix deps.get && mix release --overwrite) </dev/null >"$tmp/build.log" 2>&1; then
    cat "$tmp/build.log"
    die "MIX_ENV=prod mix release failed in $app"
fi

# 1. The platform was probed again.
if grep -q "stale probe" "$app/_build/prod/mtrace_c/makevars.mk"; then
    fail "mix compile kept a probe from an earlier build (_build/prod/mtrace_c/makevars.mk)"
else
    pass "a build with no library installed probes the platform again"
fi

# The preload must be a real file inside the release, not a symlink back into
# the source tree (mix release copies priv/ with dereference_symlinks: true).
so=$(ls "$rel"/lib/mtrace-*/priv/mtrace.so 2>/dev/null || true)
case "$so" in
"" | *"
"*) die "expected exactly one $rel/lib/mtrace-*/priv/mtrace.so, found: '${so}'" ;;
esac
if [ -L "$so" ] || [ -L "$(dirname "$so")" ] || [ ! -f "$so" ]; then
    ls -la "$(dirname "$so")" "$so" || true
    die "$so is not a real file in the release"
fi
grep -q 'export LD_PRELOAD=' "$rel"/releases/*/env.sh ||
    die "the release's env.sh does not set LD_PRELOAD (rel/env.sh.eex not used?)"

# ---- start -----------------------------------------------------------------
RELEASE_DISTRIBUTION=sname
RELEASE_NODE="mtrace_rel_$$_$(date +%s)"
RELEASE_COOKIE="mtrace_$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')"
RELEASE_TMP="$tmp"
export RELEASE_DISTRIBUTION RELEASE_NODE RELEASE_COOKIE RELEASE_TMP

# The node needs epmd (sname distribution). erl would start the release's
# copy, with LD_PRELOAD from env.sh; start the system's here if there is one
# (a no-op when epmd already runs), else the release's. It is left running,
# as other nodes may use it.
if command -v epmd >/dev/null 2>&1; then
    epmd -daemon || true
else
    for e in "$rel"/erts-*/bin/epmd; do "$e" -daemon || true; done
fi

say "starting node $RELEASE_NODE"
limit 60 "$bin" daemon </dev/null >"$tmp/daemon.out" 2>&1 || {
    cat "$tmp/daemon.out"
    die "bin/leaky_app daemon failed"
}
started=1

deadline=$(($(date +%s) + 30))
until out=$(rpc 'IO.puts(:ok)') && [ "$out" = ok ]; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
        echo "$out"
        show_log
        die "node $RELEASE_NODE did not answer rpc within 30 s"
    fi
    sleep 1
done
os_pid=$(rpc 'IO.puts(System.pid())' | tail -n 1)
case "$os_pid" in
"" | *[!0-9]*) os_pid="" ;;
esac

# ---- checks ----------------------------------------------------------------
# 2. The tracer is preloaded (rel/env.sh.eex did its job).
if out=$(rpc 'IO.puts("preloaded=#{Mtrace.preloaded?()}")') &&
    echo "$out" | grep -qx 'preloaded=true'; then
    pass "Mtrace.preloaded?() is true"
else
    echo "$out"
    fail "Mtrace.preloaded?() is not true"
fi

# 3. The leak is found, named after the C function that called malloc.  What
# the VM allocated while booting is older than the leak and would fill
# olds(50), so forget it first (Mtrace.reset/0) and let the leaker (one block
# every 200 ms) leak a few more.
leak_expr='
wait = fn wait, n ->
  if Process.whereis(LeakyApp.Leaker) || n == 0, do: :ok, else: (Process.sleep(100); wait.(wait, n - 1))
end
wait.(wait, 100)
forgotten = Mtrace.reset()
Process.sleep(1200)
olds = Mtrace.olds(50)
hits = Enum.filter(olds, &match?({_, 4096, _, _, [{_, "leaky_app_cache_entry"} | _]}, &1))
IO.puts("olds: #{length(olds)} (after forgetting #{forgotten}), leaks named leaky_app_cache_entry: #{length(hits)}")
for {age, size, _addr, _ns, stack} <- olds, do: IO.puts("  #{age}s #{size} bytes #{inspect(Enum.take(stack, 3))}")
IO.puts(if hits == [], do: "leak=missing", else: "leak=found")
caller = {"erlang", "LeakyApp.Leaker.handle_info/2"}
named = Enum.filter(hits, fn {_, _, _, _, stack} -> caller in stack end)
IO.puts(if named == [], do: "caller=missing", else: "caller=found")
'
if out=$(rpc "$leak_expr") && echo "$out" | grep -qx 'leak=found'; then
    pass "Mtrace.olds(50) has a 4096-byte block from leaky_app_cache_entry (frame 0)"
else
    echo "$out"
    fail "Mtrace.olds(50) has no 4096-byte block whose frame 0 is leaky_app_cache_entry"
fi
# 4. ... and after its native frames comes the Erlang code that called the NIF.
if echo "$out" | grep -qx 'caller=found'; then
    pass "its stack names the Erlang caller, LeakyApp.Leaker.handle_info/2"
else
    echo "$out"
    fail "no leaked block's stack names the Erlang caller LeakyApp.Leaker.handle_info/2"
fi

# 5. NIF memory in the VM's allocators is readable: the release has tools.
if out=$(rpc 'IO.puts("nif_memory=#{is_list(Mtrace.VM.nif_memory())}")') &&
    echo "$out" | grep -qx 'nif_memory=true'; then
    pass "Mtrace.VM.nif_memory() answers (the tools application is in the release)"
else
    echo "$out"
    fail "Mtrace.VM.nif_memory() failed in the release"
fi

# 6. The node stops.
if out=$(limit 30 "$bin" stop </dev/null 2>&1) && wait_gone 15 &&
    ! rpc 'IO.puts(:ok)' >/dev/null; then
    stopped=1
    pass "bin/leaky_app stop stopped the node"
else
    echo "$out"
    fail "bin/leaky_app stop did not stop the node (OS pid ${os_pid:-unknown})"
fi

[ "$failed" = 0 ] || show_log
summary
[ "$failed" = 0 ]

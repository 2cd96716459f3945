defmodule MtraceTest do
  # Not async: every test resets and reads the one allocation table of this VM.
  use ExUnit.Case, async: false
  doctest Mtrace

  import Bitwise
  alias Mtrace.Test.LeakyNif

  setup do
    LeakyNif.fresh_table(&on_exit/1)
  end

  # Live allocations of exactly `size` bytes whose frame 0 is `symbol`.
  defp leaked(size, symbol) do
    for {_age, ^size, _addr, _ns, [{_lib, ^symbol} | _]} = old <- Mtrace.olds(1_000_000),
        do: old
  end

  test "the tracer is preloaded and active in this VM" do
    assert Mtrace.preloaded?()
    stats = Mtrace.stats()
    assert stats.active
    assert stats.enabled
    assert stats.depth == 32
  end

  test "each leak is recorded with its size and the static function that made it" do
    LeakyNif.leak(:malloc, 7, 3001)
    LeakyNif.leak(:calloc, 5, 1001)
    LeakyNif.leak(:realloc, 3, 2999)
    LeakyNif.leak(:strdup, 4, 99)
    LeakyNif.leak(:aligned, 2, 4321)

    assert length(leaked(3001, "fixture_leak_malloc")) == 7
    assert length(leaked(3003, "fixture_leak_calloc")) == 5
    assert length(leaked(2999, "fixture_leak_realloc")) == 3
    assert length(leaked(100, "fixture_leak_strdup")) == 4
    assert length(leaked(4321, "fixture_leak_aligned")) == 2
    # realloc's first, small block was moved or grown: no 8-byte entry stays behind
    assert leaked(8, "fixture_leak_realloc") == []

    [{_age, 3001, addr, ns, [{lib, _} | _]} | _] = leaked(3001, "fixture_leak_malloc")
    assert lib =~ "leaky_nif.so"
    assert addr > 0 and ns >= 0
  end

  test "freed and churned allocations are gone" do
    LeakyNif.leak(:malloc, 10, 5003)
    assert length(leaked(5003, "fixture_leak_malloc")) == 10
    assert LeakyNif.free_kept() == 10
    assert leaked(5003, "fixture_leak_malloc") == []

    LeakyNif.churn(20_000, 6007)
    assert for({_, 6007, _, _, _} = o <- Mtrace.olds(1_000_000), do: o) == []
  end

  test "cluster/3 gives this node's answer as made: entries share their stack" do
    LeakyNif.leak(:malloc, 2000, 4099)
    assert {:ok, olds} = Mtrace.cluster(:olds, [100_000])[node()]
    assert length(leaked(4099, "fixture_leak_malloc")) == 2000
    # One stack term for the 2000 entries; a copy (a task's answer sent to
    # its caller) would hold one per entry: 3 GB for a million entries.
    assert :erts_debug.size(olds) * 4 < :erts_debug.flat_size(olds)
  end

  test "reset forgets everything; frees of forgotten blocks are harmless" do
    LeakyNif.leak(:malloc, 20, 7001)
    assert Mtrace.reset() >= 20
    assert leaked(7001, "fixture_leak_malloc") == []
    assert LeakyNif.free_kept() == 20
    LeakyNif.leak(:malloc, 1, 7001)
    assert length(leaked(7001, "fixture_leak_malloc")) == 1
  end

  test "olds are ordered oldest first with ages in seconds" do
    LeakyNif.leak(:malloc, 1, 8101)
    Process.sleep(1100)
    LeakyNif.leak(:malloc, 1, 8102)

    sizes = for {_, size, _, _, _} <- Mtrace.olds(1_000_000), size in [8101, 8102], do: size

    assert sizes == [8101, 8102]
    [{age, _, _, _, _}] = leaked(8101, "fixture_leak_malloc")
    assert age >= 1
    ages = for {age, _, _, _, _} <- Mtrace.olds(1_000_000), do: age
    assert ages == Enum.sort(ages, :desc)
    assert length(Mtrace.olds(2)) == 2
    assert length(Mtrace.olds(1)) == 1
    assert Mtrace.olds(0) == []
  end

  test "stats count calls and live allocations" do
    before = Mtrace.stats()
    LeakyNif.leak(:malloc, 100, 9001)
    LeakyNif.leak(:strdup, 10, 50)
    later = Mtrace.stats()
    assert later.malloc_cnt - before.malloc_cnt >= 100
    assert later.strdup_cnt - before.strdup_cnt == 10
    assert later.live_count >= 110
    assert later.live_bytes >= 100 * 9001
    assert later.dropped == 0

    for key <-
          ~w(malloc_cnt calloc_cnt realloc_cnt free_cnt posix_memalign_cnt strdup_cnt
             strndup_cnt allocated_bytes used_bytes free_bytes mmap_chunks mmap_bytes
             live_count live_bytes dropped table_bytes stacks enabled depth)a do
      assert Map.has_key?(later, key), "stats lacks #{key}"
    end
  end

  test "the table's figures can be read without glibc's heap walk, as periodic readers do" do
    full = Mtrace.VM.Native.stats()
    light = Mtrace.VM.Native.stats(false)
    heap = [:allocated_bytes, :used_bytes, :free_bytes, :mmap_chunks, :mmap_bytes]
    assert Enum.all?(heap, &is_integer(full[&1]))
    assert Enum.all?(heap, &(Map.fetch!(light, &1) == nil))
    assert Map.keys(light) == Map.keys(full)
    assert is_integer(light.live_bytes) and light.active
    assert_raise ArgumentError, fn -> Mtrace.Native.stats(:maybe) end
    assert Mtrace.stats(heap: false).used_bytes == nil
    assert_raise ArgumentError, ~r/option :heap/, fn -> Mtrace.stats(heap: :maybe) end

    # top's view and a window's steps read the light figures
    assert Mtrace.Top.Sample.take(nil, 1).memory.native[:used_bytes] == nil
    assert is_integer(Mtrace.VM.Memory.read().native.used_bytes)
  end

  test "4 threads leaking at once are all tracked" do
    LeakyNif.leak_threads(4, 250, 1237)
    assert length(leaked(1237, "fixture_thread_leak")) == 1000
  end

  test "disable stops recording, enable resumes" do
    :ok = Mtrace.disable()
    refute Mtrace.stats().enabled
    LeakyNif.leak(:malloc, 5, 4441)
    :ok = Mtrace.enable()
    LeakyNif.leak(:malloc, 3, 4441)
    assert length(leaked(4441, "fixture_leak_malloc")) == 3
  end

  test "demangle: true returns the same shape" do
    LeakyNif.leak(:malloc, 1, 3331)
    assert [{_, _, _, _, [{_, "fixture_leak_malloc"} | _]} | _] = Mtrace.olds(1, true)
  end

  test "bad arguments raise ArgumentError" do
    assert_raise ArgumentError, ~r/n must be/, fn -> Mtrace.olds(-1) end
    assert_raise ArgumentError, ~r/n must be/, fn -> Mtrace.olds(1.5) end
    assert_raise ArgumentError, ~r/n must be/, fn -> Mtrace.olds(:ten) end
    assert_raise ArgumentError, ~r/must be a boolean \(demangle\)/, fn -> Mtrace.olds(1, :yes) end
    assert_raise ArgumentError, ~r/must be a boolean \(demangle\)/, fn -> Mtrace.olds(1, nil) end
  end

  test "os:cmd and ports work under the preload" do
    assert :os.cmd(~c"echo hello") == ~c"hello\n"
    port = Port.open({:spawn, "cat"}, [:binary])
    send(port, {self(), {:command, "ping"}})
    assert_receive {^port, {:data, "ping"}}, 5000
    Port.close(port)
  end

  test "Mtrace.VM.diagnose/1 names a NIF leak under the preload" do
    leaker =
      spawn(fn ->
        for _ <- 1..15 do
          LeakyNif.leak(:malloc, 16, 1 <<< 20)
          Process.sleep(100)
        end
      end)

    result = Mtrace.VM.diagnose(window: 1000, print: false)
    Process.exit(leaker, :kill)
    assert result.verdict == :native_leak
    assert [%{kind: :native_leak} | _] = result.findings
  end

  test "a node without the preload gets a clear error" do
    {:ok, peer, _node} =
      :peer.start(%{
        connection: :standard_io,
        env: [{~c"LD_PRELOAD", false}],
        args: Enum.flat_map(:code.get_path(), &[~c"-pa", &1])
      })

    try do
      {preloaded, message} = :peer.call(peer, Mtrace.Test.Remote, :preloaded_and_error, [])
      refute preloaded
      assert message =~ "not preloaded"
      assert message =~ "LD_PRELOAD="
      assert message =~ "mtrace.so"
    after
      :peer.stop(peer)
    end
  end
end

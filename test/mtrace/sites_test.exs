defmodule Mtrace.SitesTest do
  # Not async: every test resets and reads the one allocation table of this VM.
  use ExUnit.Case, async: false
  doctest Mtrace.Options
  doctest Mtrace.Query
  doctest Mtrace.Remote
  doctest Mtrace.Frame

  import Bitwise
  alias Mtrace.Test.LeakyNif

  @lib "leaky_nif"

  setup do
    LeakyNif.fresh_table(&on_exit/1)
  end

  defp leak_three_sites do
    LeakyNif.leak(:malloc, 7, 3001)
    LeakyNif.leak(:calloc, 50, 100)
    LeakyNif.leak(:strdup, 3, 99)
  end

  defp summary(sites), do: Enum.map(sites, &{hd(&1.frames).symbol, &1.count, &1.bytes})

  # The line of the source that carries `marker`, 1-based.
  defp source_line(marker) do
    "test/fixtures/leaky_nif.c"
    |> File.read!()
    |> String.split("\n")
    |> Enum.find_index(&String.contains?(&1, marker))
    |> Kernel.+(1)
  end

  test "sites groups live allocations by stack, exact counts and bytes, in each order" do
    leak_three_sites()
    LeakyNif.churn(10_000, 4096)

    assert summary(Mtrace.sites(lib: @lib)) == [
             {"fixture_leak_malloc", 7, 21_007},
             {"fixture_leak_calloc", 50, 15_000},
             {"fixture_leak_strdup", 3, 300}
           ]

    assert summary(Mtrace.sites(lib: @lib, sort: :count)) == [
             {"fixture_leak_calloc", 50, 15_000},
             {"fixture_leak_malloc", 7, 21_007},
             {"fixture_leak_strdup", 3, 300}
           ]

    assert [{"fixture_leak_malloc", 7, 21_007}] = summary(Mtrace.sites(lib: @lib, limit: 1))
    assert length(Mtrace.sites(lib: @lib, limit: :all)) == 3
  end

  test "sort: :oldest puts the site with the oldest allocation first" do
    LeakyNif.leak(:strdup, 1, 10)
    Process.sleep(1_100)
    LeakyNif.leak(:malloc, 100, 1000)

    assert [%{oldest: old, frames: [%{symbol: "fixture_leak_strdup"} | _]}, %{oldest: young}] =
             Mtrace.sites(lib: @lib, sort: :oldest)

    assert old >= 1 and young <= old
  end

  test "a site's frames name the source file and line of the call" do
    LeakyNif.leak(:malloc, 1, 64)
    [%{frames: [frame | callers]}] = Mtrace.sites(lib: @lib)

    assert %{symbol: "fixture_leak_malloc", inlined: false} = frame
    assert frame.file =~ ~r/leaky_nif\.c$/
    assert frame.line == source_line("site: fixture_leak_malloc")
    assert frame.lib =~ "leaky_nif.so"
    assert frame.offset > 0 and frame.offset < frame.addr
    # the NIF entry point called it, from the same object
    assert Enum.any?(callers, &(&1.symbol == "leak" and &1.lib == frame.lib))
  end

  test "mark/0 and since: show only what was allocated after the mark" do
    LeakyNif.leak(:malloc, 7, 3001)
    mark = Mtrace.mark()
    assert %Mtrace.Mark{node: node} = mark
    assert node == node()
    assert Mtrace.sites(lib: @lib, since: mark) == []

    LeakyNif.leak(:strdup, 3, 99)
    LeakyNif.leak(:malloc, 2, 3001)

    assert summary(Mtrace.sites(lib: @lib, since: mark)) == [
             {"fixture_leak_malloc", 2, 6002},
             {"fixture_leak_strdup", 3, 300}
           ]

    assert length(Mtrace.olds(100, lib: @lib, since: mark)) == 5
    # without the mark, the older ones are still there: nothing was forgotten
    # (two sites: the two calls come from two lines of this test)
    assert [{_, 7, 21_007}, {_, 2, 6002} | _] = summary(Mtrace.sites(lib: @lib))
  end

  test "size and age filters" do
    leak_three_sites()
    # calloc(100, 3): 300-byte blocks; strdup of 99 chars: 100 bytes
    assert summary(Mtrace.sites(lib: @lib, min_size: 301)) == [{"fixture_leak_malloc", 7, 21_007}]
    assert summary(Mtrace.sites(lib: @lib, max_size: 300)) |> length() == 2
    assert summary(Mtrace.sites(lib: @lib, max_size: 100)) == [{"fixture_leak_strdup", 3, 300}]
    assert Mtrace.sites(lib: @lib, min_size: 101, max_size: 299) == []
    assert Mtrace.sites(lib: @lib, min_age: 3600) == []
    assert length(Mtrace.sites(lib: @lib, max_age: 3600)) == 3

    assert_raise ArgumentError, ~r/nothing could match/, fn ->
      Mtrace.sites(lib: @lib, min_size: 500, max_size: 10)
    end

    Process.sleep(1_100)
    LeakyNif.leak(:aligned, 4, 4321)
    assert [%{count: 4, bytes: 17_284}] = Mtrace.sites(lib: @lib, max_age: 0.5)
    assert length(Mtrace.sites(lib: @lib, min_age: 1)) == 3
  end

  test "lib: keeps only stacks through a matching object" do
    leak_three_sites()
    assert Mtrace.sites(lib: "no-such-object-anywhere") == []
    assert Mtrace.olds(10, lib: "no-such-object-anywhere") == []

    for site <- Mtrace.sites(lib: @lib, limit: :all) do
      assert Enum.any?(site.frames, &(&1.lib && &1.lib =~ @lib))
    end
  end

  test "olds/2 keyword form returns maps with frames, oldest first" do
    LeakyNif.leak(:malloc, 3, 3001)
    Process.sleep(1_100)
    LeakyNif.leak(:strdup, 2, 99)

    olds = Mtrace.olds(10, lib: @lib)
    assert [%{size: 3001, age: a1, frames: [%{symbol: "fixture_leak_malloc"} | _]} | _] = olds
    assert length(olds) == 5
    assert %{size: 100, age: a2} = List.last(olds)
    assert a1 >= a2 and a1 >= 1
    assert Enum.all?(olds, &(is_integer(&1.addr) and &1.ns >= 0))
    assert [%{size: 100}, %{size: 100}] = Mtrace.olds(10, lib: @lib, max_size: 100)
  end

  test "olds/2 shares one stack term among the entries of a stack, in both forms" do
    # 4_000 blocks from one stack, with Erlang frames: each entry holding its
    # own copy of ~30 frames took ~1 KiB, and a million entries gigabytes.
    Mtrace.Test.ErlangCallers.append(4_000)
    maps = Mtrace.olds(4_000, lib: @lib)
    assert length(maps) == 4_000
    assert [%{symbol: "fixture_leak_malloc"} | _] = hd(maps).frames
    assert maps |> Enum.map(& &1.frames) |> Enum.uniq() |> length() == 1
    assert Enum.any?(hd(maps).frames, &(&1[:symbol] == "Mtrace.Test.ErlangCallers.append/1"))
    assert :erts_debug.size(maps) < 4_000 * 40

    seed = for {_, 1000, _, _, _} = old <- Mtrace.olds(100_000), do: old
    assert length(seed) == 4_000
    assert Enum.any?(elem(hd(seed), 4), &(&1 == {"erlang", "Mtrace.Test.ErlangCallers.append/1"}))
    assert :erts_debug.size(seed) < 4_000 * 40
  end

  test "sites share the terms of the native frames their stacks have in common" do
    # one NIF call site, two Erlang callers: two stacks, the same C frames
    Mtrace.Test.ErlangCallers.append(2)
    Mtrace.Test.ErlangCallers.audit(3)

    [a, b] =
      Mtrace.sites(lib: @lib, limit: :all)
      |> Enum.filter(&(hd(&1.frames)[:symbol] == "fixture_leak_malloc"))
      |> Enum.sort_by(& &1.count)

    assert {a.count, b.count} == {2, 3}
    assert hd(a.frames) == hd(b.frames)
    assert :erts_debug.same(hd(a.frames), hd(b.frames))
  end

  test "the frames of a site sum to what stats counts when nothing else allocates" do
    leak_three_sites()
    total = Mtrace.sites(lib: @lib, limit: :all) |> Enum.map(& &1.bytes) |> Enum.sum()
    assert total == 21_007 + 15_000 + 300
    all = Mtrace.sites(limit: :all) |> Enum.map(& &1.bytes) |> Enum.sum()
    assert all >= total
  end

  test "an empty answer asks the table whether it traces, not glibc's heap walk" do
    # stats/0 walks glibc's arenas (every thread of the node waits); a quiet
    # node's top and watcher get empty answers at every refresh
    me = self()

    tracer =
      spawn_link(fn ->
        collect = fn collect, calls ->
          receive do
            {:trace, ^me, :call, {Mtrace.Native, :stats, args}} ->
              collect.(collect, [args | calls])

            {:calls, to} ->
              send(to, {:calls, Enum.reverse(calls)})
          end
        end

        collect.(collect, [])
      end)

    :erlang.trace(me, true, [:call, {:tracer, tracer}])
    :erlang.trace_pattern({Mtrace.Native, :stats, :_}, true, [:local])
    on_exit(fn -> :erlang.trace_pattern({Mtrace.Native, :stats, :_}, false, [:local]) end)
    assert Mtrace.sites(lib: "no_such_object_here") == []
    :erlang.trace(me, false, [:call])
    ref = :erlang.trace_delivered(me)
    assert_receive {:trace_delivered, ^me, ^ref}
    send(tracer, {:calls, me})
    assert_receive {:calls, [[false]]}
  end

  test "bad options raise ArgumentError naming the option" do
    for {opts, name} <- [
          {[sort: :size], ":sort"},
          {[limit: 0], ":limit"},
          {[limit: -1], ":limit"},
          {[limit: 1 <<< 70], ":limit"},
          {[min_size: -1], ":min_size"},
          {[max_size: "1"], ":max_size"},
          {[min_age: :old], ":min_age"},
          {[lib: ""], ":lib"},
          {[lib: "a\0b"], ":lib"},
          {[lib: :leaky], ":lib"},
          {[since: 5], ":since"},
          {[demangle: 1], ":demangle"},
          {[node: "x@y"], ":node"},
          {[colour: :red], ":colour"}
        ] do
      error = assert_raise ArgumentError, fn -> Mtrace.sites(opts) end
      assert error.message =~ name, "#{inspect(opts)}: #{error.message}"
    end

    assert_raise ArgumentError, ~r/keyword list/, fn -> Mtrace.sites(:all) end
    assert_raise ArgumentError, ~r/:min_age/, fn -> Mtrace.olds(5, min_age: -1) end
    assert_raise ArgumentError, ~r/n must/, fn -> Mtrace.olds(-1, []) end
    assert_raise ArgumentError, ~r/at most/, fn -> Mtrace.olds(1 <<< 64, []) end

    foreign = %Mtrace.Mark{node: :elsewhere@nowhere, t_ms: 1}

    # a mark's query runs on its node, here unreachable (from a distributed
    # node: an undistributed one says :not_distributed, tested elsewhere) ...
    Mtrace.Test.Remote.distribute!()
    assert %Mtrace.Error{reason: :nodedown} = catch_error(Mtrace.sites(since: foreign))

    # ... and means nothing on any other
    assert_raise ArgumentError, ~r/taken on :elsewhere@nowhere/, fn ->
      Mtrace.sites(since: foreign, node: node())
    end

    assert_raise ArgumentError, ~r/sort: :growth measures growth since a mark/, fn ->
      Mtrace.sites(sort: :growth)
    end

    assert_raise ArgumentError, ~r/either :since or :window/, fn ->
      Mtrace.sites(since: Mtrace.mark(), window: 10)
    end

    assert_raise ArgumentError, ~r/:window/, fn -> Mtrace.sites(window: 0) end
    assert_raise ArgumentError, ~r/:boot/, fn -> Mtrace.sites(boot: :yes) end
  end

  test "the boot's figure is what was allocated before mtrace started, by time" do
    started = :persistent_term.get({Mtrace, :started_ms}, nil)
    on_exit(fn -> :persistent_term.put({Mtrace, :started_ms}, started) end)

    LeakyNif.leak(:malloc, 4, 1000)
    # mtrace "starts" now: blocks from the next tick of the table's clock on
    # are after it
    :persistent_term.put({Mtrace, :started_ms}, Mtrace.mark().t_ms)
    LeakyNif.leak(:malloc, 5, 1000)

    snap = Mtrace.Query.snapshot(lib: @lib, boot: false)
    assert %{count: 5, bytes: 5000} = snap.total
    assert %{count: 4, bytes: 4000} = snap.boot

    # the bound itself: before a time, whatever else is asked
    t = Mtrace.Options.started_ms()
    before = &Mtrace.Query.sites(%{limit: 1, sort: :bytes, lib: @lib, before: &1})
    assert {%{count: 4}, _} = before.(t)
    assert {%{count: 0}, []} = before.(0)
  end
end

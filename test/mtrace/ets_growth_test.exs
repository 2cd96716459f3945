defmodule Mtrace.EtsGrowthTest do
  # The ETS check on this node's own tables: what a table grows by with the
  # binaries it references, and how its owner is named.
  use ExUnit.Case, async: false

  alias Mtrace.VM.{Diagnose, MemoryChecks}

  @extra %{bin_leak: nil, preloaded: false, sites: []}

  # A table of `n` objects, each referencing a 2 KiB refc binary of its own.
  defp blob_table(n) do
    t = :ets.new(:blobs, [:public])
    for i <- 1..n, do: :ets.insert(t, {i, :binary.copy(<<i::32, i::32>>, 256)})
    t
  end

  test "a table grows by the binaries it references, as its size counts them" do
    t = blob_table(10_000)
    snap = Diagnose.snapshot()
    bytes = Map.fetch!(snap.ets, t)
    # over 5 s, the table's own memory doubled: 10_000 objects were added,
    # and with them about 20 MiB of binaries, which the VM's binary memory
    # grew by
    prev = %{
      snap
      | at_ms: snap.at_ms - 5_000,
        ets: Map.put(snap.ets, t, div(bytes, 2)),
        memory: %{snap.memory | binary: snap.memory.binary - 10_000 * 2_048}
    }

    [ets | _] = MemoryChecks.run(prev, snap, 5.0, @extra)
    assert ets.evidence.table == t, ets.summary
    assert ets.evidence.binary_estimate >= 10_000 * 2_048
    per_s = (ets.evidence.binary_estimate + bytes) / 2 / 5.0
    assert_in_delta ets.evidence.growth_per_s, per_s, 1
    assert ets.score > 50, ets.summary
    assert ets.summary =~ ~r/growing by about \S+ MiB\/s with them$/
    :ets.delete(t)
  end

  test "a table that grows by objects without binaries grows by its own memory alone" do
    t = :ets.new(:blobs, [:public])
    for i <- 1..5_000, do: :ets.insert(t, {i, :binary.copy(<<i::32>>, 5_000)})
    prev = Diagnose.snapshot()
    # only small objects, no binary at all, are added during the window
    for i <- 5_001..10_000, do: :ets.insert(t, {i, i})
    snap = Diagnose.snapshot()
    prev = %{prev | at_ms: snap.at_ms - 5_000}
    own = Map.fetch!(snap.ets, t) - Map.fetch!(prev.ets, t)
    # the VM's binary memory did not grow: no binary came with them
    snap = %{snap | memory: %{snap.memory | binary: prev.memory.binary}}
    [ets | _] = MemoryChecks.run(prev, snap, 5.0, @extra)
    assert ets.evidence.table == t, ets.summary
    assert_in_delta ets.evidence.growth_per_s, own / 5.0, 1
    :ets.delete(t)
  end

  test "the owner is named as other findings name a process, with a call to paste" do
    me = self()

    owner =
      spawn(fn ->
        Process.register(self(), :mtrace_session_store)
        send(me, {:table, blob_table(100)})
        Process.sleep(:infinity)
      end)

    t = receive do: ({:table, t} -> t)
    snap = Diagnose.snapshot()
    [ets | _] = MemoryChecks.run(nil, %{snap | ets: %{t => 1_000_000_000}}, nil, @extra)
    assert ets.evidence.table == t
    assert ets.summary =~ "owned by #{inspect(owner)} (:mtrace_session_store), holds"
    assert ets.next =~ ~s|Process.info(#{Mtrace.VM.Format.pid_expr(owner)}, |
    refute ets.next =~ "#PID<"

    # unregistered: where it waits and how it started
    Process.unregister(:mtrace_session_store)
    [ets | _] = MemoryChecks.run(nil, %{snap | ets: %{t => 1_000_000_000}}, nil, @extra)
    assert ets.summary =~ "owned by #{inspect(owner)} (in Process.sleep/1, started as"
    Process.exit(owner, :kill)
  end
end

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
    # and with them about 20 MiB of binaries
    prev = %{snap | at_ms: snap.at_ms - 5_000, ets: Map.put(snap.ets, t, div(bytes, 2))}
    [ets | _] = MemoryChecks.run(prev, snap, 5.0, @extra)
    assert ets.evidence.table == t, ets.summary
    assert ets.evidence.binary_estimate >= 10_000 * 2_048
    per_s = (ets.evidence.binary_estimate + bytes) / 2 / 5.0
    assert_in_delta ets.evidence.growth_per_s, per_s, 1
    assert ets.score > 50, ets.summary
    assert ets.summary =~ ~r/growing by about \S+ MiB\/s with them$/
    :ets.delete(t)
  end
end

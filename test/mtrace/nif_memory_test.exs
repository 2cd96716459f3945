defmodule Mtrace.NifMemoryTest do
  # Memory NIFs hold in the VM's own allocators (enif_alloc, resources,
  # binaries), each case on a fresh peer: named by module and kind in
  # nif_memory/1 and diagnose/1; with +MRe false +MBe false routed through
  # malloc, where the tracer shows the NIF's own function first.
  use ExUnit.Case, async: false

  alias Mtrace.Test.{LeakyNif, Remote}

  @moduletag :peer

  defp leak(node, kind, count, size),
    do: :ok = :erpc.call(node, LeakyNif, :leak_enif, [kind, count, size])

  defp diagnose(node, opts \\ []),
    do: Mtrace.VM.diagnose([node: node, print: false, gc: false] ++ opts)

  defp rows(node), do: :erpc.call(node, Mtrace.VM, :nif_memory, [[limit: 100]])

  test "each kind is named by module, with exact counts; diagnose names module and kind" do
    Remote.with_peer(fn node ->
      leak(node, :enif_alloc, 10_240, 8_000)
      leak(node, :resource, 1_000, 10_000)
      leak(node, :binary, 200, 5_000)

      mine = for r <- rows(node), r.module == LeakyNif, into: %{}, do: {r.kind, r}
      assert %{count: 10_240} = mine.enif_alloc
      assert %{count: 1_000} = mine.resource
      assert %{count: 200} = mine.binary

      # bytes are estimates bounded by the size classes
      for {kind, bytes} <- [enif_alloc: 10_240 * 8_000, resource: 1_000 * 10_000] do
        row = mine[kind]
        assert row.bytes_min <= bytes and bytes <= row.bytes_max, inspect(row)
      end

      d = diagnose(node)
      text = Mtrace.VM.Diagnosis.render(d)
      assert d.verdict == :nif_alloc_leak, text
      assert %{summary: summary, evidence: %{module: LeakyNif}, next: next} = hd(d.findings)
      # resources may be binaries Erlang code keeps: their holders come first
      assert next =~ ~r/top.*:binary_memory, 5.* names the processes that keep its binaries/
      assert summary =~ "NIF module Mtrace.Test.LeakyNif holds at least"
      assert summary =~ "10_240 enif_alloc blocks"
      assert summary =~ "1_000 resources or binaries"
      assert text =~ ~r/^nif     Mtrace.Test.LeakyNif at least /m
    end)
  end

  test "a window gives growth per module and kind; allocating and freeing stays healthy" do
    Remote.with_peer(fn node ->
      :ok = :erpc.call(node, LeakyNif, :churn_enif, [2_000, 4096])
      grower = :erpc.call(node, :erlang, :spawn, [Mtrace.Test.EnifScenarios, :grow, [64 * 1024]])
      assert is_pid(grower)

      [top | _] = :erpc.call(node, Mtrace.VM, :nif_memory, [[window: 1_000, limit: 5]])
      assert %{module: LeakyNif, kind: :resource, count_delta: delta} = top
      assert delta > 0 and top.growth_per_s > 0

      d = diagnose(node, window: 2_000)
      assert %{kind: :nif_alloc_leak, evidence: ev, summary: summary} = hd(d.findings)
      assert ev.growth_per_s > 0
      assert summary =~ "grew steadily by "
      :erpc.call(node, :erlang, :exit, [grower, :kill])
      :erpc.call(node, LeakyNif, :free_kept, [])

      # a NIF that allocates and frees as much: nothing held, nothing found
      churner = :erpc.call(node, :erlang, :spawn, [Mtrace.Test.EnifScenarios, :churn, []])
      healthy = diagnose(node, window: 2_000)
      :erpc.call(node, :erlang, :exit, [churner, :kill])
      refute Enum.any?(healthy.findings, &(&1.kind == :nif_alloc_leak and &1.score >= 50))
      assert healthy.verdict == :healthy, Mtrace.VM.Diagnosis.render(healthy)
    end)
  end

  test "resources a NIF keeps are its own, though processes share a binary worth more" do
    Remote.with_peer(fn node ->
      leak(node, :resource, 10_000, 10_000)
      # 30 MiB that six processes keep: once in memory, not six times
      holders = :erpc.call(node, Mtrace.Test.EnifScenarios, :shared_blob, [30, 6])
      assert length(holders) == 6

      d = diagnose(node, gc: true)
      text = Mtrace.VM.Diagnosis.render(d)
      assert d.verdict == :nif_alloc_leak, text
      assert %{evidence: %{module: LeakyNif, counted_bytes: counted}} = hd(d.findings)
      assert counted >= 64 * 1_048_576, text
    end)
  end

  test "+MRe false +MBe false: through malloc, the NIF's own function first, exact counts" do
    Remote.with_peer(~w(+MRe false +MBe false), fn node ->
      :erpc.call(node, Mtrace, :reset, [])
      leak(node, :enif_alloc, 100, 800)
      leak(node, :resource, 50, 1_000)
      leak(node, :binary, 20, 3_000)

      firsts =
        for site <- Mtrace.sites(node: node, lib: "leaky_nif", limit: :all),
            into: %{},
            do: {hd(site.frames).symbol, site.count}

      assert firsts["fixture_leak_enif_alloc"] == 100
      assert firsts["fixture_leak_resource"] == 50
      assert firsts["fixture_leak_binary"] == 20

      # the VM side keeps working, and says what it cannot tell
      assert {:exception, %Mtrace.Error{reason: :off}, _} =
               catch_error(:erpc.call(node, Mtrace.VM, :nif_memory, []))

      d = diagnose(node)
      assert Mtrace.VM.Diagnosis.render(d) =~ "switched off (+MRe false +MBe false)"
      assert is_list(:erpc.call(node, Mtrace.VM, :allocators, []))
    end)
  end
end

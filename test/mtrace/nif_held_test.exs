defmodule Mtrace.NifHeldTest do
  # What a NIF made and Erlang code keeps, or a GC frees, is not the NIF's:
  # neither its size nor, over a window, its growth.
  use ExUnit.Case, async: false
  import Bitwise

  alias Mtrace.VM.{Diagnosis, MemoryChecks, Thresholds}

  @mib 1 <<< 20

  defp row(kind, mib) do
    b = mib * @mib
    %{module: :crypto, kind: kind, count: 10, bytes: b, bytes_min: b, bytes_max: b}
  end

  # :crypto's rows over a window of 5 steps of 1 s, each kind growing by
  # its MiB/s: {kind, mib_per_s}
  defp window(kinds) do
    series = for i <- 0..5, do: for({kind, per_s} <- kinds, do: row(kind, i * per_s))
    %{series: series, now: {:ok, List.last(series)}}
  end

  defp nif(nif, held),
    do: MemoryChecks.nif(nif, 5.0, %{total: 1 <<< 30}, Thresholds.defaults(), held)

  test "growth of binaries Erlang code holds after the forced GC is not the NIF's" do
    # 30 MiB of resources or binaries at the window's end; the GC left
    # 40 MiB, all of it held by processes and tables
    f = nif(window(resource: 6), %{left: 40 * @mib, held: 40 * @mib})
    assert f.score < 20, f.summary
    assert f.evidence.growth_per_s == 0

    assert f.summary =~
             "; its resources or binaries grew steadily by 6.0 MiB/s (21.1 GiB/h), " <>
               "all of it freed by the forced GC or held by Erlang code"

    refute f.summary =~ "(resource)"
  end

  test "growth of binaries the forced GC freed is not the NIF's" do
    # its rows read after the GC: 512 KiB of the 30 MiB left (binaries
    # on their way), and no holder explains 2 MiB of what the GC left
    left = %{row(:resource, 0) | bytes_min: 512 * 1024, count: 8}
    nif = %{window(resource: 6) | now: {:ok, [left]}}
    f = nif(nif, %{left: 2 * @mib, held: 0})
    assert f.score < 20, f.summary
    assert f.evidence.growth_per_s == 0
  end

  test "only the share no holder explains counts, and enif_alloc blocks always count" do
    f = nif(window(resource: 6), %{left: 40 * @mib, held: 25 * @mib})
    # 15 of its 30 MiB are not explained: half its growth counts
    assert f.evidence.growth_per_s == 3 * @mib
    assert f.summary =~ "6.0 MiB/s (21.1 GiB/h), of which at most 3.0 MiB/s is not Erlang"

    f = nif(window(enif_alloc: 2, resource: 6), %{left: 40 * @mib, held: 40 * @mib})
    assert f.evidence.growth_per_s == 2 * @mib
    assert f.score > 50

    assert f.summary =~
             "; its enif_alloc blocks grew steadily by 2.0 MiB/s (7.0 GiB/h), " <>
               "resources or binaries by 6.0 MiB/s"
  end

  test "without the forced GC, resources and binaries that grow are the NIF's" do
    f = nif(window(resource: 6), nil)
    assert f.evidence.growth_per_s == 6 * @mib
    assert f.summary =~ "; its resources or binaries grew steadily by 6.0 MiB/s (21.1 GiB/h)"
  end

  describe "on a peer, over a window" do
    @describetag :peer

    setup do
      Mtrace.Test.Remote.distribute!()
      {peer, node} = Mtrace.Test.Remote.start_peer([])
      on_exit(fn -> Mtrace.Test.Remote.stop_peer(peer) end)
      %{node: node}
    end

    test "binaries :crypto made that a process keeps slices of name the process", %{node: node} do
      keeper = :erpc.call(node, Mtrace.VMScenarios, :crypto_feed, [20, 64_000, true])
      # about 12 MiB/s, past binary_gc_min (and a quarter of the VM) within 3 s
      Process.sleep(3_000)
      d = diagnose(node)
      text = Diagnosis.render(d)
      assert d.verdict == :binary_held, text

      assert [{^keeper, _, [registered_name: :mtrace_header_index]} | _] =
               hd(d.findings).evidence.holders

      refute Enum.any?(d.findings, &(&1.kind == :nif_alloc_leak)), text
    end

    test "binaries :crypto made that a forced GC frees are no NIF's", %{node: node} do
      dropper = :erpc.call(node, Mtrace.VMScenarios, :crypto_feed, [20, 64_000, false])
      Process.sleep(3_000)
      d = diagnose(node)
      text = Diagnosis.render(d)
      assert d.verdict == :binary_leak, text
      assert [{^dropper, _, _} | _] = hd(d.findings).evidence.top_bytes
      refute Enum.any?(d.findings, &(&1.kind == :nif_alloc_leak)), text
      # the NIF memory shown is what the GC left
      {:ok, rows} = d.nif
      crypto = for %{module: :crypto, bytes_min: b} <- rows, reduce: 0, do: (n -> n + b)
      assert crypto < 8 * @mib, text
    end
  end

  defp diagnose(node),
    do: Mtrace.VM.diagnose(node: node, print: false, window: 3_000, timeout: 60_000)
end

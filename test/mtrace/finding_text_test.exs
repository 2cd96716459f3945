defmodule Mtrace.FindingTextTest do
  use ExUnit.Case, async: true
  import Bitwise

  alias Mtrace.VM.{Diagnosis, Findings, MemoryChecks}

  test "growth reads without a doubled sign, and a shrinking figure is not projected" do
    g = %{per_s: 2048.0, ups: 5, steps: 5}
    assert Findings.describe_growth(g) == "grew by 2.0 KiB/s (7.0 MiB/h), up in 5 of 5 steps"
    refute Findings.describe_growth(%{g | per_s: -2048.0, ups: 0}) =~ "/h"
  end

  test "a count growing by less than one a second does not read 0 a second" do
    assert Findings.count_rate(0.43, :fds) == "26 fds/min"
    assert Findings.count_rate(0.2, "processes") == "12 processes/min"
  end

  test "a NIF module's steady growth has no doubled sign" do
    row = %{module: :m, kind: :enif_alloc, count: 10, bytes: 1, bytes_min: 0, bytes_max: 2}
    rows = fn mib -> [%{row | bytes_min: mib * 1_048_576, bytes: mib * 1_048_576}] end
    series = for i <- 0..5, do: rows.(10 * i)

    f =
      MemoryChecks.nif(
        %{series: series, now: {:ok, rows.(50)}},
        5.0,
        %{total: 1 <<< 30},
        Mtrace.VM.Thresholds.defaults()
      )

    assert f.summary =~ "its enif_alloc blocks grew steadily by 10.0 MiB/s"
  end

  test "the growth line leaves out figures that stood still" do
    text = growth_text(%{total: 2048.0, processes: 2048.0, binary: 0, ets: 0.0, code: 0, atom: 0})
    assert text =~ "growth  total +2.0 KiB/s, processes +2.0 KiB/s"
    refute text =~ "+0 B/s"
    assert growth_text(%{total: 0, processes: 0}) =~ "growth  VM memory unchanged"
  end

  test "untraced native memory that may be all cached carriers is not said to be 0 B" do
    snap = Mtrace.VM.Diagnose.snapshot()
    outside = 100 * 1_048_576

    snap = %{
      snap
      | memory: Map.merge(snap.memory, %{outside_vm: outside, carrier_cache: 2 * outside})
    }

    extra = %{bin_leak: nil, preloaded: false, sites: []}

    native =
      MemoryChecks.run(nil, snap, nil, extra) |> Enum.find(&(&1 && &1.kind == :native_leak))

    assert native
    refute native.summary =~ "is 0 B"
    assert native.summary =~ "is 100.0 MiB, all of which may be carriers"
  end

  defp growth_text(g) do
    Diagnosis.render(%{
      node: :n@h,
      verdict: :healthy,
      memory: %{
        total: 1,
        processes: 1,
        binary: 1,
        ets: 1,
        code: 1,
        rss: 1,
        rss_peak: 1,
        allocated: 1,
        used: 1,
        outside_vm: 1,
        carrier_cache: 0
      },
      counts: %{},
      native: nil,
      nif: nil,
      window: 5000,
      growth: g,
      findings: []
    })
  end
end

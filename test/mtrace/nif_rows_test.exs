defmodule Mtrace.NifRowsTest do
  # The rows of Mtrace.VM.Native.nif_memory/0 built from :instrument's
  # histograms, and their growth between two reads: one row per module and
  # kind, whatever tags the VM gives them.
  use ExUnit.Case, async: true

  alias Mtrace.VM.Native

  # `n` blocks in the size class of 1-2 KiB (histograms start at 16 B)
  defp hist(n), do: {0, 0, 0, 0, 0, 0, n, 0, 0}

  test "a port driver's binary and drv_binary tags are one :binary row, summed" do
    rows = Native.nif_rows(%{tcp_inet: %{binary: hist(1_214), drv_binary: hist(2)}}, 16)

    assert [%{module: :tcp_inet, kind: :binary} = row] = rows
    assert row.count == 1_216
    assert row.bytes_min == 1_216 * 1024
    assert row.bytes_max == 1_216 * 2048
  end

  test "growth is measured per module and kind, against the same row of the first read" do
    first = Native.nif_rows(%{tcp_inet: %{binary: hist(740), drv_binary: hist(2)}}, 16)
    then = Native.nif_rows(%{tcp_inet: %{binary: hist(1_214), drv_binary: hist(4)}}, 16)

    assert [%{module: :tcp_inet, kind: :binary, count: 1_218, count_delta: 476}] =
             Native.nif_growth(first, then, 1.0)
  end

  test "rows given twice for one module and kind are summed before their growth" do
    row = fn count ->
      %{module: :m, kind: :binary, count: count, bytes: count, bytes_min: count, bytes_max: count}
    end

    assert [%{count: 12, count_delta: 6, growth_per_s: 3.0}] =
             Native.nif_growth([row.(2), row.(4)], [row.(10), row.(2)], 2.0)
  end
end

defmodule Mtrace.VM.NifChecks do
  @moduledoc """
  The check of `Mtrace.VM.diagnose/1` that looks at memory NIFs and
  drivers hold in the VM's own allocators (`Mtrace.VM.NifMemory`):
  `enif_alloc` blocks, resources and binaries, which the native tracer
  cannot see. Thresholds are listed in `Mtrace.VM.Thresholds`.
  """

  import Mtrace.VM.Findings, only: [finding: 5, ratio: 2]
  alias Mtrace.VM.{Format, Growth}

  @nouns %{enif_alloc: "enif_alloc block", resource: "resource", binary: "binary"}

  @doc """
  The `:nif_alloc_leak` finding for the module that scores highest, or
  `nil`. `nif` is `%{series: [rows] | nil, now: {:ok, rows} | {:error, _}}`:
  with a window, `series` holds the rows read at each step, and growth
  counts only when steady (up in `native_steady` of the steps), as for
  native memory; `secs` is the window, or `nil`.

  ## Example

      row = %{module: :my_nif, kind: :enif_alloc, count: 10_240, bytes: 80 <<< 20,
              bytes_min: 64 <<< 20, bytes_max: 96 <<< 20}
      Mtrace.VM.NifChecks.run(%{series: nil, now: {:ok, [row]}}, nil, %{total: 120 <<< 20},
                              Mtrace.VM.Thresholds.defaults()).kind
      #=> :nif_alloc_leak
  """
  @spec run(map | nil, number | nil, map, Mtrace.VM.Thresholds.t()) :: map | nil
  def run(%{now: {:ok, rows}} = nif, secs, memory, th) when rows != [] do
    series = if secs && is_list(nif[:series]), do: Enum.reject(nif.series, &is_nil/1)

    rows
    |> Enum.group_by(& &1.module)
    |> Enum.map(fn {module, mine} -> judge(module, mine, series, secs, memory, th) end)
    |> Enum.max_by(& &1.score, fn -> nil end)
  end

  def run(_nif, _secs, _memory, _th), do: nil

  defp judge(module, rows, series, secs, memory, th) do
    # Judged on the lower bounds of the size classes: never more than is held.
    bytes = rows |> Enum.map(& &1.bytes_min) |> Enum.sum()
    total = memory[:total] || 0

    # each kind's growth across the window's steps; only steady growth counts
    grown =
      Enum.map(rows, fn row ->
        g = series && Growth.of(Enum.map(series, &bytes_of(&1, row.module, row.kind)), secs)
        steady = g && g.steadiness >= th.native_steady && g.to - g.from >= th.nif_growth_min
        Map.merge(row, %{growth: g, steady: steady || false})
      end)

    per_s = for(%{steady: true, growth: g} <- grown, do: g.per_s) |> Enum.sum()

    share =
      if bytes >= th.nif_share_min and total > 0,
        do: ratio(bytes / total, th.nif_share),
        else: 0

    score = Enum.max([ratio(bytes, th.nif_bytes), share, ratio(per_s, th.nif_growth)])

    finding(
      :nif_alloc_leak,
      score,
      "NIF module #{inspect(module)} holds " <>
        Enum.map_join(rows, ", ", &held/1) <>
        " in the VM's allocators" <> growth_text(grown, series),
      %{module: module, bytes: bytes, rows: grown, growth_per_s: series && per_s},
      "Mtrace.VM.nif_memory(window: 10_000) shows which kind grows; for the C stacks that " <>
        "allocate it, start the VM with +MRe false +MBe false (enif_alloc, resources and " <>
        "binaries then go through malloc) and run Mtrace.report()"
    )
  end

  defp bytes_of(rows, module, kind) do
    Enum.find_value(rows, 0, &(&1.module == module and &1.kind == kind and &1.bytes_min))
  end

  @doc """
  A row in words: its lower bound of bytes (the size classes of the VM's
  histograms only bound each block) and its count.

      iex> Mtrace.VM.NifChecks.held(%{kind: :resource, count: 1000, bytes_min: 8_192_000})
      "at least 7.8 MiB in 1_000 resources"
  """
  @spec held(map) :: String.t()
  def held(row), do: "at least #{Format.bytes(row.bytes_min)} in #{held_count(row)}"

  @doc """
  A row's count with the name of its kind.

      iex> Mtrace.VM.NifChecks.held_count(%{kind: :binary, count: 3})
      "3 binaries"
  """
  @spec held_count(map) :: String.t()
  def held_count(row), do: Format.count(row.count, Map.get(@nouns, row.kind, "#{row.kind} block"))

  defp growth_text(_rows, nil), do: ""

  defp growth_text(rows, _series) do
    case Enum.filter(rows, & &1.steady) do
      [] ->
        "; not growing steadily over the window"

      growing ->
        "; growing steadily by " <>
          Enum.map_join(growing, ", ", fn row ->
            "#{Format.rate(row.growth.per_s)} (#{row.kind})"
          end)
    end
  end
end

defmodule Mtrace.VM.NifMemory do
  @moduledoc """
  Memory NIFs and drivers hold in the VM's own allocators, by module and
  kind: what `enif_alloc`, `enif_alloc_resource` and `enif_alloc_binary`
  return never reaches malloc (the ERTS allocators take it from carriers
  they map themselves), so the native tracer cannot see it, and
  `erlang:memory/0` only counts it inside `system` and `binary`.

  The VM tags each block of `driver_alloc` and `binary_alloc` with the NIF
  module or driver that allocated it; `:instrument.allocations/1` (the
  `tools` application) reads those tags, with a size histogram per module
  and kind. Counts are exact; bytes are bounded by the histogram's size
  classes (powers of two): `bytes_min` counts each block at the bottom of
  its class, `bytes_max` at the top, `bytes` in the middle (within a
  factor of 1.5 of the truth). Human outputs say "at least `bytes_min`".

  Kinds: `:enif_alloc` (`enif_alloc`, driver_alloc's `nif_internal`),
  `:resource` (`enif_alloc_resource`, and binaries made with
  `enif_make_new_binary`: binary_alloc's `binary`), `:binary`
  (`enif_alloc_binary`: `drv_binary`); other tags keep their ERTS name
  (`:driver`, `:port`, ...).
  """

  import Bitwise, only: [<<<: 2]

  # Size classes of 16 B, 32 B, 64 B, ... up to 64 GiB.
  @histogram_start 16
  @histogram_width 32
  @allocators [:driver_alloc, :binary_alloc]
  @kinds %{nif_internal: :enif_alloc, binary: :resource, drv_binary: :binary}

  @typedoc "Memory one module (or driver) holds of one kind."
  @type row :: %{
          module: atom,
          kind: atom,
          count: non_neg_integer,
          bytes: non_neg_integer,
          bytes_min: non_neg_integer,
          bytes_max: non_neg_integer
        }

  @doc """
  The rows, largest first (`:system`, the VM's own, left out), or
  `{:error, reason}`: `:no_tools` when the `tools` application is not in
  the release, `:off` when both allocators are switched off (`+MRe false
  +MBe false`: the NIFs' memory then goes through malloc, where the native
  tracer sees it with its stack).

  ## Example

      {:ok, rows} = Mtrace.VM.NifMemory.read()
      Enum.take(rows, 1)
      #=> [%{module: :leaky_nif, kind: :enif_alloc, count: 10240, bytes: 83886080, ...}]
  """
  @spec read() :: {:ok, [row]} | {:error, :no_tools | :off}
  def read do
    allocators = Enum.filter(@allocators, &enabled?/1)

    cond do
      allocators == [] ->
        {:error, :off}

      not Code.ensure_loaded?(:instrument) ->
        {:error, :no_tools}

      true ->
        opts = %{
          allocator_types: allocators,
          histogram_start: @histogram_start,
          histogram_width: @histogram_width
        }

        case :instrument.allocations(opts) do
          {:ok, {start, _unscanned, by_origin}} -> {:ok, rows(by_origin, start)}
          {:error, :not_enabled} -> {:error, :off}
        end
    end
  end

  @doc """
  The error of `read/0` in words, with what to do.

  ## Example

      iex> Mtrace.VM.NifMemory.explain(:no_tools) =~ ":tools"
      true
  """
  @spec explain(:no_tools | :off) :: String.t()
  def explain(:no_tools) do
    "the tools application (its instrument module) is not in this release: add :tools to " <>
      "extra_applications (mtrace declares it, so a release that includes mtrace has it)"
  end

  def explain(:off) do
    "driver_alloc and binary_alloc are switched off (+MRe false +MBe false): NIF memory goes " <>
      "through malloc, where the native tracer sees it (Mtrace.report/1)"
  end

  @doc """
  Rows from `:instrument.allocations/1`'s map, histograms starting at `start`.

  ## Example

      iex> hist = {0, 0, 0, 0, 0, 0, 0, 0, 10}
      iex> Mtrace.VM.NifMemory.rows(%{my_nif: %{nif_internal: hist}, system: %{binary: hist}}, 16)
      [%{module: :my_nif, kind: :enif_alloc, count: 10, bytes: 61440, bytes_min: 40960, bytes_max: 81920}]
  """
  @spec rows(map, pos_integer) :: [row]
  def rows(by_origin, start) do
    for {origin, types} <- by_origin,
        origin != :system,
        {type, hist} <- types,
        row = row(origin, type, hist, start),
        row.count > 0 do
      row
    end
    |> Enum.sort_by(&{-&1.bytes, &1.module, &1.kind})
  end

  defp row(origin, type, hist, start) do
    {count, lo, hi} =
      hist
      |> Tuple.to_list()
      |> Enum.with_index()
      |> Enum.reduce({0, 0, 0}, fn {n, i}, {count, lo, hi} ->
        {low, high} = class(i, start)
        {count + n, lo + n * low, hi + n * high}
      end)

    %{
      module: origin,
      kind: Map.get(@kinds, type, type),
      count: count,
      bytes: div(lo + hi, 2),
      bytes_min: lo,
      bytes_max: hi
    }
  end

  # Size class i holds blocks of [start * 2^i, start * 2^(i+1)) bytes; the
  # first one also the blocks under start.
  defp class(0, start), do: {0, 2 * start}
  defp class(i, start), do: {start <<< i, start <<< (i + 1)}

  defp enabled?(allocator) do
    case :erlang.system_info({:allocator, allocator}) do
      false -> false
      _ -> true
    end
  rescue
    _ -> false
  end

  @doc """
  Growth per module and kind between two reads `secs` apart: the second's
  rows, each with `growth_per_s` (estimated bytes per second) and
  `count_delta`, fastest-growing first.

  ## Example

      iex> before = [%{module: :m, kind: :resource, count: 1, bytes: 100, bytes_min: 64, bytes_max: 128}]
      iex> now = [%{module: :m, kind: :resource, count: 11, bytes: 1100, bytes_min: 704, bytes_max: 1408}]
      iex> [%{growth_per_s: 500.0, count_delta: 10}] = Mtrace.VM.NifMemory.growth(before, now, 2.0)
  """
  @spec growth([row], [row], number) :: [map]
  def growth(before, now, secs) do
    old = Map.new(before, &{{&1.module, &1.kind}, &1})

    now
    |> Enum.map(fn row ->
      prev = Map.get(old, {row.module, row.kind}, %{count: 0, bytes: 0})

      Map.merge(row, %{
        growth_per_s: (row.bytes - prev.bytes) / secs,
        count_delta: row.count - prev.count
      })
    end)
    |> Enum.sort_by(&(-&1.growth_per_s))
  end
end

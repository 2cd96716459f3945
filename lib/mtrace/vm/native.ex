defmodule Mtrace.VM.Native do
  @moduledoc """
  Native code's memory as the VM side sees it: through the malloc tracer,
  and in the VM's own allocators.

  ## The tracer

  Access to the native tracer (module `Mtrace`) is guarded. The tracer may
  be missing entirely, present without its NIF loaded, or loaded in a VM
  that was started without the `LD_PRELOAD` library. Each of those reads
  here as "no native figures" (`false` or `nil`), never as an exception: a
  leak hunt must keep working on the VM side alone.

  The module read is `Mtrace`; `config :mtrace, :native_module, Other`
  replaces it, so that tests can stand in for a preloaded tracer.

  ## NIF memory in the VM's allocators

  Memory NIFs and drivers hold in the VM's own allocators, by module and
  kind (`nif_memory/0`): what `enif_alloc`, `enif_alloc_resource` and
  `enif_alloc_binary` return never reaches malloc (the ERTS allocators take
  it from carriers they map themselves), so the native tracer cannot see
  it, and `erlang:memory/0` only counts it inside `system` and `binary`.

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
  (`enif_alloc_binary`: `drv_binary`, and a port driver's `binary`, both
  summed into one row); other tags keep their ERTS name (`:drv_internal`,
  a port driver's own `driver_alloc` blocks; `:port`, ...). There is one
  row per module and kind.
  """

  import Bitwise, only: [<<<: 2]
  alias Mtrace.VM.Format

  # Size classes of 16 B, 32 B, 64 B, ... up to 64 GiB.
  @histogram_start 16
  @histogram_width 32
  @allocators [:driver_alloc, :binary_alloc]
  @kinds %{nif_internal: :enif_alloc, binary: :resource, drv_binary: :binary}
  # binary_alloc's `binary` tag covers resources and the binaries made with
  # enif_make_new_binary alike: the VM does not tell them apart.
  @nouns %{
    enif_alloc: {"enif_alloc block", "enif_alloc blocks"},
    resource: {"resource or binary", "resources or binaries"},
    binary: {"binary", "binaries"},
    drv_internal: {"driver_alloc block", "driver_alloc blocks"}
  }

  @enable_hint "export LD_PRELOAD=$(ls $RELEASE_ROOT/lib/mtrace-*/priv/mtrace.so)"

  @doc """
  The line to add to `rel/env.sh.eex` to trace native allocations.

  ## Example

      iex> Mtrace.VM.Native.enable_hint() =~ "LD_PRELOAD"
      true
  """
  @spec enable_hint() :: String.t()
  def enable_hint, do: @enable_hint

  @doc """
  The path of this node's tracer library (the `LD_PRELOAD=` line's, for a
  report printed on another node); `nil` where the application's
  directory is not found.

  ## Example

      iex> Mtrace.VM.Native.so_path() |> Path.basename()
      "mtrace.so"
  """
  @spec so_path() :: String.t() | nil
  def so_path do
    case :code.priv_dir(:mtrace) do
      {:error, _} -> nil
      dir -> Path.join(to_string(dir), "mtrace.so")
    end
  end

  @doc """
  Whether the malloc tracer is preloaded into this VM and readable.

  ## Example

      Mtrace.VM.Native.preloaded?()
      #=> false
  """
  @spec preloaded?() :: boolean
  def preloaded? do
    call(:preloaded?, []) == {:ok, true}
  end

  @doc """
  `Mtrace.stats/0` when the tracer is preloaded, else `nil`. With `heap`
  false, glibc's heap figures (`allocated_bytes`, `used_bytes`,
  `free_bytes`, `mmap_chunks`, `mmap_bytes`) are `nil`: reading them locks
  each malloc arena in turn while its free chunks are walked (19-39 ms with
  1M of them), which a caller that reads the table every few seconds
  should not make the node's threads wait for.

  ## Example

      Mtrace.VM.Native.stats()
      #=> %{live_count: 1200, live_bytes: 5_000_000, used_bytes: 9_000_000, ...}
      Mtrace.VM.Native.stats(false).used_bytes
      #=> nil
  """
  @spec stats(boolean) :: map | nil
  def stats(heap \\ true) when is_boolean(heap) do
    with true <- preloaded?(), {:ok, %{} = stats} <- stats_call(heap) do
      stats
    else
      _ -> nil
    end
  end

  @doc """
  A mark on the tracer's table (`Mtrace.mark/0`), or `nil` when the tracer
  cannot take one.

  ## Example

      Mtrace.VM.Native.mark()
      #=> %Mtrace.Mark{node: :"app@host", t_ms: 81234567}
  """
  @spec mark() :: struct | nil
  def mark do
    case call(:mark, []) do
      {:ok, mark} -> mark
      _ -> nil
    end
  end

  @doc """
  The `n` native call sites holding the most live bytes, or `[]` when the
  tracer cannot list them. Given a `mark` taken `secs` seconds before, only
  what was allocated since and is still live, each site with its
  `growth_per_s` (bytes per second). What the VM allocated before mtrace
  started (boot, code loading) is left out.

  ## Example

      Mtrace.VM.Native.sites(3)
      #=> [%{count: 10, bytes: 40960, oldest: 30, newest: 1, frames: [...]}]
  """
  @spec sites(pos_integer, struct | nil, number | nil) :: [map]
  def sites(n, mark \\ nil, secs \\ nil) do
    opts = if mark, do: [limit: n, since: mark], else: [limit: n, boot: false]

    with true <- preloaded?(),
         {:ok, list} when is_list(list) <- sites_call(opts) do
      list
      |> Enum.filter(&is_map/1)
      |> Enum.sort_by(&(-Mtrace.VMSites.bytes(&1)))
      |> Enum.take(n)
      |> Enum.map(fn site ->
        if mark && secs,
          do: Map.put(site, :growth_per_s, Mtrace.VMSites.bytes(site) / secs),
          else: site
      end)
    else
      _ -> []
    end
  end

  # A native module without stats/1's heap: answers with the heap figures.
  defp stats_call(true), do: call(:stats, [])

  defp stats_call(false) do
    with :error <- call(:stats, [[heap: false]]), do: call(:stats, [])
  end

  # The option set of Mtrace.sites/1 is the tracer's own; options are asked
  # for first and, if the tracer rejects them, the full list is trimmed here.
  defp sites_call(opts) do
    case call(:sites, [opts]) do
      {:ok, list} -> {:ok, list}
      :error -> call(:sites, [[]])
    end
  end

  defp call(fun, args) do
    mod = native_module()

    if Code.ensure_loaded?(mod) and function_exported?(mod, fun, length(args)) do
      try do
        {:ok, apply(mod, fun, args)}
      rescue
        _ -> :error
      catch
        _, _ -> :error
      end
    else
      :error
    end
  end

  # Resolved at run time so that this module compiles and loads on nodes
  # where the tracer module does not exist.
  defp native_module, do: Application.get_env(:mtrace, :native_module, Mtrace)

  @typedoc "Memory one module (or driver) holds of one kind."
  @type nif_row :: %{
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

      {:ok, rows} = Mtrace.VM.Native.nif_memory()
      Enum.take(rows, 1)
      #=> [%{module: :leaky_nif, kind: :enif_alloc, count: 10240, bytes: 83886080, ...}]
  """
  @spec nif_memory() :: {:ok, [nif_row]} | {:error, :no_tools | :off}
  def nif_memory do
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
          {:ok, {start, _unscanned, by_origin}} -> {:ok, nif_rows(by_origin, start)}
          {:error, :not_enabled} -> {:error, :off}
        end
    end
  end

  @doc """
  The error of `nif_memory/0` in words, with what to do.

  ## Example

      iex> Mtrace.VM.Native.nif_explain(:no_tools) =~ ":tools"
      true
  """
  @spec nif_explain(:no_tools | :off) :: String.t()
  def nif_explain(:no_tools) do
    "the tools application (its instrument module) is not in this release: add :tools to " <>
      "extra_applications (mtrace declares it, so a release that includes mtrace has it)"
  end

  def nif_explain(:off) do
    "driver_alloc and binary_alloc are switched off (+MRe false +MBe false): NIF memory goes " <>
      "through malloc, where the native tracer sees it (Mtrace.report/1)"
  end

  @doc """
  Rows from `:instrument.allocations/1`'s map, histograms starting at `start`.

  ## Example

      iex> hist = {0, 0, 0, 0, 0, 0, 0, 0, 10}
      iex> Mtrace.VM.Native.nif_rows(%{my_nif: %{nif_internal: hist}, system: %{binary: hist}}, 16)
      [%{module: :my_nif, kind: :enif_alloc, count: 10, bytes: 61440, bytes_min: 40960, bytes_max: 81920}]
      iex> [%{module: :tcp_inet, kind: :binary, count: 20}] =
      ...>   Mtrace.VM.Native.nif_rows(%{tcp_inet: %{binary: hist, drv_binary: hist}}, 16)
      iex> [%{module: :prim_file, kind: :resource}] = Mtrace.VM.Native.nif_rows(%{prim_file: %{binary: hist}}, 16)
  """
  @spec nif_rows(map, pos_integer) :: [nif_row]
  def nif_rows(by_origin, start) do
    for {origin, types} <- by_origin,
        origin != :system,
        {type, hist} <- types,
        row = row(origin, type, hist, start),
        row.count > 0 do
      row
    end
    |> merged()
    |> Enum.sort_by(&{-&1.bytes, &1.module, &1.kind})
  end

  # One row per module and kind: a port driver's `binary` and `drv_binary`
  # tags are both its binaries, so their rows are summed into one.
  defp merged(rows) do
    rows
    |> Enum.reduce(%{}, fn row, acc ->
      Map.update(acc, {row.module, row.kind}, row, fn seen ->
        %{
          seen
          | count: seen.count + row.count,
            bytes: seen.bytes + row.bytes,
            bytes_min: seen.bytes_min + row.bytes_min,
            bytes_max: seen.bytes_max + row.bytes_max
        }
      end)
    end)
    |> Map.values()
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

    # a port driver (no module of that name) makes binaries, never resources
    kind = if type == :binary and driver?(origin), do: :binary, else: Map.get(@kinds, type, type)

    %{
      module: origin,
      kind: kind,
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
  `count_delta`, fastest-growing first. Rows of one read that share module
  and kind are summed first, so each is measured against its own.

  ## Example

      iex> before = [%{module: :m, kind: :resource, count: 1, bytes: 100, bytes_min: 64, bytes_max: 128}]
      iex> now = [%{module: :m, kind: :resource, count: 11, bytes: 1100, bytes_min: 704, bytes_max: 1408}]
      iex> [%{growth_per_s: 500.0, count_delta: 10}] = Mtrace.VM.Native.nif_growth(before, now, 2.0)
  """
  @spec nif_growth([nif_row], [nif_row], number) :: [map]
  def nif_growth(before, now, secs) do
    old = before |> merged() |> Map.new(&{{&1.module, &1.kind}, &1})

    now
    |> merged()
    |> Enum.map(fn row ->
      prev = Map.get(old, {row.module, row.kind}, %{count: 0, bytes: 0})

      Map.merge(row, %{
        growth_per_s: (row.bytes - prev.bytes) / secs,
        count_delta: row.count - prev.count
      })
    end)
    |> Enum.sort_by(&(-&1.growth_per_s))
  end

  @doc """
  A row in words: its lower bound of bytes (the size classes of the VM's
  histograms only bound each block) and its count.

      iex> Mtrace.VM.Native.nif_held(%{kind: :resource, count: 1000, bytes_min: 8_192_000})
      "at least 7.8 MiB in 1_000 resources or binaries"
  """
  @spec nif_held(map) :: String.t()
  def nif_held(row), do: "at least #{Format.bytes(row.bytes_min)} in #{nif_count(row)}"

  @doc """
  A row's count with the name of its kind. Kind `:resource` is binary_alloc's
  `binary` tag, which resources and the binaries a NIF made with
  `enif_make_new_binary` share: named as either. mtrace's own NIF makes no
  resources: its blocks of that kind are the binaries of its answers
  (symbol names, paths), held by whoever kept them, and say so.

      iex> Mtrace.VM.Native.nif_count(%{kind: :binary, count: 3})
      "3 binaries"
      iex> Mtrace.VM.Native.nif_count(%{kind: :resource, count: 300})
      "300 resources or binaries"
      iex> Mtrace.VM.Native.nif_count(%{module: Mtrace.Native, kind: :resource, count: 9})
      "9 binaries (mtrace's answers, held by who asked)"
  """
  @spec nif_count(map) :: String.t()
  def nif_count(%{module: Mtrace.Native, kind: :resource} = row),
    do: Format.count(row.count, "binary") <> " (mtrace's answers, held by who asked)"

  def nif_count(row) do
    {one, many} = Map.get(@nouns, row.kind, {"#{row.kind} block", "#{row.kind} blocks"})
    if row.count == 1, do: "1 " <> one, else: "#{Format.int(row.count)} #{many}"
  end

  @doc """
  What made a row's memory, in words: a NIF module, or a port driver (an
  origin that is no loaded module, as `:tcp_inet`).

      iex> Mtrace.VM.Native.origin(:tcp_inet)
      "port driver"
      iex> Mtrace.VM.Native.origin(:prim_file)
      "NIF module"
  """
  @spec origin(atom) :: String.t()
  def origin(module), do: if(driver?(module), do: "port driver", else: "NIF module")

  defp driver?(module), do: is_atom(module) and not Code.ensure_loaded?(module)
end

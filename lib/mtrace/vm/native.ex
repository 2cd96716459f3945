defmodule Mtrace.VM.Native do
  @moduledoc """
  Guarded access to the native tracer (module `Mtrace`).

  The tracer may be missing entirely, present without its NIF loaded, or
  loaded in a VM that was started without the `LD_PRELOAD` library. Each of
  those reads here as "no native figures" (`false` or `nil`), never as an
  exception: a leak hunt must keep working on the VM side alone.

  The module read is `Mtrace`; `config :mtrace, :native_module, Other`
  replaces it, so that tests can stand in for a preloaded tracer.
  """

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
  `Mtrace.stats/0` when the tracer is preloaded, else `nil`.

  ## Example

      Mtrace.VM.Native.stats()
      #=> %{live_count: 1200, live_bytes: 5_000_000, used_bytes: 9_000_000, ...}
  """
  @spec stats() :: map | nil
  def stats do
    with true <- preloaded?(), {:ok, %{} = stats} <- call(:stats, []) do
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
      |> Enum.sort_by(&(-Map.get(&1, :bytes, 0)))
      |> Enum.take(n)
      |> Enum.map(fn site ->
        if mark && secs, do: Map.put(site, :growth_per_s, site_bytes(site) / secs), else: site
      end)
    else
      _ -> []
    end
  end

  defp site_bytes(site), do: Map.get(site, :est_bytes, Map.get(site, :bytes, 0))

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
end

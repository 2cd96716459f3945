defmodule Mtrace.VM.Memory do
  @moduledoc """
  One view of a node's memory: what the VM accounts for (`erlang:memory/0`),
  what its allocators took from the OS, what the OS charges the process
  (RSS), and what the native heap holds when the malloc tracer is preloaded.
  """

  alias Mtrace.VM.{Alloc, Native}

  @erlang_keys [
    :total,
    :processes,
    :processes_used,
    :system,
    :atom,
    :atom_used,
    :binary,
    :code,
    :ets
  ]

  @typedoc "Bytes; `nil` where the figure cannot be measured on this node."
  @type t :: %{
          total: non_neg_integer | nil,
          processes: non_neg_integer | nil,
          processes_used: non_neg_integer | nil,
          system: non_neg_integer | nil,
          atom: non_neg_integer | nil,
          atom_used: non_neg_integer | nil,
          binary: non_neg_integer | nil,
          code: non_neg_integer | nil,
          ets: non_neg_integer | nil,
          rss: non_neg_integer | nil,
          rss_peak: non_neg_integer | nil,
          allocated: non_neg_integer | nil,
          used: non_neg_integer | nil,
          outside_vm: non_neg_integer | nil,
          native: map | nil
        }

  @doc """
  Measures the node's memory now. See `Mtrace.VM.memory/0`.

  ## Example

      %{rss: _, allocated: _, outside_vm: _} = Mtrace.VM.Memory.read()
  """
  @spec read() :: t
  def read do
    {allocated, used} = Alloc.totals()
    {rss, rss_peak} = proc_status()

    erlang_memory()
    |> Map.merge(%{
      rss: rss,
      rss_peak: rss_peak,
      allocated: allocated,
      used: used,
      outside_vm: outside(rss, allocated),
      native: native()
    })
  end

  @doc """
  VmRSS and VmHWM of this OS process in bytes, from `/proc/self/status`
  (`{nil, nil}` where there is no such file).

  ## Example

      {rss, peak} = Mtrace.VM.Memory.proc_status()
      true = rss <= peak
  """
  @spec proc_status() :: {non_neg_integer | nil, non_neg_integer | nil}
  def proc_status do
    case File.read("/proc/self/status") do
      {:ok, text} -> {status_kb(text, "VmRSS:"), status_kb(text, "VmHWM:")}
      {:error, _} -> {nil, nil}
    end
  end

  defp status_kb(text, field) do
    with [_, rest] <- String.split(text, field, parts: 2),
         {kb, _} <- rest |> String.trim_leading() |> Integer.parse() do
      kb * 1024
    else
      _ -> nil
    end
  end

  defp erlang_memory do
    Map.new(:erlang.memory())
  rescue
    # Raised as notsup when allocators it sums are disabled (+Mea min).
    ErlangError -> Map.new(@erlang_keys, &{&1, nil})
  end

  defp outside(rss, allocated) when is_integer(rss) and is_integer(allocated),
    do: max(rss - allocated, 0)

  defp outside(_, _), do: nil

  defp native do
    case Native.stats() do
      nil ->
        nil

      stats ->
        stats
        |> Map.take([
          :live_count,
          :live_bytes,
          :dropped,
          :enabled,
          :allocated_bytes,
          :used_bytes,
          :free_bytes,
          :mmap_bytes
        ])
        |> Map.merge(estimated(stats))
    end
  end

  # In sampling mode the table holds a sample: judge from the estimates.
  defp estimated(%{sampled: true} = stats),
    do: %{live_count: stats.est_live_count, live_bytes: stats.est_live_bytes, sampled: true}

  defp estimated(_stats), do: %{sampled: false}
end

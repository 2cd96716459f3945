defmodule Mtrace.VM.Memory do
  @moduledoc """
  One view of a node's memory: what the VM accounts for (`erlang:memory/0`),
  what its allocators took from the OS, what the OS charges the process
  (RSS), and what the native heap holds when the malloc tracer is preloaded.
  """

  import Bitwise
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

  @doc """
  The native memory figure `Mtrace.VM.diagnose/1` follows across a window:
  with `traced`, the tracer's live malloc bytes (estimated when sampling),
  else RSS outside the ERTS allocators. `nil` when it cannot be read.

  ## Example

      iex> is_integer(Mtrace.VM.Memory.native_sample(false))
      true
  """
  @spec native_sample(boolean) :: non_neg_integer | nil
  def native_sample(true) do
    case Native.stats() do
      %{sampled: true, est_live_bytes: bytes} -> bytes
      %{live_bytes: bytes} -> bytes
      _ -> nil
    end
  end

  def native_sample(false) do
    {rss, _peak} = proc_status()
    outside(rss, allocated())
  end

  @doc """
  The memory this node may use before the kernel stops it: the cgroup's
  limit (v2 `memory.max`, the tightest along the node's cgroup path; v1
  `memory.limit_in_bytes`) when one is set, else the machine's RAM
  (`MemTotal`). `nil` where neither can be read.

  ## Example

      %{bytes: _, source: _} = Mtrace.VM.Memory.limit()
  """
  @spec limit() :: %{bytes: pos_integer, source: String.t()} | nil
  def limit do
    ram = meminfo_total()

    case cgroup_limit() do
      bytes when is_integer(bytes) and (ram == nil or bytes < ram) ->
        %{bytes: bytes, source: "the cgroup's memory limit"}

      _ when is_integer(ram) ->
        %{bytes: ram, source: "the machine's RAM"}

      _ ->
        nil
    end
  end

  defp meminfo_total do
    case File.read("/proc/meminfo") do
      {:ok, text} -> status_kb(text, "MemTotal:")
      _ -> nil
    end
  end

  # The smallest limit set on the node's cgroup or any of its parents.
  defp cgroup_limit do
    with {:ok, text} <- File.read("/proc/self/cgroup") do
      text
      |> String.split("\n", trim: true)
      |> Enum.flat_map(&cgroup_files/1)
      |> Enum.flat_map(&read_limit/1)
      |> Enum.min(fn -> nil end)
    else
      _ -> nil
    end
  end

  # "0::/a/b" (v2) gives memory.max of /a/b, /a and /; "N:memory:/a" (v1)
  # gives memory.limit_in_bytes of /a.
  defp cgroup_files(line) do
    case String.split(line, ":", parts: 3) do
      ["0", "", path] ->
        for dir <- ancestors(path), do: Path.join(["/sys/fs/cgroup", dir, "memory.max"])

      [_, controllers, path] ->
        if "memory" in String.split(controllers, ","),
          do: [Path.join(["/sys/fs/cgroup/memory", path, "memory.limit_in_bytes"])],
          else: []

      _ ->
        []
    end
  end

  defp ancestors(path) do
    parts = Path.split(path) |> Enum.reject(&(&1 == "/"))
    for n <- length(parts)..0//-1, do: Path.join(["/" | Enum.take(parts, n)])
  end

  # "max" and v1's "no limit" (a page-rounded 2^63) read as no limit.
  defp read_limit(file) do
    with {:ok, text} <- File.read(file),
         {bytes, _} <- Integer.parse(String.trim(text)),
         true <- bytes < 1 <<< 62 do
      [bytes]
    else
      _ -> []
    end
  end

  defp allocated do
    {allocated, _used} = Alloc.totals()
    allocated
  end
end

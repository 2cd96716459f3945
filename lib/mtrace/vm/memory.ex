defmodule Mtrace.VM.Memory do
  @moduledoc """
  One view of a node's memory: what the VM accounts for (`erlang:memory/0`),
  what its allocators took from the OS, what the OS charges the process
  (RSS), what the native heap holds when the malloc tracer is preloaded, and
  how much the node may use before the kernel stops it.

  ## The ERTS allocators

  What they hold is read as carriers (memory taken from the OS,
  "allocated") and the blocks inside them (memory handed to the VM,
  "used"). All allocators are read in one
  `erlang:system_info({allocator_sizes, List})` call, so the two figures
  come from the same moment and `used` never exceeds `allocated`.
  Allocators that are disabled (for instance under `+Mea min`) report
  `false` there and are left out.

  Carriers the allocators give back are not unmapped at once: the segment
  allocator (mseg_alloc) keeps some mapped for reuse and lets them go over
  the next seconds. Right after a large process dies they can hold hundreds
  of MB of RSS that no allocator counts any more, so they show in
  `outside_vm`; `carrier_cache` says how much of it they can be.
  """

  import Bitwise
  alias Mtrace.VM.{JitCode, Native}

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
          carrier_cache: non_neg_integer | nil,
          jit_code: non_neg_integer | nil,
          outside_vm: non_neg_integer | nil,
          native: map | nil
        }

  @doc """
  Measures the node's memory now. See `Mtrace.VM.memory/0`. `heap: false`
  leaves glibc's heap figures out of `native` (see
  `Mtrace.VM.Native.stats/1`), for a caller that reads every few seconds.

  ## Example

      %{rss: _, allocated: _, outside_vm: _} = Mtrace.VM.Memory.read()
  """
  @spec read(keyword) :: t
  def read(opts \\ []) do
    {allocated, used} = allocator_totals()
    cache = carrier_cache()
    {rss, rss_peak, jit} = status()

    erlang_memory()
    |> Map.merge(%{
      rss: rss,
      rss_peak: rss_peak,
      allocated: allocated,
      used: used,
      carrier_cache: cache,
      jit_code: jit,
      outside_vm: outside(rss, allocated, jit),
      native: native(Keyword.get(opts, :heap, true))
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
    {rss, peak, _jit} = status()
    {rss, peak}
  end

  # VmRSS, VmHWM and the JIT's code (Mtrace.VM.JitCode): no ERTS allocator
  # holds it, and RSS counts it twice.
  defp status do
    case File.read("/proc/self/status") do
      {:ok, text} ->
        shared = status_kb(text, "RssShmem:")
        {status_kb(text, "VmRSS:"), status_kb(text, "VmHWM:"), shared && JitCode.resident(shared)}

      {:error, _} ->
        {nil, nil, nil}
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

  defp outside(rss, allocated, jit) when is_integer(rss) and is_integer(allocated),
    do: max(rss - allocated - (jit || 0), 0)

  defp outside(_, _, _), do: nil

  @doc """
  Bytes of carriers the VM has freed but its segment allocator still keeps
  mapped for reuse (mseg_alloc's cache, emptied over a few seconds): the
  default memory mapper's mapped bytes less the segments in use. Mapped is
  at most what is resident, so this is an upper bound of the RSS they
  hold. `nil` where the emulator does not report them (no mseg_alloc).

  ## Example

      iex> is_integer(Mtrace.VM.Memory.carrier_cache())
      true
  """
  @spec carrier_cache() :: non_neg_integer | nil
  def carrier_cache do
    with [_ | _] = mmap <- :erlang.system_info({:allocator, :erts_mmap}),
         {:default_mmap, props} <- List.keyfind(mmap, :default_mmap, 0),
         mapped when is_integer(mapped) <- mapped(props),
         [_ | _] = mseg <- :erlang.system_info({:allocator, :mseg_alloc}),
         in_use when is_integer(in_use) <- segments_in_use(mseg) do
      max(mapped - in_use, 0)
    else
      _ -> nil
    end
  rescue
    # Emulators built without these allocators, or reporting them otherwise.
    _ in [ArgumentError, FunctionClauseError, MatchError] -> nil
  end

  # From the OS directly, or from a super carrier reserved at boot (+MMscs).
  defp mapped(props) do
    for from <- [:os, :supercarrier], sizes = get_in(props, [from, :sizes]), reduce: nil do
      acc -> (acc || 0) + Keyword.get(sizes, :used, 0)
    end
  end

  defp segments_in_use(instances) do
    Enum.reduce_while(instances, 0, fn
      {:instance, _, props}, acc ->
        with kind when is_list(kind) <- props[:memkind],
             status when is_list(status) <- kind[:status],
             {:segments_size, cur, _, _} <- List.keyfind(status, :segments_size, 0) do
          {:cont, acc + cur}
        else
          _ -> {:halt, nil}
        end

      _, _ ->
        {:halt, nil}
    end)
  end

  defp native(heap) do
    case Native.stats(heap) do
      nil ->
        nil

      # Preloaded, but not tracing this program (MTRACE_PROGRAMS): an empty
      # table says nothing of its native memory.
      %{active: false} ->
        nil

      stats ->
        stats
        |> Map.take([
          :live_count,
          :live_bytes,
          :dropped,
          :enabled,
          :reset_ms,
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
  else RSS outside the ERTS allocators and the JIT's code. `nil` when it
  cannot be read.

  ## Example

      iex> is_integer(Mtrace.VM.Memory.native_sample(false))
      true
  """
  @spec native_sample(boolean) :: non_neg_integer | nil
  def native_sample(true), do: live_bytes(Native.stats(false))

  # The carrier cache is not taken off here, though the size check does:
  # it counts mapped bytes, not resident ones, so on a node that just
  # booted, a cache draining segments it never touched made the difference
  # rise step after step, which reads as a native leak. Over a window,
  # less_cache_rise/1 takes off only what the cache grows by.
  def native_sample(false) do
    {rss, _peak, jit} = status()
    outside(rss, allocated(), jit)
  end

  @doc false
  # The live bytes of the tracer's stats (estimated when sampling); nil
  # without them.
  @spec live_bytes(map | nil | false) :: non_neg_integer | nil
  def live_bytes(%{sampled: true, est_live_bytes: bytes}), do: bytes
  def live_bytes(%{live_bytes: bytes}), do: bytes
  def live_bytes(_stats), do: nil

  @doc """
  An untraced native series over a window: `{native_sample(false),
  carrier_cache()}` pairs read together, oldest first. From each figure
  the carrier cache's rise since its lowest reading so far is taken off,
  up to what the figure itself rose since that reading.

  Carriers the VM frees into the cache were in use, so some of their pages
  are resident: while heaps grow and die, RSS outside the allocators rises
  with the cache, and that rise is not native memory. How much of a cached
  segment is resident cannot be read, hence the cap: the series does not
  fall below where it stood when the cache was lowest. A cache that drains
  takes nothing off, since the segments it lets go may never have been
  touched. A `nil` figure stays `nil`; a `nil` cache takes nothing off.

  ## Examples

      iex> Mtrace.VM.Memory.less_cache_rise([{100, 10}, {130, 40}, {114, 30}, {125, 5}])
      [100, 100, 100, 125]
      iex> Mtrace.VM.Memory.less_cache_rise([{100, 10}, {150, 40}])
      [100, 120]
  """
  @spec less_cache_rise([{non_neg_integer | nil, non_neg_integer | nil}]) ::
          [non_neg_integer | nil]
  def less_cache_rise(readings) do
    {series, _low} =
      Enum.map_reduce(readings, nil, fn
        {native, cache}, low when is_integer(native) and is_integer(cache) ->
          # low: the cache's lowest reading so far and the figure then
          low = if low && elem(low, 0) <= cache, do: low, else: {cache, native}
          {low_cache, native_then} = low
          {native - min(cache - low_cache, max(native - native_then, 0)), low}

        {native, _cache}, low ->
          {native, low}
      end)

    series
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
    {allocated, _used} = allocator_totals()
    allocated
  end

  @typedoc "One allocator type, summed over its instances."
  @type allocator_row :: %{
          allocator: atom,
          allocated: non_neg_integer,
          used: non_neg_integer,
          wasted: non_neg_integer,
          usage: float | nil,
          instances: non_neg_integer
        }

  # Below this an allocator is too small for its usage ratio to matter: a
  # 64 KiB carrier holding 1 KiB is 2% used and costs nothing.
  @tiny 1_048_576

  @doc """
  Allocated and used bytes per allocator type, most fragmented first. See
  `Mtrace.VM.allocators/0`.

  Allocators smaller than 1 MiB come after all others, largest first.

  ## Example

      [%{allocator: _, allocated: _, used: _, usage: _} | _] = Mtrace.VM.Memory.allocators()
  """
  @spec allocators() :: [allocator_row]
  def allocators do
    allocator_sizes()
    |> Enum.map(fn {alloc, instances} -> row(alloc, instances) end)
    |> Enum.sort_by(fn
      %{allocated: a, usage: u} when a >= @tiny -> {0, u, -a}
      %{allocated: a} -> {1, 0, -a}
    end)
  end

  @doc """
  Allocated and used bytes over all allocator types, or `{nil, nil}` when no
  allocator can be read.

  ## Example

      {allocated, used} = Mtrace.VM.Memory.allocator_totals()
      true = used <= allocated
  """
  @spec allocator_totals() :: {non_neg_integer, non_neg_integer} | {nil, nil}
  def allocator_totals do
    case allocator_sizes() do
      [] ->
        {nil, nil}

      allocs ->
        Enum.reduce(allocs, {0, 0}, fn {_, instances}, {a, u} ->
          {ia, iu} = instances_sizes(instances)
          {a + ia, u + iu}
        end)
    end
  end

  defp allocator_sizes do
    allocs = :erlang.system_info(:alloc_util_allocators)

    for {alloc, instances} when is_list(instances) <-
          :erlang.system_info({:allocator_sizes, allocs}),
        do: {alloc, instances}
  rescue
    # An emulator built without these items has no allocator figures to give.
    ArgumentError -> []
  end

  defp row(alloc, instances) do
    {allocated, used} = instances_sizes(instances)

    %{
      allocator: alloc,
      allocated: allocated,
      used: used,
      wasted: allocated - used,
      usage: if(allocated > 0, do: Float.round(used / allocated, 3)),
      instances: length(instances)
    }
  end

  defp instances_sizes(instances) do
    Enum.reduce(instances, {0, 0}, fn {:instance, _, props}, acc ->
      # mbcs_pool holds carriers abandoned to the shared pool: they belong
      # to no instance's mbcs any more but are still allocated.
      Enum.reduce([:mbcs, :mbcs_pool, :sbcs], acc, fn key, {a, u} ->
        {ca, cu} = carrier_sizes(Keyword.get(props, key, []))
        # Counters of one instance are read without a common lock; a block
        # freed between the two reads must not make used exceed allocated.
        {a + ca, u + min(cu, ca)}
      end)
    end)
  end

  defp carrier_sizes(items) do
    Enum.reduce(items, {0, 0}, fn
      {:carriers_size, cur}, {a, u} -> {a + cur, u}
      {:carriers_size, cur, _, _}, {a, u} -> {a + cur, u}
      # Emulators before OTP 23 report one blocks_size instead of per-type blocks.
      {:blocks_size, cur}, {a, u} -> {a, u + cur}
      {:blocks_size, cur, _, _}, {a, u} -> {a, u + cur}
      {:blocks, types}, {a, u} -> {a, u + blocks_size(types)}
      _, acc -> acc
    end)
  end

  # Blocks are listed per allocator type because a pooled carrier can be
  # adopted by another type's instance; they all fill this instance's carriers.
  defp blocks_size(types) do
    for {_type, props} <- types, {:size, cur} <- sizes(props), reduce: 0 do
      acc -> acc + cur
    end
  end

  defp sizes(props), do: for(p <- props, elem(p, 0) == :size, do: {:size, elem(p, 1)})
end

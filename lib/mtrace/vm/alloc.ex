defmodule Mtrace.VM.Alloc do
  @moduledoc """
  What the ERTS memory allocators hold: carriers (memory taken from the OS,
  "allocated") and the blocks inside them (memory handed to the VM, "used").

  All allocators are read in one `erlang:system_info({allocator_sizes, List})`
  call, so the two figures come from the same moment and `used` never
  exceeds `allocated`. Allocators that are disabled (for instance under
  `+Mea min`) report `false` there and are left out.
  """

  @typedoc "One allocator type, summed over its instances."
  @type row :: %{
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
  Allocated and used bytes per allocator type, most fragmented first.

  Allocators smaller than 1 MiB come after all others, largest first.

  ## Example

      [%{allocator: _, allocated: _, used: _, usage: _} | _] = Mtrace.VM.Alloc.types()
  """
  @spec types() :: [row]
  def types do
    snapshot()
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

      {allocated, used} = Mtrace.VM.Alloc.totals()
      true = used <= allocated
  """
  @spec totals() :: {non_neg_integer, non_neg_integer} | {nil, nil}
  def totals do
    case snapshot() do
      [] ->
        {nil, nil}

      allocs ->
        Enum.reduce(allocs, {0, 0}, fn {_, instances}, {a, u} ->
          {ia, iu} = instances_sizes(instances)
          {a + ia, u + iu}
        end)
    end
  end

  defp snapshot do
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

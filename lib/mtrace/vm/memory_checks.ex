defmodule Mtrace.VM.MemoryChecks do
  @moduledoc """
  The checks of `Mtrace.VM.diagnose/1` that look at where memory sits: ETS
  tables, refc binaries, native memory and allocator fragmentation.
  Thresholds are listed in `Mtrace.VM.Findings`.
  """

  import Mtrace.VM.Findings, only: [finding: 5, growth_ratio: 4, rate: 2, ratio: 2]
  alias Mtrace.VM.{ETS, Format, Native}

  @mib 1_048_576
  @ets_bytes 100 * @mib
  @ets_share 0.5
  @ets_share_min 64 * @mib
  @ets_growth 1 * @mib
  @ets_growth_min 8 * @mib
  @ets_samples 64
  @binary_freed 32 * @mib
  @binary_freed_share 0.25
  @binary_gc_share 0.25
  @binary_gc_min 16 * @mib
  @binary_untested_share 0.5
  @binary_untested_cap 0.9
  @native_bytes 256 * @mib
  @native_growth 1 * @mib
  @native_growth_min 8 * @mib
  @frag_usage 0.5
  @frag_wasted 64 * @mib

  @doc """
  Runs the memory checks; `secs` is the window length, or `nil` without one.

  ## Example

      snap = Mtrace.VM.Snapshot.take()
      extra = %{bin_leak: nil, preloaded: false, sites: []}
      [_ets, _binary, _native, _fragmentation] = Mtrace.VM.MemoryChecks.run(nil, snap, nil, extra)
  """
  @spec run(Mtrace.VM.Snapshot.t() | nil, Mtrace.VM.Snapshot.t(), number | nil, map) ::
          [map | nil]
  def run(prev, snap, secs, extra) do
    [
      ets(prev, snap, secs),
      binary(snap, extra.bin_leak),
      native(prev, snap, secs, extra),
      fragmentation(snap)
    ]
  end

  @doc """
  Whether refc binaries hold enough of the VM's memory (a quarter, and at
  least 16 MiB) to be worth a node-wide garbage collection to test for a leak.

  ## Example

      iex> Mtrace.VM.MemoryChecks.bin_leak_worth_it?(%{memory: %{binary: 1000, total: 2000}})
      false
  """
  @spec bin_leak_worth_it?(%{memory: map}) :: boolean
  def bin_leak_worth_it?(%{memory: %{binary: binary, total: total}})
      when is_integer(binary) and is_integer(total) and total > 0 do
    binary >= @binary_gc_min and binary / total >= @binary_gc_share
  end

  def bin_leak_worth_it?(_), do: false

  defp ets(_prev, snap, _secs) when snap.ets == %{}, do: nil

  defp ets(prev, snap, secs) do
    total = snap.memory.total

    # Table memory leaves out the binaries a table references; estimate them
    # for the few largest tables, which is where a leak would show.
    {table, bytes, binaries} =
      snap.ets
      |> Enum.sort_by(&(-elem(&1, 1)))
      |> Enum.take(3)
      |> Enum.map(fn {t, b} -> {t, b, ETS.binary_estimate(t, @ets_samples)} end)
      |> Enum.max_by(fn {_, b, bins} -> b + (bins || 0) end)

    held = bytes + (binaries || 0)

    share =
      if held >= @ets_share_min and is_integer(total) and total > 0,
        do: ratio(held / total, @ets_share),
        else: 0

    {gtable, delta} =
      if prev do
        snap.ets
        |> Enum.map(fn {t, b} -> {t, b - Map.get(prev.ets, t, 0)} end)
        |> Enum.max_by(&elem(&1, 1))
      else
        {nil, nil}
      end

    size = max(ratio(held, @ets_bytes), share)
    growth = growth_ratio(delta, secs, @ets_growth, @ets_growth_min)
    table = if growth > size, do: gtable, else: table
    per_s = prev && rate(Map.get(snap.ets, table, 0) - Map.get(prev.ets, table, 0), secs)
    info = ETS.describe(table, :erlang.system_info(:wordsize)) || []
    name = inspect(info[:name] || table)

    finding(
      :ets_growth,
      max(size, growth),
      "ETS table #{name} holds #{Format.bytes(info[:memory_bytes])} in " <>
        "#{Format.int(info[:size] || 0)} objects" <>
        if(binaries && binaries > 0,
          do: " plus about #{Format.bytes(binaries)} of binaries it references",
          else: ""
        ) <>
        if(per_s && per_s > 0, do: ", growing by #{Format.bytes(per_s)}/s", else: ""),
      %{
        table: table,
        info: info,
        binary_estimate: binaries,
        growth_per_s: per_s,
        ets_total: snap.memory.ets
      },
      "Mtrace.VM.ets_top(5); then find who inserts into #{name} " <>
        "(owner #{inspect(info[:owner])}) without deleting"
    )
  end

  # Without a forced GC (gc: false) a leak cannot be told from binaries in
  # use, so dominating binary memory is reported below the problem score.
  defp binary(snap, nil) do
    %{binary: binary, total: total} = snap.memory

    if bin_leak_worth_it?(snap) do
      finding(
        :binary_leak,
        min(ratio(binary / total, @binary_untested_share), @binary_untested_cap),
        "refc binaries hold #{Format.bytes(binary)}, #{round(100 * binary / total)}% of the " <>
          "VM's memory; not tested for a leak",
        %{binary: binary, total: total},
        "Mtrace.VM.bin_leak(5) (garbage-collects every process), or " <>
          "Mtrace.VM.top(:binary_memory, 5) to see who holds them"
      )
    end
  end

  defp binary(snap, bin_leak) do
    before = bin_leak.binary_before
    freed = if before && bin_leak.binary_after, do: max(before - bin_leak.binary_after, 0)
    threshold = max(@binary_freed, @binary_freed_share * (snap.memory.total || 0))
    top = bin_leak.top

    next =
      case top do
        [{pid, _, _} | _] ->
          "Mtrace.VM.top(:binary_memory, 5) later to see it build up again; " <>
            "#{Format.pid_expr(pid)} passes large binaries without collecting: " <>
            "hibernate it when idle or lower its fullsweep_after"

        [] ->
          "Mtrace.VM.top(:binary_memory, 5)"
      end

    finding(
      :binary_leak,
      ratio(freed, threshold),
      "a forced GC freed #{Format.bytes(freed)} of refc binaries " <>
        "(#{Format.bytes(before)} → #{Format.bytes(bin_leak.binary_after)}), " <>
        "#{Format.int(bin_leak.freed)} references dropped" <>
        case top do
          [{pid, delta, info} | _] -> "; most by #{Format.process(pid, info)}: #{delta}"
          [] -> ""
        end,
      Map.put(bin_leak, :freed_bytes, freed),
      next
    )
  end

  defp native(prev, snap, secs, %{preloaded: true} = extra) do
    live = get_in(snap.memory, [:native, :live_bytes])
    before = prev && get_in(prev.memory, [:native, :live_bytes])
    delta = if is_integer(live) and is_integer(before), do: live - before
    per_s = delta && rate(delta, secs)
    threshold = max(@native_bytes, snap.memory.total || 0)

    finding(
      :native_leak,
      max(ratio(live, threshold), growth_ratio(delta, secs, @native_growth, @native_growth_min)),
      "the native heap holds #{Format.bytes(live)} in live malloc allocations" <>
        if(per_s && per_s > 0, do: ", growing by #{Format.bytes(per_s)}/s", else: ""),
      %{live_bytes: live, growth_per_s: per_s, native: snap.memory.native, sites: extra.sites},
      if(extra.sites != [],
        do:
          "Mtrace.sites([]) lists the native call sites holding it; compare two calls " <>
            "a few minutes apart",
        else: "Mtrace.olds(20, true) lists the oldest live allocations with their stacks"
      )
    )
  end

  defp native(prev, snap, secs, _extra) do
    outside = snap.memory.outside_vm
    before = prev && prev.memory.outside_vm
    delta = if is_integer(outside) and is_integer(before), do: outside - before
    per_s = delta && rate(delta, secs)
    threshold = max(@native_bytes, snap.memory.allocated || 0)

    finding(
      :native_leak,
      max(
        ratio(outside, threshold),
        growth_ratio(delta, secs, @native_growth, @native_growth_min)
      ),
      "#{Format.bytes(outside)} of RSS is outside the ERTS allocators (NIFs, drivers, " <>
        "libraries)" <>
        if(per_s && per_s > 0, do: ", growing by #{Format.bytes(per_s)}/s", else: ""),
      %{
        outside_vm: outside,
        rss: snap.memory.rss,
        allocated: snap.memory.allocated,
        growth_per_s: per_s
      },
      "trace native allocations: add `#{Native.enable_hint()}` to rel/env.sh.eex, " <>
        "restart, then Mtrace.VM.diagnose(window: 60_000)"
    )
  end

  defp fragmentation(snap) do
    snap.allocators
    |> Enum.filter(&(&1.usage != nil and &1.usage < @frag_usage))
    |> Enum.max_by(& &1.wasted, fn -> nil end)
    |> case do
      nil ->
        nil

      worst ->
        finding(
          :fragmentation,
          ratio(worst.wasted, @frag_wasted),
          "#{worst.allocator} has #{Format.bytes(worst.allocated)} in carriers but uses " <>
            "#{Format.bytes(worst.used)} (#{round(worst.usage * 100)}%)",
          %{worst: worst, allocators: Enum.take(snap.allocators, 5)},
          "Mtrace.VM.allocators(); if it stays low, start the VM with a different " <>
            "allocation strategy for it (e.g. +M<X>as aobf) or smaller carriers (+M<X>lmbcs)"
        )
    end
  end
end

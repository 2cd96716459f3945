defmodule Mtrace.VM.MemoryChecks do
  @moduledoc """
  The checks of `Mtrace.VM.diagnose/1` that look at where memory sits: ETS
  tables, persistent_term, refc binaries (`Mtrace.VM.BinaryChecks`), native memory, allocator fragmentation, and memory
  NIFs and drivers hold in the VM's own allocators (`enif_alloc` blocks,
  resources and binaries, which the native tracer cannot see: see
  `Mtrace.VM.Native`). Scores are those of `Mtrace.VM.Findings`;
  thresholds are listed in `Mtrace.VM.Thresholds`. `extra` may carry them
  as `:thresholds`, with `:native_series` (native bytes sampled across the
  window), `:window` (its length as asked for, in ms), `:limit`
  (`Mtrace.VM.Memory.limit/0`) and `:nif` (see `nif/4`).
  """

  import Mtrace.VM.Findings,
    only: [finding: 5, growth_ratio: 4, rate: 2, ratio: 2, growth: 2, describe_growth: 1]

  alias Mtrace.VM.{BinaryChecks, Diagnose, ETS, Findings, Format, Native, Thresholds}

  # Table memory leaves out the binaries a table references: they are
  # estimated from 64 objects of each of the 3 largest tables, where a leak
  # would show; and when binaries are a large share of the VM's memory
  # (bin_leak_worth_it?/2), from 8 objects of each of the next 256 too,
  # since a small table can keep large binaries (at most 2_240 objects
  # read in all).
  @ets_tiers [{3, 64}]
  @ets_wide_tiers [{3, 64}, {256, 8}]

  # The kinds of NIF memory that are Erlang code's once handed over.
  @handed_over [:resource, :binary]

  @doc """
  Runs the memory checks (`nil` where there is nothing to report); `secs`
  is the time between the snapshots, or `nil` without a window, and
  `extra.series_secs` (when given) the time the native and NIF samples
  span, over which their rates are taken.

  ## Example

      snap = Mtrace.VM.Diagnose.snapshot()
      extra = %{bin_leak: nil, preloaded: false, sites: []}
      [_ets, _persistent_term, _binary_leak, _binary_held, _native, _fragmentation, _nif] =
        Mtrace.VM.MemoryChecks.run(nil, snap, nil, extra)
  """
  @spec run(Diagnose.snapshot() | nil, Diagnose.snapshot(), number | nil, map) ::
          [Findings.finding() | nil]
  def run(prev, snap, secs, extra) do
    th = Map.get(extra, :thresholds, Thresholds.defaults())
    tiers = if BinaryChecks.bin_leak_worth_it?(snap, th), do: @ets_wide_tiers, else: @ets_tiers
    {estimates, unsampled} = ETS.binary_estimates(snap.ets, tiers)
    estimates = within_unheld(estimates, extra.bin_leak)
    ets_binaries = %{estimates: estimates, unsampled: unsampled}

    [
      ets(prev, snap, secs, estimates, th),
      persistent_term(prev, snap, secs, th),
      BinaryChecks.leak(snap, extra.bin_leak, th),
      BinaryChecks.held(snap, extra.bin_leak, ets_binaries, th),
      native(snap, secs && Map.get(extra, :series_secs, secs), extra, th),
      fragmentation(snap, th),
      nif(
        extra[:nif],
        secs && Map.get(extra, :series_secs, secs),
        snap.memory,
        th,
        erlang_held(extra.bin_leak, estimates)
      )
    ]
  end

  # What the forced GC shows Erlang code still holding of the binaries it
  # left: its largest holders' binaries (each counted once, however many of
  # them share it) and the binaries sampled ETS tables reference, at most
  # all it left; nil without the GC.
  defp erlang_held(%{binary_after: left} = bin_leak, estimates) when is_integer(left) do
    procs = procs_held(bin_leak)
    tables = for {_t, _, bins} <- estimates, is_integer(bins), reduce: 0, do: (n -> n + bins)
    %{left: left, held: min(procs + tables, left)}
  end

  defp erlang_held(_bin_leak, _estimates), do: nil

  defp procs_held(bin_leak) do
    Map.get_lazy(bin_leak, :held_bytes, fn ->
      for {_pid, bytes, _info} <- Map.get(bin_leak, :held, []), reduce: 0, do: (n -> n + bytes)
    end)
  end

  # A table's estimate counts a binary once for each sampled object that
  # references it, so a table of slices of one large binary reads as
  # holding it many times over. After the forced GC, no table holds more
  # than the binaries it left beyond what its largest process holders hold
  # (a binary a process and a table both reference then counts as the
  # process's).
  defp within_unheld(estimates, %{binary_after: left} = bin_leak) when is_integer(left) do
    room = max(left - procs_held(bin_leak), 0)
    for {t, b, bins} <- estimates, do: {t, b, bins && min(bins, room)}
  end

  defp within_unheld(estimates, _bin_leak), do: estimates

  defp ets(_prev, _snap, _secs, [], _th), do: nil

  defp ets(prev, snap, secs, estimates, th) do
    total = snap.memory.total

    # the table holding the most with the binaries it references
    {table, bytes, binaries} = Enum.max_by(estimates, fn {_, b, bins} -> b + (bins || 0) end)
    held = bytes + (binaries || 0)

    share =
      if held >= th.ets_share_min and is_integer(total) and total > 0,
        do: ratio(held / total, th.ets_share),
        else: 0

    deltas = prev && with_binaries(ets_deltas(prev, snap), estimates, binary_growth(prev, snap))
    {gtable, delta} = if deltas, do: Enum.max_by(deltas, &elem(&1, 1)), else: {nil, nil}

    size = max(ratio(held, th.ets_bytes), share)
    growth = growth_ratio(delta, secs, th.ets_growth, th.ets_growth_min)
    # the fastest-growing table's own estimate, if it has one
    {table, binaries} =
      if growth > size,
        do: {gtable, Enum.find_value(estimates, fn {t, _, bins} -> t == gtable && bins end)},
        else: {table, binaries}

    per_s = deltas && rate(Map.get(deltas, table, 0), secs)
    info = ETS.describe(table, :erlang.system_info(:wordsize)) || []
    # An unnamed table's name reaches nothing (:ets.info(:sessions) is
    # :undefined): said, so that the hint is not taken for a handle.
    name = inspect(info[:name] || table)
    handle = if is_atom(table), do: name, else: "#{name} (unnamed: its id is in :ets.all())"

    {owned_by, owner_next} = Findings.table_owner(info[:owner])

    finding(
      :ets_growth,
      max(size, growth),
      "ETS table #{name}#{owned_by} holds #{Format.bytes(info[:memory_bytes])} in " <>
        "#{Format.int(info[:size] || 0)} objects" <>
        if(binaries && binaries > 0,
          do: " plus about #{Format.bytes(binaries)} of binaries it references",
          else: ""
        ) <>
        ets_growth_text(per_s, binaries),
      %{
        table: table,
        info: info,
        binary_estimate: binaries,
        growth_per_s: per_s,
        ets_total: snap.memory.ets
      },
      # ets_top/1 ranks tables by their own memory, binaries left out
      if(binaries && binaries > (info[:memory_bytes] || 0),
        do: "find who inserts into #{handle} without deleting",
        else: "Mtrace.VM.ets_top(5); then find who inserts into #{handle} without deleting"
      ) <> owner_next
    )
  end

  defp ets_growth_text(per_s, binaries) when is_number(per_s) and per_s > 0 do
    if binaries && binaries > 0,
      do: ", growing by about #{Format.bytes(per_s)}/s with them",
      else: ", growing by #{Format.bytes(per_s)}/s"
  end

  defp ets_growth_text(_per_s, _binaries), do: ""

  # A table's binaries are estimated from its objects, so many bytes of
  # them per byte of its own memory (ETS.binary_estimate/2): its growth
  # carries them in that proportion, as the size check counts them (a
  # table of small objects referencing large binaries grows mostly outside
  # its own memory). But by no more than the VM's binary memory grew in the
  # window: a table of large binaries that grows by small objects without
  # any adds its own growth alone.
  defp with_binaries(deltas, estimates, binary_growth) do
    Enum.reduce(estimates, deltas, fn
      {t, b, bins}, acc when is_integer(bins) and bins > 0 and b > 0 and is_map_key(acc, t) ->
        Map.update!(acc, t, fn d -> d + min(max(round(d * bins / b), 0), binary_growth) end)

      _estimate, acc ->
        acc
    end)
  end

  defp binary_growth(%{memory: %{binary: from}}, %{memory: %{binary: to}})
       when is_integer(from) and is_integer(to),
       do: max(to - from, 0)

  defp binary_growth(_prev, _snap), do: 0

  # Each table's growth since prev. Tables new since grew by at most what
  # the tables deleted since do not make up for: a cache rebuilt in a new
  # table and swapped for the old one is not growth.
  defp ets_deltas(prev, snap) do
    {new, kept} = Enum.split_with(snap.ets, fn {t, _} -> not Map.has_key?(prev.ets, t) end)

    deleted =
      for {t, b} <- prev.ets, not Map.has_key?(snap.ets, t), reduce: 0, do: (acc -> acc + b)

    room = max(Enum.reduce(new, 0, &(elem(&1, 1) + &2)) - deleted, 0)

    Map.new(kept, fn {t, b} -> {t, b - Map.fetch!(prev.ets, t)} end)
    |> Map.merge(Map.new(new, fn {t, b} -> {t, min(b, room)} end))
  end

  # Terms kept in persistent_term: never collected, and not in processes,
  # binary, ets or code of erlang:memory/0 (they are under system), so a
  # store that only grows shows nowhere else.
  defp persistent_term(prev, snap, secs, th) do
    case Map.get(snap, :persistent_term) do
      %{count: count, memory: bytes} ->
        total = snap.memory[:total]
        before = prev && Map.get(prev, :persistent_term)
        delta = if is_map(before), do: bytes - before.memory
        per_s = delta && rate(delta, secs)

        share =
          if bytes >= th.persistent_term_share_min and is_integer(total) and total > 0,
            do: ratio(bytes / total, th.persistent_term_share),
            else: 0

        size = max(ratio(bytes, th.persistent_term_bytes), share)

        growth =
          growth_ratio(delta, secs, th.persistent_term_growth, th.persistent_term_growth_min)

        of =
          if is_integer(total) and total > 0,
            do: " (#{Format.percent(bytes, total)} of the VM's memory, under system)",
            else: ""

        finding(
          :persistent_term,
          max(size, growth),
          "persistent_term holds #{Format.bytes(bytes)} in " <>
            "#{Format.count(count, "term")}#{of}" <>
            if(per_s && per_s > 0, do: ", growing by #{Format.bytes(per_s)}/s", else: ""),
          %{count: count, memory: bytes, growth_per_s: per_s, vm_total: total},
          "Mtrace.VM.persistent_terms(5) names the largest; look for :persistent_term.put/2 " <>
            "with keys made from data, and never erased"
        )

      _ ->
        nil
    end
  end

  # Native memory: the tracer's live bytes (estimated when sampling), else
  # (no tracer, or tracking switched off) RSS outside the ERTS allocators.
  # Its size counts when it passes
  # native_bytes (or the VM's own memory), or dwarfs what the VM accounts
  # for. With a window, growth counts only when steady: the samples went up
  # in most steps and ended higher, as a leak does, not up and down as churn
  # and a working set taken and given back do; a large heap that did not
  # grow steadily is a :native_heap finding, not a leak.
  defp native(snap, secs, extra, th) do
    {bytes, what} = native_bytes(snap, extra)
    vm = vm_bytes(snap, extra)
    growth = growth(extra[:native_series], secs)

    steady =
      if growth && growth.steadiness >= th.native_steady && growth.per_s > 0 &&
           rose_enough?(growth, extra, th),
         do: ratio(growth.per_s, th.native_growth),
         else: 0

    size =
      max(
        ratio(bytes, max(th.native_bytes, vm)),
        if(vm > 0, do: ratio(bytes, max(th.native_vm_min, th.native_vm_ratio * vm)), else: 0)
      )

    times_vm =
      if is_integer(bytes) and vm > 0 and bytes >= vm,
        do: ", #{Float.round(bytes / vm, 1)}× the #{Format.bytes(vm)} #{vm_words(extra)}",
        else: ""

    over_window =
      if growth,
        do:
          "; over the #{window(extra, secs)} window it " <>
            describe_growth(growth) <> projection(growth, steady, extra[:limit], snap),
        else: ""

    kind = if growth && steady == 0, do: :native_heap, else: :native_leak

    finding(
      kind,
      if(kind == :native_leak, do: max(size, steady), else: size),
      "#{shown(what, bytes, snap, extra)}#{times_vm}#{over_window}",
      native_evidence(extra, %{
        bytes: bytes,
        live_bytes: bytes,
        vm: vm,
        growth: growth,
        limit: extra[:limit],
        native: snap.memory.native,
        outside_vm: snap.memory.outside_vm
      }),
      native_next(extra, growth, snap)
    )
  end

  # The tracer's bytes are exact; RSS moves by itself as pages are first
  # touched (seen: an idle release's first diagnosis from a remote console,
  # 72 KiB/s up in 4 of 5 steps over 5 s), so its growth counts only past a
  # floor.
  defp rose_enough?(_growth, %{preloaded: true}, _th), do: true
  defp rose_enough?(growth, _extra, th), do: growth.to - growth.from >= th.native_rss_growth_min

  # The figure after its words; when the carriers the VM keeps mapped may
  # be all of it, the figure before them is said instead of "is 0 B".
  defp shown({:all_cached, outside}, _bytes, _snap, _extra),
    do:
      "memory outside the VM's allocators, untraced (the emulator itself, NIFs, drivers, " <>
        "libraries), is #{Format.bytes(outside)}, all of which may be carriers the VM " <>
        "freed and keeps mapped"

  defp shown(what, bytes, snap, extra), do: "#{what} #{about(snap, extra)}#{Format.bytes(bytes)}"

  # The tracer's live figures are estimates when it samples (RSS is not).
  defp about(%{memory: %{native: %{sampled: true}}}, %{preloaded: true}), do: "about "
  defp about(_snap, _extra), do: ""

  # The tracer's sites are evidence only where it was read.
  defp native_evidence(%{preloaded: true, sites: sites}, evidence),
    do: Map.put(evidence, :sites, sites)

  defp native_evidence(_extra, evidence), do: evidence

  # (Estimated from the samples when sampling: see Mtrace.VM.Memory.)
  # Without the tracer the figure is not native heap but all memory the ERTS
  # allocators do not explain, the emulator's own included: said as such.
  defp native_bytes(snap, %{preloaded: true}),
    do: {snap.memory.native[:live_bytes], "the native heap (live malloc allocations) holds"}

  # Carriers the VM freed and still maps for reuse (Memory.carrier_cache/0)
  # are the VM's: right after a large process dies they can be most of it.
  # Taken off only when the summary says so (1 MiB or more), so that the
  # figure is the memory line's "outside the VM" unless told otherwise.
  defp native_bytes(snap, _extra) do
    outside = snap.memory.outside_vm
    cache = min(snap.memory[:carrier_cache] || 0, outside || 0)
    cache = if cache >= 1_048_576, do: cache, else: 0

    if cache > 0 and cache == outside,
      do: {0, {:all_cached, outside}},
      else: native_outside(outside, cache)
  end

  defp native_outside(outside, cache) do
    {outside && outside - cache,
     "memory outside the VM's allocators, untraced (the emulator itself, NIFs, " <>
       "drivers, libraries)" <>
       if(cache >= 1_048_576,
         do: ", less up to #{Format.bytes(cache)} of carriers the VM freed and keeps mapped,",
         else: ","
       ) <> " is"}
  end

  # What the VM accounts for: erlang:memory(total) with the tracer (native
  # memory is outside it), else what the ERTS allocators hold.
  defp vm_bytes(snap, %{preloaded: true}), do: snap.memory.total || 0
  defp vm_bytes(snap, _extra), do: snap.memory.allocated || 0

  # vm_bytes/2 in the words of the memory line it is on.
  defp vm_words(%{preloaded: true}), do: "the VM accounts for"
  defp vm_words(_extra), do: "the ERTS allocators hold"

  # The window as asked for (ms), as the report's other lines give it; else
  # as measured.
  defp window(%{window: ms}, _secs) when is_integer(ms), do: Format.duration_ms(ms)
  defp window(_extra, secs), do: Format.duration_ms(round(secs * 1000))

  defp projection(g, steady_ratio, limit, snap) when steady_ratio > 0 and is_map(limit) do
    case Findings.time_to(g, limit.bytes - (snap.memory.rss || 0)) do
      nil ->
        ""

      secs ->
        "; at this rate the memory limit (#{limit.source}, #{Format.bytes(limit.bytes)}) " <>
          "is reached in #{Format.age(secs)}"
    end
  end

  defp projection(_g, _ratio, _limit, _snap), do: ""

  defp native_next(%{preloaded: true, sites: [_ | _]}, growth, _snap) do
    if growth,
      do: "Mtrace.report(sort: :growth, window: 10_000) ranks the sites that grow",
      else: "Mtrace.report() shows which code holds it; compare two reports a few minutes apart"
  end

  defp native_next(%{preloaded: true}, _growth, _snap),
    do: "Mtrace.olds(20, true) lists the oldest live allocations with their stacks"

  # Switched off, native memory was judged by RSS; the tracer can name it.
  defp native_next(%{tracking_off: true}, _growth, %{memory: %{native: %{enabled: true}}}),
    do:
      "tracking is on again: Mtrace.report(sort: :growth, window: 10_000) ranks " <>
        "the sites that grow"

  defp native_next(%{tracking_off: true}, _growth, _snap),
    do:
      "Mtrace.enable() switches tracking back on; then " <>
        "Mtrace.report(sort: :growth, window: 10_000) ranks the sites that grow"

  defp native_next(%{tracer_unread: true}, _growth, _snap),
    do:
      "the tracer's figures could not be read at every step (Mtrace.stats() says " <>
        "why); Mtrace.report() shows which code holds native memory"

  defp native_next(%{program_left_out: true}, _growth, _snap),
    do:
      "trace native allocations: the tracer is preloaded but MTRACE_PROGRAMS leaves " <>
        "this program out; restart the node with it unset (it defaults to beam.smp)"

  defp native_next(_extra, _growth, _snap),
    do:
      "trace native allocations: add `#{Native.enable_hint()}` to rel/env.sh.eex, " <>
        "restart, then Mtrace.VM.diagnose(window: 60_000)"

  defp fragmentation(snap, th) do
    snap.allocators
    |> Enum.filter(&(&1.usage != nil and &1.usage < th.frag_usage))
    |> Enum.max_by(& &1.wasted, fn -> nil end)
    |> case do
      nil ->
        nil

      worst ->
        finding(
          :fragmentation,
          ratio(worst.wasted, th.frag_wasted),
          "#{worst.allocator} has #{Format.bytes(worst.allocated)} in carriers but uses " <>
            "#{Format.bytes(worst.used)} (#{round(worst.usage * 100)}%)",
          %{worst: worst, allocators: Enum.take(snap.allocators, 5)},
          "Mtrace.VM.allocators(); if it stays low, " <> frag_flags(worst.allocator)
        )
    end
  end

  # The letter of each allocator type in the VM's +M<letter><flag> options
  # (erts_alloc): +MEas aobf sets ets_alloc's strategy.
  @alloc_letters %{
    binary_alloc: "B",
    std_alloc: "D",
    ets_alloc: "E",
    fix_alloc: "F",
    eheap_alloc: "H",
    literal_alloc: "I",
    ll_alloc: "L",
    driver_alloc: "R",
    sl_alloc: "S",
    temp_alloc: "T",
    exec_alloc: "X"
  }

  @doc """
  The VM flags to try for an allocator type that stays fragmented: another
  allocation strategy (address order best fit, `+M<letter>as aobf`), or
  smaller multiblock carriers (`+M<letter>lmbcs`, in KiB: half the largest
  size in force, when the VM tells it).

  ## Example

      iex> Mtrace.VM.MemoryChecks.frag_flags(:ets_alloc) =~ "start the VM with +MEas aobf"
      true
      iex> Mtrace.VM.MemoryChecks.frag_flags(:mystery_alloc)
      "see erts_alloc for its +M flags: a different allocation strategy (as aobf) or smaller carriers (lmbcs)"
  """
  @spec frag_flags(atom) :: String.t()
  def frag_flags(allocator) do
    case Map.fetch(@alloc_letters, allocator) do
      {:ok, l} ->
        "start the VM with +M#{l}as aobf (address order best fit for #{allocator})" <>
          case lmbcs(allocator) do
            kib when is_integer(kib) and kib >= 2 ->
              " or +M#{l}lmbcs #{div(kib, 2)} (carriers of at most " <>
                "#{Format.bytes(div(kib, 2) * 1024)}, half the current size)"

            _ ->
              " or a smaller +M#{l}lmbcs (largest carrier, in KiB)"
          end

      :error ->
        "see erts_alloc for its +M flags: a different allocation strategy (as aobf) or " <>
          "smaller carriers (lmbcs)"
    end
  end

  # The largest multiblock carrier size in force for an allocator type, in
  # KiB, or nil.
  defp lmbcs(allocator) do
    :erlang.system_info({:allocator, allocator})
    |> List.wrap()
    |> Enum.find_value(fn
      {:instance, _, info} ->
        with {:options, opts} <- List.keyfind(info, :options, 0),
             {:lmbcs, bytes} when is_integer(bytes) <- List.keyfind(opts, :lmbcs, 0),
             do: div(bytes, 1024),
             else: (_ -> nil)

      _ ->
        nil
    end)
  rescue
    _ -> nil
  end

  @doc """
  The check of memory NIFs and drivers hold in the VM's own allocators
  (`Mtrace.VM.Native.nif_memory/0`): the `:nif_alloc_leak` finding for the module that scores highest, or
  `nil`. `nif` is `%{series: [rows] | nil, now: {:ok, rows} | {:error, _}}`:
  with a window, `series` holds the rows read at each step, and growth
  counts only when steady (up in `native_steady` of the steps), as for
  native memory; `secs` is the window, or `nil`.

  A NIF's resources and binaries (kinds `:resource` and `:binary`) are
  Erlang code's once handed over: a sub-binary kept in a process keeps the
  whole binary the NIF made. `held` is what a forced GC left of refc
  binaries and how much of it Erlang code was shown to hold (`%{left:
  bytes, held: bytes}`: its largest holders, and the binaries sampled ETS
  tables reference), or `nil` without the GC. With it, a module's
  resources and binaries count for at most what no holder explains
  (`left - held`), and so does their growth: only the share of what the
  module held at the window's end that no holder explains (none, when
  the GC freed them all or Erlang code holds them all); its `enif_alloc`
  blocks always count. The rows (`now`) are best read after the GC,
  which frees the binaries no one kept.

  ## Example

      row = %{module: :my_nif, kind: :enif_alloc, count: 10_240, bytes: 80 <<< 20,
              bytes_min: 64 <<< 20, bytes_max: 96 <<< 20}
      Mtrace.VM.MemoryChecks.nif(%{series: nil, now: {:ok, [row]}}, nil, %{total: 120 <<< 20},
                                 Mtrace.VM.Thresholds.defaults()).kind
      #=> :nif_alloc_leak
  """
  @spec nif(map | nil, number | nil, map, Thresholds.t(), map | nil) ::
          Findings.finding() | nil
  def nif(nif, secs, memory, th, held \\ nil)

  def nif(%{now: {:ok, rows}} = nif, secs, memory, th, held) when rows != [] do
    series = if secs && is_list(nif[:series]), do: Enum.reject(nif.series, &is_nil/1)

    rows
    |> Enum.group_by(& &1.module)
    |> Enum.map(fn {module, mine} -> nif_module(module, mine, series, secs, memory, th, held) end)
    |> Enum.max_by(& &1.score, fn -> nil end)
  end

  def nif(_nif, _secs, _memory, _th, _held), do: nil

  defp nif_module(module, rows, series, secs, memory, th, held) do
    # Judged on the lower bounds of the size classes: never more than is held.
    bytes = rows |> Enum.map(& &1.bytes_min) |> Enum.sum()
    total = memory[:total] || 0
    bins = for %{kind: k, bytes_min: b} <- rows, k in @handed_over, reduce: 0, do: (n -> n + b)
    {unheld_bins, held_text} = unheld(bins, held)
    counted = bytes - bins + unheld_bins

    # each kind's growth across the window's steps; only steady growth counts
    grown =
      Enum.map(rows, fn row ->
        g = series && growth(Enum.map(series, &bytes_of(&1, row.module, row.kind)), secs)
        steady = g && g.steadiness >= th.native_steady && g.to - g.from >= th.nif_growth_min
        Map.merge(row, %{growth: g, steady: steady || false})
      end)

    # Of its resources and binaries' growth, only the share no Erlang
    # holder explains counts: the share of what it held at the window's end
    # that is neither held by processes and ETS tables nor freed by the
    # forced GC after the window (unheld/2), and by at least nif_growth_min.
    theirs = unheld_share(grown, bins, unheld_bins, held)

    grown =
      Enum.map(grown, fn row ->
        f = if row.kind in @handed_over, do: theirs, else: 1.0
        counts = row.steady and (row.growth.to - row.growth.from) * f >= th.nif_growth_min
        Map.merge(row, %{share: f, counted_per_s: if(counts, do: row.growth.per_s * f, else: 0)})
      end)

    per_s = grown |> Enum.map(& &1.counted_per_s) |> Enum.sum()

    share =
      if counted >= th.nif_share_min and total > 0,
        do: ratio(counted / total, th.nif_share),
        else: 0

    score = Enum.max([ratio(counted, th.nif_bytes), share, ratio(per_s, th.nif_growth)])

    # Binaries a NIF or a driver made (a file read, a socket's data) are the
    # Erlang code's once handed over: whoever keeps them is named first.
    binaries? = Enum.any?(rows, &(&1.kind in @handed_over))

    held =
      if binaries?,
        do:
          "Mtrace.VM.top(:binary_memory, 5) names the processes that keep its binaries, " <>
            "if Erlang code holds them; ",
        else: ""

    finding(
      :nif_alloc_leak,
      score,
      "#{Native.origin(module)} #{inspect(module)} holds " <>
        Enum.map_join(rows, ", ", &Native.nif_held/1) <>
        " in the VM's allocators" <> held_text <> nif_growth_text(grown, series),
      %{
        module: module,
        bytes: bytes,
        counted_bytes: counted,
        rows: grown,
        growth_per_s: series && per_s
      },
      held <>
        "Mtrace.VM.nif_memory(window: 10_000) shows which kind grows; for the C stacks that " <>
        "allocate it, start the VM with +MRe false +MBe false (enif_alloc, resources and " <>
        "binaries then go through malloc) and run Mtrace.report()"
    )
  end

  # The bytes of a module's resources and binaries its size is judged on:
  # at most what the forced GC left and no Erlang holder explains. With the
  # text saying so when that lowered them.
  defp unheld(bins, nil), do: {bins, ""}

  defp unheld(bins, %{left: left, held: held}) do
    alone = max(left - held, 0)

    if bins > alone,
      do:
        {alone,
         "; processes and ETS tables still hold #{Format.bytes(held)} of refc binaries " <>
           "after a forced GC, so at most #{Format.bytes(alone)} of its resources or " <>
           "binaries are not Erlang code's"},
      else: {bins, ""}
  end

  # The share of a module's resources and binaries at the window's end
  # (before the forced GC) that unheld/2 leaves it: 1.0 without the GC.
  defp unheld_share(_grown, _bins, _unheld, nil), do: 1.0

  defp unheld_share(grown, bins, unheld, _held) do
    at_end =
      for %{kind: k, growth: %{to: to}} <- grown, k in @handed_over, reduce: 0, do: (n -> n + to)

    case max(at_end, bins) do
      0 -> 1.0
      whole -> min(unheld / whole, 1.0)
    end
  end

  defp bytes_of(rows, module, kind) do
    Enum.find_value(rows, 0, &(&1.module == module and &1.kind == kind and &1.bytes_min))
  end

  defp nif_growth_text(_rows, nil), do: ""

  defp nif_growth_text(rows, _series) do
    case Enum.filter(rows, & &1.steady) do
      [] ->
        "; not growing steadily over the window"

      growing ->
        "; its " <>
          Enum.map_join(Enum.with_index(growing), ", ", fn {row, i} ->
            "#{kind_noun(row)} #{if i == 0, do: "grew steadily ", else: ""}by " <>
              "#{Format.bytes(row.growth.per_s)}/s " <>
              "(#{Format.bytes(row.growth.per_s * 3600)}/h)" <> explained(row)
          end)
    end
  end

  # A kind's name, as the rows name it ("resources or binaries").
  defp kind_noun(row), do: Native.nif_count(%{row | count: 2}) |> String.replace_prefix("2 ", "")

  # How much of a kind's growth Erlang code explains (unheld_share/4).
  defp explained(%{share: share}) when share >= 1.0, do: ""

  defp explained(%{share: share}) when share == 0,
    do: ", all of it freed by the forced GC or held by Erlang code"

  defp explained(row),
    do: ", of which at most #{Format.bytes(row.growth.per_s * row.share)}/s is not Erlang code's"
end

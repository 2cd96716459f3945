defmodule Mtrace.VM.BinaryChecks do
  @moduledoc """
  The checks of `Mtrace.VM.diagnose/1` that look at refc binaries, run by
  `Mtrace.VM.MemoryChecks`: `:binary_leak`, what a forced collection of
  every process frees (`Mtrace.VM.bin_leak/1`), and `:binary_held`, what it
  leaves and who holds it. Scores are those of `Mtrace.VM.Findings`;
  thresholds are listed in `Mtrace.VM.Thresholds`.

  Binaries a GC cannot free are in use, not leaked, but when they are much
  of the VM's memory the report still has to say where they are: a cache
  or a state that keeps every payload it was sent looks like that. One
  process keeping them is judged as `:process_memory` judges a process's
  heap; binaries spread over many holders are a lead, below a problem.
  """

  import Mtrace.VM.Findings, only: [finding: 5, ratio: 2]

  alias Mtrace.VM.{ETS, Findings, Format, Ports, Thresholds}

  # Dominating binaries that no process is known to keep (untested without
  # the forced GC, or spread over many holders) score below a problem.
  @lead_share 0.5
  @lead_cap 0.9

  # Holders (processes, ETS tables) are named, at most 3 of each, when they
  # hold this share of the binaries a GC left.
  @named_share 0.1
  @named 3

  @doc """
  Whether refc binaries hold enough of the VM's memory (a quarter, and at
  least 16 MiB: `binary_gc_share` and `binary_gc_min`) to be worth a
  node-wide garbage collection to test for a leak, and for what the
  collection leaves to be named.

  ## Example

      iex> Mtrace.VM.BinaryChecks.bin_leak_worth_it?(%{memory: %{binary: 1000, total: 2000}})
      false
  """
  @spec bin_leak_worth_it?(%{memory: map}) :: boolean
  @spec bin_leak_worth_it?(%{memory: map}, Thresholds.t()) :: boolean
  def bin_leak_worth_it?(snap, th \\ Thresholds.defaults())

  def bin_leak_worth_it?(%{memory: %{binary: binary, total: total}}, th)
      when is_integer(binary) and is_integer(total) and total > 0 do
    binary >= th.binary_gc_min and binary / total >= th.binary_gc_share
  end

  def bin_leak_worth_it?(_, _th), do: false

  @doc """
  The `:binary_leak` finding: what the forced GC (`bin_leak`, a
  `Mtrace.VM.bin_leak/1` result) freed, naming the process that let go of
  the most bytes. Without the GC (`bin_leak` `nil`), binaries that
  dominate memory are a lead (at most 45): a leak cannot be told from
  binaries in use.

  ## Example

      iex> snap = %{memory: %{binary: 600_000_000, total: 800_000_000}}
      iex> f = Mtrace.VM.BinaryChecks.leak(snap, nil, Mtrace.VM.Thresholds.defaults())
      iex> {f.kind, f.score}
      {:binary_leak, 45.0}
  """
  @spec leak(map, map | nil, Thresholds.t()) :: Findings.finding() | nil
  def leak(snap, nil, th) do
    %{binary: binary, total: total} = snap.memory

    if bin_leak_worth_it?(snap, th) do
      finding(
        :binary_leak,
        min(ratio(binary / total, @lead_share), @lead_cap),
        "refc binaries hold #{Format.bytes(binary)}, #{Format.percent(binary, total)} of the " <>
          "VM's memory; not tested for a leak",
        %{binary: binary, total: total},
        "Mtrace.VM.bin_leak(5) (garbage-collects every process), or " <>
          "Mtrace.VM.top(:binary_memory, 5) to see who holds them"
      )
    end
  end

  # Names the process that let go of the most bytes: one hoarding a few
  # large binaries, not one that passed many small ones.
  def leak(snap, bin_leak, th) do
    before = bin_leak.binary_before
    freed = if before && bin_leak.binary_after, do: max(before - bin_leak.binary_after, 0)
    threshold = max(th.binary_freed, th.binary_freed_share * (snap.memory.total || 0))
    top = Map.get(bin_leak, :top_bytes, [])

    next =
      case top do
        [{pid, _, _} | _] ->
          "#{Format.pid_expr(pid)} keeps large binaries without collecting: hibernate " <>
            "it when idle or lower its fullsweep_after; Mtrace.VM.top(:binary_memory, 5) " <>
            "later shows them build up again"

        [] ->
          "Mtrace.VM.top(:binary_memory, 5)"
      end

    finding(
      :binary_leak,
      ratio(freed, threshold),
      "a forced GC freed #{Format.bytes(freed)} of refc binaries " <>
        "(binary memory #{Format.bytes(before)} -> #{Format.bytes(bin_leak.binary_after)})" <>
        case top do
          [{pid, bytes, info} | _] ->
            "; #{Format.process(pid, info)} let go of the most, #{Format.bytes(bytes)}"

          [] ->
            ""
        end <>
        "; #{Format.count(bin_leak.freed, "binary reference")} dropped in all",
      Map.put(bin_leak, :freed_bytes, freed),
      next
    )
  end

  @doc """
  The `:binary_held` finding: the refc binaries the forced GC (`bin_leak`)
  left, and who holds them: the processes of its `held`, and the ETS
  tables whose binaries `ets` estimated (`%{estimates: [{table, bytes,
  binaries}], unsampled: count}`, from `Mtrace.VM.ETS.binary_estimates/2`);
  `nil` without the GC. Holders are named when they hold a tenth of what
  is left, as are ports with that much queued to be written (`snap.ports`,
  judged by `:port_queue`). The first process is judged as `:process_memory` judges a heap
  (`process_memory`, or `process_memory_min`+ that is
  `process_memory_share` of the VM's memory); binaries left holding
  `binary_gc_share` of the VM's memory (and `binary_gc_min`) are a lead
  (at most 45) whoever holds them, so that they are never left unnamed.
  (Tables are `:ets_growth`'s to judge.)

  ## Example

      iex> keeper = :erlang.list_to_pid(~c"<0.42.0>")
      iex> mib = 1_048_576
      iex> held = [{keeper, 150 * mib, [registered_name: :keeper]}]
      iex> bin_leak = %{held: held, binary_before: 151 * mib, binary_after: 150 * mib}
      iex> snap = %{memory: %{total: 181 * mib}}
      iex> ets = %{estimates: [], unsampled: 0}
      iex> f = Mtrace.VM.BinaryChecks.held(snap, bin_leak, ets, Mtrace.VM.Thresholds.defaults())
      iex> {f.kind, f.score}
      {:binary_held, 86.8}
      iex> f.summary
      "a forced GC left 150.0 MiB of refc binaries, 83% of the VM's memory: " <>
        "held, not freed by a GC; #PID<0.42.0> (:keeper) holds 150.0 MiB of them"
  """
  @spec held(map, map | nil, map, Thresholds.t()) :: Findings.finding() | nil
  def held(%{memory: %{total: before}} = snap, %{binary_after: left} = bin_leak, ets, th)
      when is_integer(before) and is_integer(left) do
    freed = max((bin_leak.binary_before || left) - left, 0)
    # the VM's memory once the GC freed what it did
    total = max(before - freed, left)
    holders = Map.get(bin_leak, :held, [])
    named = Enum.filter(holders, fn {_, bytes, _} -> bytes >= @named_share * left end)

    tables =
      for {t, _, bins} <- ets.estimates, is_integer(bins), bins >= @named_share * left do
        info = ETS.describe(t, :erlang.system_info(:wordsize)) || []
        # an unnamed table's name reaches nothing: said (as :ets_growth does)
        name = inspect(info[:name] || t)
        called = if(is_atom(t), do: name, else: "#{name} (unnamed)")
        # an estimate from a sample, of what the GC left at most
        {t, min(bins, left), Keyword.put(info, :called, called)}
      end
      |> Enum.sort_by(&(-elem(&1, 1)))
      |> Enum.take(@named)

    # ports with that much queued to be written (not all of it need be
    # refc binaries: small writes are copied), judged by :port_queue
    ports =
      for {port, bytes} <- Map.get(snap, :ports, %{}), bytes >= @named_share * left do
        {port, bytes}
      end
      |> Enum.sort_by(&(-elem(&1, 1)))
      |> Enum.take(@named)
      |> Enum.map(fn {port, bytes} -> {port, bytes, Ports.describe(port)} end)

    one =
      case holders do
        [{_pid, bytes, _info} | _] -> holder_ratio(bytes, total, th)
        [] -> 0
      end

    spread =
      if bin_leak_worth_it?(%{memory: %{binary: left, total: total}}, th),
        do: min(ratio(left / total, @lead_share), @lead_cap),
        else: 0

    finding(
      :binary_held,
      max(one, spread),
      "a forced GC left #{Format.bytes(left)} of refc binaries, " <>
        "#{Format.percent(left, total)} of the VM's memory: held, not freed by a GC" <>
        holders_text(Enum.take(named, @named), tables, {ports, left}, ets.unsampled),
      %{
        binary: left,
        total: total,
        freed_bytes: freed,
        holders: holders,
        ets: tables,
        ets_unsampled: ets.unsampled,
        ports: ports
      },
      held_next(named, tables, ports)
    )
  end

  def held(_snap, _bin_leak, _ets, _th), do: nil

  # As Mtrace.VM.Findings judges one process's memory (:process_memory).
  defp holder_ratio(bytes, total, th) do
    share =
      if bytes >= th.process_memory_min and total > 0,
        do: ratio(bytes / total, th.process_memory_share),
        else: 0

    max(ratio(bytes, th.process_memory), share)
  end

  defp holders_text([], [], {[], _left}, unsampled) do
    "; no process, port or sampled ETS table holds a tenth of them (NIFs, drivers and " <>
      "private tables are not seen here" <>
      if(unsampled > 0, do: "; #{Format.count(unsampled, "small table")} not sampled)", else: ")")
  end

  defp holders_text(procs, tables, {ports, left}, _unsampled) do
    Enum.map_join(procs, fn {pid, bytes, info} ->
      "; #{Format.process(pid, info)} holds #{Format.bytes(bytes)} of them"
    end) <>
      Enum.map_join(ports, fn {port, bytes, info} ->
        "; port #{Ports.name(port, info)} has #{Format.bytes(bytes)} queued to write" <>
          if(bytes > left,
            do: " (binaries queued more than once count each time)",
            else: ""
          )
      end) <>
      Enum.map_join(tables, fn {_t, bins, info} ->
        "; ETS table #{info[:called]} references about #{Format.bytes(bins)}"
      end)
  end

  # With only ports named, their listing comes first.
  defp held_next([], [], [_ | _]),
    do: "Mtrace.VM.port_top(5) lists the ports with the most queued to write"

  defp held_next(procs, tables, _ports) do
    "Mtrace.VM.top(:binary_memory, 5) lists the processes that hold them" <>
      case procs do
        [{pid, _, _} | _] ->
          "; :sys.get_state(#{Format.pid_expr(pid)}) shows what a GenServer or an Agent keeps"

        [] ->
          ""
      end <>
      case tables do
        [{_t, _, info} | _] ->
          {owned_by, owner_next} = Findings.table_owner(info[:owner])
          "; find who inserts into #{info[:called]}#{owned_by} without deleting" <> owner_next

        [] ->
          ""
      end
  end
end

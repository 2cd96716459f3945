defmodule Mtrace.VM.Diagnose do
  @moduledoc """
  Runs `Mtrace.VM.diagnose/1`: samples the node (twice with a window),
  decides whether a node-wide GC is worth it to test for a binary leak,
  collects native evidence, judges, and prints.

  ## Snapshots

  A snapshot (`snapshot/1`) is one sample of everything the diagnosis
  judges, taken with a single pass over the processes. Given the previous
  snapshot, the pass also ranks processes by how much their mailbox,
  monitor counts and memory grew since then. To make that possible a
  snapshot remembers the first two for every process where they are not
  zero (most processes have neither messages waiting nor monitors), and
  memory only for processes holding at least 1 MiB: on a node of 100_000
  processes, the few large ones. A process under that floor in the
  previous snapshot (or born since) counts as having grown from the floor.
  Ports are read once each, for the bytes queued in them
  (`Mtrace.VM.Ports.queued/0`); only those with some are kept.

  ## Idle groups

  The pass also groups idle processes (waiting, mailbox empty) by what
  they were started as and where they wait, and keeps the largest group.
  To the VM every process started through `proc_lib` (a GenServer, an
  Agent, a Task, a supervisor) started as `:proc_lib.init_p/5`, so for
  those what they were started as is proc_lib's record of it,
  `$initial_call` in their dictionary (`Mtrace.VM.Procs.started_as/2`);
  other processes are not read further. On OTP 26.2 and later that one
  entry is read (`process_info(pid, {:dictionary, key})`); earlier, the
  whole dictionary is copied, and only for processes of at most 256 KiB
  (the dictionary is part of a process's memory, so one keeping much there
  is not copied): larger ones stay grouped as `:proc_lib.init_p/5`, where
  a leak of many small idle processes does not hide. A GenServer's
  dictionary is a few entries, but copying it is a call of its own: on
  OTP 25, a pass over 200_000 idle GenServers took 1.5 s instead of 0.9 s
  (about 3 µs more per idle proc_lib process).
  """

  alias Mtrace.VM.{
    BinaryChecks,
    Diagnosis,
    ETS,
    Findings,
    Format,
    Memory,
    Native,
    Ports,
    Procs,
    Thresholds
  }

  import Mtrace.VM.Procs, only: [ranking: 1, rank: 3, ranked: 1]

  @defaults [print: true, window: nil, node: nil, gc: :auto, timeout: 300_000, thresholds: []]
  @rules [
    print: :boolean,
    # shorter windows would extrapolate rates from a few ms of noise
    window: {:or, {:ms, 100}, nil},
    node: {:or, :node, nil},
    gc: {:one_of, [:auto, true, false]},
    timeout: {:or, {:ms, 1}, :infinity}
  ]

  # How many processes and native sites are kept as evidence (and processes
  # per ranking in a snapshot): enough for evidence, small enough to print.
  @keep 5

  # The least a process holds for a snapshot to remember its memory (see
  # the module documentation).
  @memory_floor 1_048_576

  # The shortest step of a window (see sample/3).
  @min_step 20

  @doc """
  Validates `opts` and runs the diagnosis. See `Mtrace.VM.diagnose/1`.

  ## Example

      %{verdict: _, findings: _} = Mtrace.VM.Diagnose.run(print: false)
  """
  @spec run(keyword) :: Diagnosis.t()
  def run(opts) do
    o = Mtrace.Options.parse!(opts, @defaults, "VM.diagnose/1", @rules)
    o = Map.put(o, :th, Thresholds.merge!(o.thresholds))

    result =
      if o.node in [nil, node()] do
        waiting(o)
        local(o)
      else
        remote(o)
      end

    if o.print, do: IO.puts(Diagnosis.render(result))
    result
  end

  # Said once the window can start: after the checks that may raise.
  defp waiting(o) do
    say = o.print && Format.waiting(o.window, "Watching #{o.node || node()}", "diagnosis")
    if say, do: IO.puts(say)
  end

  defp local(o) do
    th = o.th
    preloaded = Native.preloaded?()
    # false only when the tracer says so (MTRACE_PROGRAMS leaves this
    # program out); figures that cannot be read are another matter
    program_traced = preloaded and not match?(%{active: false}, Native.stats(false))
    first = snapshot()
    # Native figures come from the tracer only when they can be read and
    # move; otherwise RSS outside the allocators stands in for them (with
    # tracking switched off the tracer's stand still while a leak grows).
    tracer? = first.memory.native != nil

    {prev, snap, series, mark, nif, {tracer_ok, steps_off}} =
      if o.window do
        mark = if tracer?, do: Native.mark()
        {samples, series_secs} = sample(tracer?, o.window, th.window_steps)
        readings = Enum.map(samples, &elem(&1, 0))
        tracer_ok = tracer? and Enum.all?(readings, &is_integer(elem(&1, 0)))

        series =
          if tracer_ok,
            do: Enum.map(readings, &elem(&1, 0)),
            else: Memory.less_cache_rise(Enum.map(readings, &elem(&1, 1)))

        nif = %{
          series: Enum.map(samples, &ok_rows(elem(&1, 1))),
          now: elem(List.last(samples), 1)
        }

        steps_off = Enum.any?(readings, &(elem(&1, 0) == :off))
        {first, snapshot(first), {series, series_secs}, mark, nif, {tracer_ok, steps_off}}
      else
        {nil, first, {nil, nil}, nil, %{series: nil, now: Native.nif_memory()}, {tracer?, false}}
      end

    {series, series_secs} = series
    # Switched off at the start, at any step or at the end: judged by RSS;
    # so too when the tracer's figures could not be read at every step.
    tracking_off = tracer? and (tracking_off?(first) or steps_off or tracking_off?(snap))
    traced = tracer_ok and not tracking_off
    tracer_unread = tracer? and not tracer_ok and not tracking_off

    # The sites are read with the snapshot, before a forced collection can
    # run NIF resources' destructors: both tell of the same moment.
    secs = prev && max(snap.at_ms - prev.at_ms, 1) / 1000
    sites = if traced, do: Native.sites(@keep, mark, secs), else: []

    bin_leak =
      case o.gc do
        true -> Procs.bin_leak(@keep)
        false -> nil
        :auto -> if BinaryChecks.bin_leak_worth_it?(snap, th), do: Procs.bin_leak(@keep)
      end

    # the binaries the forced GC freed are no NIF's: its rows after it
    nif = if bin_leak, do: %{nif | now: Native.nif_memory()}, else: nif

    findings =
      Findings.judge(prev, snap, %{
        bin_leak: bin_leak,
        preloaded: traced,
        tracking_off: tracking_off,
        tracer_unread: tracer_unread,
        program_left_out: preloaded and not program_traced,
        sites: sites,
        thresholds: th,
        native_series: series,
        series_secs: series_secs,
        window: o.window,
        limit: Memory.limit(),
        nif: nif
      })

    %Diagnosis{
      verdict: Findings.verdict(findings),
      findings: findings,
      node: node(),
      window: o.window,
      memory: snap.memory,
      counts: snap.counts,
      growth: prev && growth(prev, snap, secs, series, series_secs),
      native: %{
        preloaded: preloaded,
        program_traced: program_traced,
        so: Native.so_path(),
        stats: snap.memory.native,
        sites: sites,
        judged_by: if(traced, do: :tracer, else: :rss),
        tracking_off: tracking_off,
        tracer_unread: tracer_unread
      },
      nif: nif.now
    }
  end

  defp ok_rows({:ok, rows}), do: rows
  defp ok_rows(_), do: nil

  # Reads native and NIF memory at the window's start and at each of its
  # steps, on time: a read (a few ms) does not push the next step later,
  # and steps come at most one per @min_step ms, so that many steps cannot
  # stretch a short window. Returns the readings and the seconds from the
  # first to the last: their rates are over that span, not the snapshots'
  # (whose first process scan, on a node of many processes, takes a second
  # before the window starts).
  defp sample(traced, window, steps) do
    steps = min(steps, max(div(window, @min_step), 1))
    read = fn -> {native_reading(traced), Native.nif_memory()} end
    start = System.monotonic_time(:millisecond)
    first = read.()

    rest =
      for k <- 1..steps do
        due = start + div(window * k, steps)
        Process.sleep(max(due - System.monotonic_time(:millisecond), 0))
        read.()
      end

    {[first | rest], max(System.monotonic_time(:millisecond) - start, 1) / 1000}
  end

  # Each step reads RSS outside the allocators, with the carrier cache (what
  # it grows by over the window is taken off: Memory.less_cache_rise/1),
  # and the tracer's figure where it answers, :off while tracking is
  # switched off: which series is judged is decided after the window, the
  # tracer's only if it was read, tracking on, at every step.
  defp native_reading(tracer?) do
    rss = {Memory.native_sample(false), Memory.carrier_cache()}

    # one read of the tracer's figures: whether tracking is on and the
    # bytes are of the same moment
    case tracer? && Native.stats(false) do
      %{enabled: false} -> {:off, rss}
      stats -> {Memory.live_bytes(stats), rss}
    end
  end

  defp tracking_off?(snap), do: match?(%{enabled: false}, snap.memory.native)

  # Per category of erlang:memory, and native memory, how fast it moved.
  defp growth(prev, snap, secs, series, series_secs) do
    vm =
      for key <- [:total, :processes, :binary, :ets, :code, :atom],
          is_integer(snap.memory[key]) and is_integer(prev.memory[key]),
          into: %{},
          do: {key, (snap.memory[key] - prev.memory[key]) / secs}

    Map.put(vm, :native, Findings.growth(series, series_secs))
  end

  @typedoc "One sample; see the module documentation."
  @type snapshot :: %{
          at_ms: integer,
          memory: Memory.t(),
          counts: Procs.counts(),
          allocators: [Memory.allocator_row()],
          ets: %{:ets.table() => non_neg_integer},
          persistent_term: %{count: non_neg_integer, memory: non_neg_integer} | nil,
          ports: %{port => pos_integer},
          procs: map
        }

  @doc """
  Takes a snapshot; pass the previous one to rank growth since then.

  ## Example

      first = Mtrace.VM.Diagnose.snapshot()
      second = Mtrace.VM.Diagnose.snapshot(first)
      second.procs.mql_growth
      #=> [{#PID<0.250.0>, 1200}]
  """
  @spec snapshot(snapshot | nil) :: snapshot
  def snapshot(prev \\ nil) do
    %{
      at_ms: System.monotonic_time(:millisecond),
      memory: Memory.read(),
      counts: Procs.counts(),
      allocators: Memory.allocators(),
      ets: ETS.sizes(),
      persistent_term: persistent_term(),
      ports: Ports.queued(),
      procs: procs(prev && prev.procs)
    }
  end

  # Terms in persistent_term and the bytes they take (the VM's literal
  # memory, under system in erlang:memory/0); nil where it cannot be read.
  defp persistent_term do
    %{count: count, memory: memory} = :persistent_term.info()
    %{count: count, memory: memory}
  rescue
    _ -> nil
  end

  @items [:message_queue_len, :monitors, :memory, :status, :initial_call, :current_function]

  defp procs(prev) do
    acc = %{
      count: 0,
      mql: %{},
      monitors: %{},
      memory: %{},
      mql_top: ranking(@keep),
      monitors_top: ranking(@keep),
      memory_top: ranking(@keep),
      mql_growth: ranking(@keep),
      monitors_growth: ranking(@keep),
      memory_growth: ranking(@keep),
      idle_groups: %{}
    }

    # not the process diagnosing: it holds the first snapshot, and would
    # read as the one that grew most
    :erlang.processes()
    |> List.delete(self())
    |> Enum.reduce(acc, fn pid, acc ->
      case :erlang.process_info(pid, @items) do
        [_ | _] = items -> add(acc, pid, Map.new(items), prev)
        _ -> acc
      end
    end)
    |> Map.update!(:idle_groups, &largest_group/1)
    |> finish([
      :mql_top,
      :monitors_top,
      :memory_top,
      :mql_growth,
      :monitors_growth,
      :memory_growth
    ])
  end

  defp add(acc, pid, i, prev) do
    mql = i.message_queue_len
    monitors = length(i.monitors)

    acc = %{
      acc
      | count: acc.count + 1,
        mql: put_nonzero(acc.mql, pid, mql),
        monitors: put_nonzero(acc.monitors, pid, monitors),
        memory: put_large(acc.memory, pid, i.memory),
        mql_top: rank(acc.mql_top, pid, mql),
        monitors_top: rank(acc.monitors_top, pid, monitors),
        memory_top: rank(acc.memory_top, pid, i.memory)
    }

    acc = idle(acc, pid, i)

    if prev do
      %{
        acc
        | mql_growth: rank(acc.mql_growth, pid, mql - Map.get(prev.mql, pid, 0)),
          monitors_growth:
            rank(acc.monitors_growth, pid, monitors - Map.get(prev.monitors, pid, 0)),
          memory_growth: memory_growth(acc.memory_growth, pid, i.memory, prev)
      }
    else
      acc
    end
  end

  # Idle means waiting in receive with nothing to receive: a worker nobody
  # talks to any more. Groups are keyed by what a process was started as
  # and where it waits; a leaking pool shows up as one very large group.
  # Each group keeps its first process as a sample, with the VM's initial
  # call for it.
  defp idle(acc, pid, %{status: :waiting, message_queue_len: 0} = i) do
    key = {Procs.started_as(pid, i.initial_call), i.current_function}

    groups =
      Map.update(acc.idle_groups, key, {1, pid, i.initial_call}, fn {count, sample, initial} ->
        {count + 1, sample, initial}
      end)

    %{acc | idle_groups: groups}
  end

  defp idle(acc, _pid, _i), do: acc

  defp largest_group(groups) when groups == %{}, do: nil

  defp largest_group(groups) do
    {{started_as, current_function}, {count, sample, initial_call}} =
      Enum.max_by(groups, fn {_, {count, _, _}} -> count end)

    %{
      started_as: started_as,
      initial_call: initial_call,
      current_function: current_function,
      count: count,
      sample: sample
    }
  end

  # Only processes over the floor are remembered, and ranked by growth: one
  # the previous snapshot did not remember grew from the floor.
  defp put_large(map, pid, bytes) when bytes >= @memory_floor, do: Map.put(map, pid, bytes)
  defp put_large(map, _pid, _bytes), do: map

  defp memory_growth(ranking, pid, bytes, prev) when bytes >= @memory_floor,
    do: rank(ranking, pid, bytes - Map.get(Map.get(prev, :memory, %{}), pid, @memory_floor))

  defp memory_growth(ranking, _pid, _bytes, _prev), do: ranking

  defp put_nonzero(map, _pid, 0), do: map
  defp put_nonzero(map, pid, value), do: Map.put(map, pid, value)

  defp finish(acc, keys) do
    Enum.reduce(keys, acc, fn key, acc -> Map.update!(acc, key, &ranked/1) end)
  end

  # A node that cannot be reached, or has no mtrace, raises Mtrace.Error
  # (reason :nodedown, :timeout, :not_loaded, ...) as Mtrace's queries do.
  defp remote(%{node: target} = o) do
    # within the caller's timeout, as everything asked of that node
    Mtrace.Remote.reachable!(target, Mtrace.VM, o.timeout)
    waiting(o)
    # erpc takes at most 2^32 - 1 ms
    timeout =
      if o.timeout == :infinity,
        do: :infinity,
        else: min(o.timeout + (o.window || 0), 0xFFFFFFFF)

    opts = [print: false, window: o.window, gc: o.gc, thresholds: o.thresholds]
    result = erpc(target, Mtrace.VM, :diagnose, [opts], timeout)
    %{result | findings: Enum.map(result.findings, &here(&1, target))}
  end

  # The target wrote each finding for itself; rewritten, its next call
  # works here, where it is printed and returned, and its pids read as
  # this node shows them (as in the evidence).
  defp here(%{next: next, summary: summary} = finding, target)
       when is_binary(next) and is_binary(summary) do
    expr = fn local ->
      if pid = pid_here(local, target), do: Format.pid_expr(pid), else: ~s|pid("#{local}")|
    end

    shown = fn whole, local ->
      if pid = pid_here(local, target), do: inspect(pid), else: whole
    end

    pids = &Regex.replace(~r/#PID<(0\.\d+\.\d+)>/, &1, shown)
    ports = &Regex.replace(~r/#Port<0\.\d+>/, &1, fn whole -> port_here(whole, target) end)

    %{
      finding
      | next: pids.(Format.remote_hint(next, target, expr)),
        summary: summary |> pids.() |> ports.()
    }
  end

  defp here(finding, _target), do: finding

  # pid("0.x.y") of the target as this node writes it: pid("n.x.y").
  defp pid_here(local, target) do
    case :erpc.call(target, :erlang, :list_to_pid, [~c"<#{local}>"], 5_000) do
      pid when is_pid(pid) -> pid
      _ -> nil
    end
  catch
    _, _ -> nil
  end

  # "#Port<0.x>" of the target as this node shows it ("#Port<n.x>"), as
  # in the evidence.
  defp port_here(local, target) do
    case :erpc.call(target, :erlang, :list_to_port, [String.to_charlist(local)], 5_000) do
      port when is_port(port) -> inspect(port)
      _ -> local
    end
  catch
    _, _ -> local
  end

  # Remote.call, with the option to raise when the diagnosis took too long.
  defp erpc(target, m, f, a, timeout) do
    Mtrace.Remote.call(target, m, f, a, timeout)
  rescue
    e in Mtrace.Error ->
      if e.reason == :timeout,
        do: reraise(%{e | message: e.message <> " (raise option :timeout)"}, __STACKTRACE__),
        else: reraise(e, __STACKTRACE__)
  end
end

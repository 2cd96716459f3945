defmodule Mtrace.VM.Diagnose do
  @moduledoc """
  Runs `Mtrace.VM.diagnose/1`: samples the node (twice with a window),
  decides whether a node-wide GC is worth it to test for a binary leak,
  collects native evidence, judges, and prints.
  """

  alias Mtrace.VM.{Args, Findings, Memory, MemoryChecks, Native, NifMemory, Procs, Report}
  alias Mtrace.VM.Snapshot
  alias Mtrace.VM.Thresholds

  @defaults [print: true, window: nil, node: nil, gc: :auto, timeout: 300_000, thresholds: []]
  @where "Mtrace.VM.diagnose/1"

  # How many processes and native sites are kept as evidence.
  @keep 5

  @doc """
  Validates `opts` and runs the diagnosis. See `Mtrace.VM.diagnose/1`.

  ## Example

      %{verdict: _, findings: _} = Mtrace.VM.Diagnose.run(print: false)
  """
  @spec run(keyword) :: Mtrace.VM.Diagnosis.t()
  def run(opts) do
    o = Args.opts!(opts, @defaults, @where)
    check!(o)
    o = Map.put(o, :th, Thresholds.merge!(o.thresholds))

    result =
      if o.node in [nil, node()],
        do: local(o),
        else: remote(o)

    if o.print, do: IO.puts(Report.render(result))
    result
  end

  defp check!(o) do
    Args.one_of!(o.print, [true, false], "option :print")
    Args.one_of!(o.gc, [:auto, true, false], "option :gc")
    if o.window != nil, do: Args.pos_int!(Args.ms!(o.window, "option :window"), "option :window")

    unless o.timeout == :infinity, do: Args.pos_int!(o.timeout, "option :timeout")

    unless o.node == nil or is_atom(o.node) do
      raise ArgumentError, "option :node must be a node name (atom), got: #{inspect(o.node)}"
    end
  end

  defp local(o) do
    th = o.th
    preloaded = Native.preloaded?()
    first = Snapshot.take()
    # Native figures come from the tracer only when they can be read;
    # otherwise RSS outside the allocators stands in for them.
    traced = first.memory.native != nil

    {prev, snap, series, mark, nif} =
      if o.window do
        mark = if traced, do: Native.mark()
        samples = sample(traced, o.window, th.window_steps)
        series = Enum.map(samples, &elem(&1, 0))

        nif = %{
          series: Enum.map(samples, &ok_rows(elem(&1, 1))),
          now: elem(List.last(samples), 1)
        }

        {first, Snapshot.take(first), series, mark, nif}
      else
        {nil, first, nil, nil, %{series: nil, now: NifMemory.read()}}
      end

    bin_leak =
      case o.gc do
        true -> Procs.bin_leak(@keep)
        false -> nil
        :auto -> if MemoryChecks.bin_leak_worth_it?(snap, th), do: Procs.bin_leak(@keep)
      end

    secs = prev && max(snap.at_ms - prev.at_ms, 1) / 1000
    sites = if traced, do: Native.sites(@keep, mark, secs), else: []

    findings =
      Findings.judge(prev, snap, %{
        bin_leak: bin_leak,
        preloaded: traced,
        sites: sites,
        thresholds: th,
        native_series: series,
        limit: Memory.limit(),
        nif: nif
      })

    %Mtrace.VM.Diagnosis{
      verdict: Findings.verdict(findings),
      findings: findings,
      node: node(),
      window: o.window,
      memory: snap.memory,
      counts: snap.counts,
      growth: prev && growth(prev, snap, secs, series),
      native: %{preloaded: preloaded, stats: snap.memory.native, sites: sites},
      nif: nif.now
    }
  end

  defp ok_rows({:ok, rows}), do: rows
  defp ok_rows(_), do: nil

  # The native figure and the NIF memory rows at the start and after each
  # of `steps` even steps.
  defp sample(traced, window, steps) do
    step = max(div(window, steps), 1)
    read = fn -> {Memory.native_sample(traced), NifMemory.read()} end
    first = read.()

    rest =
      for _ <- 1..steps do
        Process.sleep(step)
        read.()
      end

    [first | rest]
  end

  # Per category of erlang:memory, and native memory, how fast it moved.
  defp growth(prev, snap, secs, series) do
    vm =
      for key <- [:total, :processes, :binary, :ets, :code, :atom],
          is_integer(snap.memory[key]) and is_integer(prev.memory[key]),
          into: %{},
          do: {key, (snap.memory[key] - prev.memory[key]) / secs}

    Map.put(vm, :native, Mtrace.VM.Growth.of(series, secs))
  end

  defp remote(%{node: target} = o) do
    case erpc(target, :code, :ensure_loaded, [Mtrace.VM], 15_000) do
      {:module, _} ->
        :ok

      _ ->
        raise ArgumentError,
              "Mtrace.VM is not loaded on node #{inspect(target)}: include mtrace in that " <>
                "node's release (or add its ebin directory there with :code.add_paths/1)"
    end

    timeout = if o.timeout == :infinity, do: :infinity, else: o.timeout + (o.window || 0)
    opts = [print: false, window: o.window, gc: o.gc, thresholds: o.thresholds]
    erpc(target, Mtrace.VM, :diagnose, [opts], timeout)
  end

  # Remote.call's errors, as errors of option :node.
  defp erpc(target, m, f, a, timeout) do
    Mtrace.Remote.call(target, m, f, a, timeout)
  rescue
    e in Mtrace.Error ->
      hint = if e.reason == :timeout, do: " (raise option :timeout)", else: ""
      raise ArgumentError, "option :node: " <> e.message <> hint
  end
end

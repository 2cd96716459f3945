defmodule Mtrace.VM.Diagnose do
  @moduledoc """
  Runs `Mtrace.VM.diagnose/1`: samples the node (twice with a window),
  decides whether a node-wide GC is worth it to test for a binary leak,
  collects native evidence, judges, and prints.
  """

  alias Mtrace.VM.{Args, Findings, MemoryChecks, Native, Procs, Report, Snapshot}

  @defaults [print: true, window: nil, node: nil, gc: :auto, timeout: 300_000]
  @where "Mtrace.VM.diagnose/1"

  # How many processes and native sites are kept as evidence.
  @keep 5

  @doc """
  Validates `opts` and runs the diagnosis. See `Mtrace.VM.diagnose/1`.

  ## Example

      %{verdict: _, findings: _} = Mtrace.VM.Diagnose.run(print: false)
  """
  @spec run(keyword) :: map
  def run(opts) do
    o = Args.opts!(opts, @defaults, @where)
    check!(o)

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
    first = Snapshot.take()

    {prev, snap} =
      if o.window do
        Process.sleep(o.window)
        {first, Snapshot.take(first)}
      else
        {nil, first}
      end

    bin_leak =
      case o.gc do
        true -> Procs.bin_leak(@keep)
        false -> nil
        :auto -> if MemoryChecks.bin_leak_worth_it?(snap), do: Procs.bin_leak(@keep)
      end

    preloaded = Native.preloaded?()
    # Native memory is judged from the tracer only when its figures could be
    # read; otherwise RSS outside the allocators stands in for it.
    traced = snap.memory.native != nil
    sites = if traced, do: Native.sites(@keep), else: []
    findings = Findings.judge(prev, snap, %{bin_leak: bin_leak, preloaded: traced, sites: sites})

    %{
      verdict: Findings.verdict(findings),
      findings: findings,
      node: node(),
      window: o.window,
      memory: snap.memory,
      counts: snap.counts,
      native: %{preloaded: preloaded, stats: snap.memory.native, sites: sites}
    }
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
    erpc(target, Mtrace.VM, :diagnose, [[print: false, window: o.window, gc: o.gc]], timeout)
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

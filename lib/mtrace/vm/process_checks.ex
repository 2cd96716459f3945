defmodule Mtrace.VM.ProcessChecks do
  @moduledoc """
  The checks of `Mtrace.VM.diagnose/1` that look at processes: mailbox
  build-up, process leaks and monitor leaks. Thresholds are listed in
  `Mtrace.VM.Thresholds`.
  """

  import Mtrace.VM.Findings, only: [finding: 5, growth_ratio: 4, rate: 2, ratio: 2]
  alias Mtrace.VM.{Format, Procs}

  @doc """
  Runs the process checks; `secs` is the window length, or `nil` without one.

  ## Example

      snap = Mtrace.VM.Snapshot.take()
      [_mailbox, _processes, _monitors] = Mtrace.VM.ProcessChecks.run(nil, snap, nil)
  """
  @spec run(
          Mtrace.VM.Snapshot.t() | nil,
          Mtrace.VM.Snapshot.t(),
          number | nil,
          Mtrace.VM.Thresholds.t()
        ) :: [map | nil]
  def run(prev, snap, secs, t \\ Mtrace.VM.Thresholds.defaults()) do
    [mailbox(snap, secs, t), processes(prev, snap, secs, t), monitors(snap, secs, t)]
  end

  defp mailbox(snap, secs, t) do
    {pid, score, per_s, own_per_s} =
      leader(snap.procs.mql_top, snap.procs.mql_growth, secs, t.mailbox_len,
        growth: t.mailbox_growth,
        min: t.mailbox_growth_min
      )

    if pid do
      info = Procs.info(pid)
      len = Map.get(snap.procs.mql, pid, 0)

      finding(
        :mailbox_buildup,
        score,
        "#{Format.process(pid, info)} has #{Format.int(len)} messages waiting" <>
          growth_text(own_per_s, "messages"),
        %{
          pid: pid,
          message_queue_len: len,
          growth_per_s: per_s,
          info: info,
          top: snap.procs.mql_top
        },
        "Process.info(#{Format.pid_expr(pid)}, [:current_stacktrace, :status]) shows " <>
          "why it is not receiving; Mtrace.VM.top(:message_queue_len, 5) lists the others"
      )
    end
  end

  defp processes(prev, snap, secs, t) do
    {count, limit} = snap.counts.processes
    group = snap.procs.idle_groups
    delta = prev && count - elem(prev.counts.processes, 0)
    per_s = delta && rate(delta, secs)
    share = ratio(count / limit, t.process_share)

    grouped =
      if group,
        do: min(ratio(group.count, t.idle_group), ratio(group.count / count, t.idle_share)),
        else: 0

    growth = growth_ratio(delta, secs, t.process_growth, t.process_growth_min)
    group = group && Map.put(group, :started_as, started_as(group.sample))

    summary =
      cond do
        grouped >= max(share, growth) and group != nil ->
          "#{Format.int(group.count)} of #{Format.int(count)} processes are idle in " <>
            "#{Format.mfa(group.current_function)}, started as #{Format.mfa(group.started_as)}"

        true ->
          "#{Format.int(count)} processes of a limit of #{Format.int(limit)}"
      end

    next =
      if group,
        do:
          "Process.info(#{Format.pid_expr(group.sample)}, [:current_stacktrace, :parent, " <>
            ":dictionary]) shows one of the idle ones and who started it",
        else: "Mtrace.VM.top(:memory, 10)"

    finding(
      :process_leak,
      Enum.max([share, grouped, growth]),
      summary <> growth_text(per_s, "processes"),
      %{processes: count, limit: limit, idle_group: group, growth_per_s: per_s},
      next
    )
  end

  defp monitors(snap, secs, t) do
    {pid, score, per_s, own_per_s} =
      leader(snap.procs.monitors_top, snap.procs.monitors_growth, secs, t.monitors,
        growth: t.monitor_growth,
        min: t.monitor_growth_min
      )

    if pid do
      n = Map.get(snap.procs.monitors, pid, 0)
      targets = monitor_targets(pid)

      finding(
        :monitor_leak,
        score,
        "#{Format.process(pid, Procs.info(pid))} holds #{Format.int(n)} monitors" <>
          growth_text(own_per_s, "monitors"),
        %{pid: pid, monitors: n, growth_per_s: per_s, targets: targets},
        "Process.info(#{Format.pid_expr(pid)}, :monitors); look for Process.monitor/1 " <>
          "calls in its code that are never matched by a demonitor or a :DOWN"
      )
    end
  end

  # The processes or ports monitored most often by one process: a leak
  # usually monitors the same few targets over and over, or a stream of new ones.
  defp monitor_targets(pid) do
    case :erlang.process_info(pid, :monitors) do
      {:monitors, list} ->
        list
        |> Enum.frequencies_by(&elem(&1, 1))
        |> Enum.sort_by(fn {_, times} -> -times end)
        |> Enum.take(3)

      _ ->
        []
    end
  end

  defp started_as(pid) do
    case :proc_lib.translate_initial_call(pid) do
      {_, _, _} = mfa -> mfa
      _ -> nil
    end
  catch
    _, _ -> nil
  end

  # The process to report for a per-process measure: the largest one, or the
  # fastest-growing one when its growth scores higher. Returns {pid, score,
  # growth_per_s, growth_per_s when it is that process's own (else nil)}.
  defp leader(top, growth_top, secs, size_limit, growth: growth_limit, min: growth_min) do
    {pid, value} = first(top)
    {gpid, delta} = first(growth_top)
    per_s = rate(delta, secs)
    size = ratio(value, size_limit)
    growth = growth_ratio(delta, secs, growth_limit, growth_min)
    pid = if growth > size, do: gpid, else: pid
    {pid, max(size, growth), per_s, per_s && gpid == pid && per_s}
  end

  defp first([head | _]), do: head
  defp first([]), do: {nil, 0}

  defp growth_text(per_s, what) when is_number(per_s) and per_s > 0,
    do: ", growing by #{Format.int(round(per_s))} #{what}/s"

  defp growth_text(_, _), do: ""
end

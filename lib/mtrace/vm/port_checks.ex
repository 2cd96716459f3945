defmodule Mtrace.VM.PortChecks do
  @moduledoc """
  The check of `Mtrace.VM.diagnose/1` that looks at what ports hold queued
  to be written (`Mtrace.VM.Ports`): `:port_queue`. Scores are those of
  `Mtrace.VM.Findings`; thresholds are listed in `Mtrace.VM.Thresholds`.

  Data sent to a socket whose peer does not read, or to a program that
  does not read its input, waits in the port's queue as binaries that no
  process references: a forced GC cannot free them and no process's
  memory shows them.
  """

  import Mtrace.VM.Findings, only: [finding: 5, ratio: 2, growth_ratio: 4, rate: 2]

  alias Mtrace.VM.{Findings, Format, Ports, Procs, Thresholds}

  @doc """
  The `:port_queue` finding: the largest queue against `port_queue`, all
  queues together against `port_queue_all` (each counted for at most the
  VM's memory: a binary queued to several ports is held once) and, over
  a window, the growth of the queues of ports that had bytes queued at
  its start as well (one large write is not a trend), counted for at most
  what the VM's memory grew by, against `port_queue_growth`; `nil` when
  no port has anything queued.
  `snap.ports` (and `prev.ports`) map each port with bytes queued to
  their number, as `Mtrace.VM.Ports.queued/0` returns them.

  ## Example

      iex> port = hd(Port.list())
      iex> snap = %{ports: %{port => 80 * 1_048_576}}
      iex> f = Mtrace.VM.PortChecks.queue(nil, snap, nil, Mtrace.VM.Thresholds.defaults())
      iex> {f.kind, f.score, f.evidence.queued}
      {:port_queue, 66.1, 83_886_080}
  """
  @spec queue(map | nil, map, number | nil, Thresholds.t()) :: Findings.finding() | nil
  def queue(prev, snap, secs, th) do
    queues = Map.get(snap, :ports, %{})

    if queues != %{} do
      {port, largest} = Enum.max_by(queues, &elem(&1, 1))
      all = queues |> Map.values() |> Enum.sum()
      total = get_in(snap, [:memory, :total])
      held = fn bytes -> if is_integer(total), do: min(bytes, total), else: bytes end
      delta = prev |> growth(queues) |> within_vm(prev, total)
      growth = growth_ratio(delta, secs, th.port_queue_growth, th.port_queue_growth_min)
      per_s = if growth > 0, do: rate(delta, secs)
      info = Ports.describe(port)

      finding(
        :port_queue,
        Enum.max([
          ratio(held.(largest), th.port_queue),
          ratio(held.(all), th.port_queue_all),
          growth
        ]),
        summary(port, info, largest, all, map_size(queues), per_s, shared(all, total)),
        %{
          port: port,
          info: info,
          largest: largest,
          queued: all,
          ports: map_size(queues),
          growth_per_s: per_s,
          vm_total: total
        },
        next(info)
      )
    end
  end

  # What the queues of ports queued at both ends of the window gained.
  defp growth(nil, _queues), do: nil

  defp growth(prev, queues) do
    for {port, from} <- Map.get(prev, :ports, %{}), to = queues[port], reduce: 0 do
      sum -> sum + to - from
    end
  end

  # At most what the VM's memory grew by: the same binary queued again and
  # again grows the queues, not the memory.
  defp within_vm(delta, %{memory: %{total: from}}, to)
       when is_integer(delta) and is_integer(from) and is_integer(to),
       do: min(delta, max(to - from, 0))

  defp within_vm(delta, _prev, _to), do: delta

  defp summary(port, info, largest, all, count, per_s, shared) do
    owner =
      case info[:connected] do
        pid when is_pid(pid) -> ", owned by #{Format.process(pid, Procs.info(pid))}"
        _ -> ""
      end

    grew = if per_s, do: ", growing by #{Format.bytes(per_s)}/s", else: ""

    if count == 1 do
      "#{Ports.name(port, info)} has #{Format.bytes(largest)} queued to write" <>
        "#{shared}#{grew}#{owner}"
    else
      "#{Format.count(count, "port")} have #{Format.bytes(all)} queued to write" <>
        "#{shared}#{grew}; " <>
        "the most, #{Format.bytes(largest)}, in #{Ports.name(port, info)}#{owner}"
    end
  end

  defp shared(all, total) when is_integer(total) and all > total,
    do:
      " (binaries queued more than once count each time: " <>
        "the VM's memory is #{Format.bytes(total)})"

  defp shared(_all, _total), do: ""

  @listing "Mtrace.VM.port_top(5) lists the ports with the most queued to write"
  # A port's queue goes only with the port, and a plain close waits for
  # it to drain (a socket's linger, a program's exit).

  defp next(info) do
    case info[:kind] do
      :socket ->
        "#{@listing}; a socket keeps what its peer has not read, and closing it " <>
          "waits for the peer: with its linger option set to {true, 0} " <>
          "(:inet.setopts/2) a close drops the queue at once, and gen_tcp's " <>
          "send_timeout option (with send_timeout_close: true) closes a connection " <>
          "once a send waits that long"

      :distribution ->
        "#{@listing}; the connection to #{info[:peer]} does not drain: that node is " <>
          "slow, paused or unreachable (:erlang.disconnect_node/1 drops the connection)"

      :program ->
        "#{@listing}; the port keeps what the program has not read of its input: it " <>
          "stopped reading, or reads slower than it is written to; killing the port " <>
          "(Process.exit/2 with :kill; its owner exits with it unless it traps exits) " <>
          "drops the queue at once"

      :stdio ->
        "#{@listing}; whatever reads the VM's output (a pipe, a terminal, a log " <>
          "collector) stopped reading it, or reads slower than the node writes"

      _ ->
        @listing
    end
  end
end

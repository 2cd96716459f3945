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
  queues together against `port_queue_all` and, over a window, their
  growth against `port_queue_growth`; `nil` when no port has anything
  queued. `snap.ports` (and `prev.ports`) map each port with bytes queued
  to their number, as `Mtrace.VM.Ports.queued/0` returns them.

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
      delta = if prev, do: all - (prev |> Map.get(:ports, %{}) |> Map.values() |> Enum.sum())
      growth = growth_ratio(delta, secs, th.port_queue_growth, th.port_queue_growth_min)
      per_s = if growth > 0, do: rate(delta, secs)
      info = Ports.describe(port) || []

      finding(
        :port_queue,
        Enum.max([ratio(largest, th.port_queue), ratio(all, th.port_queue_all), growth]),
        summary(port, info, largest, all, map_size(queues), per_s),
        %{
          port: port,
          info: info,
          largest: largest,
          queued: all,
          ports: map_size(queues),
          growth_per_s: per_s
        },
        next(info)
      )
    end
  end

  defp summary(port, info, largest, all, count, per_s) do
    owner =
      case info[:connected] do
        pid when is_pid(pid) -> ", owned by #{Format.process(pid, Procs.info(pid))}"
        _ -> ""
      end

    grew = if per_s, do: ", growing by #{Format.bytes(per_s)}/s", else: ""

    if count == 1 do
      "#{Ports.name(port, info)} has #{Format.bytes(largest)} queued to write#{grew}#{owner}"
    else
      "#{Format.count(count, "port")} have #{Format.bytes(all)} queued to write#{grew}; " <>
        "the most, #{Format.bytes(largest)}, #{Ports.name(port, info)}#{owner}"
    end
  end

  defp next(info) do
    "Mtrace.VM.port_top(5) lists the ports with the most queued; " <>
      if info[:peer] || String.ends_with?(info[:name] || "", "_inet"),
        do:
          "a socket keeps what its peer has not read: gen_tcp's send_timeout option " <>
            "(with send_timeout_close: true) closes a connection whose peer stopped reading",
        else: "a program started with Port.open/2 keeps what it has not read of its input"
  end
end

defmodule Mtrace.Top.Sample do
  @moduledoc """
  What one refresh of `Mtrace.top/1` shows, taken on the node watched (the
  view itself may run elsewhere): memory at a glance, the native sites that
  grew since the previous refresh, and the processes whose memory grew
  most. `traced` says whether the native tracer records this program's
  allocations (preloaded, and the program one `MTRACE_PROGRAMS` names);
  `left_out` that it is preloaded but `MTRACE_PROGRAMS` leaves the program
  out. `take/2` is given the previous sample's `:state` to measure growth
  against; the first refresh has nothing to compare with, nor has one
  given a state from another run of the node (it restarted since: the
  state says which OS process and start time it came from). Rates divide
  by the time between the two marks on the tracer's clock (this node's
  clock when it is not traced).
  """

  alias Mtrace.VM.{Memory, Native, Procs}

  @typedoc "One refresh; see the module documentation."
  @type t :: %{
          node: node,
          at_ms: integer,
          secs: float | nil,
          memory: map,
          traced: boolean,
          left_out: boolean,
          nif: [map] | {:error, atom},
          sites: [map],
          procs: [{pid, integer, integer, term}],
          state: map
        }

  @doc """
  A sample, growth measured against `state` (`nil` the first time); `n`
  rows of sites and processes at most. The processes in `viewers` (the
  view's own, when it runs on the node it watches) and the caller are not
  among the processes shown.

  ## Example

      first = Mtrace.Top.Sample.take(nil, 5)
      second = Mtrace.Top.Sample.take(first.state, 5)
      second.secs > 0
      #=> true
  """
  @spec take(map | nil, pos_integer, [pid]) :: t
  def take(state, n, viewers \\ []) do
    incarnation = incarnation()
    state = if match?(%{incarnation: ^incarnation}, state), do: state
    at = System.monotonic_time(:millisecond)
    memory = Memory.read()
    mark = if memory.native, do: Native.mark()
    secs = secs(state, mark, at)
    procs = process_memory([self() | viewers])

    %{
      node: node(),
      at_ms: at,
      secs: secs,
      memory: memory,
      traced: memory.native != nil,
      left_out: match?(%{active: false}, Native.stats()),
      native_per_s: native_rate(state, memory, secs),
      nif: nif_rows(n),
      sites: if(state && state.mark, do: Native.sites(n, state.mark, secs), else: []),
      procs: growing(state, procs, secs, n),
      state: %{
        incarnation: incarnation,
        at_ms: at,
        mark: mark,
        procs: procs,
        native: native_bytes(memory)
      }
    }
  end

  # Which run of the node this is: a restarted node has the same name but
  # another OS process, and its own clocks and allocation table.
  defp incarnation, do: {System.pid(), :erlang.system_info(:start_time)}

  # On the tracer's clock when both marks were taken; else (not traced) on
  # this node's, which the same run of the node keeps.
  defp secs(nil, _mark, _at), do: nil
  defp secs(%{mark: %{t_ms: before}}, %{t_ms: now}, _at), do: max(now - before, 1) / 1000
  defp secs(%{at_ms: before}, _mark, at), do: max(at - before, 1) / 1000

  defp native_bytes(%{native: %{live_bytes: bytes}}), do: bytes
  defp native_bytes(_memory), do: nil

  defp native_rate(%{native: before}, memory, secs) when is_integer(before) do
    case native_bytes(memory) do
      now when is_integer(now) -> (now - before) / secs
      _ -> nil
    end
  end

  defp native_rate(_state, _memory, _secs), do: nil

  defp nif_rows(n) do
    case Native.nif_memory() do
      {:ok, rows} -> Enum.take(rows, n)
      {:error, reason} -> {:error, reason}
    end
  end

  # Every other process's memory: the watcher leaves itself out.
  defp process_memory(viewers) do
    for pid <- Process.list(), pid not in viewers, into: %{} do
      {pid, Procs.value(pid, :memory) || 0}
    end
  end

  defp growing(nil, _procs, _secs, _n), do: []

  defp growing(state, procs, secs, n) do
    procs
    |> Enum.map(fn {pid, bytes} -> {pid, bytes, bytes - Map.get(state.procs, pid, bytes)} end)
    |> Enum.filter(fn {_pid, _bytes, delta} -> delta > 0 end)
    |> Enum.sort_by(fn {_pid, _bytes, delta} -> -delta end)
    |> Enum.take(n)
    |> Enum.map(fn {pid, bytes, delta} -> {pid, bytes, delta / secs, Procs.info(pid)} end)
  end
end

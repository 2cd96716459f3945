defmodule Mtrace.VM.Snapshot do
  @moduledoc """
  One sample of everything `Mtrace.VM.diagnose/1` judges, taken with a single
  pass over the processes.

  Given the previous sample, the pass also ranks processes by how much their
  mailbox and monitor counts grew since then. To make that possible a sample
  remembers those two figures for every process where they are not zero
  (most processes have neither messages waiting nor monitors).
  """

  alias Mtrace.VM.{Alloc, Counts, ETS, Memory, TopN}

  # Processes kept per ranking: enough for evidence, small enough to print.
  @keep 5

  defstruct [:at_ms, :memory, :counts, :allocators, :ets, :procs]

  @typedoc "A sample; see the module documentation."
  @type t :: %__MODULE__{
          at_ms: integer,
          memory: Memory.t(),
          counts: Counts.t(),
          allocators: [Alloc.row()],
          ets: %{:ets.table() => non_neg_integer},
          procs: map
        }

  @doc """
  Takes a sample; pass the previous one to rank growth since then.

  ## Example

      first = Mtrace.VM.Snapshot.take()
      second = Mtrace.VM.Snapshot.take(first)
      second.procs.mql_growth
      #=> [{#PID<0.250.0>, 1200}]
  """
  @spec take(t | nil) :: t
  def take(prev \\ nil) do
    %__MODULE__{
      at_ms: System.monotonic_time(:millisecond),
      memory: Memory.read(),
      counts: Counts.read(),
      allocators: Alloc.types(),
      ets: ETS.sizes(),
      procs: procs(prev && prev.procs)
    }
  end

  @items [:message_queue_len, :monitors, :memory, :status, :initial_call, :current_function]

  defp procs(prev) do
    acc = %{
      count: 0,
      mql: %{},
      monitors: %{},
      mql_top: TopN.new(@keep),
      monitors_top: TopN.new(@keep),
      memory_top: TopN.new(@keep),
      mql_growth: TopN.new(@keep),
      monitors_growth: TopN.new(@keep),
      idle_groups: %{}
    }

    :erlang.processes()
    |> Enum.reduce(acc, fn pid, acc ->
      case :erlang.process_info(pid, @items) do
        [_ | _] = items -> add(acc, pid, Map.new(items), prev)
        _ -> acc
      end
    end)
    |> Map.update!(:idle_groups, &largest_group/1)
    |> finish([:mql_top, :monitors_top, :memory_top, :mql_growth, :monitors_growth])
  end

  defp add(acc, pid, i, prev) do
    mql = i.message_queue_len
    monitors = length(i.monitors)

    acc = %{
      acc
      | count: acc.count + 1,
        mql: put_nonzero(acc.mql, pid, mql),
        monitors: put_nonzero(acc.monitors, pid, monitors),
        mql_top: TopN.add(acc.mql_top, pid, mql),
        monitors_top: TopN.add(acc.monitors_top, pid, monitors),
        memory_top: TopN.add(acc.memory_top, pid, i.memory)
    }

    acc = idle(acc, pid, i)

    if prev do
      %{
        acc
        | mql_growth: TopN.add(acc.mql_growth, pid, mql - Map.get(prev.mql, pid, 0)),
          monitors_growth:
            TopN.add(acc.monitors_growth, pid, monitors - Map.get(prev.monitors, pid, 0))
      }
    else
      acc
    end
  end

  # Idle means waiting in receive with nothing to receive: a worker nobody
  # talks to any more. Groups are keyed by where a process started and where
  # it waits; a leaking pool shows up as one very large group.
  defp idle(acc, pid, %{status: :waiting, message_queue_len: 0} = i) do
    key = {i.initial_call, i.current_function}

    groups =
      Map.update(acc.idle_groups, key, {1, pid}, fn {count, sample} -> {count + 1, sample} end)

    %{acc | idle_groups: groups}
  end

  defp idle(acc, _pid, _i), do: acc

  defp largest_group(groups) when groups == %{}, do: nil

  defp largest_group(groups) do
    {{initial_call, current_function}, {count, sample}} =
      Enum.max_by(groups, fn {_, {count, _}} -> count end)

    %{
      initial_call: initial_call,
      current_function: current_function,
      count: count,
      sample: sample
    }
  end

  defp put_nonzero(map, _pid, 0), do: map
  defp put_nonzero(map, pid, value), do: Map.put(map, pid, value)

  defp finish(acc, keys) do
    Enum.reduce(keys, acc, fn key, acc -> Map.update!(acc, key, &TopN.to_list/1) end)
  end
end

# Wall time and memory of Mtrace.VM.top/2 on a node with 200_000 extra
# processes, next to the collect-everything-and-sort approach it replaces.
#
#     mix run bench/vm_top_bench.exs
#
# Prints a markdown table. Figures are measured on this machine, not asserted.

defmodule VMTopBench do
  @processes 200_000
  @n 10

  def run do
    limit = :erlang.system_info(:process_limit)
    wanted = min(@processes, limit - :erlang.system_info(:process_count) - 1_000)
    pids = spawn_idle(wanted)

    IO.puts("""
    Mtrace.VM.top/2 with #{wanted} idle processes (#{:erlang.system_info(:process_count)} in all), \
    n = #{@n}, #{:erlang.system_info(:schedulers_online)} schedulers, OTP #{:erlang.system_info(:otp_release)}

    | call | wall ms | caller heap after (KiB) | node total peak delta (KiB) |
    | --- | ---: | ---: | ---: |\
    """)

    for attr <- [:memory, :message_queue_len, :reductions, :monitors, :binary_memory] do
      row("Mtrace.VM.top(#{inspect(attr)}, #{@n})", fn -> Mtrace.VM.top(attr, @n) end)
    end

    row("sort all by :memory, take #{@n} (reference)", fn -> naive_top(@n) end)

    Enum.each(pids, &send(&1, :stop))
  end

  defp spawn_idle(count) do
    for _ <- 1..count do
      spawn(fn ->
        receive do
          :stop -> :ok
        end
      end)
    end
  end

  # The usual one-liner: every {pid, value} pair in one list, sorted.
  defp naive_top(n) do
    :erlang.processes()
    |> Enum.flat_map(fn pid ->
      case Process.info(pid, :memory) do
        {:memory, m} -> [{pid, m}]
        nil -> []
      end
    end)
    |> Enum.sort_by(&elem(&1, 1), :desc)
    |> Enum.take(n)
  end

  defp row(label, fun) do
    # Warm-up: loads code and settles allocators before the measured run.
    measure(fun)
    {us, heap_words, peak} = measure(fun)
    word = :erlang.system_info(:wordsize)

    IO.puts(
      "| #{label} | #{Float.round(us / 1000, 1)} | #{div(heap_words * word, 1024)} | " <>
        "#{div(max(peak, 0), 1024)} |"
    )
  end

  # Runs fun in a fresh process, so its heap after the call (before any
  # shrinking GC) reflects what the call needed, while a sampler polls the
  # node's total memory every millisecond for a peak.
  defp measure(fun) do
    parent = self()
    base = :erlang.memory(:total)
    sampler = spawn(fn -> sample(base, 0, parent) end)

    {worker, ref} =
      spawn_monitor(fn ->
        {us, _} = :timer.tc(fun)
        {:total_heap_size, words} = Process.info(self(), :total_heap_size)
        send(parent, {:measured, us, words})
      end)

    receive do
      {:measured, us, words} ->
        receive do: ({:DOWN, ^ref, :process, ^worker, _} -> :ok)
        send(sampler, :stop)
        receive do: ({:peak, peak} -> {us, words, peak})
    end
  end

  defp sample(base, peak, parent) do
    receive do
      :stop -> send(parent, {:peak, peak})
    after
      1 -> sample(base, max(peak, :erlang.memory(:total) - base), parent)
    end
  end
end

VMTopBench.run()

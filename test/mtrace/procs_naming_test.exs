defmodule Mtrace.ProcsNamingTest do
  # How Mtrace.VM.Procs.info/1 names a large process started through
  # proc_lib: by what it was started as, where reading that copies little.
  use ExUnit.Case, async: false

  alias Mtrace.VM.Procs

  defmodule Stuck do
    use GenServer

    @impl true
    def init(test), do: {:ok, test}

    # the first cast waits for :release, so the rest stay queued
    @impl true
    def handle_cast(_msg, test) do
      send(test, {:stuck, self()})

      receive do
        :release -> {:noreply, test}
      end
    end
  end

  test "a GenServer whose mailbox, off its heap, is over 64 MiB is named by its init" do
    {:ok, pid} = GenServer.start(Stuck, self(), spawn_opt: [message_queue_data: :off_heap])

    on_exit(fn -> Process.exit(pid, :kill) end)
    GenServer.cast(pid, :first)
    assert_receive {:stuck, ^pid}, 5_000

    payload = Enum.to_list(1..100)
    for _ <- 1..50_000, do: GenServer.cast(pid, {:ev, payload})

    {:memory, memory} = Process.info(pid, :memory)
    {:total_heap_size, words} = Process.info(pid, :total_heap_size)
    assert memory > 64 * 1024 * 1024
    assert words * :erlang.system_info(:wordsize) < 1024 * 1024

    assert [current_function: _, initial_call: {Stuck, :init, 1}] = Procs.info(pid)
  end
end

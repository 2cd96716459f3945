defmodule LeakyApp.Leaker do
  @moduledoc """
  Leaks 10 blocks of 4096 bytes when it starts, then one more every 200 ms,
  until 500 blocks (2 MB) have been leaked.
  """
  use GenServer

  @initial 10
  @interval_ms 200
  @max 500

  def start_link(_arg), do: GenServer.start_link(__MODULE__, nil, name: __MODULE__)

  @doc "How many blocks have been leaked so far."
  def leaked, do: GenServer.call(__MODULE__, :leaked)

  @impl true
  def init(nil) do
    leaked = LeakyApp.Native.leak(@initial)
    schedule()
    {:ok, leaked}
  end

  @impl true
  def handle_info(:leak, leaked) when leaked >= @max, do: {:noreply, leaked}

  def handle_info(:leak, leaked) do
    leaked = leaked + LeakyApp.Native.leak(1)
    if leaked < @max, do: schedule()
    {:noreply, leaked}
  end

  @impl true
  def handle_call(:leaked, _from, leaked), do: {:reply, leaked, leaked}

  defp schedule, do: Process.send_after(self(), :leak, @interval_ms)
end

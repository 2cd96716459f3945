defmodule Mtrace.Test.NativeScenarios do
  @moduledoc false
  # What the nodes judged by the diagnose tests do, started in fresh peers.
  alias Mtrace.Test.LeakyNif

  # A slow steady leak: `count` blocks of `bytes` kept by the NIF every `tick` ms.
  def slow_leak(bytes, tick, count \\ 1) do
    spawn(fn -> leak_loop(bytes, tick, count) end)
    :ok
  end

  defp leak_loop(bytes, tick, count) do
    LeakyNif.leak(:malloc, count, bytes)
    Process.sleep(tick)
    leak_loop(bytes, tick, count)
  end

  # A busy node that leaks nothing: one process churns malloc/free at a high
  # rate, another takes a 4 MiB working set and gives it back every 700 ms.
  def churn do
    spawn(fn -> churn_loop() end)
    spawn(fn -> working_set_loop() end)
    :ok
  end

  defp churn_loop do
    LeakyNif.churn(20_000, 512)
    Process.sleep(5)
    churn_loop()
  end

  defp working_set_loop do
    LeakyNif.leak(:malloc, 64, 64 * 1024)
    Process.sleep(350)
    LeakyNif.free_kept()
    Process.sleep(350)
    working_set_loop()
  end
end

defmodule Mtrace.WatchTest do
  use ExUnit.Case, async: false

  import ExUnit.CaptureLog
  alias Mtrace.Test.LeakyNif

  @interval 150

  setup do
    LeakyNif.fresh_table(&on_exit/1)
  end

  # Runs a watcher while `work` runs once per interval, for `n` intervals;
  # returns what it logged and its final state.
  defp watch_while(n, work) do
    opts = [interval: @interval, intervals: 3, min_growth: 512 * 1024, limit: 3, name: nil]

    capture_log(fn ->
      {:ok, pid} = Mtrace.Watch.start_link(opts)

      for _ <- 1..n do
        work.()
        Process.sleep(@interval)
      end

      send(self(), {:info, Mtrace.Watch.info(pid)})
      GenServer.stop(pid)
    end)
  end

  test "warns with the growing site after steady growth" do
    log = watch_while(8, fn -> LeakyNif.leak(:malloc, 64, 32 * 1024) end)
    assert_received {:info, %{warnings: warnings}}
    assert warnings >= 1
    # wrapped for 80 columns: continuations are indented
    lines = String.split(log, "\n", trim: true)
    assert Enum.all?(lines, &(String.length(&1) <= 80)), log
    text = String.replace(log, ~r/\n +/, " ")
    assert text =~ ~r/native live memory keeps growing \+[\d.]+ MiB \([\d.]+ \w+ -> [\d.]+ MiB\)/
    assert text =~ "in 3 consecutive intervals of 150 ms; sites that grew most since then:"
    assert text =~ "fixture_leak_malloc (leaky_nif.c:"
    # the Erlang code that called the NIF, named like everywhere else
    assert text =~ " <- Mtrace.Test.LeakyNif.leak/3 <- "
  end

  test "stays silent on churn" do
    log = watch_while(8, fn -> LeakyNif.churn(5_000, 32 * 1024) end)
    assert_received {:info, %{warnings: 0}}
    refute log =~ "grew"
  end

  test "bad options raise" do
    assert_raise ArgumentError, ~r/:interval/, fn -> Mtrace.Watch.start_link(interval: 0) end
    assert_raise ArgumentError, ~r/:colour/, fn -> Mtrace.Watch.start_link(colour: 1) end
  end
end

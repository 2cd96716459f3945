defmodule Mtrace.WatchTest do
  use ExUnit.Case, async: false

  import Bitwise
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
    assert text =~ ~r/native live memory keeps growing \+[\d.]+ MiB in 3 consecutive/
    assert text =~ ~r/intervals of 150 ms, to [\d.]+ MiB live; sites that grew most since then:/
    assert text =~ "fixture_leak_malloc (leaky_nif.c:"
    # the Erlang code that called the NIF, named like everywhere else
    assert text =~ " <- Mtrace.Test.LeakyNif.leak/3 <- "
  end

  test "stays silent on churn" do
    log = watch_while(8, fn -> LeakyNif.churn(5_000, 32 * 1024) end)
    assert_received {:info, %{warnings: 0}}
    refute log =~ "grew"
  end

  test "says when tracking is switched off, and when it is on again" do
    on_exit(fn -> Mtrace.enable() end)

    # each state lasts more than two intervals, so a sample sees it
    log =
      watch_while(2, fn ->
        Mtrace.disable()
        Process.sleep(2 * @interval + 50)
        Mtrace.enable()
        Process.sleep(2 * @interval)
      end)

    text = String.replace(log, ~r/\n +|\n(?=\S)/, " ")
    assert text =~ "tracking is switched off (Mtrace.disable/0 or MTRACE_ENABLED=0)"
    assert text =~ "tracking is on again"
  end

  # A watcher whose own timer never fires within the test: each :tick sent
  # is one sample, and info/1 (a call) returns once it has been taken.
  defp tick(pid, n) do
    for _ <- 1..n do
      send(pid, :tick)
      Mtrace.Watch.info(pid)
    end
    |> List.last()
  end

  @manual [interval: :timer.hours(1), intervals: 2, min_growth: 0, limit: 3, name: nil]

  test "min_growth: 0, flat memory is no growth: tracking off, it stays quiet" do
    on_exit(fn -> Mtrace.enable() end)
    # switched off with the table empty: live bytes stay at 0
    Mtrace.disable()
    Mtrace.reset()

    log =
      capture_log(fn ->
        {:ok, pid} = Mtrace.Watch.start_link(@manual)
        send(self(), {:info, tick(pid, 4)})
        GenServer.stop(pid)
      end)

    assert_received {:info, %{warnings: 0, streak: 0, last_bytes: 0}}
    refute log =~ "keeps growing"
    # the one thing said: tracking is off, within 80 columns like the rest
    text = String.replace(log, ~r/\n +|\n(?=\S)/, " ")
    assert text =~ "tracking is switched off (Mtrace.disable/0 or MTRACE_ENABLED=0), so native"
    lines = String.split(log, "\n", trim: true)
    assert Enum.all?(lines, &(String.length(&1) <= 80)), log
  end

  test "min_growth: 0, any growth counts" do
    log =
      capture_log(fn ->
        {:ok, pid} = Mtrace.Watch.start_link(@manual)
        LeakyNif.leak(:malloc, 4, 1024 * 1024)
        tick(pid, 1)
        LeakyNif.leak(:malloc, 4, 1024 * 1024)
        send(self(), {:info, tick(pid, 1)})
        GenServer.stop(pid)
      end)

    assert_received {:info, %{warnings: 1}}
    assert log =~ "native live memory keeps growing"
    assert log =~ "fixture_leak_malloc"
  end

  test "sampling, the warning gives the estimates, said to be estimates" do
    site = %{
      count: 12,
      bytes: 49_152,
      est_count: 1_500,
      est_bytes: 6_144_000,
      frames: [%{symbol: "leak", lib: "/opt/leaky.so", file: nil, line: nil, offset: 0}]
    }

    o = %{intervals: 2, interval: 300}
    text = Mtrace.Watch.warning(o, [site], 1_000_000, 7_291_456, "about ")
    assert text =~ "about +6.0 MiB in 2 consecutive intervals of 300 ms, to about 7.0 MiB live"
    assert text =~ "#1  about +5.9 MiB in about 1_500 blocks (12 sampled): leak"
    # lossless, the recorded figures, as they are
    exact = %{site | est_count: 12, est_bytes: 49_152}
    assert Mtrace.Watch.warning(o, [exact], 0, 49_152, "") =~ "#1  +48.0 KiB in 12 blocks: leak"
    # no site to name: said, rather than a heading with nothing under it
    none = Mtrace.Watch.warning(o, [], 0, 49_152, "") |> String.replace(~r/\n +/, " ")
    assert none =~ "live; no block allocated since then is still live"
    refute none =~ "sites that grew most"
  end

  # A watcher ticked by hand: `tick.()` takes one sample and returns the state.
  defp manual_watcher(opts) do
    opts = [interval: :timer.hours(1), min_growth: 0, limit: 3, name: nil] ++ opts
    {:ok, pid} = Mtrace.Watch.start_link(opts)
    on_exit(fn -> if Process.alive?(pid), do: GenServer.stop(pid) end)

    {pid,
     fn ->
       send(pid, :tick)
       Mtrace.Watch.info(pid)
     end}
  end

  test "a reset during a streak ends it, and is said" do
    mib = 1024 * 1024

    log =
      capture_log(fn ->
        {_pid, tick} = manual_watcher(intervals: 3)
        LeakyNif.leak(:malloc, 1, mib)
        assert %{streak: 1} = tick.()
        Mtrace.reset()
        # more live after the reset than before it: not growth of one streak
        LeakyNif.leak(:malloc, 16, mib)
        assert %{streak: 0} = tick.()
        LeakyNif.leak(:malloc, 1, mib)
        assert %{streak: 1, warnings: 0} = tick.()
      end)

    assert log =~ "the table was reset"
    refute log =~ "keeps growing"
  end

  test "tracking switched off or on ends a streak: no warning from intervals that span it" do
    on_exit(fn -> Mtrace.enable() end)
    mib = 1024 * 1024

    log =
      capture_log(fn ->
        {_pid, tick} = manual_watcher(intervals: 2)
        LeakyNif.leak(:malloc, 1, mib)
        assert %{streak: 1} = tick.()
        # grown while tracked, then switched off within the interval
        LeakyNif.leak(:malloc, 1, mib)
        Mtrace.disable()
        assert %{streak: 0, warnings: 0} = tick.()
        # back on: the interval was tracked for part of its time
        Mtrace.enable()
        LeakyNif.leak(:malloc, 1, mib)
        assert %{streak: 0, warnings: 0} = tick.()
        # whole intervals tracked count again
        LeakyNif.leak(:malloc, 1, mib)
        assert %{streak: 1} = tick.()
        LeakyNif.leak(:malloc, 1, mib)
        assert %{streak: 0, warnings: 1} = tick.()
      end)

    assert log =~ "tracking is switched off"
    assert log =~ "tracking is on again"
    text = String.replace(log, ~r/\n +/, " ")
    # the one warning, over the two intervals after tracking came back on
    assert [_, _] = String.split(text, "keeps growing")
    assert text =~ "+2.0 MiB in 2 consecutive intervals"
  end

  test "every message's continuation lines are indented, within 80 columns" do
    on_exit(fn -> Mtrace.enable() end)

    log =
      capture_log(fn ->
        {_pid, tick} = manual_watcher(intervals: 2)
        Mtrace.reset()
        tick.()
        Mtrace.disable()
        tick.()
        Mtrace.enable()
        tick.()
        LeakyNif.leak(:malloc, 4, 1024 * 1024)
        tick.()
        LeakyNif.leak(:malloc, 4, 1024 * 1024)
        tick.()
      end)

    for text <- ["the table was reset", "switched off", "on again", "keeps growing"],
        do: assert(log =~ text)

    lines = String.split(log, "\n", trim: true)
    assert Enum.all?(lines, &(String.length(&1) <= 80)), log
    # each line a message's first (after the time and level) or indented
    assert Enum.all?(lines, &(&1 =~ ~r/^(\d\d:\d\d:\d\d\.\d{3} \[\w+\] | {2,}\S)/)), log
    assert Enum.count(lines, &String.starts_with?(&1, "  ")) >= 4, log
  end

  test "a reset while a sample waits for its mark is seen" do
    mib = 1024 * 1024
    me = self()

    # resets the table as soon as the watcher asks for its mark
    resetter =
      spawn_link(fn ->
        receive do
          {:trace, _, :call, {Mtrace.Query, :next_tick, []}} -> send(me, {:reset, Mtrace.reset()})
        end
      end)

    log =
      capture_log(fn ->
        {pid, tick} = manual_watcher(intervals: 3)
        LeakyNif.leak(:malloc, 1, mib)
        assert %{streak: 1} = tick.()
        LeakyNif.leak(:malloc, 1, mib)
        :erlang.trace_pattern({Mtrace.Query, :next_tick, 0}, true, [:local])
        :erlang.trace(pid, true, [:call, {:tracer, resetter}])
        tick.()
        :erlang.trace(pid, false, [:call])
        assert_receive {:reset, _}
        LeakyNif.leak(:malloc, 4, mib)
        assert %{warnings: 0} = tick.()
      end)

    :erlang.trace_pattern({Mtrace.Query, :next_tick, 0}, false, [:local])
    assert log =~ "the table was reset"
    refute log =~ "keeps growing"
  end

  test "the node renamed during a streak (distribution started): the warning still comes" do
    log =
      capture_log(fn ->
        {pid, tick} = manual_watcher(intervals: 2)
        LeakyNif.leak(:malloc, 4, 256 * 1024)
        assert %{streak: 1} = tick.()

        # the marks taken so far name the node as it was called then
        :sys.replace_state(pid, fn s ->
          {mark, bytes} = s.since
          old = &%{&1 | node: :before_rename@nohost}
          %{s | since: {old.(mark), bytes}, last_mark: old.(s.last_mark)}
        end)

        LeakyNif.leak(:malloc, 4, 256 * 1024)
        assert %{streak: 0, warnings: 1} = tick.()
      end)

    text = String.replace(log, ~r/\n +/, " ")
    assert text =~ "native live memory keeps growing"
    assert text =~ "+2.0 MiB in 2 consecutive intervals"
    # both halves of the streak, called from two lines
    assert length(String.split(text, "+1.0 MiB in 4 blocks")) == 3, text
  end

  test "a stray message does not stop the watcher or end its streak" do
    capture_log(fn ->
      {pid, tick} = manual_watcher(intervals: 5)
      LeakyNif.leak(:malloc, 1, 1024 * 1024)
      assert %{streak: 1} = tick.()
      send(pid, {:not, :for, :the_watcher})
      LeakyNif.leak(:malloc, 1, 1024 * 1024)
      assert %{streak: 2} = tick.()
    end)
  end

  test "info/1 without a watcher says so" do
    assert_raise ArgumentError, ~r/no watcher is running as :no_such_watch/, fn ->
      Mtrace.Watch.info(:no_such_watch)
    end

    for bad <- [1, "watch", {:bad}] do
      assert_raise ArgumentError, ~r/Mtrace.Watch.info\/1: server must be a pid/, fn ->
        Mtrace.Watch.info(bad)
      end
    end
  end

  test "bad options raise" do
    assert_raise ArgumentError, ~r/:interval/, fn -> Mtrace.Watch.start_link(interval: 0) end
    # below the tracer's clock's few ms a "1 ms" interval would be 4 ms
    assert_raise ArgumentError, ~r/:interval/, fn -> Mtrace.Watch.start_link(interval: 50) end
    assert_raise ArgumentError, ~r/:colour/, fn -> Mtrace.Watch.start_link(colour: 1) end
    # at start, not when the first warning's query takes it, hours later
    assert_raise ArgumentError, ~r/option :limit of Mtrace.Watch.start_link/, fn ->
      Mtrace.Watch.start_link(limit: 1 <<< 64, name: nil)
    end
  end
end

defmodule Mtrace.DiagnoseGrowthTest do
  # Mtrace.VM.diagnose/1 judging native growth, each case on a fresh peer:
  # a slow steady leak is found with its rate, a busy node that churns is
  # healthy, a large static native heap is a finding that is not a leak.
  use ExUnit.Case, async: false
  doctest Mtrace.VM.Thresholds
  doctest Mtrace.VM.Diagnosis

  alias Mtrace.Test.{LeakyNif, NativeScenarios, Remote}

  @moduletag :peer
  @window 5_000

  # Runs the three scenarios at once, each on its own peer, and returns
  # what each gave.
  defp scenarios(cases) do
    cases
    |> Task.async_stream(
      fn {name, fun} -> {name, Remote.with_peer(fun)} end,
      timeout: 60_000,
      max_concurrency: length(cases)
    )
    |> Map.new(fn {:ok, result} -> result end)
  end

  defp diagnose(node, opts),
    do: Mtrace.VM.diagnose([node: node, print: false, gc: false] ++ opts)

  defp native_finding(d),
    do: Enum.find(d.findings, &(&1.kind in [:native_leak, :native_heap]))

  test "slow leak, churn and a static heap, each judged by diagnose/1" do
    results =
      scenarios(
        slow_leak: fn node ->
          # 8_700 bytes every 100 ms: ~85 KiB/s, ~300 MiB an hour
          :ok = :erpc.call(node, NativeScenarios, :slow_leak, [8_700, 100])
          Process.sleep(500)
          d = diagnose(node, window: @window)
          {d, Mtrace.VM.Diagnosis.render(d)}
        end,
        churn: fn node ->
          :ok = :erpc.call(node, NativeScenarios, :churn, [])
          Process.sleep(500)
          diagnose(node, window: @window)
        end,
        static_heap: fn node ->
          :ok = :erpc.call(node, LeakyNif, :leak, [:malloc, 100, 1024 * 1024])
          {diagnose(node, []), diagnose(node, window: 2_000), diagnose(node, window: 400)}
        end
      )

    # the slow leak: found, with its rate, steadiness, projection and site
    {leak, text} = results.slow_leak
    assert leak.verdict == :native_leak, text
    assert %{kind: :native_leak, evidence: evidence, summary: summary} = native_finding(leak)
    per_s = evidence.growth.per_s
    assert per_s > 0.7 * 87_000 and per_s < 1.3 * 87_000, "#{per_s} B/s"
    assert evidence.growth.ups >= 4
    assert summary =~ "at this rate the memory limit ("
    assert [site | _] = evidence.sites
    assert Enum.any?(site.frames, &(&1[:function] == :leak_loop))
    assert site.growth_per_s > 0.5 * 87_000
    assert text =~ "native grew by "
    assert text =~ ~r/growth  total [+-]/

    # churn: busy, but healthy
    churn = results.churn
    assert churn.verdict == :healthy, Mtrace.VM.Diagnosis.render(churn)
    assert churn.growth.native.steadiness < 0.75 or churn.growth.native.per_s < 50 * 1024

    # a static heap of 100 MiB, some times what the VM accounts for: a
    # finding without a window, and with one not a leak
    {no_window, window, short} = results.static_heap
    assert %{kind: :native_leak, score: score, summary: summary} = native_finding(no_window)
    assert score >= 50 and summary =~ "× the"
    assert window.verdict == :native_heap, Mtrace.VM.Diagnosis.render(window)
    assert native_finding(window).summary =~ "over the 2s window"
    # a window under a second is named as asked for, as the report's other lines do
    assert native_finding(short).summary =~ "over the 400 ms window"
  end

  test "tracking switched off: a leak is still found, by RSS outside the VM" do
    {d, text} =
      Remote.with_peer(fn node ->
        :ok = :erpc.call(node, Mtrace, :disable, [])
        # 64 blocks of 4 KiB every 20 ms, each touching a page: RSS grows
        # by up to 12 MiB/s, far over what a booting peer's RSS moves by
        :ok = :erpc.call(node, NativeScenarios, :slow_leak, [4_096, 20, 64])
        Process.sleep(300)
        d = diagnose(node, window: 3_000)
        {d, Mtrace.VM.Diagnosis.render(d)}
      end)

    flat = String.replace(text, ~r/\s+/, " ")
    assert d.verdict == :native_leak, text
    assert %{summary: summary, next: next} = native_finding(d)
    assert summary =~ "memory outside the VM's allocators, untraced", summary
    assert summary =~ "over the 3s window it grew", summary
    assert next =~ ~r"Mtrace, :enable, \[\]\) switches tracking back on", next
    assert flat =~ "tracking is switched off (Mtrace.disable/0 or MTRACE_ENABLED=0)", text
    assert flat =~ ~r/ outside the VM grew by /, text
  end

  test "tracking switched off or on during the window: judged by RSS, and said so" do
    # one diagnosis of a leaking node, while the window runs, with fun.()
    during = fn node, fun ->
      task = Task.async(fn -> diagnose(node, window: 3_000) end)
      Process.sleep(800)
      :ok = fun.()
      d = Task.await(task, 30_000)
      {d, Mtrace.VM.Diagnosis.render(d)}
    end

    {{off, off_text}, {on, on_text}} =
      Remote.with_peer(fn node ->
        :ok = :erpc.call(node, NativeScenarios, :slow_leak, [4_096, 20, 64])
        Process.sleep(300)
        off = during.(node, fn -> :erpc.call(node, Mtrace, :disable, []) end)
        on = during.(node, fn -> :erpc.call(node, Mtrace, :enable, []) end)
        {off, on}
      end)

    # switched off: the tracer's figures stop while RSS goes on growing
    assert %{judged_by: :rss, tracking_off: true} = off.native
    assert off.verdict == :native_leak, off_text
    assert off_text =~ "tracking is switched off (Mtrace.disable/0", off_text
    assert native_finding(off).summary =~ "memory outside the VM's allocators", off_text

    # switched on: the tracer's figures jump by all it starts recording
    assert %{judged_by: :rss, tracking_off: true} = on.native
    flat = String.replace(on_text, ~r/\s+/, " ")

    assert flat =~ "tracking was off for part of the window, so native memory is judged",
           on_text

    assert flat =~ ~r/ outside the VM grew by /, on_text
    refute flat =~ ~r/ native grew by /, on_text
    assert native_finding(on).next =~ "tracking is on again: ", on_text
  end

  test "tracking switched off: said, and native memory judged by RSS outside the VM" do
    on_exit(fn ->
      Mtrace.enable()
      LeakyNif.free_kept()
    end)

    # 1 MiB held, recorded before tracking goes off: whatever an earlier
    # test's reset left, the heap holds enough for these thresholds
    Mtrace.enable()
    LeakyNif.leak(:malloc, 64, 16_384)
    :ok = Mtrace.disable()

    # thresholds this low make the recorded native heap a finding
    result =
      Mtrace.VM.diagnose(
        print: false,
        gc: false,
        window: 300,
        thresholds: [native_vm_min: 1, native_vm_ratio: 0.001]
      )

    text = Mtrace.VM.Diagnosis.render(result)
    flat = String.replace(text, ~r/\s+/, " ")
    assert flat =~ "tracking is switched off (Mtrace.disable/0 or MTRACE_ENABLED=0)", text
    assert flat =~ "so native memory is judged by RSS outside the VM", text
    assert flat =~ ~r/ outside the VM (grew|shrank|held)/, text
    refute flat =~ ~r/ native (grew|shrank|held)/, text
    refute flat =~ "the node looks healthy", text
    assert text |> String.split("\n") |> Enum.all?(&(String.length(&1) <= 80)), text

    # the finding is of RSS outside the VM, not of the tracer's standing figure
    assert %{summary: summary, next: next} =
             Enum.find(result.findings, &(&1.kind in [:native_heap, :native_leak]))

    assert summary =~ "memory outside the VM's allocators, untraced", summary
    assert next =~ "Mtrace.enable()", next
  end

  test "thresholds are options: a lower native_growth flags slower growth" do
    results =
      scenarios(
        slow: fn node ->
          # ~20 KiB/s: below the default 50 KiB/s
          :ok = :erpc.call(node, NativeScenarios, :slow_leak, [2_000, 100])
          Process.sleep(300)

          {diagnose(node, window: 3_000),
           diagnose(node, window: 3_000, thresholds: [native_growth: 5_000])}
        end
      )

    {default, lowered} = results.slow
    assert default.verdict != :native_leak
    assert lowered.verdict == :native_leak
  end

  test "report/1 on a node: ten sites by default, boot memory in one line" do
    %{report: {text, boot_text}} =
      scenarios(
        report: fn node ->
          {ExUnit.CaptureIO.capture_io(fn -> Mtrace.report(node: node, boot: true) end),
           ExUnit.CaptureIO.capture_io(fn -> Mtrace.report(node: node) end)}
        end
      )

    ranks = Regex.scan(~r/^#(\d+) /m, text) |> Enum.map(fn [_, n] -> String.to_integer(n) end)
    assert ranks == Enum.to_list(1..10)

    assert boot_text =~
             ~r/^Boot \(before mtrace started\): .* in [\d_]+ blocks; boot: true ranks them/m
  end
end

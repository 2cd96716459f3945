defmodule Mtrace.TopTest do
  # Mtrace.top/1: the plain view (remote shells), bad options, a node that
  # goes away, and the real thing in a terminal: IEx and bin/mtrace-top run
  # under tmux, read back with capture-pane.
  # Not async: it reads the one allocation table of this VM.
  use ExUnit.Case, async: false

  import Bitwise
  import ExUnit.CaptureIO
  alias Mtrace.Test.{ErlangCallers, LeakyNif, Remote}

  setup do
    LeakyNif.fresh_table(&on_exit/1)
  end

  # A process that leaks from ErlangCallers.append/1 until killed.
  defp leaker do
    pid = spawn(&ErlangCallers.leak_forever/0)
    on_exit(fn -> Process.exit(pid, :kill) end)
    pid
  end

  test "plain view: one screen per refresh, the growing site with its rate and caller" do
    leaker()
    out = capture_io(fn -> assert :ok = Mtrace.top(interval: 300, refreshes: 3, ansi: false) end)
    screens = out |> String.split(~r/^mtrace top /m) |> Enum.reject(&(String.trim(&1) == ""))
    assert length(screens) == 3
    # told apart by a rule
    assert length(Regex.scan(~r/^-{80}$/m, out)) == 2
    refute out =~ "\e["
    assert Enum.all?(String.split(out, "\n"), &(String.length(&1) <= 80)), out
    last = List.last(screens)
    assert last =~ ~r/^native [\d.]+ \w+ in [\d_]+ blocks/m
    assert last =~ "native sites growing fastest"

    assert last =~
             ~r/^ +\+[\d.]+ KiB\/s +[\d_]+ blocks  fixture_leak_malloc \(leaky_nif.c:\d+\)\n +<- Mtrace.Test.ErlangCallers.append\/1 \(erlang_callers.ex:\d+\)$/m

    assert last =~ "processes growing fastest"
  end

  # The screens of a plain view's output, each without its title line.
  defp screens(out) do
    out |> String.split(~r/^mtrace top /m) |> Enum.reject(&(String.trim(&1) == ""))
  end

  # The rates of the site lines of a screen, in bytes per second.
  defp site_rates(screen) do
    [_, sites] = String.split(screen, "native sites growing fastest\n")
    [sites | _] = String.split(sites, "processes growing fastest")

    for [_, n, unit] <- Regex.scan(~r/^ +(?:about )?\+([\d.]+) (B|KiB|MiB|GiB)\/s  /m, sites) do
      String.to_float(if n =~ ".", do: n, else: n <> ".0") *
        Map.fetch!(%{"B" => 1, "KiB" => 1024, "MiB" => 1 <<< 20, "GiB" => 1 <<< 30}, unit)
    end
  end

  test "a state from another run of the node is not compared with; rates go by the marks" do
    leaker()
    first = Mtrace.Top.Sample.take(nil, 5)
    s = Mtrace.Top.Sample.take(first.state, 5)
    # the seconds between the marks, on the tracer's clock
    assert s.secs == (s.state.mark.t_ms - first.state.mark.t_ms) / 1000
    assert is_float(s.native_per_s)

    # the same node name, restarted: another OS process and start time
    restarted = %{s.state | incarnation: {"1", 0}}
    again = Mtrace.Top.Sample.take(restarted, 5)
    assert again.secs == nil
    assert again.sites == []
    assert again.native_per_s == nil
    screen = Mtrace.Top.render(again, %{interval: 2000, ansi: false}, {80, 24})
    assert IO.iodata_to_binary(screen) =~ "(growth shows from the next refresh on)"
  end

  test "the NIF/driver line counts every other module, however few rows are asked for" do
    {:ok, rows} = Mtrace.VM.Native.nif_memory()
    assert length(rows) >= 2, "the tty driver and the test NIFs hold memory"
    s = Mtrace.Top.Sample.take(nil, 1)
    assert length(s.nif) == length(rows)
    screen = Mtrace.Top.render(s, %{interval: 2000, ansi: false}, {80, 24})
    assert IO.iodata_to_binary(screen) =~ "(+#{length(rows) - 1} more)"
  end

  test "the VM's own sites, merged, are sorted among the others by their rate" do
    s = Mtrace.Top.Sample.take(nil, 5)
    own = fn symbol -> [%{symbol: symbol, lib: "beam.smp", offset: 0}] end
    leak = [%{symbol: "leak_here", lib: "/opt/leaky.so", offset: 0}]

    site = fn frames, per_s ->
      %{count: 1, bytes: 1, est_count: 1, est_bytes: 1, growth_per_s: per_s, frames: frames}
    end

    sites = [
      site.(own.("beamasm_metadata_update"), 2_000_000),
      site.(own.("erts_alcu_start"), 1_950_000),
      site.(own.("erts_alcu_start"), 1_950_000),
      site.(leak, 1_900_000),
      site.(own.("beamasm_metadata_update"), 1_800_000)
    ]

    screen =
      %{s | secs: 2.0, sites: sites, procs: []}
      |> Mtrace.Top.render(%{interval: 2000, ansi: false}, {80, 24})
      |> IO.iodata_to_binary()

    assert screen =~ "allocator carrier"
    rates = site_rates(screen)
    assert length(rates) == 3
    assert rates == Enum.sort(rates, :desc), screen
  end

  # `n` processes that wait, killed when the test ends.
  defp idle_processes(n) do
    pids = for _ <- 1..n, do: spawn(fn -> receive do: (:stop -> :ok) end)
    on_exit(fn -> Enum.each(pids, &Process.exit(&1, :kill)) end)
    pids
  end

  defp leak_bytes(sites) do
    sites
    |> Enum.filter(&(Mtrace.Frame.name(hd(&1.frames)) == "fixture_leak_malloc"))
    |> Enum.map(& &1.est_bytes)
    |> Enum.sum()
  end

  test "sites are counted up to the new mark, before the process scan: each block once" do
    # the scan of 20_000 processes takes a while, and blocks leak during it
    idle_processes(20_000)

    leaker =
      spawn(fn ->
        Stream.repeatedly(fn -> ErlangCallers.append(1) && Process.sleep(1) end) |> Stream.run()
      end)

    on_exit(fn -> Process.exit(leaker, :kill) end)
    first = Mtrace.Top.Sample.take(nil, 20)
    second = Mtrace.Top.Sample.take(first.state, 20)
    third = Mtrace.Top.Sample.take(second.state, 20)
    Process.exit(leaker, :kill)
    Process.sleep(50)
    # everything the leak allocated from the first mark to the third, none
    # of it freed
    since = &leak_bytes(Mtrace.sites(since: &1.state.mark, limit: 50))
    total = since.(first) - since.(third)

    # each block counted in exactly one refresh, those of the scans too
    assert leak_bytes(second.sites) > 0
    assert leak_bytes(second.sites) + leak_bytes(third.sites) == total

    for s <- [second, third],
        site <- s.sites,
        do: assert(site.growth_per_s == site.est_bytes / s.secs)
  end

  test "a reset between refreshes: no native rate over it, site rates since the reset" do
    LeakyNif.leak(:malloc, 8, 1_048_576)
    first = Mtrace.Top.Sample.take(nil, 5)
    Process.sleep(300)
    Mtrace.reset()
    Process.sleep(200)
    LeakyNif.leak(:malloc, 10, 10_240)
    s = Mtrace.Top.Sample.take(first.state, 5)
    assert s.reset and s.native_per_s == nil
    [site | _] = for site <- s.sites, site.bytes == 102_400, do: site
    # 100 KiB over the ~0.2 s since the reset, not the ~0.5 s since the mark
    assert site.growth_per_s > 102_400 / 0.45

    screen =
      s |> Mtrace.Top.render(%{interval: 1000, ansi: false}, {80, 24}) |> IO.iodata_to_binary()

    assert screen =~ "table reset since the last refresh"
    refute screen =~ ~r/ -[\d.]+ [KMG]?i?B\/s/
    assert not Mtrace.Top.Sample.take(s.state, 5).reset
  end

  test "a reset after a refresh read the table, before its mark, is told at the next" do
    LeakyNif.leak(:malloc, 8, 1_048_576)
    first = Mtrace.Top.Sample.take(nil, 5)
    Mtrace.reset()
    # the figures read before the reset, the mark taken after it
    racing = %{first.state | mark: Mtrace.mark()}
    s = Mtrace.Top.Sample.take(racing, 5)
    assert s.reset and s.native_per_s == nil
    refute Mtrace.Top.Sample.take(s.state, 5).reset
  end

  test "a process started since the last refresh grew by all it holds" do
    first = Mtrace.Top.Sample.take(nil, 5)
    me = self()

    pid =
      spawn(fn ->
        held = Enum.to_list(1..1_000_000)
        send(me, :holding)
        receive do: (:stop -> held)
      end)

    on_exit(fn -> Process.exit(pid, :kill) end)
    assert_receive :holding, 5_000
    s = Mtrace.Top.Sample.take(first.state, 5)
    assert [{^pid, bytes, rate, _info}] = for({^pid, _, _, _} = p <- s.procs, do: p)
    assert bytes > 16_000_000 and rate > 0
  end

  @tag :peer
  test "this node is watched as itself when distribution starts under the view" do
    Remote.distribute!()
    {:ok, peer, _} = :peer.start_link(%{connection: :standard_io})
    on_exit(fn -> Remote.stop_peer(peer) end)
    :ok = :peer.call(peer, :code, :add_paths, [:code.get_path()])
    {:ok, _} = :peer.call(peer, Application, :ensure_all_started, [:mtrace])
    {name, out} = :peer.call(peer, Remote, :top_across_node_start, [], 30_000)
    assert is_binary(out), inspect(out)
    assert length(String.split(out, ~r/^mtrace top /m, trim: true)) == 4
    assert out =~ "mtrace top #{name} "
    refute out =~ "not answering"
  end

  test "the state carried between refreshes is small; a helper on the node keeps the processes" do
    idle_processes(20_000)
    first = Mtrace.Top.Sample.take(nil, 5)
    s = Mtrace.Top.Sample.take(first.state, 5)
    assert byte_size(:erlang.term_to_binary(s.state)) < 1000
    # one helper across refreshes, not among the processes shown
    assert is_pid(s.state.helper) and s.state.helper == first.state.helper
    assert {:dictionary, dict} = Process.info(s.state.helper, :dictionary)
    assert dict[:"$initial_call"] == {Mtrace.Top.Sample, :helper, 0}
    refute Enum.any?(s.procs, fn {pid, _, _, _} -> pid == s.state.helper end)
    assert {first.procs, first.procs_secs} == {[], nil}
    assert is_float(s.procs_secs)

    # it ends with the process it serves
    me = self()

    owner =
      spawn(fn ->
        send(me, {:helper, Mtrace.Top.Sample.take(nil, 5, owner: self()).state.helper})
        receive do: (:stop -> :ok)
      end)

    assert_receive {:helper, helper}, 30_000
    ref = Process.monitor(helper)
    send(owner, :stop)
    assert_receive {:DOWN, ^ref, :process, ^helper, _}, 30_000

    # ... or when no refresh asks for it
    helper = Mtrace.Top.Sample.take(nil, 5, keep: 100).state.helper
    ref = Process.monitor(helper)
    assert_receive {:DOWN, ^ref, :process, ^helper, _}, 30_000

    # Without an owner (an older view, through a short-lived RPC process)
    # it outlives its caller, so the next refresh has an earlier scan.
    caller = spawn(fn -> send(me, {:state, Mtrace.Top.Sample.take(nil, 5).state}) end)
    assert_receive {:state, state}, 30_000
    ref = Process.monitor(caller)
    assert_receive {:DOWN, ^ref, :process, ^caller, _}, 30_000
    assert is_float(Mtrace.Top.Sample.take(state, 5, keep: 100).procs_secs)
  end

  @tag :peer
  test "watching another node leaves no process there once the view ends" do
    {peer, node} = Remote.start_peer()
    on_exit(fn -> Remote.stop_peer(peer) end)

    helpers = fn ->
      for pid <- :erpc.call(node, Process, :list, []),
          {:dictionary, dict} <- [:erpc.call(node, Process, :info, [pid, :dictionary])],
          dict[:"$initial_call"] == {Mtrace.Top.Sample, :helper, 0},
          do: pid
    end

    out =
      capture_io(fn ->
        assert :ok = Mtrace.top(node: node, interval: 200, refreshes: 3, ansi: false)
      end)

    assert length(screens(out)) == 3
    assert List.last(screens(out)) =~ "processes growing fastest"
    wait_until(fn -> helpers.() == [] end)
  end

  test "a local view leaves no helper behind once it ends" do
    helpers = fn ->
      for pid <- Process.list(),
          {:dictionary, dict} <- [Process.info(pid, :dictionary)],
          dict[:"$initial_call"] == {Mtrace.Top.Sample, :helper, 0},
          do: pid
    end

    before = helpers.()
    # a long interval: the helper's keep alone would hold it for minutes
    capture_io(fn -> assert :ok = Mtrace.top(interval: 60_000, refreshes: 1, ansi: false) end)
    wait_until(fn -> helpers.() -- before == [] end)
  end

  test "Ctrl-G i in the shell (the pending read fails as interrupted) ends the view" do
    me = self()
    io = spawn_link(fn -> interrupted_io() end)

    viewer =
      spawn(fn ->
        Process.group_leader(self(), io)
        send(me, {:done, Mtrace.top(interval: 100, ansi: false)})
      end)

    on_exit(fn -> Process.exit(viewer, :kill) end)
    assert_receive {:done, :ok}, 5_000
  end

  # An I/O device whose reads fail as the shell's do once Ctrl-G i
  # interrupts them; output is dropped.
  defp interrupted_io do
    receive do
      {:io_request, from, ref, request} ->
        reply =
          case request do
            {:put_chars, _, _} -> :ok
            {:put_chars, _, _, _, _} -> :ok
            {:get_geometry, _} -> {:error, :enotsup}
            _ -> {:error, :interrupted}
          end

        send(from, {:io_reply, ref, reply})
        interrupted_io()
    end
  end

  test "the title says the real time between refreshes when sampling takes longer" do
    s = Mtrace.Top.Sample.take(nil, 5)
    title = fn o -> Mtrace.Top.render(s, o, {80, 24}) |> IO.iodata_to_binary() end

    slow = title.(%{interval: 1000, period: 2140, ansi: false})
    assert slow =~ ~r/^mtrace top \S+  every 2.1s \(asked 1.0s\)  q \+ Enter quits/
    assert slow |> String.split("\n") |> Enum.all?(&(String.length(&1) <= 80))

    for period <- [nil, 1000, 1040],
        do: assert(title.(%{interval: 1000, period: period, ansi: false}) =~ "  every 1.0s  q")
  end

  # A sample with the figures given: its native line, no NIF line, and the
  # sites and processes given, each compared with a refresh 2 s before.
  defp sample_with(sites, procs) do
    s = Mtrace.Top.Sample.take(nil, 5)
    native = %{s.memory.native | live_bytes: 13_495_904, live_count: 2219, enabled: true}
    memory = %{s.memory | native: native, rss: 90_000_000, total: 28_900_000}
    memory = %{memory | processes: 5_800_000, binary: 562_600, ets: 645_000}

    %{s | memory: memory, native_per_s: 61_440.0, nif: [], reset: false, secs: 2.0}
    |> Map.merge(%{sites: sites, procs: procs, procs_secs: 2.0})
  end

  defp screen(s, size, o \\ %{interval: 2000, ansi: false}),
    do: s |> Mtrace.Top.render(o, size) |> IO.iodata_to_binary()

  defp site(frames, per_s) do
    %{count: 20, bytes: 4096, est_count: 20, est_bytes: 4096, growth_per_s: per_s, frames: frames}
  end

  @caller %{module: Two, function: :loop, arity: 0, symbol: nil, file: "iex", line: 88}

  test "a site line names the C frame with its file:line: two sites of one function differ" do
    c = fn line ->
      %{symbol: "parse_headers", lib: "/opt/two.so", file: "two/two.c", line: line}
    end

    nif = %{module: Two, function: :parse, arity: 1, symbol: nil, file: "iex", line: 80}
    sites = [site([c.(6), nif, @caller], 40_960.0), site([c.(8), nif, @caller], 20_480.0)]
    out = screen(sample_with(sites, []), {80, 24})

    assert out =~
             ~r/^ +\+40.0 KiB\/s +20 blocks  parse_headers \(two.c:6\) <- Two.loop\/0 \(iex:88\)$/m

    assert out =~
             ~r/^ +\+20.0 KiB\/s +20 blocks  parse_headers \(two.c:8\) <- Two.loop\/0 \(iex:88\)$/m

    # a name too long for the line: shortened at its start, file:line kept
    long = "std::vector<std::pair<int, std::string>>::_M_realloc_insert<int const&>"
    frame = %{symbol: long, lib: "/opt/lib.so", file: "src/long_file_name.cc", line: 1234}
    caller = %{@caller | module: MyApp.Some.Deep.Namespace.Worker, function: :handle_info}

    for cols <- [80, 60, 40] do
      out = screen(sample_with([site([frame, nif, caller], 1024.0)], []), {cols, 24})
      lines = String.split(out, "\n")
      assert Enum.all?(lines, &(String.length(&1) <= cols)), out

      if cols >= 60 do
        assert out =~ ~r/_M_realloc_insert<[^\n]*> \(long_file_name.cc:1234\)\n/, out
        assert out =~ "Worker.handle_info/0 (iex:88)\n", out
      end
    end
  end

  test "narrow terminals: the memory line wraps and the title keeps the quit hint" do
    s = sample_with([], [])

    for cols <- [80, 60, 50, 40] do
      out = screen(s, {cols, 24})
      lines = String.split(out, "\n", trim: true)
      assert Enum.all?(lines, &(String.length(&1) <= cols)), out
      assert hd(lines) =~ ~r/  q \+ Enter quits( +\d\d:\d\d:\d\d UTC)?$/, out
      # every figure of the memory line, none cut off
      text = String.replace(out, ~r/\s+/, " ")

      assert text =~
               "RSS 85.8 MiB VM 27.6 MiB: processes 5.5 MiB, binary 549.4 KiB, ets 629.9 KiB",
             out

      refute out =~ "…\n", out
    end

    # the clock goes first, then the interval, the name keeps 8 columns
    assert hd(String.split(screen(s, {40, 24}), "\n")) =~ ~r/^mtrace top .{8,}  q \+ Enter quits$/

    for cols <- [30, 20] do
      assert [title | _] = String.split(screen(s, {cols, 24}), "\n")
      assert title =~ ~r/q \+ Enter quits$/
      assert String.length(title) <= cols
    end
  end

  test "process lines: the sizes align, what a process was started as goes on a line of its own" do
    pid = :erlang.list_to_pid(~c"<0.194.0>")
    other = :erlang.list_to_pid(~c"<0.5.0>")
    dist = [current_function: {:dist_util, :con_loop, 2}, initial_call: {:proc_lib, :init_p, 5}]

    procs = [
      {pid, 13_619, 6_860.0, dist},
      {other, 1_048_000, 205.0, [registered_name: :my_cache]}
    ]

    for cols <- [80, 60] do
      out = screen(sample_with([], procs), {cols, 24})
      assert out |> String.split("\n") |> Enum.all?(&(String.length(&1) <= cols)), out
      refute out =~ "…", out
      [_, procs] = String.split(out, "processes growing fastest\n")
      text = String.replace(procs, ~r/\n +/, " ")
      assert text =~ "#PID<0.194.0> (in :dist_util.con_loop/2, started as :proc_lib.init_p/5)"
      assert procs =~ ~r/^ +started as :proc_lib.init_p\/5\)$/m
      # the pids start in one column
      assert [[a], [b]] = Regex.scan(~r/^.*(?=#PID)/m, procs)
      assert String.length(a) == String.length(b), procs
    end
  end

  test "a section's heading shows only with at least one of its entries" do
    frames = [%{symbol: "leak", lib: "/opt/l.so", file: "l.c", line: 3}, @caller]
    sites = [site(frames, 4096.0)]
    procs = [{:erlang.list_to_pid(~c"<0.5.0>"), 1000, 100.0, [registered_name: :a]}]
    s = sample_with(sites, procs)

    for rows <- 4..14 do
      lines = s |> screen({80, rows}) |> String.split("\n")

      for {line, i} <- Enum.with_index(lines),
          line in ["native sites growing fastest", "processes growing fastest"] do
        assert Enum.at(lines, i + 1) =~ ~r/^ {2,}\S/, Enum.join(lines, "\n")
      end
    end
  end

  test "on a short screen each section shows its top entries" do
    frames = [%{symbol: "leak", lib: "/opt/l.so", file: "l.c", line: 3}, @caller]
    sites = for i <- 1..10, do: site(frames, 4096.0 * (11 - i))
    pids = for i <- 1..5, do: :erlang.list_to_pid(~c"<0.#{i}.0>")
    procs = for {pid, i} <- Enum.with_index(pids), do: {pid, 1000, 100.0 - i, [initial_call: i]}
    s = sample_with(sites, procs)
    short = s |> screen({80, 14}) |> String.split("\n", trim: true)
    assert "native sites growing fastest" in short
    assert "processes growing fastest" in short
    assert length(short) <= 13
    # the fastest site first; the rest of the room to the sites, one process
    assert Enum.count(short, &(&1 =~ "#PID<")) == 1
    # room for all: each section whole
    tall = s |> screen({80, 60}) |> String.split("\n", trim: true)
    assert Enum.count(tall, &(&1 =~ "leak (l.c:3)")) == 10
    assert Enum.count(tall, &(&1 =~ "#PID<")) == 5
  end

  test "the view's own reads of /proc do not show as a NIF holding binaries" do
    # every module the sample uses loaded (loading reads .beam files)
    Mtrace.Top.Sample.take(Mtrace.Top.Sample.take(nil, 5).state, 5)
    # the garbage of earlier reads, the file server's included, collected
    for pid <- Process.list(), do: :erlang.garbage_collect(pid)
    first = Mtrace.Top.Sample.take(nil, 5)
    s = Mtrace.Top.Sample.take(first.state, 5)

    for sample <- [first, s] do
      assert is_list(sample.nif)
      refute Enum.any?(sample.nif, &(&1.module == :prim_file)), inspect(sample.nif)
    end
  end

  test "tracking switched on between refreshes: no rate over the part it was off" do
    on_exit(fn -> Mtrace.enable() end)
    Mtrace.disable()
    off = Mtrace.Top.Sample.take(nil, 5)
    LeakyNif.leak(:malloc, 20, 4096)
    Mtrace.enable()
    LeakyNif.leak(:malloc, 20, 4096)
    s = Mtrace.Top.Sample.take(off.state, 5)

    assert s.resumed
    assert s.native_per_s == nil
    assert s.sites == []

    out =
      s |> Mtrace.Top.render(%{interval: 2000, ansi: false}, {80, 24}) |> IO.iodata_to_binary()

    assert out =~ ~r/^native [\d.]+ \w+ in [\d_]+ blocks  tracking on again: rate from the next/m
    assert out =~ "(tracking was off for part of the time: growth shows from the next"
    [before_procs | _] = String.split(out, "processes growing fastest")
    refute before_procs =~ "/s", out

    # a whole interval tracked: rates again
    LeakyNif.leak(:malloc, 20, 4096)
    again = Mtrace.Top.Sample.take(s.state, 5)
    refute again.resumed
    assert is_float(again.native_per_s)
    assert leak_bytes(again.sites) == 20 * 4096
  end

  test "refreshes are scheduled from the start of each one" do
    assert Mtrace.Top.pause(1000, 5000, 5300) == 700
    assert Mtrace.Top.pause(1000, 5000, 7100) == 0
  end

  test "sampling: the native line and the site lines say about, within 80 columns" do
    first = Mtrace.Top.Sample.take(nil, 5)
    s = Mtrace.Top.Sample.take(first.state, 5)
    frames = [%{symbol: "fixture_leak_malloc", lib: "/opt/leaky_nif.so", offset: 0}]
    site = %{count: 80, bytes: 80_000, est_count: 525, est_bytes: 508_518, frames: frames}
    native = %{s.memory.native | live_bytes: 13_495_904, live_count: 2219}
    screen = fn s -> Mtrace.Top.render(s, %{interval: 1000, ansi: false}, {80, 24}) end

    sampled = %{
      s
      | memory: %{s.memory | native: Map.put(native, :sampled, true)},
        native_per_s: 508_518.0,
        sites: [Map.put(site, :growth_per_s, 508_518.0)],
        procs: []
    }

    out = IO.iodata_to_binary(screen.(sampled))

    assert out =~
             ~r/^native about 12.9 MiB in about 2_219 blocks  about \+496.6 KiB\/s \(\+1.7 GiB\/h\)$/m

    assert out =~ ~r/^  about \+496.6 KiB\/s +about 525 blocks  fixture_leak_malloc /m

    # large figures, tracking off: the line breaks rather than being cut off
    big = %{native | live_bytes: 1_073_000_000_000, live_count: 123_456_789, sampled: true}

    for variant <- [
          %{sampled | memory: %{s.memory | native: big}, native_per_s: 1_000_000_000.0},
          %{sampled | memory: %{s.memory | native: %{big | enabled: false}}}
        ] do
      lines = variant |> screen.() |> IO.iodata_to_binary() |> String.split("\n")
      assert Enum.all?(lines, &(String.length(&1) <= 80)), Enum.join(lines, "\n")
      refute Enum.any?(lines, &String.ends_with?(&1, "…")), Enum.join(lines, "\n")
      assert Enum.any?(lines, &(&1 =~ ~r/^native about 999.3 GiB in about 123_456_789 blocks$/))
    end

    # exact figures say no about
    exact = %{sampled | memory: %{s.memory | native: Map.put(native, :sampled, false)}}
    exact = IO.iodata_to_binary(screen.(exact))
    refute exact =~ "about"
    assert exact =~ ~r/^native 12.9 MiB in 2_219 blocks  \+496.6 KiB\/s/m
    assert exact =~ ~r/^  \+496.6 KiB\/s +525 blocks  fixture_leak_malloc /m
  end

  @tag :peer
  test "a node that samples (MTRACE_SAMPLE_BYTES): top says about" do
    Remote.distribute!()
    env = [{~c"MTRACE_SAMPLE_BYTES", ~c"524288"}]
    {:ok, peer, node} = :peer.start(%{name: :peer.random_name(), env: env})
    on_exit(fn -> Remote.stop_peer(peer) end)
    :ok = :erpc.call(node, :code, :add_paths, [:code.get_path()])
    {:ok, _} = :erpc.call(node, Application, :ensure_all_started, [:mtrace])

    first = :erpc.call(node, Mtrace.Top.Sample, :take, [nil, 5])
    # blocks of 1 MiB, each above the sampling interval: they are recorded
    :ok = :erpc.call(node, LeakyNif, :leak, [:malloc, 20, 1 <<< 20])
    s = :erpc.call(node, Mtrace.Top.Sample, :take, [first.state, 5])

    out =
      s |> Mtrace.Top.render(%{interval: 1000, ansi: false}, {80, 24}) |> IO.iodata_to_binary()

    # the rate on the line, or on the next when the line would be too long
    assert out =~ ~r/^native about [\d.]+ \w+ in about [\d_]+ blocks\s+about [+-][\d.]+ \w+\/s/m
    assert out =~ ~r/^ +about \+[\d.]+ \w+\/s +about [\d_]+ blocks  fixture_leak_malloc/m
    assert out |> String.split("\n") |> Enum.all?(&(String.length(&1) <= 80)), out
  end

  @tag :peer
  test "a node restarted under the same name: the first refresh after shows no growth" do
    Remote.distribute!()
    name = :peer.random_name()
    {peer, node} = named_peer(name)
    on_exit(fn -> Remote.stop_peer(peer) end)
    {:ok, io} = StringIO.open("")
    me = self()

    # the view's output goes to `io`, read here while it runs
    viewer =
      spawn(fn ->
        Process.group_leader(self(), io)
        send(me, {:done, Mtrace.top(node: node, interval: 200, ansi: false, refreshes: 1000)})
      end)

    on_exit(fn -> Process.exit(viewer, :kill) end)
    output = fn -> io |> StringIO.contents() |> elem(1) end
    wait_until(fn -> length(screens(output.())) >= 2 end)
    Remote.stop_peer(peer)
    wait_until(fn -> output.() =~ "the node is not answering" end)

    {peer, ^node} = named_peer(name)
    on_exit(fn -> Remote.stop_peer(peer) end)

    # the screens since the last one that said the node was not answering
    after_restart = fn ->
      output.()
      |> screens()
      |> Enum.reverse()
      |> Enum.take_while(&(not (&1 =~ "the node is not answering")))
      |> Enum.reverse()
    end

    wait_until(fn -> length(after_restart.()) >= 2 end)
    Process.exit(viewer, :kill)
    [first, second | _] = after_restart.()

    assert first =~ "(growth shows from the next refresh on)", first
    refute first =~ "/s", first
    refute second =~ "(growth shows from the next refresh on)", second
    assert site_rates(second) == Enum.sort(site_rates(second), :desc), second
  end

  # A peer named `name`, with this node's code paths and mtrace started;
  # the name may take a moment to be free again after a peer of that name.
  defp named_peer(name, tries \\ 50) do
    case :peer.start(%{name: name}) do
      {:ok, peer, node} ->
        :ok = :erpc.call(node, :code, :add_paths, [:code.get_path()])
        {:ok, _} = :erpc.call(node, Application, :ensure_all_started, [:mtrace])
        {peer, node}

      {:error, _} when tries > 0 ->
        Process.sleep(100)
        named_peer(name, tries - 1)
    end
  end

  # Polls `fun` until it is true (at most ~30 s).
  defp wait_until(fun, tries \\ 300) do
    cond do
      fun.() -> :ok
      tries == 0 -> flunk("never happened")
      true -> Process.sleep(100) && wait_until(fun, tries - 1)
    end
  end

  test "bad options raise ArgumentError naming the option" do
    for {opts, message} <- [
          {[interval: 0], "option :interval"},
          {[interval: 50], "option :interval"},
          {[rows: -1], "option :rows"},
          # the sites' limit is a 64-bit word
          {[rows: 1 <<< 64], "option :rows of Mtrace.top/1"},
          {[ansi: :maybe], "option :ansi"},
          {[node: "app@host"], "option :node"},
          {[refreshes: 0], "option :refreshes"},
          {[bogus: 1], "unknown option :bogus"}
        ] do
      error = assert_raise ArgumentError, fn -> Mtrace.top(opts) end
      assert error.message =~ message, inspect(opts)
    end
  end

  test "a node that cannot be reached raises Mtrace.Error :nodedown, as every node: option does" do
    Remote.distribute!()

    for call <- [
          fn -> Mtrace.top(node: :absent@nowhere, refreshes: 1) end,
          fn -> Mtrace.VM.diagnose(node: :absent@nowhere, print: false) end,
          fn -> Mtrace.sites(node: :absent@nowhere) end,
          fn -> Mtrace.stats(node: :absent@nowhere) end
        ] do
      error = assert_raise Mtrace.Error, call
      assert error.reason == :nodedown
      assert error.message =~ "cannot connect to node :absent@nowhere"
    end

    # a value of the wrong kind is still an ArgumentError
    for call <- [fn -> Mtrace.top(node: "x@y") end, fn -> Mtrace.VM.diagnose(node: "x@y") end] do
      assert_raise ArgumentError, ~r/option :node/, call
    end
  end

  @tag :peer
  test "a node that goes away is said so on the screen, and the view goes on" do
    {peer, node} = Remote.start_peer()

    out =
      capture_io(fn ->
        task =
          Task.async(fn -> Mtrace.top(node: node, interval: 400, refreshes: 3, ansi: false) end)

        Process.sleep(200)
        :peer.stop(peer)
        assert :ok = Task.await(task, 20_000)
      end)

    assert out =~ "mtrace top #{node}"
    assert out =~ "the node is not answering"
  end

  test "a process of the watched node is numbered as that node numbers it" do
    # a pid of another node, as a remote sample brings it: node "a@vm",
    # number 50, serial 0 (the external term format's NEW_PID_EXT)
    remote = :erlang.binary_to_term(<<131, 88, 119, 4, "a@vm", 50::32, 0::32, 1::32>>)
    assert node(remote) == :a@vm
    refute inspect(remote) =~ "<0.50.0>"

    assert Mtrace.VM.Format.process(remote, registered_name: :code_server) ==
             "#PID<0.50.0> (:code_server)"

    s = Mtrace.Top.Sample.take(nil, 5)
    s = %{s | secs: 2.0, procs_secs: 2.0, procs: [{remote, 4096, 1024.0, nil}]}
    screen = Mtrace.Top.render(s, %{interval: 2000, ansi: false}, {80, 24})
    assert IO.iodata_to_binary(screen) =~ "#PID<0.50.0> (exited since)"
  end

  test "a long node name is shortened, not the quit hint; an error screen says if it tries again" do
    node = :"myapp@ip-10-0-12-134.eu-west-1.compute.internal.example.org"
    o = %{node: node, interval: 2000, ansi: false}
    message = "mtrace: node #{inspect(node)} did not answer within 5000 ms (timeout: 5000)"

    again = Mtrace.Top.render_error(o, message, {80, 24}, false) |> IO.iodata_to_binary()
    [title | _] = lines = String.split(again, "\n", trim: true)

    assert title =~
             ~r/^mtrace top myapp@ip-10-0-12-134.*…  every 2\.0s  q \+ Enter quits +\d\d:\d\d:\d\d UTC$/

    assert Enum.all?(lines, &(String.length(&1) <= 80))
    assert String.replace(again, "\n", " ") =~ "the node is not answering: node :\"myapp@"
    refute again =~ "answering: mtrace:"
    assert again =~ "(timeout: 5000)"
    assert List.last(lines) == "trying again..."

    last = Mtrace.Top.render_error(o, message, {80, 24}, true) |> IO.iodata_to_binary()
    refute last =~ "trying again"
  end

  test "a narrow terminal: the error wraps whole, the quit hint stays, commands are not cut" do
    node = :mtrace_review_remote_node_eleven@vm
    o = %{node: node, interval: 1000, ansi: false}
    message = "mtrace: cannot connect to node #{inspect(node)} (is it running? same cookie?)"

    for cols <- [60, 50] do
      screen = Mtrace.Top.render_error(o, message, {cols, 24}, false) |> IO.iodata_to_binary()
      [title | _] = lines = String.split(screen, "\n", trim: true)
      assert title =~ "q + Enter quits"
      assert Enum.all?(lines, &(String.length(&1) <= cols)), screen
      refute screen =~ "…\n" and not String.starts_with?(title, "mtrace top mtrace_")
      assert String.replace(screen, "\n", " ") =~ "(is it running? same cookie?)"
    end

    s = Mtrace.Top.Sample.take(nil, 5)
    so = "/srv/releases/my_app/lib/mtrace-0.2.0/priv/mtrace.so"
    untraced = %{s | memory: %{s.memory | native: nil}, traced: false} |> Map.put(:so, so)
    screen = untraced |> Mtrace.Top.render(o, {60, 24}) |> IO.iodata_to_binary()
    assert screen =~ "\n  LD_PRELOAD=#{so}\n"
    assert screen =~ "\n  export LD_PRELOAD=$(ls $RELEASE_ROOT/lib/mtrace-*/priv/mtrace.so)\n"

    for line <- String.split(screen, "\n"),
        not String.contains?(line, "LD_PRELOAD="),
        do: assert(String.length(line) <= 60, line)
  end

  test "without the tracer, the native line says not traced and no site section shows" do
    first = Mtrace.Top.Sample.take(nil, 5)
    s = Mtrace.Top.Sample.take(first.state, 5)
    o = %{interval: 2000, ansi: false}
    untraced = fn s -> Mtrace.Top.render(s, o, {80, 24}) |> IO.iodata_to_binary() end

    assert s.traced and s.so == nil
    assert untraced.(s) =~ "native sites growing fastest"

    not_preloaded = untraced.(%{s | memory: %{s.memory | native: nil}, traced: false})
    assert not_preloaded =~ "native: not traced (the tracer is not preloaded)"

    assert not_preloaded =~
             "\n  export LD_PRELOAD=$(ls $RELEASE_ROOT/lib/mtrace-*/priv/mtrace.so)\n"

    assert not_preloaded |> String.split("\n") |> Enum.all?(&(String.length(&1) <= 80))
    refute not_preloaded =~ "native sites"
    refute not_preloaded =~ "none: no native memory"

    # a sample from a node not traced carries that node's path to the tracer,
    # and the line that preloads it comes first
    so = Mtrace.VM.Native.so_path()
    untraced_sample = %{s | memory: %{s.memory | native: nil}, traced: false} |> Map.put(:so, so)
    with_path = untraced.(untraced_sample)
    assert with_path =~ "start the node with\n  LD_PRELOAD=#{so}\n  or, in a release"
    assert with_path =~ "\n  export LD_PRELOAD=$(ls $RELEASE_ROOT/lib/mtrace-*/priv/mtrace.so)\n"
    assert with_path |> String.split("\n") |> Enum.all?(&(String.length(&1) <= 80))

    # preloaded, but another release's library, or the NIF not loaded: why
    for e <- [Mtrace.Error.preload_mismatch(), Mtrace.Error.nif_not_loaded(:enoent)] do
      why = Map.put(untraced_sample, :not_traced, {e.reason, Exception.message(e)})
      screen = untraced.(why)
      words = e.message |> String.replace_prefix("mtrace: ", "") |> String.slice(0, 40)
      assert String.replace(screen, ~r/\s*\n\s*/, " ") =~ "native: not traced: " <> words
      refute screen =~ "not preloaded"
      assert screen |> String.split("\n") |> Enum.all?(&(String.length(&1) <= 80)), screen
    end

    not_named = untraced.(%{s | memory: %{s.memory | native: nil}, traced: false, left_out: true})
    assert not_named =~ ~r/^native: not traced \(MTRACE_PROGRAMS does not name beam.smp/m
    refute not_named =~ "native sites"

    # a NIF module with a long name: what it holds goes on a line of its own
    row = %{module: Mtrace.Test.SomeLongNamespace.LeakyNif, kind: :enif_alloc, count: 10_240}
    row = Map.merge(row, %{bytes: 83_886_080, bytes_min: 83_886_080, bytes_max: 83_886_080})
    nif = untraced.(%{s | nif: [row, row]})

    assert nif =~
             "\nNIF/driver Mtrace.Test.SomeLongNamespace.LeakyNif (+1 more)\n  at least 80.0 MiB"

    assert nif |> String.split("\n") |> Enum.all?(&(String.length(&1) <= 80)), nif

    # switched off: said on the native line and where the sites would be
    off = untraced.(%{s | memory: %{s.memory | native: %{s.memory.native | enabled: false}}})

    assert off =~
             ~r/^native [\d.]+ \w+ in [\d_]+ blocks  tracking switched off: Mtrace.enable\/0$/m

    assert off =~ "none can show: tracking is switched off"
    refute off =~ "none: no native memory"
  end

  @tag :peer
  test "a node whose MTRACE_PROGRAMS leaves beam.smp out: queries and top say not traced" do
    Remote.distribute!()
    env = [{~c"MTRACE_PROGRAMS", ~c"beam"}]
    {:ok, peer, node} = :peer.start(%{name: :peer.random_name(), env: env})

    try do
      :ok = :erpc.call(node, :code, :add_paths, [:code.get_path()])
      {:ok, _} = :erpc.call(node, Application, :ensure_all_started, [:mtrace])
      # loaded, but recording nothing
      assert :erpc.call(node, Mtrace, :preloaded?, [])
      assert %{active: false} = stats = Mtrace.stats(node: node)
      # nothing walked: no walker or Erlang frames to speak of
      assert inspect(stats) =~ "tracking: not traced"
      refute inspect(stats) =~ "Erlang frames"

      for query <- [
            fn -> Mtrace.sites(node: node) end,
            fn -> Mtrace.olds(3, node: node) end,
            fn -> :erpc.call(node, Mtrace, :olds, [3]) end,
            # switching tracking on cannot make it record
            fn -> :erpc.call(node, Mtrace, :enable, []) end,
            fn -> capture_io(fn -> Mtrace.report(node: node) end) end,
            # nor can a window: said at once
            fn -> capture_io(fn -> Mtrace.report(node: node, window: 60_000) end) end
          ] do
        error =
          try do
            query.()
            flunk("answered as if traced")
          rescue
            e in Mtrace.Error -> e
            e in ErlangError -> e.original |> elem(1)
          end

        assert %Mtrace.Error{reason: :not_traced} = error
        assert Exception.message(error) =~ "MTRACE_PROGRAMS=beam)"
        assert Exception.message(error) =~ "MTRACE_PROGRAMS=beam.smp"
      end

      out =
        capture_io(fn ->
          Mtrace.top(node: node, interval: 200, refreshes: 2, ansi: false)
        end)

      assert out =~ "native: not traced (MTRACE_PROGRAMS does not name beam.smp"
      refute out =~ "native sites"
    after
      Remote.stop_peer(peer)
    end
  end

  # ---- in a terminal ---------------------------------------------------------------------

  defp tmux(args), do: System.cmd("tmux", args, stderr_to_stdout: true)

  defp screen(session) do
    {text, 0} = tmux(["capture-pane", "-p", "-t", session])
    text
  end

  # Polls the pane until `fun` accepts it (at most ~20 s).
  defp until(session, fun, tries \\ 100) do
    text = screen(session)

    cond do
      fun.(text) -> text
      tries == 0 -> flunk("tmux pane never showed what was expected:\n" <> text)
      true -> Process.sleep(200) && until(session, fun, tries - 1)
    end
  end

  defp with_tmux(command, fun) do
    if System.find_executable("tmux") == nil do
      IO.puts(:stderr, "skipped: tmux is not installed (Debian: apt-get install tmux)")
    else
      session = "mtrace_top_#{System.unique_integer([:positive])}"
      {_, 0} = tmux(["new-session", "-d", "-s", session, "-x", "80", "-y", "24", command])

      try do
        fun.(session)
      after
        tmux(["kill-session", "-t", session])
      end
    end
  end

  @tag :tmux
  test "in IEx under tmux: redraws in place, shows the growing site, q gives the shell back" do
    preload = Path.expand("priv/mtrace.so")
    build = System.get_env("MTRACE_BUILD", "_build/c")

    command =
      "cd #{File.cwd!()} && MIX_ENV=test MTRACE_BUILD=#{build} LD_PRELOAD=#{preload} iex -S mix"

    with_tmux(command, fn s ->
      until(s, &(&1 =~ "iex(1)>"))

      tmux(["send-keys", "-t", s, "spawn(&Mtrace.Test.ErlangCallers.leak_forever/0)", "Enter"])
      tmux(["send-keys", "-t", s, "Mtrace.top(interval: 500)", "Enter"])

      first = until(s, &(&1 =~ ~r/\+[\d.]+ KiB\/s +[\d_]+ blocks  fixture_leak_malloc/))

      assert first =~ ~r/^mtrace top \S+  every 0.5s  q \+ Enter quits/m

      assert first =~
               ~r/fixture_leak_malloc \(leaky_nif.c:\d+\)\n +<- Mtrace.Test.ErlangCallers.append\/1 \(/

      # redrawn in place: one title on the screen, and its clock moves on
      assert length(Regex.scan(~r/^mtrace top /m, first)) == 1
      [clock] = Regex.run(~r/\d\d:\d\d:\d\d UTC/, first)
      until(s, &(not (&1 =~ clock) and &1 =~ "UTC"))

      tmux(["send-keys", "-t", s, "q", "Enter"])
      until(s, &(&1 =~ ~r/^:ok$/m and &1 =~ ~r/iex\(\d+\)> *$/m))
      tmux(["send-keys", "-t", s, "IO.puts(:shell_back)", "Enter"])
      until(s, &(&1 =~ ~r/^shell_back$/m))
    end)
  end

  @tag :tmux
  @tag :peer
  test "bin/mtrace-top attaches to a node from a terminal, as a hidden node" do
    {peer, node} = Remote.start_peer()
    on_exit(fn -> Remote.stop_peer(peer) end)
    cookie = Node.get_cookie()

    with_tmux("bin/mtrace-top #{node} #{cookie} 500", fn s ->
      text = until(s, &(&1 =~ "processes growing fastest" or &1 =~ "native"))
      assert text =~ "mtrace top #{node}"
      # hidden: the peer does not count the watcher among its nodes
      assert :erpc.call(node, Node, :list, []) == [node()]
      tmux(["send-keys", "-t", s, "q", "Enter"])
    end)
  end
end

defmodule Mtrace.VMTest do
  # Scenarios run in peer nodes so that each starts from a quiet VM and the
  # test node's own processes cannot change a verdict.
  use ExUnit.Case, async: false

  import ExUnit.CaptureIO

  alias Mtrace.VM

  @scenarios Mtrace.VMScenarios

  doctest Mtrace.VM
  doctest Mtrace.VM.Procs
  doctest Mtrace.VM.Native
  doctest Mtrace.VM.MemoryChecks
  doctest Mtrace.VM.BinaryChecks
  doctest Mtrace.VM.Format
  doctest Mtrace.VM.JitCode
  doctest Mtrace.VM.Findings

  setup_all do
    Mtrace.Test.Remote.distribute!()
  end

  # The segment cache keeps at most a few segments: once earlier tests
  # filled it with large ones, a dead heap's carriers are unmapped instead
  # of cached. It lets its segments go within seconds.
  defp cache_drained(deadline \\ System.monotonic_time(:millisecond) + 20_000) do
    if VM.Memory.carrier_cache() > 8_000_000 and System.monotonic_time(:millisecond) < deadline do
      Process.sleep(200)
      cache_drained(deadline)
    end
  end

  describe "on this node" do
    test "slices of one large binary in a table are not counted past the node's binary memory" do
      big = :binary.copy(<<7>>, 64 * 1_048_576)
      table = :ets.new(:slices, [])
      :ets.insert(table, for(i <- 1..2_000, do: {i, binary_part(big, i * 100, 70)}))

      estimate = VM.ETS.binary_estimate(table, 64)
      assert estimate >= 64 * 1_048_576
      assert estimate <= :erlang.memory(:binary), inspect(estimate)
      :ets.delete(table)
    end

    test "memory/0 ties the VM's figures to RSS" do
      m = VM.memory()

      for key <- [:total, :processes, :binary, :ets, :code, :rss, :rss_peak, :allocated, :used] do
        assert is_integer(m[key]) and m[key] > 0, "#{key}: #{inspect(m[key])}"
      end

      assert m.used <= m.allocated
      assert m.rss <= m.rss_peak
      assert m.outside_vm == max(m.rss - m.allocated - m.jit_code, 0)

      if VM.Native.preloaded?(),
        do: assert(is_integer(m.native.live_bytes)),
        else: assert(m.native == nil)
    end

    test "the JIT's code, mapped twice, is not memory outside the VM" do
      if :erlang.system_info(:emu_flavor) == :jit do
        # each view of the JIT's shared code file, resident, as smaps sees it
        views =
          for map <- String.split(File.read!("/proc/self/smaps"), ~r/\n(?=[0-9a-f]+-)/),
              String.contains?(hd(String.split(map, "\n")), "memfd:vmem"),
              [_, kb] = Regex.run(~r/\nRss: +(\d+) kB/, map),
              do: String.to_integer(kb) * 1024

        assert length(views) >= 2 and rem(length(views), 2) == 0
        m = VM.memory()
        # read a moment later: code loaded since only adds
        assert m.jit_code >= Enum.sum(views)
        assert m.outside_vm <= max(m.rss - m.allocated - Enum.sum(views), 0)
      end
    end

    test "the process diagnosing is not among those it judges" do
      # the largest process here, with what it holds (a first snapshot, say)
      hold = Enum.to_list(1..2_000_000)
      snap = VM.Diagnose.snapshot()
      largest = Enum.map(snap.procs.memory_top, &elem(&1, 0))
      assert largest != []
      refute self() in largest
      refute Map.has_key?(snap.procs.memory, self())
      assert length(hold) == 2_000_000
    end

    test "a table of objects too large to copy gets no binary estimate, not a copy" do
      t = :ets.new(:huge_objects, [])
      # about 9 MiB in the table: two words a list cell
      :ets.insert(t, {1, Enum.to_list(1..600_000)})
      assert VM.ETS.binary_estimate(t, 64) == nil
      small = :ets.new(:small_objects, [])
      :ets.insert(small, {1, :binary.copy("x", 1000)})
      assert VM.ETS.binary_estimate(small, 64) == 1000
    end

    test "a process started by proc_lib:spawn is named after its fun, as one started by proc_lib:start" do
      pid = :proc_lib.spawn(fn -> Process.sleep(:infinity) end)
      on_exit(fn -> Process.exit(pid, :kill) end)
      {:initial_call, initial} = Process.info(pid, :initial_call)
      assert initial == {:proc_lib, :init_p, 3}
      assert {m, _, 0} = VM.Procs.started_as(pid, initial)
      assert m == __MODULE__
    end

    test "a compressed table's objects are not copied out to estimate its binaries" do
      t = :ets.new(:compressed_objects, [:compressed])
      # a few bytes compressed, 16 MiB each copied out
      for i <- 1..4, do: :ets.insert(t, {i, List.duplicate([], 1_000_000)})
      assert VM.ETS.binary_estimate(t, 64) == nil
    end

    test "a process with a large dictionary is not copied to be named" do
      big = Enum.to_list(1..5_000_000)

      {:ok, agent} =
        Agent.start_link(fn ->
          Process.put(:hoard, big)
          :state
        end)

      on_exit(fn -> Process.exit(agent, :kill) end)
      # over 64 MiB: what proc_lib recorded is not read, at any size of it
      assert {:memory, m} = Process.info(agent, :memory)
      assert m > 64 * 1024 * 1024

      # no process_info(agent, :dictionary): the whole dictionary, copied here
      me = self()

      tracer =
        spawn_link(fn ->
          collect = fn collect, asked ->
            receive do
              {:trace, ^me, :call, {:erlang, :process_info, [^agent, what]}} ->
                collect.(collect, [what | asked])

              {:trace, _, _, _} ->
                collect.(collect, asked)

              {:asked, to} ->
                send(to, {:asked, asked})
            end
          end

          collect.(collect, [])
        end)

      :erlang.trace(me, true, [:call, {:tracer, tracer}])
      :erlang.trace_pattern({:erlang, :process_info, 2}, true, [:global])
      on_exit(fn -> :erlang.trace_pattern({:erlang, :process_info, 2}, false, [:global]) end)
      assert [current_function: _, initial_call: _] = VM.Procs.info(agent)
      :erlang.trace(me, false, [:call])
      ref = :erlang.trace_delivered(me)
      assert_receive {:trace_delivered, ^me, ^ref}
      send(tracer, {:asked, me})
      assert_receive {:asked, asked}
      assert asked != []
      refute :dictionary in asked
    end

    test "shared memory a NIF maps is outside the VM, not the JIT's code" do
      Mtrace.Test.LeakyNif.load()
      on_exit(fn -> Mtrace.Test.LeakyNif.free_kept() end)
      mib = 1_048_576
      before = VM.memory()
      :ok = Mtrace.Test.LeakyNif.leak_enif(:shared, 4, 16 * mib)
      after_leak = VM.memory()
      assert after_leak.outside_vm - before.outside_vm >= 48 * mib
      assert after_leak.jit_code - before.jit_code < 8 * mib
    end

    test "carriers a dead process freed and the segment cache still maps are carrier_cache" do
      cache_drained()
      before = VM.memory().carrier_cache
      assert is_integer(before)
      # A heap of about 50 MB, grown in large carriers, freed all at once.
      {pid, ref} = spawn_monitor(fn -> 1..3_000_000 |> Enum.to_list() |> length() end)
      assert_receive {:DOWN, ^ref, :process, ^pid, :normal}, 10_000
      m = VM.memory()
      assert m.carrier_cache >= before + 10_000_000, inspect({before, m.carrier_cache})
    end

    test "a heap freed into the segment cache is not native growth over a window" do
      read = fn -> {VM.Memory.native_sample(false), VM.Memory.carrier_cache()} end
      cache_drained()
      before = read.()
      {pid, ref} = spawn_monitor(fn -> 1..3_000_000 |> Enum.to_list() |> length() end)
      assert_receive {:DOWN, ^ref, :process, ^pid, :normal}, 10_000
      later = read.()
      # RSS outside the allocators rose with the cached carriers ...
      assert elem(later, 0) >= elem(before, 0) + 10_000_000, inspect({before, later})
      # ... and the series taken over a window does not.
      assert [from, to] = VM.Memory.less_cache_rise([before, later])
      assert to - from < 5_000_000, inspect({before, later, from, to})
    end

    test "allocators/0 sums instances and puts low usage first" do
      rows = VM.allocators()
      names = Enum.map(rows, & &1.allocator)

      assert :binary_alloc in names and :eheap_alloc in names and :ets_alloc in names
      assert length(names) == length(Enum.uniq(names))

      for r <- rows do
        assert r.used <= r.allocated
        assert r.wasted == r.allocated - r.used
        assert r.instances >= 1
      end

      big = Enum.filter(rows, &(&1.allocated >= 1_048_576))
      assert big == Enum.take(rows, length(big))
      usages = Enum.map(big, & &1.usage)
      assert usages == Enum.sort(usages)
    end

    test "ets_top/2 ranks by memory and by size" do
      table = :ets.new(:mtrace_vm_test_table, [:named_table])
      :ets.insert(table, for(i <- 1..50_000, do: {i, i}))
      word = :erlang.system_info(:wordsize)

      assert [{:mtrace_vm_test_table, bytes, info}] = VM.ets_top(1)
      assert bytes == :ets.info(table, :memory) * word

      assert info == [
               name: :mtrace_vm_test_table,
               owner: self(),
               size: 50_000,
               memory_bytes: bytes
             ]

      assert [{:mtrace_vm_test_table, 50_000, _}] = VM.ets_top(1, :size)
      # top/2's order, (attr, n), and the attribute alone
      assert [{:mtrace_vm_test_table, 50_000, _}] = VM.ets_top(:size, 1)
      assert [{:mtrace_vm_test_table, ^bytes, _} | _] = VM.ets_top(:memory)
    end

    test "a preloaded tracer's figures reach memory/0 and diagnose/1" do
      use_native(Mtrace.VMTest.FakeTracer)

      assert %{live_bytes: 629_145_600, live_count: 12_000, used_bytes: 681_574_400} =
               VM.memory().native

      {result, output} = with_io(fn -> VM.diagnose(gc: false) end)
      assert result.verdict == :native_leak
      assert result.native.preloaded
      assert [%{kind: :native_leak, evidence: evidence} | _] = result.findings
      assert evidence.live_bytes == 629_145_600
      # Sites come back largest first even when the tracer refuses a limit.
      assert Enum.map(evidence.sites, & &1.bytes) == [
               419_430_400,
               157_286_400,
               52_428_800,
               1_048_576
             ]

      # lines are wrapped for an 80-column shell
      assert output |> String.split("\n") |> Enum.all?(&(String.length(&1) <= 80)), output
      text = String.replace(output, ~r/\s+/, " ")
      assert text =~ "600.0 MiB live in 12_000 blocks"
      assert text =~ "400.0 MiB in 9_000 blocks, oldest 1h 00m: leaky_nif_alloc (libleaky.so)"

      refute output =~ "LD_PRELOAD"
    end

    test "with a window, site lines give growth within the window, not holdings" do
      use_native(Mtrace.VMTest.MarkingTracer)

      {_result, output} = with_io(fn -> VM.diagnose(gc: false, window: 1_000) end)
      # a window of a second or more is said before it is waited for
      assert output =~ ~r/\AWatching #{node()} for 1s; the diagnosis follows.\n/
      text = String.replace(output, ~r/\s+/, " ")
      assert text =~ "+400.0 MiB in 9_000 blocks over the 1s window: leaky_nif_alloc"
      refute text =~ "oldest 1h 00m"
      assert output |> String.split("\n") |> Enum.all?(&(String.length(&1) <= 80)), output
    end

    test "a sampling tracer's estimates are said to be about" do
      use_native(Mtrace.VMTest.SamplingTracer)

      {result, output} = with_io(fn -> VM.diagnose(gc: false) end)
      assert result.native.stats.live_bytes == 629_145_600
      text = String.replace(output, ~r/\s+/, " ")
      assert text =~ "native about 600.0 MiB live in about 12_000 blocks (estimated from samples)"
      assert text =~ "about 400.0 MiB in about 9_000 blocks, oldest 1h 00m: leaky_nif_alloc"

      assert text =~
               "native_leak: the native heap (live malloc allocations) holds about 600.0 MiB"

      # the estimates rank the sites, not the samples behind them
      assert [%{est_bytes: 419_430_400} | _] = result.native.sites
    end

    test "with a window, what grew ranks before what only held still, whatever the scores" do
      snap = VM.Diagnose.snapshot()
      prev = %{snap | at_ms: snap.at_ms - 5_000}
      # a NIF module holding 2 GiB that did not move, native memory growing
      # steadily by 100 KiB/s
      row = %{module: :big_nif, kind: :enif_alloc, count: 1, bytes: 2_147_483_648}
      row = Map.merge(row, %{bytes_min: 2_147_483_648, bytes_max: 2_147_483_648})
      base = (snap.memory.native || %{live_bytes: 0}).live_bytes

      findings =
        VM.Findings.judge(prev, snap, %{
          bin_leak: nil,
          preloaded: true,
          sites: [],
          native_series: for(i <- 0..5, do: base + i * 100 * 1024),
          nif: %{series: List.duplicate([row], 6), now: {:ok, [row]}}
        })

      kinds = Enum.map(findings, & &1.kind)
      assert [:native_leak, :nif_alloc_leak | _] = kinds
      [leak, nif | _] = findings
      assert nif.score > leak.score
      assert VM.Findings.verdict(findings) == :native_leak
    end

    test "a native heap that rose in most steps but ended lower is a heap, not a leak" do
      mib = 1_048_576
      snap = VM.Diagnose.snapshot()
      snap = put_in(snap.memory.native, Map.put(snap.memory.native, :live_bytes, 200 * mib))
      prev = %{snap | at_ms: snap.at_ms - 5_000}
      rises = for i <- 0..4, do: 300 * mib + i * 200 * 1024

      findings =
        VM.Findings.judge(prev, snap, %{
          bin_leak: nil,
          preloaded: true,
          sites: [],
          native_series: rises ++ [200 * mib],
          nif: %{series: nil, now: {:ok, []}}
        })

      kinds = Enum.map(findings, & &1.kind)
      assert :native_heap in kinds and :native_leak not in kinds
    end

    test "RSS that rose steadily by less than native_rss_growth_min is no leak" do
      snap = VM.Diagnose.snapshot()
      prev = %{snap | at_ms: snap.at_ms - 5_000}
      # 72 KiB/s, up in 4 of 5 steps: an idle release's first diagnosis
      series = [0, 72, 144, 216, 288, 360] |> Enum.map(&(&1 * 1024 + 40_000_000))
      extra = %{bin_leak: nil, sites: [], native_series: series, series_secs: 5.0}
      extra = Map.put(extra, :nif, %{series: nil, now: {:ok, []}})
      kinds = fn extra -> for %{kind: k} <- VM.Findings.judge(prev, snap, extra), do: k end

      # untraced: RSS outside the allocators, 360 KiB over the window
      refute :native_leak in kinds.(Map.put(extra, :preloaded, false))
      # the tracer's bytes: a leak
      assert :native_leak in kinds.(Map.put(extra, :preloaded, true))
      # untraced, past the floor: a leak
      th = VM.Thresholds.merge!(native_rss_growth_min: 100_000)
      lower = Map.merge(extra, %{preloaded: false, thresholds: th})
      assert :native_leak in kinds.(lower)
    end

    test "native and NIF rates are over the samples' span, not the snapshots'" do
      snap = VM.Diagnose.snapshot()
      # the first snapshot's scan took 2 s before the 2 s window began
      prev = %{snap | at_ms: snap.at_ms - 4_000}
      series = for i <- 0..4, do: 600 * 1_048_576 + i * 60 * 1024
      extra = %{bin_leak: nil, preloaded: true, sites: [], native_series: series}
      extra = Map.merge(extra, %{nif: %{series: nil, now: {:ok, []}}, series_secs: 2.0})
      [native] = for %{kind: :native_leak} = f <- VM.Findings.judge(prev, snap, extra), do: f
      assert native.evidence.growth.per_s == 240 * 1024 / 2.0
    end

    test "a table's binaries never count what the GC's process holders hold" do
      mib = 1_048_576
      # slices over 64 bytes stay slices in a table (shorter ones are copied)
      line = String.duplicate("0123456789abcdef", 6) <> "\n"
      lines = :binary.split(:binary.copy(line, div(4 * mib, 97)), "\n", [:global, :trim])
      t = :ets.new(:slices, [])

      lines
      |> Enum.take(50_000)
      |> Enum.with_index()
      |> Enum.each(&:ets.insert(t, {elem(&1, 1), elem(&1, 0)}))

      snap = VM.Diagnose.snapshot()
      all = :erlang.memory(:binary)
      # a process found holding all but 1 MiB of the binaries left
      bin_leak = %{binary_before: all, binary_after: all, held_bytes: all - mib, held: []}
      bin_leak = Map.merge(bin_leak, %{freed: 0})
      extra = %{bin_leak: bin_leak, preloaded: false, sites: []}
      [ets | _] = VM.MemoryChecks.run(nil, %{snap | ets: %{t => 1_000_000_000}}, nil, extra)
      assert ets.evidence.table == t
      assert ets.evidence.binary_estimate <= mib
      :ets.delete(t)
    end

    test "a table rebuilt and swapped for the old one is not growth; a table new beside the rest is" do
      mib = 1_048_576
      old = :ets.new(:cache, [])
      new = :ets.new(:cache, [])
      snap = VM.Diagnose.snapshot()
      extra = %{bin_leak: nil, preloaded: false, sites: []}
      # 50 MiB in the old table, then in its replacement; ETS as a whole flat
      prev = %{snap | at_ms: snap.at_ms - 5_000, ets: %{old => 50 * mib}}
      swapped = %{snap | ets: %{new => 50 * mib}, memory: %{snap.memory | ets: prev.memory.ets}}
      [ets | _] = VM.MemoryChecks.run(prev, swapped, 5.0, extra)
      assert ets.score < 50, ets.summary
      refute ets.summary =~ "growing by"

      # another table grew meanwhile (and ETS with it, by a little more): it
      # is the one named, at its own rate
      leaky = :ets.new(:leaky, [])
      prev = put_in(prev.ets[leaky], 10 * mib)
      grown = put_in(swapped.ets[leaky], 35 * mib)
      grown = put_in(grown.memory.ets, prev.memory.ets + 26 * mib)
      [ets | _] = VM.MemoryChecks.run(prev, grown, 5.0, extra)
      assert ets.evidence.table == leaky
      assert ets.evidence.growth_per_s == 5 * mib

      # a new table beside the old one (nothing deleted) grows by its size
      both = %{grown | ets: Map.put(grown.ets, old, 50 * mib)}
      [ets | _] = VM.MemoryChecks.run(prev, both, 5.0, extra)
      assert ets.evidence.table == new
      assert ets.evidence.growth_per_s == 10 * mib
    end

    test "a mailbox finding on the largest queue carries that queue's rate, not another's" do
      snap = VM.Diagnose.snapshot()
      prev = %{snap | at_ms: snap.at_ms - 3_000}
      [a, b] = for _ <- 1..2, do: spawn(fn -> Process.sleep(:infinity) end)
      procs = %{snap.procs | mql_top: [{a, 40_000}], mql_growth: [{b, 1_500}]}
      procs = %{procs | mql: %{a => 40_000, b => 1_500}}
      checks = VM.Findings.process_checks(prev, %{snap | procs: procs}, 3.0)
      [mailbox] = for %{kind: :mailbox_buildup} = f <- checks, do: f
      assert %{pid: ^a, growth_per_s: nil} = mailbox.evidence
      Enum.each([a, b], &Process.exit(&1, :kill))
    end

    test "a table deleted while its binaries are sampled is skipped" do
      big = List.to_tuple(for i <- 1..900, do: :binary.copy(<<i::32>>, 100))

      for i <- 1..300 do
        parent = self()

        owner =
          spawn(fn ->
            t = :ets.new(:victim, [:public])
            for k <- 1..64, do: :ets.insert(t, {k, big})
            send(parent, {:table, t})
            receive do: (:go -> Process.sleep(rem(i, 3)))
          end)

        t = receive do: ({:table, t} -> t)
        send(owner, :go)
        estimate = VM.ETS.binary_estimate(t, 64)
        assert estimate == nil or is_integer(estimate)
      end
    end

    test "untraced, the report gives the release's line and the one for any node" do
      d = VM.diagnose(print: false, gc: false)
      text = VM.Diagnosis.render(%{d | native: %{preloaded: false, stats: nil, sites: []}})
      assert text =~ "add to rel/env.sh.eex:\n          export LD_PRELOAD=$(ls $RELEASE_ROOT"
      so = Path.join(to_string(:code.priv_dir(:mtrace)), "mtrace.so")
      assert text =~ "or start the node (iex -S mix, erl) with:\n          LD_PRELOAD=#{so}\n"
      assert d.native.so == so
    end

    test "untraced, the line for any node names the diagnosed node's path, not this one's" do
      d = VM.diagnose(print: false, gc: false)

      remote = %{
        preloaded: false,
        stats: nil,
        sites: [],
        so: "/srv/app/lib/mtrace-0.1.0/priv/mtrace.so"
      }

      text = VM.Diagnosis.render(%{d | node: :app@elsewhere, native: remote})
      assert text =~ "\n          LD_PRELOAD=/srv/app/lib/mtrace-0.1.0/priv/mtrace.so\n"
    end

    test "the VM's own sites of one kind read as one line, with how many they are" do
      d = VM.diagnose(print: false, gc: false)
      own = [%{symbol: "beamasm_metadata_update", lib: "beam.smp", offset: 0}]
      leak = [%{symbol: "leak", lib: "/opt/leaky.so", file: nil, line: nil, offset: 0}]

      sites = [
        %{count: 3, bytes: 18_636, oldest: 1, frames: own},
        %{count: 2, bytes: 4096, oldest: 1, frames: leak},
        %{count: 3, bytes: 96, oldest: 1, frames: own}
      ]

      stats = %{live_bytes: 1, live_count: 1, used_bytes: 1, free_bytes: 1, mmap_bytes: 1}
      native = %{preloaded: true, program_traced: true, stats: stats, sites: sites}
      text = VM.Diagnosis.render(%{d | native: native}) |> String.replace(~r/\s+/, " ")
      assert text =~ "18.3 KiB in 6 blocks at 2 sites, oldest 1s: the VM's own loaded code"
      assert text =~ "4.0 KiB in 2 blocks, oldest 1s: leak (leaky.so)"
      assert length(Regex.scan(~r/the VM's own loaded code/, text)) == 1
    end

    test "findings under the problem score are listed apart, without their kind" do
      d = VM.diagnose(print: false, gc: false)
      problem = %{kind: :binary_leak, score: 95.5, summary: "freed a lot", next: "look"}
      lead = %{kind: :native_leak, score: 24.7, summary: "memory outside", next: "trace"}

      lines = VM.Diagnosis.render(%{d | findings: [problem, lead]}) |> String.split("\n")
      tail = Enum.drop_while(lines, &(not String.starts_with?(&1, "findings")))

      assert tail == [
               "findings (a score of 50 or more is a problem):",
               "    95.5  binary_leak: freed a lot",
               "          next: look",
               "below 50, not a problem on its own:",
               "    24.7  memory outside",
               "          next: trace"
             ]

      healthy = %{d | verdict: :healthy, findings: [lead]}
      text = VM.Diagnosis.render(healthy)
      assert text =~ "findings: none scores 50 or more (a problem); the node looks healthy\n"
      refute text =~ "native_leak"
      assert inspect(healthy) =~ "healthy, 1 finding below 50>"
      # the lead's data stays in the result
      assert [%{kind: :native_leak, score: 24.7}] = healthy.findings
    end

    test "without the tracer, native memory is named as untraced memory outside the allocators" do
      snap = VM.Diagnose.snapshot()
      extra = %{bin_leak: nil, preloaded: false, sites: []}
      [_, _, _, _, native, _, _] = VM.MemoryChecks.run(nil, snap, nil, extra)

      assert native.kind == :native_leak
      assert native.summary =~ ~r/^memory outside the VM's allocators, untraced \(/
      assert native.evidence.outside_vm == snap.memory.outside_vm
    end

    test "with tracking off under sampling, RSS is not called an estimate" do
      snap = VM.Diagnose.snapshot()
      native = Map.merge(snap.memory.native || %{}, %{sampled: true, enabled: false})
      snap = put_in(snap.memory.native, native)
      extra = %{bin_leak: nil, preloaded: false, tracking_off: true, sites: []}
      [_, _, _, _, finding, _, _] = VM.MemoryChecks.run(nil, snap, nil, extra)

      assert finding.summary =~ ~r/^memory outside the VM's allocators, untraced \(/
      refute finding.summary =~ "about"
      assert finding.next =~ "Mtrace.enable() switches tracking back on"
    end

    test "without the tracer, carriers the VM freed and still maps are not native memory" do
      snap = VM.Diagnose.snapshot()
      mib = 1_048_576
      # As right after a process with a 300 MiB heap died: its carriers are
      # cached, outside the allocators' figures but still resident.
      memory = %{snap.memory | outside_vm: 330 * mib, carrier_cache: 300 * mib, jit_code: 0}
      extra = %{bin_leak: nil, preloaded: false, sites: []}
      [_, _, _, _, native, _, _] = VM.MemoryChecks.run(nil, %{snap | memory: memory}, nil, extra)

      assert native.evidence.bytes == 30 * mib
      assert native.summary =~ "less up to 300.0 MiB of carriers the VM freed", native.summary
      assert native.score < 50

      lines =
        VM.Diagnosis.render(%VM.Diagnosis{VM.diagnose(print: false, gc: false) | memory: memory})

      assert lines =~ "outside the VM 330.0 MiB (RSS the ERTS allocators do not hold); up to"

      # nothing outside the allocators: no "up to 0 B of it"
      memory = %{memory | outside_vm: 0}

      lines =
        VM.Diagnosis.render(%VM.Diagnosis{VM.diagnose(print: false, gc: false) | memory: memory})

      refute lines =~ "of it carriers", lines

      # the JIT's code, said where it is left out
      memory = %{memory | outside_vm: 330 * mib, jit_code: 25 * mib}

      lines =
        VM.Diagnosis.render(%VM.Diagnosis{VM.diagnose(print: false, gc: false) | memory: memory})

      assert lines =~ ~r/do not hold, the JIT's\s+25.0 MiB of code left out\); up to/
    end

    test "without the tracer, a carrier cache too small to be named leaves the figure whole" do
      snap = VM.Diagnose.snapshot()
      mib = 1_048_576
      # the memory line says "outside the VM 30.0 MiB": so does the finding
      memory = %{snap.memory | outside_vm: 30 * mib, carrier_cache: div(mib, 2)}
      extra = %{bin_leak: nil, preloaded: false, sites: []}
      [_, _, _, _, native, _, _] = VM.MemoryChecks.run(nil, %{snap | memory: memory}, nil, extra)

      assert native.evidence.bytes == 30 * mib
      assert native.summary =~ "libraries), is 30.0 MiB", native.summary
    end

    test "atoms that would reach their limit soon score no more than atoms at their limit" do
      snap = VM.Diagnose.snapshot()
      prev = %{snap | at_ms: snap.at_ms - 2_000}
      # 1_500 atoms made in a 2 s window (a burst, say a module loaded), 2%
      # of the limit: at that rate the limit would be reached in 23 minutes
      snap = %{snap | counts: %{snap.counts | atoms: {21_500, 1_048_576}}}
      prev = %{prev | counts: %{prev.counts | atoms: {20_000, 1_048_576}}}
      [_, _, _, _, limit] = VM.Findings.process_checks(prev, snap, 2.0)

      assert %{kind: :limit_near, evidence: %{what: :atoms, seconds_to_limit: eta}} = limit
      assert eta in 1_300..1_400
      assert limit.summary =~ "the limit is reached in 2"
      # as a count at its limit does; not above a table of 600 MiB (179)
      assert limit.score == 100.0
    end

    test "descriptors growing toward the usual limit of 1_024 are judged on a smaller floor" do
      snap = VM.Diagnose.snapshot()
      prev = %{snap | at_ms: snap.at_ms - 5_000}
      # 300 sockets opened in 5 s with 1_024 allowed: 10 s left at that rate
      counts = Map.drop(snap.counts, [:atoms, :ports])
      snap = %{snap | counts: Map.put(counts, :fds, {700, 1_024})}
      prev = %{prev | counts: Map.put(counts, :fds, {400, 1_024})}
      [_, _, _, _, limit] = VM.Findings.process_checks(prev, snap, 5.0)

      assert %{kind: :limit_near, evidence: %{what: :fds, seconds_to_limit: eta}} = limit
      assert eta in 5..6
      assert limit.score == 100.0
    end

    test "a process that grew is named first, and the largest after it when it is a problem" do
      snap = VM.Diagnose.snapshot()
      mib = 1_048_576
      big = spawn(fn -> Process.sleep(:infinity) end)
      grower = spawn(fn -> Process.sleep(:infinity) end)
      on_exit(fn -> Enum.each([big, grower], &Process.exit(&1, :kill)) end)

      # one process holds 880 MiB of a 1 GiB VM; another grew from under 1
      # MiB to 16 MiB over a 2 s window
      procs =
        Map.merge(snap.procs, %{
          memory_top: [{big, 880 * mib}, {grower, 16 * mib}],
          memory_growth: [{grower, 15 * mib}],
          memory: %{big => 880 * mib, grower => 16 * mib}
        })

      snap = %{snap | procs: procs, memory: %{snap.memory | total: 1024 * mib}}
      prev = %{snap | at_ms: snap.at_ms - 2_000}
      [_, _, _, memory, _] = VM.Findings.process_checks(prev, snap, 2.0)

      assert %{kind: :process_memory, evidence: %{pid: ^grower}} = memory
      summary = String.replace(memory.summary, ~r/\s+/, " ")
      assert summary =~ "holds 16.0 MiB (2% of the VM's memory), growing by 7.5 MiB/s"
      assert summary =~ "; #{inspect(big)} (in "
      assert summary =~ "holds the most, 880.0 MiB (86%)"
      assert memory.evidence.largest == {big, 880 * mib}
    end

    test "a fragmented allocator is told the VM flags for that allocator" do
      snap = VM.Diagnose.snapshot()
      mib = 1_048_576
      # ets_alloc after a table grew and was mostly emptied: 400 MiB in
      # carriers, 40 MiB used
      row = %{allocator: :ets_alloc, allocated: 400 * mib, used: 40 * mib, wasted: 360 * mib}
      row = Map.merge(row, %{usage: 0.1, instances: 3})
      extra = %{bin_leak: nil, preloaded: false, sites: []}
      [_, _, _, _, _, frag, _] = VM.MemoryChecks.run(nil, %{snap | allocators: [row]}, nil, extra)

      assert frag.kind == :fragmentation
      assert frag.score >= 50
      assert frag.next =~ "start the VM with +MEas aobf"
      assert frag.next =~ ~r/ or \+MElmbcs \d+ \(carriers of at most /
      refute frag.next =~ "<X>"
    end

    test "untraced, growth and sizes are named as on the memory lines" do
      for tracer <- [Mtrace.VMTest.NoTracer, Mtrace.VMTest.InactiveTracer] do
        use_native(tracer)
        {_result, output} = with_io(fn -> VM.diagnose(gc: false, window: 300) end)
        flat = String.replace(output, ~r/\s+/, " ")
        # RSS outside the allocators is not the tracer's native heap
        assert flat =~ ~r/ outside the VM (grew|shrank|held)/, output
        refute output =~ ~r/^\s+native (grew|shrank|held)/m, output
        # and what it is compared with is the allocators', not erlang:memory's
        refute flat =~ "the VM accounts for", output
      end
    end

    test "a short window takes at most one step per 20 ms, however many are asked for" do
      th = [window_steps: 2_000]
      result = VM.diagnose(gc: false, print: false, window: 100, thresholds: th)
      # native memory read 5 times after the first
      assert result.growth.native.steps == 5
      result = VM.diagnose(gc: false, print: false, window: 100, thresholds: [window_steps: 3])
      assert result.growth.native.steps == 3
    end

    test "a tracer whose figures fail during the window: judged by RSS, and said why" do
      use_native(Mtrace.VMTest.FlakyTracer)
      # enough reads for the checks and snapshot before the window, not its steps
      :persistent_term.put({Mtrace.VMTest.FlakyTracer, :reads}, 4)
      on_exit(fn -> :persistent_term.erase({Mtrace.VMTest.FlakyTracer, :reads}) end)

      {result, output} = with_io(fn -> VM.diagnose(gc: false, window: 300) end)
      assert %{judged_by: :rss, tracking_off: false, tracer_unread: true} = result.native
      flat = String.replace(output, ~r/\s+/, " ")
      assert flat =~ "figures could not be read", output
      refute flat =~ "add `export LD_PRELOAD", output
    end

    test "a tracer that raises reads as one without figures" do
      use_native(Mtrace.VMTest.BrokenTracer)

      assert VM.memory().native == nil
      {result, output} = with_io(fn -> VM.diagnose(gc: false) end)
      assert %{preloaded: true, program_traced: true, stats: nil, sites: []} = result.native
      refute Enum.any?(result.findings, &match?(%{kind: :native_leak, evidence: %{sites: _}}, &1))
      assert output =~ "preloaded but its figures could not be read"
    end

    test "a tracer that does not trace this program says so, not an empty table" do
      use_native(Mtrace.VMTest.InactiveTracer)

      assert VM.memory().native == nil
      {result, output} = with_io(fn -> VM.diagnose(gc: false) end)
      assert %{preloaded: true, program_traced: false, stats: nil} = result.native
      assert output =~ "native  not traced: the tracer is preloaded, but this program"
      assert output =~ "MTRACE_PROGRAMS names"
      refute output =~ "0 B live"
      # The native finding, listed or not (that depends on how much memory
      # is outside the allocators), says what to change.
      snap = VM.Diagnose.snapshot()
      extra = %{bin_leak: nil, preloaded: false, program_left_out: true, sites: []}
      [_, _, _, _, native, _, _] = VM.MemoryChecks.run(nil, snap, nil, extra)
      assert native.next =~ "MTRACE_PROGRAMS leaves this program out"

      if Enum.any?(result.findings, &(&1.kind == :native_leak)),
        do: assert(output =~ "MTRACE_PROGRAMS leaves this program out")
    end

    test "bad arguments raise ArgumentError naming the argument" do
      cases = [
        {fn -> VM.top(:bogus) end, "attr"},
        {fn -> VM.top(:memory, 0) end, "n must be"},
        {fn -> VM.window(:memory, 1, -5) end, "ms must be"},
        {fn -> VM.window(:links, :two, 10) end, "n must be"},
        {fn -> VM.bin_leak(-1) end, "n must be"},
        {fn -> VM.ets_top(0) end, "n must be"},
        {fn -> VM.ets_top(3, :rows) end, "by must be"},
        {fn -> VM.ets_top(:bytes) end, "by must be :memory or :size, or n a positive integer"},
        {fn -> VM.ets_top(:bytes, 3) end, "by must be one of :memory, :size, got: :bytes"},
        {fn -> VM.diagnose(bogus: 1) end, "unknown option :bogus"},
        {fn -> VM.diagnose(:now) end, "keyword list"},
        {fn -> VM.diagnose(window: 0) end, "option :window"},
        {fn -> VM.diagnose(print: :maybe) end, "option :print"},
        {fn -> VM.diagnose(gc: :sometimes) end, "option :gc"},
        {fn -> VM.diagnose(node: "peer@host") end, "option :node"},
        {fn -> VM.diagnose(timeout: -1) end, "option :timeout"},
        {fn -> VM.diagnose(timeout: 4_294_967_296) end, "option :timeout"}
      ]

      for {fun, text} <- cases do
        error = assert_raise ArgumentError, fun
        assert error.message =~ text
      end
    end

    test "diagnose/1 names an unreachable node in an Mtrace.Error :nodedown" do
      [_, host] = node() |> Atom.to_string() |> String.split("@")
      absent = :"mtrace_absent_#{System.unique_integer([:positive])}@#{host}"

      error = assert_raise Mtrace.Error, fn -> VM.diagnose(node: absent, print: false) end
      assert error.reason == :nodedown
      assert error.message =~ "cannot connect"
      assert error.message =~ Atom.to_string(absent)
    end
  end

  describe "known processes in a peer" do
    @describetag :peer

    setup do
      node = start_peer(["+P", "100000"])
      %{node: node, pids: :erpc.call(node, @scenarios, :known_processes, [])}
    end

    test "top/2 finds the known process for every attribute", %{node: node, pids: pids} do
      plain = [current_function: {@scenarios, :park, 0}, initial_call: {:erlang, :apply, 2}]

      expect = [
        memory: {pids.fat, [registered_name: :mtrace_fat]},
        total_heap_size: {pids.fat, [registered_name: :mtrace_fat]},
        heap_size: {pids.fat, [registered_name: :mtrace_fat]},
        binary_memory: {pids.binaries, plain},
        message_queue_len: {pids.mailbox, plain},
        reductions: {pids.burner, plain},
        monitors: {pids.monitors, plain},
        links: {pids.links, plain}
      ]

      for {attr, {pid, info}} <- expect do
        # the second is left out where its value is 0 (no other mailbox)
        assert [{^pid, value, ^info} | rest] = top(node, attr, 2)
        second = with [{_, second, _}] <- rest, do: second, else: ([] -> 0)
        assert value > second, "#{attr}: #{value} vs #{second}"
        now = :erpc.call(node, VM.Procs, :value, [pid, attr])
        # Handling the first process_info request counts as a reduction.
        if attr == :reductions,
          do: assert(value in (now - 2)..now),
          else: assert(value == now, "#{attr}: #{value} vs #{now}")
      end

      assert [{_, reductions, _}] = top(node, :reductions, 1)
      assert reductions >= 5_000_000

      # Eight 1 MiB binaries, one of them referenced twice, count once each.
      assert [{_, 8_388_608, _}] = top(node, :binary_memory, 1)
      assert [{_, 3_000, _}] = top(node, :message_queue_len, 1)
      assert [{_, 500, _}] = top(node, :monitors, 1)
      assert [{_, 300, _}] = top(node, :links, 1)
      assert [{_, words, _}] = top(node, :heap_size, 1)
      assert words >= 2_000_000

      all = top(node, :memory, 1_000_000)
      # Every process is ranked (give or take the short-lived erpc workers).
      count = :erpc.call(node, :erlang, :system_info, [:process_count])
      assert abs(length(all) - count) <= 2
      assert Enum.all?(Map.values(pids), fn pid -> List.keymember?(all, pid, 0) end)
      values = Enum.map(all, &elem(&1, 1))
      assert values == Enum.sort(values, :desc)
    end

    test "window/3 ranks growth and counts newborns from zero", %{node: node} do
      target = :erpc.call(node, @scenarios, :window_events, [200])

      result = :erpc.call(node, VM, :window, [:message_queue_len, 2, 1_500])
      newborn = :erpc.call(node, Process, :whereis, [:mtrace_newborn])

      assert [{^target, 1_000, _}, {^newborn, 700, _}] = result
      # A process that did not change is left out, not ranked with 0.
      unchanged = :erpc.call(node, VM, :window, [:message_queue_len, 10, 10])
      refute Enum.any?(unchanged, &match?({_, 0, _}, &1)), inspect(unchanged)
    end

    test "counts/0 reports the limits the peer was started with", %{node: node} do
      counts = :erpc.call(node, VM, :counts, [])

      # +P 100000 is rounded up by the VM to a power of two.
      assert {procs, 131_072} = counts.processes
      assert procs > 300 and procs < 1_000
      assert {atoms, 1_048_576} = counts.atoms
      assert atoms > 1_000
      assert {ports, 65_536} = counts.ports
      assert ports >= 1
      assert {tables, limit} = counts.ets
      assert tables >= 1 and limit >= tables
    end
  end

  describe "diagnose/1 on a peer with one leak" do
    @describetag :peer

    test "a table of 1_000_000 65-byte binaries is ETS growth" do
      node = start_peer()
      owner = :erpc.call(node, @scenarios, :ets_table, [1_000_000], 60_000)

      result = diagnose(node)
      assert result.verdict == :ets_growth
      assert [%{kind: :ets_growth, evidence: evidence, next: next} | _] = result.findings
      assert evidence.table == :mtrace_leaky_cache
      assert next =~ "find who inserts into :mtrace_leaky_cache without deleting"

      assert next =~
               ":erpc.call(#{inspect(node)}, Process, :info, [#{VM.Format.pid_expr(owner)}, "

      assert evidence.info[:size] == 1_000_000
      assert evidence.info[:owner] == owner
      assert evidence.info[:memory_bytes] > 100 * 1_048_576
      # Every object references one 65-byte binary that table memory leaves out.
      assert evidence.binary_estimate == 65_000_000
      # The binaries live in the table, so a forced GC must not call it a binary leak.
      refute Enum.any?(result.findings, &(&1.kind == :binary_leak and &1.score >= 50))
    end

    test "100_000 unread messages are a mailbox build-up" do
      node = start_peer()
      sink = :erpc.call(node, @scenarios, :mailbox, [100_000], 60_000)

      result = diagnose(node)
      assert result.verdict == :mailbox_buildup
      assert [%{kind: :mailbox_buildup, evidence: evidence, next: next} | _] = result.findings
      assert evidence.pid == sink
      assert evidence.message_queue_len == 100_000

      # Diagnosed from here, the next call is written to run here, on the peer.
      call = ":erpc.call(#{inspect(node)}, Process, :info, [#{VM.Format.pid_expr(sink)}, "
      assert String.starts_with?(next, call), next
      [call, _] = String.split(next, " shows", parts: 2)
      {info, _} = Code.eval_string("import IEx.Helpers, only: [pid: 1]; " <> call)
      assert info[:status] == :waiting
      assert next =~ ":erpc.call(#{inspect(node)}, Mtrace.VM, :top, [:message_queue_len, 5])"
      # and the summary names the process as it reads here
      assert result.findings |> hd() |> Map.get(:summary) =~ inspect(sink)
    end

    test "refc binaries kept only by an uncollected process are a binary leak" do
      node = start_peer()
      hoarder = :erpc.call(node, @scenarios, :binary_hoarder, [2_000, 65_536], 60_000)

      # Without the forced GC, dominating binaries are only a lead.
      untested = diagnose(node, gc: false)
      assert untested.verdict == :healthy
      assert [%{kind: :binary_leak, score: 45.0, next: next}] = untested.findings
      assert next =~ ":erpc.call(#{inspect(node)}, Mtrace.VM, :bin_leak, [5])"

      result = diagnose(node)
      assert result.verdict == :binary_leak
      assert [%{kind: :binary_leak, evidence: evidence} | _] = result.findings
      assert [{^hoarder, -2_000, _} | _] = evidence.top
      assert [{^hoarder, bytes, _} | _] = evidence.top_bytes
      assert bytes >= 2_000 * 65_536
      assert evidence.freed_bytes >= 2_000 * 65_536

      # bin_leak/1 on its own reports the same for a second hoarder.
      second = :erpc.call(node, @scenarios, :binary_hoarder, [500, 65_536], 60_000)
      leak = :erpc.call(node, VM, :bin_leak, [3], 60_000)
      assert [{^second, -500, _} | _] = leak.top
      assert leak.binary_before - leak.binary_after >= 500 * 65_536
    end

    test "the binary leak names the process that let go of the most bytes" do
      node = start_peer()
      # A few large binaries, and many small ones in another process: the
      # second drops more references, the first frees the memory.
      hoarder = :erpc.call(node, @scenarios, :binary_hoarder, [40, 1_048_576], 60_000)
      chatter = :erpc.call(node, @scenarios, :binary_hoarder, [2_000, 100], 60_000)

      result = diagnose(node, gc: true)
      assert [%{kind: :binary_leak, evidence: evidence} = finding | _] = result.findings
      assert [{^chatter, -2_000, _} | _] = evidence.top
      assert [{^hoarder, bytes, _} | _] = evidence.top_bytes
      assert bytes >= 40 * 1_048_576

      summary = String.replace(finding.summary, ~r/\s+/, " ")
      assert summary =~ "#{inspect(hoarder)} (in "
      assert summary =~ "let go of the most, #{VM.Format.bytes(bytes)}"
      refute summary =~ inspect(chatter)
      assert finding.next =~ VM.Format.pid_expr(hoarder)
    end

    test "binaries a process holds, which a GC cannot free, are named with who holds them" do
      node = start_peer()
      keeper = :erpc.call(node, @scenarios, :binary_keeper, [150, 1_048_576], 60_000)

      {result, output} = with_io(fn -> VM.diagnose(node: node, timeout: 60_000) end)
      assert result.verdict == :binary_held, VM.Diagnosis.render(result)

      assert [%{kind: :binary_held, evidence: evidence, summary: summary, next: next} | _] =
               result.findings

      assert [{^keeper, bytes, [registered_name: :mtrace_binary_keeper]} | _] = evidence.holders
      assert bytes == 150 * 1_048_576
      summary = String.replace(summary, ~r/\s+/, " ")
      assert summary =~ "held, not freed by a GC"
      assert summary =~ "#{inspect(keeper)} (:mtrace_binary_keeper) holds 150.0 MiB of them"
      assert next =~ ":erpc.call(#{inspect(node)}, Mtrace.VM, :top, [:binary_memory, 5])"
      # what the GC could not free is not a leak
      refute Enum.any?(result.findings, &(&1.kind == :binary_leak and &1.score >= 20))
      assert output |> String.split("\n") |> Enum.all?(&(String.length(&1) <= 80)), output
    end

    test "binaries a NIF made but a process keeps are the process's, not a NIF leak" do
      node = start_peer()
      # 150 slices of 100 bytes, each keeping a 1 MiB binary :crypto made
      cache = :erpc.call(node, @scenarios, :header_cache, [150, 1_048_576], 60_000)

      result = diagnose(node)
      text = VM.Diagnosis.render(result)
      assert result.verdict == :binary_held, text
      assert [%{kind: :binary_held, evidence: evidence} | rest] = result.findings
      assert [{^cache, bytes, [registered_name: :mtrace_header_cache]} | _] = evidence.holders
      assert bytes >= 150 * 1_048_576

      # the VM's tag for them is named as either kind it covers
      assert text =~ ~r/:crypto at least 150.0 MiB in 150 resources or\s+binaries/

      case Enum.find(rest, &(&1.kind == :nif_alloc_leak)) do
        nil -> :ok
        nif -> assert nif.score < 50 and nif.summary =~ "resources or binaries", text
      end
    end

    test "binaries a small ETS table keeps are counted, though it is not among the largest" do
      node = start_peer()
      owner = :erpc.call(node, @scenarios, :blob_table, [60, 2 * 1_048_576], 60_000)

      result = diagnose(node)
      assert result.verdict == :ets_growth, VM.Diagnosis.render(result)
      assert [%{kind: :ets_growth, evidence: evidence} | _] = result.findings
      assert evidence.table == :mtrace_blob_cache
      assert evidence.info[:owner] == owner
      # capped by erlang:memory(binary), read at another moment, which was
      # seen 2_624 bytes under the binaries' own bytes
      assert_in_delta evidence.binary_estimate, 60 * 2 * 1_048_576, 65_536

      # what the GC left is said to be the table's, not left unexplained
      held = Enum.find(result.findings, &(&1.kind == :binary_held))
      assert held.score < 50

      assert String.replace(held.summary, ~r/\s+/, " ") =~
               "ETS table :mtrace_blob_cache references about 120.0 MiB"
    end

    test "on another node, every call a next names runs there as written" do
      node = start_peer()
      :erpc.call(node, @scenarios, :blob_table, [60, 2 * 1_048_576, false], 60_000)

      result = diagnose(node)
      assert %{next: next} = Enum.find(result.findings, &(&1.kind == :ets_growth))
      # an unnamed table's id, looked up where the table is
      assert next =~ "(unnamed: its id is in :erpc.call(#{inspect(node)}, :ets, :all, []))"
      refute next =~ ~r/[^,] :ets\.all\(\)/

      # a pipeline of calls runs there whole, and gives the peer's answer
      hint = "Port.list() |> Enum.map(&Port.info(&1, :connected)) |> Enum.frequencies() shows"
      remote = VM.Format.remote_hint(hint, node, & &1)
      assert [expr] = Regex.run(~r/^:erpc.call\(.* end\)(?= shows$)/, remote)
      {counts, _} = Code.eval_string(expr)
      ports = :erpc.call(node, :erlang, :ports, [])
      assert counts |> Map.values() |> Enum.sum() == length(ports)
    end

    test "50_000 idle workers of a leaking pool are a process leak" do
      node = start_peer()
      :erpc.call(node, @scenarios, :leaking_pool, [50_000], 60_000)

      result = diagnose(node)
      assert result.verdict == :process_leak
      assert [%{kind: :process_leak, evidence: evidence} | _] = result.findings
      assert evidence.idle_group.count == 50_000
      assert evidence.idle_group.current_function == {@scenarios, :worker_loop, 0}
      # Plain spawns, not proc_lib's init_p/5.
      assert evidence.idle_group.started_as == {:erlang, :apply, 2}
      assert evidence.processes >= 50_000
    end

    test "idle servers are grouped by the module they were started with, not by proc_lib" do
      node = start_peer()
      :ok = :erpc.call(node, @scenarios, :idle_servers, [12_000, 8_000], 120_000)

      {result, output} = with_io(fn -> VM.diagnose(node: node, timeout: 60_000) end)
      assert result.verdict == :process_leak, VM.Diagnosis.render(result)

      assert [%{kind: :process_leak, evidence: evidence, summary: summary} | _] = result.findings

      # not the 20_000 servers and the system's own, all :proc_lib.init_p/5
      # to the VM, under one name
      assert %{count: 12_000, sample: sample} = evidence.idle_group
      assert evidence.idle_group.started_as == {Mtrace.VMScenarios.IdleServer, :init, 1}
      assert evidence.idle_group.current_function == {:gen_server, :loop, 7}
      assert evidence.idle_group.initial_call == {:proc_lib, :init_p, 5}

      # the sample is one of them, not a system process
      assert :erpc.call(node, :proc_lib, :initial_call, [sample]) ==
               {Mtrace.VMScenarios.IdleServer, :init, [:Argument__1]}

      flat = String.replace(summary, ~r/\s+/, " ")
      assert flat =~ ~r/^12_000 of 20_\d{3} processes are idle in :gen_server.loop\/7, /
      assert flat =~ "started as Mtrace.VMScenarios.IdleServer.init/1"

      assert output |> String.split("\n") |> Enum.all?(&(String.length(&1) <= 80)), output
    end

    test "with a window, a process count growing fast still names the idle group" do
      node = start_peer()
      # up to 2_000 workers a second, never given work, for longer than the window
      :erpc.call(node, @scenarios, :spawn_flood, [20, 6_000])

      result = diagnose(node, gc: false, window: 2_000)
      text = VM.Diagnosis.render(result)
      assert result.verdict == :process_leak, text

      assert [%{kind: :process_leak, evidence: evidence, summary: summary, next: next} | _] =
               result.findings

      assert evidence.growth_per_s >= 100
      assert evidence.idle_group.current_function == {@scenarios, :worker_loop, 0}
      flat = String.replace(summary, ~r/\s+/, " ")
      # growth scored highest, and leads; the idle ones it says next are named
      assert flat =~ ~r/^[\d_]+ processes of a limit of 262_144, growing by [\d_]+ processes\/s; /

      assert flat =~
               ~r/; [\d_]+ of them are idle in Mtrace.VMScenarios.worker_loop\/0, started as :erlang.apply\/2$/

      assert next =~ "shows one of the idle ones"
    end

    test "20_000 monitors held by one process are a monitor leak" do
      node = start_peer()
      {hog, target} = :erpc.call(node, @scenarios, :monitor_hog, [20_000], 60_000)

      result = diagnose(node)
      assert result.verdict == :monitor_leak
      assert [%{kind: :monitor_leak, evidence: evidence} | _] = result.findings
      assert evidence.pid == hog
      assert evidence.monitors == 20_000
      assert evidence.targets == [{target, 20_000}]
    end

    test "a quiet node is healthy, and the report says how to trace native memory" do
      # With this VM's environment: under the tracer, a quiet peer is traced
      # too and must still be healthy.
      node = start_peer([], [])

      {result, output} = with_io(fn -> VM.diagnose(node: node) end)

      assert result.verdict == :healthy
      assert result.node == node
      assert Enum.all?(result.findings, &(&1.score < 50))
      assert output =~ "mtrace diagnose #{node}: verdict healthy"
      assert output =~ ~r/counts  processes \d+\/262_144/

      # Peers inherit LD_PRELOAD: a suite run under the tracer sees it there too.
      if result.native.preloaded do
        assert output =~ "live in"
      else
        assert output =~ "export LD_PRELOAD=$(ls $RELEASE_ROOT/lib/mtrace-*/priv/mtrace.so)"
        assert output =~ ~r/LD_PRELOAD=\S+\/priv\/mtrace.so\n/
      end
    end

    test "one process keeping most of the VM's memory is named" do
      node = start_peer()
      keeper = :erpc.call(node, @scenarios, :big_state, [300], 60_000)
      result = diagnose(node, gc: false)
      assert result.verdict == :process_memory, VM.Diagnosis.render(result)

      assert [%{kind: :process_memory, evidence: evidence, summary: summary} | _] =
               result.findings

      assert evidence.pid == keeper
      assert evidence.memory > 300 * 1_048_576
      assert summary =~ ~r/holds [\d.]+ MiB \(\d+% of the VM's memory\)/
    end

    test "with a window, the process whose memory grows is named before a larger stable one" do
      node = start_peer()
      stable = :erpc.call(node, @scenarios, :big_state, [100], 60_000)
      # about 10 MiB/s for longer than the window
      grower = :erpc.call(node, @scenarios, :growing_state, [10, 6_000])

      result = diagnose(node, gc: false, window: 2_000)
      text = VM.Diagnosis.render(result)
      assert result.verdict == :process_memory, text

      assert [%{kind: :process_memory, evidence: evidence, summary: summary} | _] =
               result.findings

      assert evidence.pid == grower, text
      refute evidence.pid == stable
      assert evidence.growth_per_s >= 2 * 1_048_576, text
      assert summary =~ ~r/, growing by [\d.]+ MiB\/s; /
      # the stable one, 80% of the VM's memory, is a problem too: named after
      assert String.replace(summary, ~r/\s+/, " ") =~
               ~r/; #{Regex.escape(inspect(stable))} \(.*\) holds the most, [\d.]+ MiB \(\d+%\)$/

      assert {^stable, _} = evidence.largest
    end

    test "terms piling up in persistent_term are named, though only system memory shows them" do
      node = start_peer()
      # 150 MiB in 150 terms: none of it in processes, binary, ets or code
      keys = :erpc.call(node, @scenarios, :persistent_terms, [150, 1024], 60_000)

      result = diagnose(node, gc: false)
      assert result.verdict == :persistent_term, VM.Diagnosis.render(result)

      assert [%{kind: :persistent_term, evidence: evidence, summary: summary, next: next} | _] =
               result.findings

      assert evidence.count >= 150
      assert evidence.memory > 150 * 1_048_576
      assert summary =~ ~r/^persistent_term holds 15\d\.\d MiB in \d+ terms \(\d+% of the VM's/

      assert next =~ "Mtrace.VM.persistent_terms(node: #{inspect(node)}, 5)" or
               next =~ ":erpc.call(#{inspect(node)}, Mtrace.VM, :persistent_terms, [5])"

      [{key, bytes} | _] = :erpc.call(node, VM, :persistent_terms, [3])
      assert key in keys
      assert bytes == 1024 * 1024
    end

    test "atoms near their limit are a finding, with what makes them" do
      node = start_peer(["+t", "40000"])
      {count, 40_000} = :erpc.call(node, VM, :counts, []).atoms
      # three quarters of the limit
      names = for i <- 1..(30_000 - count), do: "made_#{i}"
      :ok = :erpc.call(node, Enum, :each, [names, &String.to_atom/1])

      result = diagnose(node)

      assert %{score: score, summary: summary, next: next} =
               Enum.find(result.findings, &(&1.kind == :limit_near))

      assert score >= 50
      assert summary =~ ~r/^atoms at 3\d_\d{3} of a limit of 40_000 \(\d+%\)/
      assert next =~ "String.to_existing_atom/1"
    end

    @tag skip: not File.exists?("/proc/self/limits") and "no /proc on this OS"
    test "open file descriptors near the OS's limit are named, far below the port limit" do
      node = start_peer()
      os_pid = :erpc.call(node, :os, :getpid, [])
      # as after `ulimit -n 256`: the soft limit only
      {_, 0} = System.cmd("prlimit", ["--pid", to_string(os_pid), "--nofile=256:"])
      pool = :erpc.call(node, @scenarios, :open_sockets, [80], 60_000)

      {result, output} = with_io(fn -> VM.diagnose(node: node, gc: false, timeout: 60_000) end)
      assert result.verdict == :limit_near, output

      assert [%{kind: :limit_near, evidence: evidence, summary: summary, next: next} | _] =
               result.findings

      assert %{what: :fds, limit: 256, count: count} = evidence
      assert count >= 160 and count < 256
      assert {ports, 65_536} = result.counts.ports
      assert ports < 0.01 * 65_536
      assert summary =~ ~r/^fds at \d+ of a limit of 256 \(\d+%\)$/
      assert next =~ "ulimit -n"
      assert output =~ ~r/fds \d+\/256/
      assert is_pid(pool)
    end

    test "with a window, atoms far from their limit but growing fast are named with the time left" do
      node = start_peer()
      # up to 2_000 atoms a second for longer than the window: 1% of the
      # limit, reached within hours at that rate
      :erpc.call(node, @scenarios, :atom_flood, [20, 6_000])

      result = diagnose(node, gc: false, window: 2_000)
      text = VM.Diagnosis.render(result)
      assert result.verdict == :limit_near, text
      assert [%{kind: :limit_near, evidence: evidence, summary: summary} | _] = result.findings
      assert evidence.what == :atoms
      assert evidence.count < 0.1 * evidence.limit
      assert evidence.growth_per_s >= 500
      assert evidence.seconds_to_limit > 0

      assert String.replace(summary, ~r/\s+/, " ") =~
               ~r/^atoms at [\d_]+ of a limit of 1_048_576 \(\d+%\), growing by [\d_]+ atoms\/s: at this rate the limit is reached in \d+[hm] /
    end

    test "with a window, a mailbox still small but growing fast is a build-up" do
      node = start_peer()
      # About 5_000 messages a second for 3 s: under 10_000 when judged, but
      # far over 500 a second.
      sink = :erpc.call(node, @scenarios, :mailbox_flood, [50, 3_000])

      # the largest timeout, plus the window, is still one erpc takes
      result = diagnose(node, window: 1_000, timeout: 4_294_967_295)
      assert result.verdict == :mailbox_buildup
      assert [%{kind: :mailbox_buildup, evidence: evidence} | _] = result.findings
      assert evidence.pid == sink
      assert evidence.growth_per_s >= 500
      assert result.window == 1_000
    end
  end

  describe "degraded nodes" do
    @describetag :peer

    test "+Mea min and no native module: figures are nil, nothing crashes" do
      node = start_peer(["+Mea", "min"])
      :ok = :erpc.call(node, @scenarios, :remove_native_module, [])
      refute :erpc.call(node, Code, :ensure_loaded?, [Mtrace])

      m = :erpc.call(node, VM, :memory, [])
      assert m.total == nil and m.binary == nil
      assert is_integer(m.rss) and m.rss > 0
      # Only the allocators that cannot be disabled are left to count.
      assert m.allocated > 0 and m.used <= m.allocated
      assert m.outside_vm == max(m.rss - m.allocated - m.jit_code, 0)
      assert m.native == nil

      rows = :erpc.call(node, VM, :allocators, [])
      names = Enum.map(rows, & &1.allocator)
      assert :temp_alloc in names
      refute :binary_alloc in names

      result = diagnose(node, gc: true)
      assert result.verdict == :healthy
      assert result.memory.total == nil
      assert %{binary_before: nil, binary_after: nil} = :erpc.call(node, VM, :bin_leak, [1])
    end

    test "the process table full (a process leak): bin_leak and diagnose still collect" do
      node = start_peer(["+P", "1024"])
      calls = [bin_leak: [2], diagnose: [[gc: true, print: false]]]

      # their code loaded first, while the code server can still start what it needs
      for {fun, args} <- calls, do: :erpc.call(node, VM, fun, args, 60_000)
      {:module, _} = :erpc.call(node, :code, :ensure_loaded, [Exception])

      for {fun, args} <- calls do
        assert {:ok, _} =
                 :erpc.call(node, @scenarios, :with_full_process_table, [VM, fun, args], 60_000)
      end
    end

    test "a node without mtrace loaded is named in the error" do
      {:ok, peer, node} = :peer.start_link(%{name: :peer.random_name()})
      on_exit(fn -> Mtrace.Test.Remote.stop_peer(peer) end)

      error = assert_raise Mtrace.Error, fn -> VM.diagnose(node: node, print: false) end
      assert error.reason == :not_loaded
      assert error.message =~ "mtrace: not loaded on node #{inspect(node)}"
    end
  end

  defp use_native(module) do
    Application.put_env(:mtrace, :native_module, module)
    on_exit(fn -> Application.delete_env(:mtrace, :native_module) end)
  end

  defp top(node, attr, n), do: :erpc.call(node, VM, :top, [attr, n], 60_000)

  defp diagnose(node, opts \\ []) do
    VM.diagnose(Keyword.merge([node: node, print: false, timeout: 60_000], opts))
  end

  # Peers run without the malloc tracer unless asked (`env: []` keeps this
  # VM's environment), so that VM-side scenarios are judged on their own.
  defp start_peer(args \\ [], env \\ [{~c"LD_PRELOAD", false}]) do
    {:ok, peer, node} =
      :peer.start_link(%{
        name: :peer.random_name(),
        args: Enum.map(args, &to_charlist/1),
        env: env
      })

    on_exit(fn -> Mtrace.Test.Remote.stop_peer(peer) end)
    # This node's code paths hold mtrace and the test support modules.
    :ok = :erpc.call(node, :code, :add_paths, [:code.get_path()])
    {:module, @scenarios} = :erpc.call(node, :code, :ensure_loaded, [@scenarios])
    node
  end
end

defmodule Mtrace.VMTest.FakeTracer do
  # Stands in for a preloaded tracer whose heap holds 600 MiB, and whose
  # sites/1 knows no :limit option.
  @mib 1_048_576

  def preloaded?, do: true

  def stats do
    %{
      live_count: 12_000,
      live_bytes: 600 * @mib,
      dropped: 0,
      enabled: true,
      allocated_bytes: 700 * @mib,
      used_bytes: 650 * @mib,
      free_bytes: 50 * @mib,
      mmap_bytes: 10 * @mib,
      malloc_cnt: 99
    }
  end

  def sites([]) do
    [site(50, 10), site(400, 9_000), site(150, 5), site(1, 1)]
  end

  def sites(opts), do: raise(ArgumentError, "unknown options: #{inspect(opts)}")

  defp site(mib, count) do
    frame = %{
      lib: "/opt/app/libleaky.so",
      symbol: "leaky_nif_alloc",
      file: nil,
      line: nil,
      addr: 1
    }

    %{count: count, bytes: mib * @mib, oldest: 3600, newest: 1, frames: [frame]}
  end
end

defmodule Mtrace.VMTest.SamplingTracer do
  # The same heap seen through sampling: the table holds a sample, and
  # stats and sites carry the estimates. The largest site by estimate
  # recorded the fewest bytes.
  alias Mtrace.VMTest.FakeTracer

  defdelegate preloaded?, to: FakeTracer

  def stats do
    Map.merge(FakeTracer.stats(), %{
      sampled: true,
      live_count: 700,
      live_bytes: 50 * 1_048_576,
      est_live_count: 12_000,
      est_live_bytes: 600 * 1_048_576
    })
  end

  def sites(_opts) do
    for %{bytes: bytes, count: count} = site <- FakeTracer.sites([]) do
      Map.merge(site, %{
        bytes: div(1_048_576 * 1024, bytes),
        count: 1,
        est_bytes: bytes,
        est_count: count
      })
    end
  end
end

defmodule Mtrace.VMTest.MarkingTracer do
  # The same heap, from a tracer that takes marks and lists what was
  # allocated since one.
  alias Mtrace.VMTest.FakeTracer

  defdelegate preloaded?, to: FakeTracer
  defdelegate stats, to: FakeTracer

  def mark, do: :mark
  def sites(opts), do: if(opts[:since] == :mark, do: FakeTracer.sites([]), else: [])
end

defmodule Mtrace.VMTest.NoTracer do
  # Not preloaded: native figures are RSS outside the ERTS allocators.
  def preloaded?, do: false
end

defmodule Mtrace.VMTest.InactiveTracer do
  # Preloaded, but MTRACE_PROGRAMS leaves this program out: an empty table.
  def preloaded?, do: true

  def stats do
    %{active: false, live_count: 0, live_bytes: 0, dropped: 0, enabled: true, sampled: false}
  end

  def sites(_opts), do: []
end

defmodule Mtrace.VMTest.FlakyTracer do
  # Preloaded and answering, until its reads start failing (after the
  # number of reads in :persistent_term {__MODULE__, :reads}).
  def preloaded?, do: true
  def mark, do: Mtrace.mark()
  def sites(_opts), do: []

  def stats do
    left = :persistent_term.get({__MODULE__, :reads}, 0)
    :persistent_term.put({__MODULE__, :reads}, left - 1)
    if left > 0, do: Mtrace.stats(heap: false), else: raise("the NIF went away")
  end
end

defmodule Mtrace.VMTest.BrokenTracer do
  # Preloaded, but every read fails, as when the NIF cannot reach the preload.
  def preloaded?, do: true
  def stats, do: raise("mtrace_api_v2 not found")
  def sites(_opts), do: exit(:boom)
end

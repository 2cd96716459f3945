defmodule Mtrace.ErlangFramesTest do
  # The Erlang code behind native allocations: what a NIF allocates carries
  # the Erlang call chain of the process that called it.
  # Not async: every test resets and reads the one allocation table of this VM.
  use ExUnit.Case, async: false

  alias Mtrace.Frame
  alias Mtrace.Test.{ErlangCallers, LeakyNif, Remote}

  @lib "leaky_nif"
  @callers "test/support/erlang_callers.ex"

  setup do
    LeakyNif.fresh_table(&on_exit/1)
  end

  # The line of the call that follows the `# call: name` marker.
  defp call_line(name) do
    @callers
    |> File.read!()
    |> String.split("\n")
    |> Enum.find_index(&String.ends_with?(&1, "# call: #{name}"))
    |> Kernel.+(2)
  end

  defp erlang(site), do: for(f <- site.frames, Frame.erlang?(f), do: f)

  # {module, function, arity, line} of a site's first n Erlang frames.
  defp chain(site, n) do
    site |> erlang() |> Enum.take(n) |> Enum.map(&{&1.module, &1.function, &1.arity, &1.line})
  end

  defp only_sites(opts \\ []), do: Mtrace.sites([lib: @lib, limit: :all] ++ opts)

  test "stats say Erlang frames are on, and why not when they are not" do
    assert %{erlang_frames: true, erlang_frames_off: nil, erlang_stacks: n} = Mtrace.stats()
    assert is_integer(n)
  end

  test "two Erlang callers of one NIF are two sites; the same Erlang path is one site" do
    # one call site of append/1 here, taken twice: one Erlang path
    for n <- [3, 4], do: ErlangCallers.append(n)
    ErlangCallers.audit(5)

    assert [append, audit] = only_sites()
    assert {append.count, audit.count} == {7, 5}

    assert chain(append, 2) == [
             {LeakyNif, :leak, 3, nil},
             {ErlangCallers, :append, 1, call_line("append")}
           ]

    assert chain(audit, 2) == [
             {LeakyNif, :leak, 3, nil},
             {ErlangCallers, :audit, 1, call_line("audit")}
           ]

    # the native part is the same, and ends where the NIF was called: the
    # VM's trampoline and scheduler frames are left out
    native = for f <- append.frames, not Frame.erlang?(f), do: f.symbol
    assert native == for(f <- audit.frames, not Frame.erlang?(f), do: f.symbol)
    assert ["fixture_leak_malloc", "leak"] = native

    assert %{file: @callers, symbol: "Mtrace.Test.ErlangCallers.append/1"} =
             Enum.at(append.frames, 3)

    # the frames both share (the NIF's, this test's) are one term each, in
    # the answer and in both named forms: a large answer is not copied
    # frame by frame
    shared = fn a, b -> :erts_debug.same(List.last(a), List.last(b)) end
    assert shared.(append.frames, audit.frames)
    assert shared.(Enum.take(append.frames, 3), Enum.take(audit.frames, 3))
    olds = Mtrace.olds(100, lib: @lib)
    [a, b | _] = olds |> Enum.map(& &1.frames) |> Enum.uniq()
    assert shared.(a, b)

    leaks =
      for {_, _, _, _, stack} <- Mtrace.olds(100_000, true),
          match?([{_, "fixture_leak_malloc"} | _], stack),
          do: stack

    [sa, sb] = Enum.uniq(leaks)
    assert shared.(sa, sb)
  end

  for {nif, marker} <- [leak: "inner", leak_dirty: "inner_dirty"] do
    test "a chain of non-tail calls, NIF #{nif} (#{if nif == :leak, do: "normal", else: "dirty"} scheduler)" do
      ErlangCallers.outer(unquote(nif), 6)
      assert [site] = only_sites()
      assert site.count == 6

      assert chain(site, 4) == [
               {LeakyNif, unquote(nif), 3, nil},
               {ErlangCallers, :inner, 2, call_line(unquote(marker))},
               {ErlangCallers, :middle, 2, call_line("middle")},
               {ErlangCallers, :outer, 2, call_line("outer")}
             ]

      # and on up to this test, which called outer/2
      assert Enum.any?(erlang(site), &(&1.module == __MODULE__))
      refute Enum.any?(site.frames, &(&1.symbol =~ ~r/beam_jit_call_nif|erts_call_dirty_nif/))
    end
  end

  test "call tracing (return_trace, exception_trace, return_to, call_time) adds no frame" do
    expected = [
      {LeakyNif, :leak, 3, nil},
      {ErlangCallers, :inner, 2, call_line("inner")},
      {ErlangCallers, :middle, 2, call_line("middle")},
      {ErlangCallers, :outer, 2, call_line("outer")}
    ]

    tracer = spawn(fn -> Process.sleep(:infinity) end)
    on_exit(fn -> Process.exit(tracer, :kill) end)

    for {pattern, flags} <- [
          {[{:_, [], [{:return_trace}]}], [:local]},
          {[{:_, [], [{:exception_trace}]}], [:local]},
          {[], [:local]},
          {true, [:call_time]}
        ],
        trace <- [[:call, {:tracer, tracer}], [:call, :return_to, {:tracer, tracer}]] do
      Mtrace.reset()
      :erlang.trace(self(), true, trace)

      for f <- [:outer, :middle, :inner],
          do: :erlang.trace_pattern({ErlangCallers, f, 2}, pattern, flags)

      ErlangCallers.outer(:leak, 2)
      :erlang.trace(self(), false, [:all])
      :erlang.trace_pattern({ErlangCallers, :_, :_}, false, flags)
      assert [site] = only_sites(), inspect({pattern, flags, trace})
      assert chain(site, 4) == expected, inspect({pattern, flags, trace})
      assert Enum.all?(erlang(site), &(&1.module != nil)), inspect(erlang(site))
    end
  end

  test "a tail-called NIF: its immediate caller is absent, the chain starts one above" do
    ErlangCallers.tail_outer(2)
    assert [site] = only_sites()

    assert chain(site, 2) == [
             {LeakyNif, :leak, 3, nil},
             {ErlangCallers, :tail_outer, 1, call_line("tail_outer")}
           ]
  end

  test "a process that exits while its allocations live: the names stay" do
    {pid, ref} = spawn_monitor(fn -> ErlangCallers.append(3) end)
    assert_receive {:DOWN, ^ref, :process, ^pid, :normal}
    assert [site] = only_sites()
    assert site.count == 3
    assert [_, {ErlangCallers, :append, 1, _}] = chain(site, 2)
  end

  # Mtrace.Test.Reloaded, its leaking call on line `line`.
  defp load_reloaded(line) do
    source =
      String.duplicate("\n", line - 3) <>
        """
        defmodule Mtrace.Test.Reloaded do
          def go(n) do
            Mtrace.Test.LeakyNif.leak(:malloc, n, 1000)
            :ok
          end
        end
        """

    :code.purge(Mtrace.Test.Reloaded)
    [{Mtrace.Test.Reloaded, _}] = Code.compile_string(source, "reloaded.ex")
  end

  test "purge and reload of the calling module: old allocations keep their names and lines" do
    Code.put_compiler_option(:ignore_module_conflict, true)
    on_exit(fn -> Code.put_compiler_option(:ignore_module_conflict, false) end)

    load_reloaded(10)
    go = &apply(Mtrace.Test.Reloaded, :go, [&1])
    go.(2)
    # a new version with the call elsewhere; the old one is purged
    load_reloaded(30)
    :code.purge(Mtrace.Test.Reloaded)
    go.(3)

    names = fn ->
      for site <- only_sites(), do: {site.count, chain(site, 2) |> Enum.at(1)}
    end

    expected = [
      {3, {Mtrace.Test.Reloaded, :go, 1, 30}},
      {2, {Mtrace.Test.Reloaded, :go, 1, 10}}
    ]

    assert names.() == expected
    # gone altogether: the names were taken when the stacks were first seen
    :code.purge(Mtrace.Test.Reloaded)
    :code.delete(Mtrace.Test.Reloaded)
    :code.purge(Mtrace.Test.Reloaded)
    refute :code.is_loaded(Mtrace.Test.Reloaded)
    assert names.() == expected
    assert [%{file: "reloaded.ex"} | _] = only_sites() |> hd() |> erlang() |> Enum.drop(1)
  end

  # Mtrace.Test.Reused<i>: its leaking call on line `line`.
  defp load_reused(module, line, file) do
    source =
      String.duplicate("\n", line - 3) <>
        """
        defmodule #{inspect(module)} do
          def go(n) do
            Mtrace.Test.LeakyNif.leak(:malloc, n, 1000)
            :ok
          end
        end
        """

    [{^module, _}] = Code.compile_string(source, file)
  end

  defp gone(module) do
    :code.purge(module)
    :code.delete(module)
    :code.purge(module)
  end

  # Once a module is purged the JIT may load the next module, or the next
  # version of it, at the same addresses: same return addresses, other code.
  test "code loaded where purged code was is told apart, and named as it is" do
    Code.put_compiler_option(:ignore_module_conflict, true)
    on_exit(fn -> Code.put_compiler_option(:ignore_module_conflict, false) end)

    versions = for i <- 1..6, do: {Mtrace.Test.Reused, 10 * i, "reused.ex", i}

    modules =
      for i <- 1..6, do: {Module.concat(Mtrace.Test, "Reused#{i}"), 10, "reused.ex", i + 6}

    # the same module and line, compiled from files moved about
    moved = for i <- 1..4, do: {Mtrace.Test.Moved, 10, "v#{i}/moved.ex", i + 12}
    loads = versions ++ modules ++ moved

    for {module, line, file, n} <- loads do
      load_reused(module, line, file)
      apply(module, :go, [n])
      gone(module)
    end

    got =
      for site <- only_sites() do
        caller = site |> erlang() |> Enum.at(1)
        {site.count, {caller.module, caller.line, caller.file}}
      end

    expected = for {module, line, file, n} <- loads, do: {n, {module, line, file}}
    assert Enum.sort(got) == Enum.sort(expected)
  end

  # A dirty NIF's frame is the address of its {M, F, A} in its process's one
  # native function record, which the VM rewrites for the next dirty NIF:
  # two NIFs from one call site, with thread progress held still by a NIF
  # spinning on another scheduler, are still two sites.
  if :erlang.system_info(:schedulers_online) < 2, do: @tag(skip: "needs 2 schedulers")

  test "two dirty NIFs from one call site are told apart, thread progress or not" do
    :erlang.spawn_opt(fn -> LeakyNif.spin(300) end, [{:scheduler, 2}])
    me = self()

    :erlang.spawn_opt(
      fn ->
        # let the spin start, on the caller's own scheduler
        t = System.monotonic_time(:millisecond)

        Stream.repeatedly(fn -> System.monotonic_time(:millisecond) - t end)
        |> Enum.find(&(&1 >= 50))

        for {nif, n} <- [leak_dirty: 3, leak_dirty2: 5],
            do: apply(LeakyNif, nif, [:malloc, n, 512])

        send(me, :done)
      end,
      [{:scheduler, 1}]
    )

    assert_receive :done, 5_000

    got =
      for site <- only_sites() do
        [nif | _] = erlang(site)
        {site.count, nif.function}
      end

    assert Enum.sort(got) == [{3, :leak_dirty}, {5, :leak_dirty2}]
  end

  # ... and one code path is one site, though each process has its own
  # record of the dirty NIF it runs.
  test "a dirty NIF called by many processes at once is one site" do
    parent = self()

    pids =
      for _ <- 1..12 do
        spawn(fn ->
          LeakyNif.leak_dirty(:malloc, 4, 640)
          send(parent, :leaked)
          receive do: (:go -> :ok)
        end)
      end

    for _ <- pids, do: assert_receive(:leaked, 5_000)
    assert [%{count: 48}] = only_sites()
    Enum.each(pids, &send(&1, :go))
  end

  test "every output shows the Erlang frames: seed olds, report, folded, JSON, flame graph" do
    ErlangCallers.append(3)
    name = "Mtrace.Test.ErlangCallers.append/1"

    # the seed form has no filter: code the VM loads meanwhile (a module
    # first called) may hold an older block than this test's
    olds = Mtrace.olds(100, true)
    assert {_age, 1000, _addr, _ns, stack} = Enum.find(olds, &(elem(&1, 1) == 1000))

    assert [{_, "fixture_leak_malloc"}, {_, "leak"}, {"erlang", leak}, {"erlang", ^name} | _] =
             stack

    assert leak == "Mtrace.Test.LeakyNif.leak/3"

    report = ExUnit.CaptureIO.capture_io(fn -> Mtrace.report(lib: @lib) end)
    assert report =~ "    #{name} (#{@callers}:#{call_line("append")})\n"
    refute report =~ "beam_jit_call_nif"

    dir = Path.join(System.tmp_dir!(), "mtrace_erlang_#{System.unique_integer([:positive])}")
    File.mkdir_p!(dir)
    on_exit(fn -> File.rm_rf!(dir) end)
    folded = Path.join(dir, "out.folded")
    :ok = Mtrace.export(folded, lib: @lib)

    assert File.read!(folded) =~
             ";#{name};Mtrace.Test.LeakyNif.leak/3;leak;fixture_leak_malloc 3000\n"

    json = Path.join(dir, "out.json")
    :ok = Mtrace.export(json, lib: @lib, format: :json)
    assert File.read!(json) =~ ~s|"name":"#{name}"|
    svg = Path.join(dir, "out.svg")
    :ok = Mtrace.flamegraph(svg, lib: @lib)
    assert File.read!(svg) =~ ">#{name}<"
  end

  @tag :peer
  test "8 schedulers of concurrent NIF calls, normal and dirty: exact counts per Erlang path" do
    {peer, node} = Remote.start_peer(~w(+S 8:8 +SDcpu 8:8))
    on_exit(fn -> Remote.stop_peer(peer) end)
    assert 8 = :erpc.call(node, :erlang, :system_info, [:schedulers_online])
    :erpc.call(node, Mtrace, :reset, [])

    :ok = :erpc.call(node, ErlangCallers, :concurrently, [64, 25])
    sites = Mtrace.sites(node: node, lib: @lib, limit: :all)
    assert %{erlang_frames: true} = Mtrace.stats(node: node)

    by_caller =
      sites
      |> Enum.group_by(fn site -> site |> chain(2) |> Enum.map(&elem(&1, 1)) end)
      |> Map.new(fn {path, group} -> {path, group |> Enum.map(& &1.count) |> Enum.sum()} end)

    assert by_caller == %{
             [:leak, :append] => 400,
             [:leak, :audit] => 400,
             [:leak_dirty, :inner] => 400,
             [:leak, :inner] => 400
           }
  end
end

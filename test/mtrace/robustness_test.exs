defmodule Mtrace.RobustnessTest do
  # Whatever a caller passes, mtrace answers with a value or a clear error and
  # the VM stays up: bad arguments, random terms, addresses of live blocks,
  # garbage in the MTRACE_* variables, child programs under the preload, and a
  # NIF library unloaded while its allocations are still live.
  #
  # Not async: the tests share the one allocation table of this VM, and the
  # randomized tests run in a working directory of their own for a while.
  use ExUnit.Case, async: false

  import Bitwise
  import ExUnit.CaptureIO
  alias Mtrace.{Frame, Mark}
  alias Mtrace.Test.{LeakyNif, Remote, ShellProbe, TermGen}

  @moduletag :capture_log
  # A call that hangs is given up on after 20 s and reported with the rest,
  # so a test may need more than ExUnit's default minute to say so.
  @moduletag timeout: 300_000

  @huge 1 <<< 70
  @mtrace_vars ~w(MTRACE_PROGRAMS MTRACE_ENABLED MTRACE_DEPTH MTRACE_SAMPLE_BYTES MTRACE_UNWIND)

  setup_all do
    Mtrace.Test.Remote.distribute!()
  end

  setup do
    LeakyNif.fresh_table(&on_exit/1)
  end

  # ---- running a call in isolation ---------------------------------------------------------

  # Runs `fun` in a process of its own, its output swallowed and exits
  # trapped (so a linked process that dies cannot take the test down), and
  # says how it ended: {:ok, value}, {:raise, exception, where}, {kind,
  # reason} for a throw or exit, {:died, reason}, or {:hang, ms}.
  defp outcome(fun, timeout \\ 20_000) do
    {:ok, io} = StringIO.open("")

    try do
      run_isolated(fun, io, timeout)
    after
      StringIO.close(io)
    end
  end

  defp run_isolated(fun, io, timeout) do
    parent = self()
    ref = make_ref()

    {pid, mon} =
      spawn_monitor(fn ->
        Process.group_leader(self(), io)
        Process.flag(:trap_exit, true)

        result =
          try do
            {:ok, fun.()}
          rescue
            e -> {:raise, e, where(__STACKTRACE__)}
          catch
            kind, reason -> {kind, reason}
          end

        send(parent, {ref, result})
      end)

    receive do
      {^ref, result} ->
        Process.demonitor(mon, [:flush])
        result

      {:DOWN, ^mon, :process, ^pid, reason} ->
        {:died, reason}
    after
      timeout ->
        Process.exit(pid, :kill)
        {:hang, timeout}
    end
  end

  defp where([{m, f, a, _} | _]), do: Exception.format_mfa(m, f, a)
  defp where(_), do: "?"

  defp describe({:raise, e, where}),
    do: "#{inspect(e.__struct__)} in #{where}: #{String.slice(Exception.message(e), 0, 200)}"

  defp describe(other), do: inspect(other, limit: 12, printable_limit: 200)

  # Starts a watcher with `opts` and stops it again; how the start ended.
  defp start_watch(opts) do
    case Mtrace.Watch.start_link(opts) do
      {:ok, pid} ->
        GenServer.stop(pid)
        :started

      :ignore ->
        :ignore

      {:error, {:already_started, _}} = already ->
        already

      {:error, reason} ->
        {:start_error, reason}
    end
  end

  # ---- 1. bad arguments --------------------------------------------------------------------

  # Each case is {label, fun, expect}: the call must raise ArgumentError whose
  # message matches the regex `expect` (it names the argument or option).
  # With {:or_ok, regex}, a normal return is fine as well: a huge value that
  # still means something ("at least 2^70 bytes") may be answered.
  defp check_cases(cases) do
    failures =
      cases
      |> Enum.map(fn {label, fun, expect} ->
        case judge(outcome(fun, 10_000), expect) do
          nil -> nil
          problem -> "  #{label}: #{problem}"
        end
      end)
      |> Enum.reject(&is_nil/1)

    assert failures == [],
           "#{length(failures)} of #{length(cases)} calls did not raise an ArgumentError " <>
             "naming the argument:\n" <> Enum.join(failures, "\n")
  end

  defp judge({:ok, {:start_error, reason}}, _expect),
    do: "start_link returned {:error, #{inspect(reason, limit: 6)}}"

  defp judge({:ok, _}, {:or_ok, _}), do: nil
  defp judge(result, {:or_ok, re}), do: judge(result, re)

  defp judge({:raise, %ArgumentError{message: message}, _}, re) do
    unless message =~ re, do: "its ArgumentError does not name it: #{inspect(message)}"
  end

  defp judge(other, _re), do: "expected ArgumentError, got " <> describe(other)

  defp opt_re(key), do: ~r/#{Regex.escape(inspect(key))}\b/

  # Values each option must refuse, and which huge values it may answer.
  defp bad_values(key) when key in [:min_age, :max_age],
    do: [-1, -0.5, :x, "1", nil, [1]] ++ or_ok([@huge, 1.0e306, 1.7976931348623157e308])

  defp bad_values(key) when key in [:min_size, :max_size],
    do: [-1, 1.5, :x, "10", nil, @huge, 1 <<< 64]

  defp bad_values(:since) do
    [
      :x,
      1,
      "mark",
      %{node: node(), t_ms: 1},
      %Mark{node: node(), t_ms: -1},
      %Mark{node: node(), t_ms: 1.5},
      %Mark{node: "node", t_ms: 1},
      # a mark from a clock 2^70 ms ahead: no mark can say that
      %Mark{node: node(), t_ms: @huge},
      %Mark{node: node(), t_ms: 1 <<< 64}
    ]
  end

  defp bad_values(:lib),
    do: ["", 1, :leaky_nif, ~c"leaky_nif", :binary.copy("a", 512), "a\0b", nil]

  defp bad_values(:demangle), do: [1, nil, "true", :yes]
  defp bad_values(:node), do: [1, "node@host", nil, {:a, :b}, ~c"a@b"]
  defp bad_values(:timeout), do: [0, -1, 1.5, :x, "100", @huge, 1 <<< 32]
  defp bad_values(:sort), do: [:x, 1, "bytes", nil]
  defp bad_values(:limit), do: [0, -1, 1.5, :x, "10", nil, @huge, 1 <<< 64]
  defp bad_values(:frames), do: [0, -1, 1.5, :x] ++ or_ok([@huge])
  defp bad_values(:format), do: [:x, "json", :svg, nil]
  defp bad_values(:weight), do: [:x, "bytes", :oldest, nil]
  defp bad_values(:title), do: [:x, 1, ~c"title", {"t"}]
  defp bad_values(:width), do: [99, 0, -1, 1.5, :x, "800"] ++ or_ok([@huge, 1 <<< 1100])

  defp or_ok(values), do: Enum.map(values, &{:or_ok, &1})

  # What a bad value of option key must give, and the value itself.
  defp expectation(key, {:or_ok, value}), do: {{:or_ok, opt_re(key)}, value}
  defp expectation(key, value), do: {opt_re(key), value}

  # Keyword lists that are not keyword lists of known options.
  defp bad_lists do
    [
      {:x, ~r/options/},
      {%{limit: 1}, ~r/options/},
      {[1, 2], ~r/options/},
      {[{"limit", 1}], ~r/options/},
      {[{:limit, 1} | :tail], ~r/options/},
      {[{:min_size, 1}, {:limit}], ~r/options/},
      {[colour: :red], ~r/:colour\b/},
      {[{:"with space", 1}], ~r/:"with space"/}
    ]
  end

  # Every bad option and bad list for a function taking options `keys`.
  defp option_cases(label, call, keys) do
    per_key =
      for key <- keys, value <- bad_values(key) do
        {expect, value} = expectation(key, value)

        opts = [{key, value}]

        {"#{label}(#{inspect(opts, limit: 4, printable_limit: 20)})", fn -> call.(opts) end,
         expect}
      end

    lists =
      for {opts, re} <- bad_lists() do
        {"#{label}(#{inspect(opts)})", fn -> call.(opts) end, re}
      end

    per_key ++ lists
  end

  @filters [:since, :min_age, :max_age, :min_size, :max_size, :lib, :demangle, :node, :timeout]

  test "query options: wrong types, negative and huge numbers, unknown options" do
    check_cases(
      option_cases("Mtrace.sites", &Mtrace.sites/1, @filters ++ [:sort, :limit]) ++
        option_cases("Mtrace.olds(3, _)", &Mtrace.olds(3, &1), @filters) ++
        option_cases("Mtrace.report", &Mtrace.report/1, @filters ++ [:sort, :limit, :frames]) ++
        option_cases("Mtrace.mark", &Mtrace.mark/1, [:node, :timeout]) ++
        option_cases("Mtrace.stats", &Mtrace.stats/1, [:node, :timeout])
    )
  end

  test "options that would mean nothing are refused, not ignored" do
    # stats and mark read counters and the clock: a filter would be ignored
    assert_raise ArgumentError, ~r/unknown option :lib for Mtrace.stats\/1/, fn ->
      Mtrace.stats(lib: "leaky_nif")
    end

    assert_raise ArgumentError, ~r/unknown option :min_age for Mtrace.mark\/1/, fn ->
      Mtrace.mark(min_age: 5)
    end

    # bounds the wrong way round would match nothing
    for {fun, opts} <- [
          {&Mtrace.sites/1, [min_size: 10, max_size: 5]},
          {&Mtrace.report/1, [min_age: 10, max_age: 5]},
          {&Mtrace.olds(3, &1), [max_size: 5, min_size: 10]}
        ] do
      assert_raise ArgumentError, ~r/is greater than :max_\w+ \(5\): nothing could match/, fn ->
        fun.(opts)
      end
    end

    assert Mtrace.sites(min_size: 5, max_size: 5, lib: "no-such-lib") == []

    # each known option is listed once
    e = catch_error(Mtrace.report(foo: 1))
    assert length(Regex.scan(~r/:boot\b/, e.message)) == 1, e.message

    path = Path.join(tmp_dir("growth_outputs"), "x")

    for fun <- [&Mtrace.export/2, &Mtrace.flamegraph/2] do
      assert_raise ArgumentError, ~r/sort: :growth measures growth since a mark/, fn ->
        fun.(path, sort: :growth)
      end

      # with a window, as sites/1 and report/1 take it
      assert :ok = fun.(path, sort: :growth, window: 20)
    end

    assert_raise ArgumentError, ~r/weight: applies to format: :folded only/, fn ->
      Mtrace.export(path, format: :json, weight: :count)
    end
  end

  test "export and flamegraph: bad paths and options, and nothing written when they raise" do
    dir = tmp_dir("bad_outputs")
    path = fn name -> Path.join(dir, name) end

    export_keys = @filters ++ [:sort, :limit, :format, :weight]
    flame_keys = @filters ++ [:sort, :limit, :weight, :title, :width]

    bad_paths =
      for bad <- [nil, :atom, 1, [?/ | :x], ~c"", "", {"a"}, path.("nul\0byte")],
          {name, fun} <- [export: &Mtrace.export/1, flamegraph: &Mtrace.flamegraph/1] do
        {"Mtrace.#{name}(#{inspect(bad)})", fn -> fun.(bad) end, ~r/\bpath\b/}
      end

    check_cases(
      bad_paths ++
        option_cases("Mtrace.export(path, _)", &Mtrace.export(path.("e"), &1), export_keys) ++
        option_cases("Mtrace.flamegraph(path, _)", &Mtrace.flamegraph(path.("f"), &1), flame_keys)
    )

    # only the calls that returned wrote a file, each at its path
    assert File.ls!(dir) -- ["e", "f"] == []
  end

  test "positional arguments of olds and cluster" do
    olds =
      for n <- [-1, 1.5, :x, "10", nil, [1], @huge, 1 <<< 64],
          {form, fun} <- [
            {"", &Mtrace.olds(&1)},
            {", true", &Mtrace.olds(&1, true)},
            {", []", &Mtrace.olds(&1, [])}
          ] do
        {"Mtrace.olds(#{inspect(n)}#{form})", fn -> fun.(n) end, ~r/\bn must\b/}
      end

    demangle =
      for d <- [:yes, nil, 1, "true", %{}, {true}] do
        {"Mtrace.olds(1, #{inspect(d)})", fn -> Mtrace.olds(1, d) end, ~r/demangle/}
      end

    funs =
      for f <- [:halt, 1, "stats", nil, :olds_where] do
        {"Mtrace.cluster(#{inspect(f)})", fn -> Mtrace.cluster(f) end, ~r/\bfun\b/}
      end

    args =
      for a <- [:x, %{}, {1}, [1 | 2], [1, 2, 3], [[limit: 1], :extra], [limit: 1]] do
        {"Mtrace.cluster(:sites, #{inspect(a)})", fn -> Mtrace.cluster(:sites, a) end,
         ~r/\bargs\b/}
      end

    timeouts =
      for t <- [-1, 0, 1.5, :x, "100", @huge] do
        {"Mtrace.cluster(:stats, [], #{inspect(t)})", fn -> Mtrace.cluster(:stats, [], t) end,
         ~r/\btimeout\b/}
      end

    check_cases(olds ++ demangle ++ funs ++ args ++ timeouts)

    # An argument that is wrong for the function cluster runs is that
    # function's ArgumentError, raised or given as the answer of every node.
    for {fun, args} <- [olds: [-1], sites: [[limit: 0]], mark: [[timeout: 0]], stats: [:x]] do
      case outcome(fn -> Mtrace.cluster(fun, args) end) do
        {:raise, %ArgumentError{}, _} ->
          :ok

        {:ok, per_node} ->
          assert %{} = per_node
          assert {:error, %ArgumentError{}} = per_node[node()]

          for {node, answer} <- per_node do
            assert match?({:error, %ArgumentError{}}, answer),
                   "cluster(#{inspect(fun)}, #{inspect(args)}) on #{node}: #{inspect(answer)}"
          end

        other ->
          flunk("cluster(#{inspect(fun)}, #{inspect(args)}): " <> describe(other))
      end
    end
  end

  test "Mtrace.Watch.start_link/1 options" do
    positive = [0, -1, 1.5, :x, "10", nil]

    cases =
      for {key, values} <- [
            interval: positive ++ [@huge] ++ or_ok([1 <<< 32]),
            intervals: positive ++ or_ok([@huge]),
            limit: positive ++ [@huge, 1 <<< 64],
            min_growth: [-1, 1.5, :x, "10", nil] ++ or_ok([@huge]),
            name: [1, "watch", {:bad}, [:a]]
          ],
          value <- values do
        {expect, value} = expectation(key, value)

        # a name of its own, unless the name is what is tested
        opts = if key == :name, do: [{key, value}], else: [{key, value}, {:name, nil}]

        {"Mtrace.Watch.start_link(#{inspect(opts)})", fn -> start_watch(opts) end, expect}
      end

    lists =
      for {opts, re} <- bad_lists() do
        {"Mtrace.Watch.start_link(#{inspect(opts)})", fn -> start_watch(opts) end, re}
      end

    check_cases(cases ++ lists)
  end

  test "Mtrace.VM: bad arguments and options" do
    attrs = [:x, "memory", 1, nil, :binary]
    counts = [0, -1, 1.5, :x, "10", nil]

    cases =
      Enum.flat_map(attrs, fn a ->
        [
          {"Mtrace.VM.top(#{inspect(a)})", fn -> Mtrace.VM.top(a) end, ~r/\battr\b/},
          {"Mtrace.VM.window(#{inspect(a)}, 1, 0)", fn -> Mtrace.VM.window(a, 1, 0) end,
           ~r/\battr\b/}
        ]
      end) ++
        Enum.flat_map(counts, fn n ->
          [
            {"Mtrace.VM.top(:memory, #{inspect(n)})", fn -> Mtrace.VM.top(:memory, n) end,
             ~r/\bn\b/},
            {"Mtrace.VM.window(:memory, #{inspect(n)}, 0)",
             fn -> Mtrace.VM.window(:memory, n, 0) end, ~r/\bn\b/},
            {"Mtrace.VM.bin_leak(#{inspect(n)})", fn -> Mtrace.VM.bin_leak(n) end, ~r/\bn\b/},
            {"Mtrace.VM.ets_top(#{inspect(n)})", fn -> Mtrace.VM.ets_top(n) end, ~r/\bn\b/}
          ]
        end) ++
        [
          {"Mtrace.VM.top(:memory, huge)", fn -> Mtrace.VM.top(:memory, @huge) end,
           {:or_ok, ~r/\bn\b/}},
          {"Mtrace.VM.ets_top(huge)", fn -> Mtrace.VM.ets_top(@huge) end, {:or_ok, ~r/\bn\b/}},
          {"Mtrace.VM.bin_leak(huge)", fn -> Mtrace.VM.bin_leak(@huge) end, {:or_ok, ~r/\bn\b/}}
        ] ++
        for by <- [:x, "memory", 1, nil] do
          {"Mtrace.VM.ets_top(1, #{inspect(by)})", fn -> Mtrace.VM.ets_top(1, by) end, ~r/\bby\b/}
        end ++
        for ms <- [-1, 1.5, :x, "10", nil, @huge, 1 <<< 32] do
          {"Mtrace.VM.window(:memory, 1, #{inspect(ms)})",
           fn -> Mtrace.VM.window(:memory, 1, ms) end, ~r/\bms\b/}
        end ++
        for {key, values} <- [
              window: [0, -1, 1.5, :x, "10", @huge, 1 <<< 32],
              gc: [1, :x, nil, "true"],
              print: [1, :x, nil, "false"],
              node: [1, "node@host", {:a}],
              timeout: [0, -1, 1.5, :x, "10"] ++ or_ok([@huge])
            ],
            value <- values do
          {expect, value} = expectation(key, value)

          # the option tested comes last, where it wins over print: false
          opts = [{:print, false}, {key, value}]
          {"Mtrace.VM.diagnose(#{inspect(opts)})", fn -> Mtrace.VM.diagnose(opts) end, expect}
        end ++
        for {opts, re} <- bad_lists() do
          {"Mtrace.VM.diagnose(#{inspect(opts)})", fn -> Mtrace.VM.diagnose(opts) end, re}
        end

    check_cases(cases)
  end

  test "the functions without arguments, and the defaults, still answer" do
    assert Mtrace.preloaded?() == true
    assert :ok = Mtrace.disable()
    refute Mtrace.stats().enabled
    assert :ok = Mtrace.enable()
    assert Mtrace.stats().enabled
    assert is_integer(Mtrace.reset())
    assert is_list(Mtrace.olds())
    assert is_list(Mtrace.sites())
    assert %Mark{node: node} = Mtrace.mark()
    assert node == node()
    assert {:ok, :ok} = outcome(fn -> Mtrace.report() end)
    assert %{total: _} = Mtrace.VM.memory()
    assert %{processes: {_, _}} = Mtrace.VM.counts()
    assert is_list(Mtrace.VM.allocators())
    assert is_list(Mtrace.VM.ets_top())
    assert %{verdict: _} = Mtrace.VM.diagnose(print: false)
  end

  # ---- 2. random terms ---------------------------------------------------------------------

  # Valid values for the options, drawn most of the time by TermGen.keyword/2;
  # some are valid in type and absurd in size, which the functions must also
  # answer or refuse cleanly.
  defp node_opts do
    %{
      node: fn -> Enum.random([node(), node(), :not_a_node]) end,
      timeout: fn -> Enum.random([1, 1000, 60_000, :infinity, TermGen.integer()]) end
    }
  end

  defp query_opts(mark) do
    number = fn -> Enum.random([0, 1, 2.5, 3600, TermGen.integer(), TermGen.float()]) end
    size = fn -> Enum.random([0, 1, 100, 4096, TermGen.integer()]) end

    Map.merge(node_opts(), %{
      since: fn ->
        Enum.random([
          mark,
          mark,
          %Mark{node: :elsewhere@nohost, t_ms: 1},
          %Mark{node: node(), t_ms: TermGen.integer()}
        ])
      end,
      min_age: number,
      max_age: number,
      min_size: size,
      max_size: size,
      lib: fn ->
        Enum.random(["leaky_nif", "beam.smp", "libc", "no-such-lib", TermGen.binary()])
      end,
      demangle: fn -> Enum.random([true, false]) end
    })
  end

  defp sites_opts(mark) do
    Map.merge(query_opts(mark), %{
      sort: fn -> Enum.random([:bytes, :count, :oldest]) end,
      limit: fn -> Enum.random([1, 3, 10, :all, TermGen.integer()]) end
    })
  end

  defp report_opts(mark),
    do: Map.put(sites_opts(mark), :frames, fn -> Enum.random([1, 3, TermGen.integer()]) end)

  defp export_opts(mark) do
    Map.merge(sites_opts(mark), %{
      format: fn -> Enum.random([:folded, :json]) end,
      weight: fn -> Enum.random([:bytes, :count]) end
    })
  end

  defp flamegraph_opts(mark) do
    Map.merge(sites_opts(mark), %{
      weight: fn -> Enum.random([:bytes, :count]) end,
      title: fn -> TermGen.binary() end,
      width: fn -> Enum.random([100, 800, 1200, TermGen.integer()]) end
    })
  end

  defp watch_opts do
    %{
      interval: fn -> Enum.random([1, 50, 60_000, TermGen.integer()]) end,
      intervals: fn -> Enum.random([1, 3, TermGen.integer()]) end,
      min_growth: fn -> Enum.random([0, 1024, TermGen.integer()]) end,
      limit: fn -> Enum.random([1, 5, TermGen.integer()]) end,
      name: fn -> Enum.random([nil, nil, :mtrace_robustness_watch]) end
    }
  end

  defp diagnose_opts do
    %{
      window: fn -> Enum.random([1, 5, TermGen.integer()]) end,
      gc: fn -> Enum.random([:auto, true, false]) end,
      print: fn -> Enum.random([true, false]) end,
      node: fn -> Enum.random([nil, node(), :not_a_node]) end,
      timeout: fn -> Enum.random([1, 1000, :infinity, TermGen.integer()]) end
    }
  end

  # Mostly options drawn from `known`, sometimes any term at all.
  defp opts_or_term(known) do
    if :rand.uniform(5) == 1, do: TermGen.term(), else: TermGen.keyword(known)
  end

  defp count_or_term do
    if :rand.uniform(5) <= 3, do: :rand.uniform(50) - 1, else: TermGen.term()
  end

  defp attr_or_term do
    if :rand.uniform(5) <= 3, do: Enum.random(Mtrace.VM.Procs.attrs()), else: TermGen.term()
  end

  # A valid duration in milliseconds would really be waited for: keep those
  # short. Anything else (wrong types, 2^32 and more) is left as it is.
  defp short_ms(ms) when is_integer(ms) and ms >= 0 and ms < 1 <<< 32, do: rem(ms, 5)
  defp short_ms(other), do: other

  defp short_windows(opts) when is_list(opts) do
    if proper_list?(opts) do
      Enum.map(opts, fn
        {:window, ms} -> {:window, short_ms(ms)}
        other -> other
      end)
    else
      opts
    end
  end

  defp short_windows(other), do: other

  defp proper_list?([]), do: true
  defp proper_list?([_ | tail]), do: proper_list?(tail)
  defp proper_list?(_), do: false

  # A file name inside the output directory: random bytes (invalid UTF-8
  # included), no "/" and no NUL, never "." or "..".
  defp file_name do
    name =
      :rand.uniform(16)
      |> TermGen.bytes()
      |> :binary.bin_to_list()
      |> Enum.map(fn b -> if b in [0, ?/], do: ?_, else: b end)
      |> :binary.list_to_bin()

    if name in [".", ".."], do: "dots", else: name
  end

  # The path argument of export/flamegraph: a file in `dir`, "" or a term
  # that no file API takes as a path (never a binary, charlist or atom).
  defp path_arg(dir) do
    case :rand.uniform(10) do
      n when n <= 8 -> Path.join(dir, file_name())
      9 -> ""
      10 -> not_a_path()
    end
  end

  defp not_a_path do
    term = TermGen.term()
    if is_binary(term) or is_list(term) or is_atom(term), do: not_a_path(), else: term
  end

  # {module, function, args} of one random call of `target`.
  defp random_call(target, ctx) do
    case target do
      "olds/1" ->
        {Mtrace, :olds, [count_or_term()]}

      "olds/2" ->
        second = Enum.random([true, false, TermGen.keyword(query_opts(ctx.mark)), TermGen.term()])

        {Mtrace, :olds, [count_or_term(), second]}

      "sites/1" ->
        {Mtrace, :sites, [short_windows(opts_or_term(sites_opts(ctx.mark)))]}

      "mark/1" ->
        {Mtrace, :mark, [opts_or_term(node_opts())]}

      "stats/1" ->
        {Mtrace, :stats, [opts_or_term(node_opts())]}

      "report/1" ->
        {Mtrace, :report, [short_windows(opts_or_term(report_opts(ctx.mark)))]}

      "export/1,2" ->
        path = path_arg(ctx.dir)

        if :rand.uniform(5) == 1,
          do: {Mtrace, :export, [path]},
          else: {Mtrace, :export, [path, short_windows(opts_or_term(export_opts(ctx.mark)))]}

      "flamegraph/1,2" ->
        path = path_arg(ctx.dir)

        if :rand.uniform(5) == 1,
          do: {Mtrace, :flamegraph, [path]},
          else:
            {Mtrace, :flamegraph, [path, short_windows(opts_or_term(flamegraph_opts(ctx.mark)))]}

      "cluster/1..3" ->
        fun =
          if :rand.uniform(4) <= 3,
            do: Enum.random([:stats, :sites, :olds, :mark, :reset, :enable, :preloaded?]),
            else: TermGen.term()

        args =
          Enum.random([
            [],
            [short_windows(TermGen.keyword(sites_opts(ctx.mark)))],
            [:rand.uniform(10)],
            TermGen.term()
          ])

        timeout = Enum.random([1000, 60_000, :infinity, TermGen.term()])
        {Mtrace, :cluster, Enum.take([fun, args, timeout], :rand.uniform(3))}

      "Watch.start_link/1" ->
        {Mtrace.Watch, :start_link, [opts_or_term(watch_opts())]}

      "VM.top/1,2" ->
        {Mtrace.VM, :top, Enum.take([attr_or_term(), count_or_term()], :rand.uniform(2))}

      "VM.window/3" ->
        {Mtrace.VM, :window, [attr_or_term(), count_or_term(), short_ms(count_or_term())]}

      "VM.bin_leak/1" ->
        {Mtrace.VM, :bin_leak, [count_or_term()]}

      "VM.ets_top/0..2" ->
        by = if :rand.uniform(2) == 1, do: Enum.random([:memory, :size]), else: TermGen.term()
        {Mtrace.VM, :ets_top, Enum.take([count_or_term(), by], :rand.uniform(3) - 1)}

      "VM.diagnose/1" ->
        {Mtrace.VM, :diagnose, [short_windows(opts_or_term(diagnose_opts()))]}

      "VM.nif_memory/1" ->
        {Mtrace.VM, :nif_memory, [short_windows(opts_or_term(nif_memory_opts()))]}

      "top/1" ->
        {Mtrace, :top, [short_intervals(opts_or_term(top_opts()))]}
    end
  end

  defp nif_memory_opts do
    %{
      window: fn -> Enum.random([1, 5, TermGen.integer()]) end,
      limit: fn -> Enum.random([1, 10, TermGen.integer()]) end
    }
  end

  defp top_opts do
    %{
      interval: fn -> Enum.random([100, 150, TermGen.integer()]) end,
      rows: fn -> Enum.random([1, 5, TermGen.integer()]) end,
      ansi: fn -> Enum.random([true, false, nil]) end,
      node: fn -> Enum.random([nil, node(), :not_a_node]) end,
      timeout: fn -> Enum.random([1000, TermGen.integer()]) end
    }
  end

  # Valid intervals kept short, and the view stopped after one refresh.
  defp short_intervals(opts) when is_list(opts) do
    if proper_list?(opts) and Keyword.keyword?(opts) do
      Enum.map(opts, fn
        {:interval, ms} when is_integer(ms) and ms >= 100 and ms < 1 <<< 32 -> {:interval, 100}
        other -> other
      end) ++ [refreshes: 1]
    else
      opts
    end
  end

  defp short_intervals(other), do: other

  defp invoke(Mtrace.Watch, :start_link, [opts]), do: start_watch(opts)
  defp invoke(Mtrace, :top, [opts]) when is_list(opts), do: quiet_top(opts)
  defp invoke(m, f, args), do: apply(m, f, args)

  # The outcomes a call may have: a value, ArgumentError or Mtrace.Error.
  # cluster's answer holds one outcome per node, judged the same way; a
  # watcher must start, be ignored, or find its name taken.
  defp acceptable?({:ok, {:start_error, _}}, Mtrace.Watch), do: false

  defp acceptable?({:ok, per_node}, :cluster) when is_map(per_node) do
    Enum.all?(per_node, fn
      {_node, {:ok, _}} -> true
      {_node, {:error, %ArgumentError{}}} -> true
      {_node, {:error, %Mtrace.Error{}}} -> true
      _ -> false
    end)
  end

  defp acceptable?({:ok, _}, _), do: true
  defp acceptable?({:raise, %ArgumentError{}, _}, _), do: true
  defp acceptable?({:raise, %Mtrace.Error{}, _}, _), do: true
  defp acceptable?(_, _), do: false

  # What went wrong, for grouping the failures of a run.
  defp kind({:raise, e, where}), do: "#{inspect(e.__struct__)} in #{where}"

  defp kind({:ok, {:start_error, reason}}),
    do: "start_link: {:error, #{inspect(reason, limit: 2)}}"

  defp kind({:ok, per_node}) when is_map(per_node) do
    errors =
      for {_, {:error, %mod{}}} <- per_node, mod not in [ArgumentError, Mtrace.Error], do: mod

    "a node answered with #{inspect(Enum.uniq(errors))}"
  end

  defp kind({class, _}), do: "#{class}"

  defp call_text({m, f, args}) do
    "#{inspect(m)}.#{f}(" <>
      Enum.map_join(args, ", ", &inspect(&1, limit: 8, printable_limit: 40)) <> ")"
  end

  # {function, calls}
  @fuzz [
    {"olds/1", 500},
    {"olds/2", 500},
    {"sites/1", 500},
    {"mark/1", 300},
    {"stats/1", 500},
    {"report/1", 400},
    {"export/1,2", 400},
    {"flamegraph/1,2", 400},
    {"cluster/1..3", 500},
    {"Watch.start_link/1", 300},
    {"VM.top/1,2", 300},
    {"VM.window/3", 300},
    {"VM.bin_leak/1", 100},
    {"VM.ets_top/0..2", 300},
    {"VM.diagnose/1", 200},
    {"VM.nif_memory/1", 100},
    {"top/1", 100}
  ]

  for {target, cases} <- @fuzz do
    test "random terms: #{target}" do
      fuzz(unquote(target), unquote(cases))
    end
  end

  defp fuzz(target, cases) do
    seed = ExUnit.configuration()[:seed]
    TermGen.seed(seed, target)
    dir = tmp_dir("fuzz")
    # a working directory of its own: a relative path written by mistake
    # would land there
    cwd = tmp_dir("fuzz_cwd")
    home = File.cwd!()
    before = File.ls!(home)
    ctx = %{mark: Mtrace.mark(), dir: dir}

    results =
      try do
        File.cd!(cwd)

        for _ <- 1..cases do
          {m, f, args} = call = random_call(target, ctx)
          result = outcome(fn -> invoke(m, f, args) end)
          {call, result}
        end
      after
        File.cd!(home)
      end

    # the generator reaches both the checks and the work behind them
    answered = Enum.count(results, &match?({_, {:ok, _}}, &1))
    refused = Enum.count(results, &match?({_, {:raise, %ArgumentError{}, _}}, &1))

    assert answered >= div(cases, 10) and refused >= div(cases, 10),
           "#{target}: #{answered} answers and #{refused} ArgumentErrors in #{cases} calls"

    bad =
      for {{m, f, _} = call, result} <- results,
          not acceptable?(result, if(m == Mtrace and f == :cluster, do: :cluster, else: m)),
          do: {call, result}

    report =
      bad
      |> Enum.group_by(fn {_, result} -> kind(result) end)
      |> Enum.map_join("\n", fn {kind, [{call, result} | _] = all} ->
        "  #{kind} (#{length(all)} calls), e.g.\n    #{call_text(call)}\n    -> #{describe(result)}"
      end)

    assert bad == [],
           "#{length(bad)} of #{cases} random calls of #{target} ended other than with a value, " <>
             "ArgumentError or Mtrace.Error (seed #{seed}):\n" <> report

    # files only where the caller said: in `dir`, at names that were passed
    assert File.ls!(cwd) == []
    assert File.ls!(home) -- before == []
    passed = for {{_, _, [p | _]}, _} <- results, is_binary(p), do: Path.basename(p)
    assert File.ls!(dir) -- passed == []

    # the node and the tracer are fine (the calls may have reset the table
    # or turned tracking off: cluster(:reset), cluster(:disable))
    Mtrace.enable()
    assert %{active: true, enabled: true} = Mtrace.stats()
    LeakyNif.leak(:malloc, 2, 1001)
    assert [%{count: 2}] = Mtrace.sites(min_size: 1001, max_size: 1001, lib: "leaky_nif")
  end

  # ---- 3. addresses ------------------------------------------------------------------------

  # No public function frees, writes or reads memory at an address the
  # caller gives. What is checked:
  #
  #   * the public surface of Mtrace and of its NIF module Mtrace.Native is
  #     exactly the functions listed here, so a function added later fails
  #     this test until it is reviewed for taking an address;
  #   * the address of a live block (as olds/2 reports it) is passed in every
  #     argument position of every function of Mtrace, Mtrace.Native,
  #     Mtrace.VM and Mtrace.Watch.start_link/1, the other arguments valid:
  #     each call raises ArgumentError or returns, and where the value is a
  #     count, a size, a time or a limit, the answer shows it was read as one
  #     (olds(addr) lists every live block, min_size: addr none);
  #   * afterwards the blocks are still live in the table at their addresses
  #     with their sizes, so nothing freed them through the allocator, and
  #     their owner frees them without glibc aborting on a double free.
  #
  # A write into a block cannot be seen from here; that no argument is ever
  # taken as an address is what rules it out. Durations are left out: an
  # address as a number of milliseconds is a wait of thousands of years
  # (VM.window/3's ms, diagnose's window:, Watch's interval:), and their
  # huge values are the bad-argument tests' business.
  test "no public function takes an address: a live block's address is a number or refused" do
    size = 48_611
    LeakyNif.leak(:malloc, 3, size)
    addrs = for {_, ^size, addr, _, _} <- Mtrace.olds(1_000_000), do: addr
    assert length(addrs) == 3
    a = Enum.max(addrs)
    assert a > 1 <<< 32

    assert Enum.sort(Mtrace.__info__(:functions)) ==
             Enum.sort(
               cluster: 1,
               cluster: 2,
               cluster: 3,
               disable: 0,
               enable: 0,
               export: 1,
               export: 2,
               flamegraph: 1,
               flamegraph: 2,
               mark: 0,
               mark: 1,
               olds: 0,
               olds: 1,
               olds: 2,
               preloaded?: 0,
               report: 0,
               report: 1,
               reset: 0,
               sites: 0,
               sites: 1,
               stats: 0,
               stats: 1,
               top: 0,
               top: 1
             )

    assert Enum.sort(Mtrace.Native.__info__(:functions)) ==
             Enum.sort(
               load: 0,
               load_error: 0,
               now_ms: 0,
               olds: 5,
               preloaded: 0,
               check_erlang_frames: 0,
               erlang_layout: 1,
               erlang_layout_dirty: 1,
               reset: 0,
               set_enabled: 1,
               sites: 5,
               stats: 0,
               stats: 1
             )

    dir = tmp_dir("addresses")
    out = Path.join(dir, "out")
    nofilter = {nil, nil, nil, nil, nil, nil}

    option_calls =
      for {label, call, keys} <- [
            {"sites", &Mtrace.sites/1, @filters ++ [:sort, :limit]},
            {"olds(3, _)", &Mtrace.olds(3, &1), @filters},
            {"report", &Mtrace.report/1, @filters ++ [:sort, :limit, :frames]},
            {"export(out, _)", &Mtrace.export(out, &1),
             @filters ++ [:sort, :limit, :format, :weight]},
            {"flamegraph(out, _)", &Mtrace.flamegraph(out, &1),
             @filters ++ [:sort, :limit, :weight, :title, :width]},
            {"mark", &Mtrace.mark/1, [:node, :timeout]},
            {"stats", &Mtrace.stats/1, [:node, :timeout]},
            {"Watch.start_link", &start_watch([{:name, nil} | &1]),
             [:intervals, :min_growth, :limit]},
            {"Watch.start_link", &start_watch/1, [:name]},
            {"VM.diagnose", &Mtrace.VM.diagnose([{:print, false} | &1]),
             [:gc, :print, :node, :timeout]},
            {"VM.nif_memory", &Mtrace.VM.nif_memory/1, [:window, :limit]},
            # one refresh, so that a number taken as such does not keep it running
            {"top", &quiet_top/1, [:interval, :node, :rows, :ansi, :timeout]}
          ],
          key <- keys do
        {"#{label}(#{key}: addr)", fn -> call.([{key, a}]) end}
      end

    positional = [
      {"olds(addr)", fn -> Mtrace.olds(a) end},
      {"olds(addr, true)", fn -> Mtrace.olds(a, true) end},
      {"olds(addr, [])", fn -> Mtrace.olds(a, []) end},
      {"olds(1, addr)", fn -> Mtrace.olds(1, a) end},
      {"export(addr)", fn -> Mtrace.export(a) end},
      {"export(addr, [])", fn -> Mtrace.export(a, []) end},
      {"export(out, addr)", fn -> Mtrace.export(out, a) end},
      {"flamegraph(addr)", fn -> Mtrace.flamegraph(a) end},
      {"flamegraph(out, addr)", fn -> Mtrace.flamegraph(out, a) end},
      {"sites(addr)", fn -> Mtrace.sites(a) end},
      {"report(addr)", fn -> Mtrace.report(a) end},
      {"mark(addr)", fn -> Mtrace.mark(a) end},
      {"stats(addr)", fn -> Mtrace.stats(a) end},
      {"cluster(addr)", fn -> Mtrace.cluster(a) end},
      {"cluster(:olds, addr)", fn -> Mtrace.cluster(:olds, a) end},
      {"cluster(:olds, [addr])", fn -> Mtrace.cluster(:olds, [a]) end},
      {"cluster(:stats, [], addr)", fn -> Mtrace.cluster(:stats, [], a) end},
      {"Watch.start_link(addr)", fn -> start_watch(a) end},
      {"VM.top(addr)", fn -> Mtrace.VM.top(a) end},
      {"VM.top(:memory, addr)", fn -> Mtrace.VM.top(:memory, a) end},
      {"VM.window(addr, 1, 0)", fn -> Mtrace.VM.window(a, 1, 0) end},
      {"VM.window(:memory, addr, 0)", fn -> Mtrace.VM.window(:memory, a, 0) end},
      {"VM.bin_leak(addr)", fn -> Mtrace.VM.bin_leak(a) end},
      {"VM.ets_top(addr)", fn -> Mtrace.VM.ets_top(a) end},
      {"VM.ets_top(1, addr)", fn -> Mtrace.VM.ets_top(1, a) end},
      {"VM.diagnose(addr)", fn -> Mtrace.VM.diagnose(a) end},
      {"VM.nif_memory(addr)", fn -> Mtrace.VM.nif_memory(a) end},
      {"top(addr)", fn -> Mtrace.top(a) end},
      {"Native.olds(addr, false, _, nil, :seed)",
       fn -> Mtrace.Native.olds(a, false, nofilter, nil, :seed) end},
      {"Native.olds(1, addr, ...)", fn -> Mtrace.Native.olds(1, a, nofilter, nil, :maps) end},
      {"Native.olds(1, false, addr, nil, :maps)",
       fn -> Mtrace.Native.olds(1, false, a, nil, :maps) end},
      {"Native.olds(1, false, _, addr, :maps)",
       fn -> Mtrace.Native.olds(1, false, nofilter, a, :maps) end},
      {"Native.olds(1, false, _, nil, addr)",
       fn -> Mtrace.Native.olds(1, false, nofilter, nil, a) end},
      {"Native.sites(addr, ...)", fn -> Mtrace.Native.sites(a, :bytes, false, nofilter, nil) end},
      {"Native.sites(1, addr, ...)", fn -> Mtrace.Native.sites(1, a, false, nofilter, nil) end},
      {"Native.sites(1, :bytes, addr, ...)",
       fn -> Mtrace.Native.sites(1, :bytes, a, nofilter, nil) end},
      {"Native.sites(1, :bytes, false, addr, nil)",
       fn -> Mtrace.Native.sites(1, :bytes, false, a, nil) end},
      {"Native.sites(1, :bytes, false, _, addr)",
       fn -> Mtrace.Native.sites(1, :bytes, false, nofilter, a) end},
      {"Native.set_enabled(addr)", fn -> Mtrace.Native.set_enabled(a) end}
    ]

    # each element of both filter tuples of the NIF
    filter_elements =
      for i <- 0..4, f = put_elem(nofilter, i, a) do
        [
          {"Native.olds(1, false, #{inspect(f)}, nil, :maps)",
           fn -> Mtrace.Native.olds(1, false, f, nil, :maps) end},
          {"Native.sites(1, :bytes, false, #{inspect(f)}, nil)",
           fn -> Mtrace.Native.sites(1, :bytes, false, f, nil) end}
        ]
      end
      |> List.flatten()

    results =
      for {label, fun} <- option_calls ++ positional ++ filter_elements,
          do: {label, outcome(fun)}

    Mtrace.enable()

    wrong =
      for {label, result} <- results,
          not match?({:ok, _}, result) and not match?({:raise, %ArgumentError{}, _}, result),
          do: "  #{label}: #{describe(result)}"

    assert wrong == [], "calls with an address ended badly:\n" <> Enum.join(wrong, "\n")

    answers = Map.new(results)

    # read as counts and bounds, never as pointers
    for label <- ["olds(addr)", "olds(addr, true)"] do
      {:ok, olds} = answers[label]
      assert Enum.count(olds, &match?({_, ^size, _, _, _}, &1)) == 3, label
    end

    {:ok, olds} = answers["olds(addr, [])"]
    assert Enum.count(olds, &(&1.size == size)) == 3
    {:ok, olds} = answers["Native.olds(addr, false, _, nil, :seed)"]
    assert Enum.count(olds, &match?({_id, {_, ^size, _, _, _}}, &1)) == 3
    assert {:ok, []} = answers["sites(min_size: addr)"]
    assert {:ok, []} = answers["sites(min_age: addr)"]
    assert {:ok, sites} = answers["sites(limit: addr)"]
    assert Enum.any?(sites, &(&1.count == 3 and &1.bytes == 3 * size))
    assert {:ok, sites} = answers["sites(max_size: addr)"]
    assert Enum.any?(sites, &(&1.count == 3 and &1.bytes == 3 * size))
    assert {:ok, [_ | _]} = answers["VM.top(:memory, addr)"]
    assert {:ok, %{} = per_node} = answers["cluster(:olds, [addr])"]
    assert {:ok, olds} = per_node[node()]
    assert Enum.count(olds, &match?({_, ^size, _, _, _}, &1)) == 3

    # nothing freed the blocks; their owner can
    left = for {_, ^size, addr, _, _} <- Mtrace.olds(1_000_000), do: addr
    assert Enum.sort(left) == Enum.sort(addrs)
    assert LeakyNif.free_kept() == 3
    assert for({_, ^size, _, _, _} = o <- Mtrace.olds(1_000_000), do: o) == []
  end

  # ---- peers ------------------------------------------------------------------------------

  # A peer with this node's code paths. `env` is set there; MTRACE_*
  # variables not in it are unset, so that the peer runs with the defaults.
  defp start_peer(env) do
    names = for {name, _} <- env, do: to_string(name)

    unset = for var <- @mtrace_vars, var not in names, do: {String.to_charlist(var), false}

    env = for({name, value} <- env, do: {to_charlist(name), charlist_or_false(value)}) ++ unset
    {:ok, peer, node} = :peer.start_link(%{name: :peer.random_name(), env: env})
    :ok = :erpc.call(node, :code, :add_paths, [:code.get_path()])
    {peer, node}
  end

  defp charlist_or_false(false), do: false
  defp charlist_or_false(value), do: to_charlist(value)

  defp with_peer(env, fun) do
    {peer, node} = start_peer(env)

    try do
      fun.(node)
    after
      Remote.stop_peer(peer)
    end
  end

  # ---- 4. garbage in the environment -------------------------------------------------------

  # {environment, figures of stats it must give, config_errors}. README,
  # "Configuration": garbage falls back to the default, out-of-range values
  # are clamped (depth 1..128), and a value that is not understood is named
  # in config_errors. c_src/preload/config.c takes only digits as a depth: "-1" is
  # not understood (default 32, named), "100000" and "0" are numbers out of
  # range (clamped, not named).
  @env_cases [
    {[{"MTRACE_DEPTH", "abc"}], %{depth: 32}, ["MTRACE_DEPTH"]},
    {[{"MTRACE_DEPTH", "-1"}], %{depth: 32}, ["MTRACE_DEPTH"]},
    {[{"MTRACE_DEPTH", "100000"}], %{depth: 128}, []},
    {[{"MTRACE_DEPTH", "0"}], %{depth: 1}, []},
    {[{"MTRACE_SAMPLE_BYTES", "x"}], %{sample_bytes: 0, sampled: false}, ["MTRACE_SAMPLE_BYTES"]},
    {[{"MTRACE_ENABLED", "maybe"}], %{enabled: true}, ["MTRACE_ENABLED"]},
    {[{"MTRACE_UNWIND", "quick"}], %{fast_unwind: true}, ["MTRACE_UNWIND"]},
    {[{"MTRACE_ERLANG", "sometimes"}], %{erlang_frames: true}, ["MTRACE_ERLANG"]},
    {[{"MTRACE_ERLANG", "0"}],
     %{erlang_frames: false, erlang_frames_off: "off: MTRACE_ERLANG=0", erlang_stacks: 0}, []},
    {[
       {"MTRACE_DEPTH", "3x"},
       {"MTRACE_ENABLED", "perhaps"},
       {"MTRACE_SAMPLE_BYTES", "1M"},
       {"MTRACE_UNWIND", ""}
     ], %{depth: 32, enabled: true, sampled: false, fast_unwind: true},
     ["MTRACE_DEPTH", "MTRACE_ENABLED", "MTRACE_SAMPLE_BYTES"]},
    {[
       {"MTRACE_DEPTH", "deep"},
       {"MTRACE_ENABLED", "maybe"},
       {"MTRACE_SAMPLE_BYTES", "-5"},
       {"MTRACE_UNWIND", "quick"}
     ], %{depth: 32, enabled: true, sampled: false, fast_unwind: true},
     ["MTRACE_DEPTH", "MTRACE_ENABLED", "MTRACE_SAMPLE_BYTES", "MTRACE_UNWIND"]}
  ]

  test "MTRACE_* variables with garbage: defaults, clamps, and config_errors naming them" do
    results =
      @env_cases
      |> Task.async_stream(
        fn {env, _, _} ->
          with_peer(env, fn node ->
            stats = :erpc.call(node, Mtrace, :stats, [])
            # the effective settings are in force: a leak is recorded, with
            # as many frames as the depth allows
            :ok = :erpc.call(node, LeakyNif, :leak, [:malloc, 3, 5003])
            only = [lib: "leaky_nif", min_size: 5003, max_size: 5003]
            sites = :erpc.call(node, Mtrace, :sites, [only])
            {stats, sites}
          end)
        end,
        timeout: 60_000,
        max_concurrency: 3
      )
      |> Enum.zip(@env_cases)

    for {{:ok, {stats, sites}}, {env, figures, errors}} <- results do
      label = inspect(env)
      assert stats.active, label
      assert Map.take(stats, Map.keys(figures)) == figures, label
      assert stats.config_errors == errors, label

      assert [%{count: 3, bytes: 15_009, frames: frames}] = sites, label
      assert %{symbol: "fixture_leak_malloc"} = hd(frames)
      # the depth bounds the native frames and the Erlang frames each
      {erlang, native} = frames |> Enum.reject(& &1.inlined) |> Enum.split_with(&Frame.erlang?/1)
      assert erlang != [] == stats.erlang_frames, label

      for part <- [native, erlang], part != [] do
        if stats.depth == 1,
          do: assert(length(part) == 1, label),
          else: assert(length(part) > 1 and length(part) <= stats.depth, label)
      end
    end
  end

  # ---- 5. child programs -------------------------------------------------------------------

  test "os:cmd, System.cmd, ports and peers behave as without the preload" do
    here = ShellProbe.run()

    [there, bare] =
      [[], [{"LD_PRELOAD", false}]]
      |> Task.async_stream(&with_peer(&1, fn node -> :erpc.call(node, ShellProbe, :run, []) end),
        timeout: 60_000
      )
      |> Enum.map(fn {:ok, result} -> result end)

    # the setups differ as intended: a peer inherits the preload unless
    # LD_PRELOAD is removed from its environment
    assert here.preloaded and there.preloaded
    assert here.ld_preload =~ "mtrace.so"
    assert there.ld_preload == here.ld_preload
    refute bare.preloaded
    assert bare.ld_preload == nil

    # what the programs printed and how they exited does not
    results = &Map.drop(&1, [:preloaded, :ld_preload])
    assert results.(here) == results.(bare)
    assert results.(there) == results.(bare)

    # and it is right
    assert [?h, ?i, ?\n | ls] = bare.os_cmd
    assert to_string(ls) =~ "/nonexistent"
    assert bare.os_cmd_status == ~c"status=3\n"
    assert bare.system_cmd == {"out\nerr\n", 4}
    assert bare.port == {ShellProbe.pattern(70_000), 5}
  end

  # ---- 6. a NIF library unloaded while traced ----------------------------------------------

  # The fixture NIF under a new name, loaded in a peer by a module of the
  # same name as the fixture's (ERL_NIF_INIT binds the library to that
  # name) whose on_load points at the copy.
  defp nif_stub(so_path) do
    source = """
    -module('Elixir.Mtrace.Test.LeakyNif').
    -export([load/0, leak/3, leak_dirty/3, leak_dirty2/3, spin/1, churn/2, free_kept/0,
             leak_threads/3, leak_enif/3, churn_enif/2]).
    -on_load(load/0).
    load() -> erlang:load_nif("#{Path.rootname(so_path)}", 0).
    leak(_, _, _) -> erlang:nif_error(nif_not_loaded).
    leak_dirty(_, _, _) -> erlang:nif_error(nif_not_loaded).
    leak_dirty2(_, _, _) -> erlang:nif_error(nif_not_loaded).
    spin(_) -> erlang:nif_error(nif_not_loaded).
    churn(_, _) -> erlang:nif_error(nif_not_loaded).
    free_kept() -> erlang:nif_error(nif_not_loaded).
    leak_threads(_, _, _) -> erlang:nif_error(nif_not_loaded).
    leak_enif(_, _, _) -> erlang:nif_error(nif_not_loaded).
    churn_enif(_, _) -> erlang:nif_error(nif_not_loaded).
    """

    {:ok, tokens, _} = :erl_scan.string(String.to_charlist(source))

    forms =
      tokens
      |> Enum.chunk_while(
        [],
        fn
          {:dot, _} = dot, acc -> {:cont, Enum.reverse([dot | acc]), []}
          token, acc -> {:cont, [token | acc]}
        end,
        fn acc -> {:cont, acc} end
      )
      |> Enum.map(fn form ->
        {:ok, parsed} = :erl_parse.parse_form(form)
        parsed
      end)

    {:ok, LeakyNif, beam} = :compile.forms(forms, [:binary, :return_errors])
    beam
  end

  defp load_nif_copy(node, so_path) do
    beam = nif_stub(so_path)
    name = String.to_charlist(Path.basename(so_path))
    assert {:module, LeakyNif} = :erpc.call(node, :code, :load_binary, [LeakyNif, name, beam])
  end

  # The lines of /proc/<pid>/maps that map `path`.
  defp mappings(os_pid, path) do
    "/proc/#{os_pid}/maps"
    |> File.read!()
    |> String.split("\n")
    |> Enum.filter(&String.ends_with?(&1, " " <> path))
  end

  defp executable?(line), do: line |> String.split() |> Enum.at(1) |> String.contains?("x")

  # Checks `fun` until it is true, a bounded number of times.
  defp eventually(fun, tries \\ 100) do
    cond do
      fun.() -> true
      tries == 0 -> false
      true -> Process.sleep(20) && eventually(fun, tries - 1)
    end
  end

  test "mtrace's own NIF purged and loaded again: what it read of other files goes with it" do
    dir = tmp_dir("own_reload")
    src = Path.expand(Path.join(System.get_env("MTRACE_BUILD", "_build/c"), "leaky_nif.so"))
    copy = Path.join(dir, "leaky_named_#{System.unique_integer([:positive])}.so")
    File.cp!(src, copy)

    with_peer([], fn node ->
      os_pid = :erpc.call(node, :os, :getpid, [])
      load_nif_copy(node, copy)
      :ok = :erpc.call(node, LeakyNif, :leak, [:malloc, 3, 4321])
      named = fn -> assert [%{count: 3}] = :erpc.call(node, Mtrace, :sites, [[lib: copy]]) end
      named.()
      # the library's own mappings and those of the symbolizer's reads
      before = length(mappings(os_pid, copy))

      for _ <- 1..3 do
        :erpc.call(node, :code, :delete, [Mtrace.Native])
        :erpc.call(node, :code, :purge, [Mtrace.Native])
        {:module, _} = :erpc.call(node, :code, :load_file, [Mtrace.Native])
        named.()
      end

      # before, each instance's reads stayed mapped (one more mapping each)
      assert length(mappings(os_pid, copy)) == before
    end)
  end

  test "a NIF library unloaded, Erlang frames on: its frames stay, nameless, and its stacks apart" do
    dir = tmp_dir("nif_unload_erl")
    src = Path.expand(Path.join(System.get_env("MTRACE_BUILD", "_build/c"), "leaky_nif.so"))
    copy = Path.join(dir, "leaky_erl_#{System.unique_integer([:positive])}.so")
    File.cp!(src, copy)
    size = 66_663
    only = [min_size: size, max_size: size]

    with_peer([], fn node ->
      assert %{erlang_frames: true} = :erpc.call(node, Mtrace, :stats, [])
      load_nif_copy(node, copy)
      :ok = :erpc.call(node, LeakyNif, :leak, [:malloc, 3, size])
      # calloc(n, 3): the same size from another function
      :ok = :erpc.call(node, LeakyNif, :leak, [:calloc, 2, div(size, 3)])
      loaded = :erpc.call(node, Mtrace, :sites, [only])
      assert [%{count: 3}, %{count: 2}] = loaded
      ours = fn frames -> for %{lib: ^copy, addr: a} <- frames, do: a end
      assert Enum.all?(loaded, &(length(ours.(&1.frames)) >= 2))

      assert :erpc.call(node, :code, :delete, [LeakyNif])
      :erpc.call(node, :code, :purge, [LeakyNif])

      # the library's frames are still there, nameless, so the two stacks
      # (malloc's and calloc's) stay two sites, told apart by address
      assert [a, b] = :erpc.call(node, Mtrace, :sites, [only])
      assert {a.count, b.count} == {3, 2}
      assert a.frames != b.frames

      for {site, was} <- Enum.zip([a, b], loaded) do
        addrs = ours.(was.frames)
        gone = Enum.take(site.frames, length(addrs))
        assert Enum.map(gone, & &1.addr) == addrs
        assert Enum.all?(gone, &match?(%{lib: nil, symbol: nil}, &1))
      end
    end)
  end

  test "a NIF library unloaded while its allocations live: stacks into it lose their names" do
    dir = tmp_dir("nif_reload")
    src = Path.expand(Path.join(System.get_env("MTRACE_BUILD", "_build/c"), "leaky_nif.so"))
    copy = Path.join(dir, "leaky_copy_#{System.unique_integer([:positive])}.so")
    again = Path.join(dir, "leaky_again_#{System.unique_integer([:positive])}.so")
    File.cp!(src, copy)
    File.cp!(src, again)
    size = 77_773

    with_peer([], fn node ->
      os_pid = :erpc.call(node, :os, :getpid, [])
      load_nif_copy(node, copy)
      assert Enum.any?(mappings(os_pid, copy), &executable?/1)

      :ok = :erpc.call(node, LeakyNif, :leak, [:malloc, 5, size])
      assert [%{count: 5, frames: frames}] = :erpc.call(node, Mtrace, :sites, [[lib: copy]])
      assert [%{lib: ^copy, symbol: "fixture_leak_malloc"} | _] = frames
      in_copy = for %{lib: ^copy, addr: addr} <- frames, do: addr
      assert length(in_copy) >= 2

      # unload: the module's code goes, and with it the library (dlclose)
      assert :erpc.call(node, :code, :delete, [LeakyNif])
      :erpc.call(node, :code, :purge, [LeakyNif])
      refute :erpc.call(node, :code, :is_loaded, [LeakyNif])

      assert eventually(fn -> not Enum.any?(mappings(os_pid, copy), &executable?/1) end),
             "#{copy} is still mapped executable:\n" <> Enum.join(mappings(os_pid, copy), "\n")

      # the blocks are still live; their stacks point into unmapped memory
      assert :erpc.call(node, Mtrace, :sites, [[lib: copy]]) == []
      only = [min_size: size, max_size: size]

      assert [%{count: 5, frames: frames}] =
               :erpc.call(node, Mtrace, :sites, [[limit: :all] ++ only])

      unnamed = for %{addr: addr} = f <- frames, addr in in_copy, do: f
      assert length(unnamed) == length(in_copy)

      for f <- unnamed do
        assert %{lib: nil, symbol: nil, file: nil, line: nil} = f
      end

      olds = :erpc.call(node, Mtrace, :olds, [100, only])
      assert length(olds) == 5

      for %{frames: frames} <- olds, %{addr: addr} = f <- frames, addr in in_copy do
        assert %{lib: nil, symbol: nil} = f
      end

      tuples =
        for {_, ^size, _, _, stack} <- :erpc.call(node, Mtrace, :olds, [100_000, true]),
            do: stack

      assert length(tuples) == 5
      assert Enum.all?(tuples, &match?([{nil, nil}, {nil, nil} | _], &1))

      # the outputs cope with nameless frames
      report = capture_io(fn -> assert :ok = :erpc.call(node, Mtrace, :report, [only]) end)
      assert report =~ "5 blocks"
      assert report =~ "??"
      assert :ok = :erpc.call(node, Mtrace, :flamegraph, [Path.join(dir, "g.svg"), only])
      assert :ok = :erpc.call(node, Mtrace, :export, [Path.join(dir, "e.json"), [format: :json]])
      assert File.read!(Path.join(dir, "g.svg")) =~ "??"

      # and nothing of the copy stays mapped once the names were looked up again
      assert mappings(os_pid, copy) == []

      # loaded again under another name, the library's new stacks are named
      # again; the old ones stay nameless, also where the loader placed the
      # new copy at the first one's addresses (it usually does)
      load_nif_copy(node, again)
      :ok = :erpc.call(node, LeakyNif, :leak, [:malloc, 2, size + 2])

      assert [%{count: 2, frames: [%{lib: ^again, symbol: "fixture_leak_malloc"} | _]}] =
               :erpc.call(node, Mtrace, :sites, [[lib: again]])

      assert [%{count: 5, frames: frames}] =
               :erpc.call(node, Mtrace, :sites, [[limit: :all] ++ only])

      assert Enum.all?(frames, &(&1.addr not in in_copy or &1.lib == nil)), inspect(frames)

      assert %{active: true, live_count: live} = :erpc.call(node, Mtrace, :stats, [])
      assert live >= 7
    end)

    assert %{active: true} = Mtrace.stats()
  end

  # ---- helpers ----------------------------------------------------------------------------

  defp quiet_top(opts) do
    capture_io(fn -> send(self(), {:top, Mtrace.top(opts ++ [refreshes: 1])}) end)
    assert_received {:top, result}
    result
  end

  defp tmp_dir(what) do
    dir = Path.join(System.tmp_dir!(), "mtrace_#{what}_#{System.unique_integer([:positive])}")
    File.mkdir_p!(dir)
    on_exit(fn -> File.rm_rf(dir) end)
    dir
  end
end

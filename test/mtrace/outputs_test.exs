defmodule Mtrace.OutputsTest do
  # report/1, export/2 and flamegraph/2 on the live table of this VM.
  use ExUnit.Case, async: false

  import ExUnit.CaptureIO
  import ExUnit.CaptureLog
  require Record
  alias Mtrace.Test.{JSONParser, LeakyNif, Remote}

  Record.defrecordp(
    :xml_element,
    :xmlElement,
    Record.extract(:xmlElement, from_lib: "xmerl/include/xmerl.hrl")
  )

  @lib "leaky_nif"

  setup do
    LeakyNif.free_kept()
    Mtrace.enable()
    Mtrace.reset()
    LeakyNif.leak(:malloc, 7, 3001)
    LeakyNif.leak(:calloc, 50, 100)
    LeakyNif.leak(:strdup, 3, 99)
    dir = Path.join(System.tmp_dir!(), "mtrace_outputs_#{System.unique_integer([:positive])}")
    File.mkdir_p!(dir)

    on_exit(fn ->
      LeakyNif.free_kept()
      File.rm_rf(dir)
    end)

    %{dir: dir}
  end

  test "report/1 prints the top sites with sizes, ages and file:line frames" do
    out = capture_io(fn -> assert :ok = Mtrace.report(lib: @lib, limit: 2, frames: 2) end)
    lines = String.split(out, "\n", trim: true)
    # filtered: what matches first, the node's whole after it, within 80 columns
    {head, rest} = Enum.split_while(lines, &(not String.starts_with?(&1, "#1 ")))
    head = head |> Enum.map_join(" ", &String.trim/1)
    assert head =~ ~r/^Native memory live on #{node()}: [\d.]+ KiB in \d+ blocks with a frame in/
    assert head =~ ~r/with a frame in "leaky_nif" \(of [\d.]+ \w+ in [\d_]+ blocks in all\)$/
    assert Enum.all?(lines, &(String.length(&1) <= 80)), out
    lines = ["header" | rest]
    assert Enum.at(lines, 1) =~ ~r/^#1  20\.5 KiB in 7 blocks  oldest \d+s  newest \d+s$/

    assert Enum.at(lines, 2) =~
             ~r/^    fixture_leak_malloc \(test\/fixtures\/leaky_nif\.c:\d+\) leaky_nif\.so$/

    # the code that called the NIF (this test's setup) in the last place
    assert Enum.at(lines, 3) == "    ... 2 more"

    assert Enum.at(lines, 4) =~
             ~r/^    Mtrace\.OutputsTest\..*\(test\/mtrace\/outputs_test\.exs:22\)$/

    assert Enum.at(lines, 5) =~ ~r/^    \.\.\. \d+ more$/
    assert Enum.at(lines, 6) =~ ~r/^#2  14\.6 KiB in 50 blocks/
    refute out =~ "#3"
  end

  test "report/1's header gives size bounds as given, humanized only when exact" do
    words = fn opts ->
      capture_io(fn -> Mtrace.report([lib: @lib, limit: 1] ++ opts) end)
      |> String.replace(~r/\s*\n\s*/, " ")
    end

    assert words.(max_size: 2000) =~ "of at most 2_000 B each"
    assert words.(min_size: 2048) =~ "of at least 2.0 KiB each"
    assert words.(min_size: 100) =~ "of at least 100 B each"
  end

  test "a reset after the mark: stats give its time, report says what it forgot" do
    mark = Mtrace.mark()
    LeakyNif.leak(:malloc, 5, 1234)
    out = capture_io(fn -> Mtrace.report(since: mark, lib: @lib) end)
    refute out =~ "The table was reset"

    Mtrace.reset()
    assert %{reset_ms: reset} = Mtrace.stats()
    assert reset >= mark.t_ms
    LeakyNif.leak(:malloc, 2, 1234)
    out = capture_io(fn -> Mtrace.report(since: mark, lib: @lib) end)
    assert out =~ "2.4 KiB in 2 blocks"
    assert out |> String.replace("\n  ", " ") =~ "The table was reset (Mtrace.reset/0) within"

    # a mark taken after the reset: nothing was forgotten since
    later = Mtrace.mark()
    refute capture_io(fn -> Mtrace.report(since: later, lib: @lib) end) =~ "The table was"
  end

  test "stats name the walker in use, and the own walker's stacks given to libunwind" do
    s = Mtrace.stats()
    own = inspect(%{s | fast_unwind: true, unwind_fallbacks: 3})
    assert own =~ "own stack walker (3 to libunwind)"
    # MTRACE_UNWIND=libunwind: every stack is libunwind's, none "given" to it
    libunwind = inspect(%{s | fast_unwind: false, unwind_fallbacks: 0})
    assert libunwind =~ "; libunwind"
    refute libunwind =~ "to libunwind"
    # here libunwind is loaded; without it, what it would finish ends early
    assert s.libunwind == true

    none =
      inspect(%{s | fast_unwind: true, libunwind: false}) |> String.replace(~r/\s*\n\s*/, " ")

    assert none =~ "own stack walker (libunwind.so.8 not loaded: stacks it would finish end early"
  end

  test "export/2 :folded lines sum to the live bytes (or counts) of the sites", %{dir: dir} do
    path = Path.join(dir, "native.folded")
    assert :ok = Mtrace.export(path, lib: @lib)
    weights = folded_weights(path)
    assert Enum.sum(Map.values(weights)) == 21_007 + 15_000 + 300

    assert Enum.any?(weights, fn {stack, w} ->
             w == 21_007 and String.ends_with?(stack, ";fixture_leak_malloc")
           end)

    assert :ok = Mtrace.export(path, lib: @lib, weight: :count)
    assert path |> folded_weights() |> Map.values() |> Enum.sum() == 60

    # without a filter: every live site, summing to what the sites hold
    assert :ok = Mtrace.export(path, format: :folded)
    assert path |> folded_weights() |> Map.values() |> Enum.sum() >= 36_307
  end

  test "export/2 :json decodes to sites, totals and stats", %{dir: dir} do
    path = Path.join(dir, "native.json")
    assert :ok = Mtrace.export(path, format: :json, lib: @lib)
    doc = path |> File.read!() |> JSONParser.decode!()
    assert doc["node"] == Atom.to_string(node())
    assert {:ok, _, 0} = DateTime.from_iso8601(doc["generated_at"])
    assert %{"count" => 60, "bytes" => 36_307} = doc["total"]
    assert [%{"count" => 7, "bytes" => 21_007, "frames" => [frame | _]} | _] = doc["sites"]
    assert frame["symbol"] == "fixture_leak_malloc"
    assert frame["file"] =~ "leaky_nif.c"
    assert is_integer(frame["line"])
    assert is_map(doc["stats"]) and is_integer(doc["stats"]["live_count"])
  end

  test "export/2 :json since a mark or over a window keeps the growth and says so",
       %{dir: dir} do
    path = Path.join(dir, "growth.json")
    mark = Mtrace.mark()
    LeakyNif.leak(:malloc, 4, 2500)
    # within 100 ms of the mark a rate would say nothing: none is given
    assert :ok = Mtrace.export(path, format: :json, sort: :growth, since: mark, lib: @lib)
    [early] = JSONParser.decode!(File.read!(path))["sites"]
    assert early["growth_per_s"] == nil
    Process.sleep(150)
    # a misspelled setting, which Mtrace.stats/0 names among config_errors
    System.put_env("MTRACE_DEPTHS", "12")

    try do
      assert :ok = Mtrace.export(path, format: :json, sort: :growth, since: mark, lib: @lib)
    after
      System.delete_env("MTRACE_DEPTHS")
    end

    doc = path |> File.read!() |> JSONParser.decode!()
    assert doc["since"] == mark.t_ms
    assert doc["window_ms"] == nil
    # `since` is on the table's clock: the file says where that clock stood
    assert is_integer(doc["stats"]["now_ms"]) and doc["stats"]["now_ms"] >= mark.t_ms
    assert [%{"bytes" => 10_000, "count" => 4} = grown] = doc["sites"]
    assert is_number(grown["growth_per_s"]) and grown["growth_per_s"] > 0
    # the stats are Mtrace.stats/0's: misspelled settings among config_errors
    assert "MTRACE_DEPTHS (did you mean MTRACE_DEPTH?)" in doc["stats"]["config_errors"]
    assert Map.has_key?(doc["stats"], "heap")

    # nothing allocated in the window: the empty file is logged as such
    log =
      capture_log(fn ->
        assert :ok = Mtrace.export(path, format: :json, sort: :growth, window: 20, lib: @lib)
      end)

    assert log =~ "holds no allocation site"
    doc = path |> File.read!() |> JSONParser.decode!()
    assert doc["window_ms"] == 20
    assert is_integer(doc["since"]) and doc["since"] >= mark.t_ms
    assert Enum.all?(doc["sites"], &is_number(&1["growth_per_s"]))

    # a window of a second or more is said before it is waited for
    said =
      capture_io(fn ->
        capture_log(fn ->
          assert :ok = Mtrace.flamegraph(path <> ".svg", window: 1000, lib: @lib)
        end)
      end)

    assert said =~
             ~r/\ARecording what .* allocates for 1s; then .*growth\.json\.svg is written\.\n\z/

    # a path that cannot be written fails before the window, not after it
    for {fun, where} <- [
          {&Mtrace.export/2, "/nonexistent-dir/x.folded"},
          {&Mtrace.flamegraph/2, "/nonexistent-dir/x.svg"},
          {&Mtrace.export/2, System.tmp_dir!()},
          # a directory that refuses new files (even to root), and a parent
          # that is a file
          {&Mtrace.export/2, "/sys/x.folded"},
          {&Mtrace.flamegraph/2, Path.join(path, "x.svg")}
        ] do
      said =
        capture_io(fn ->
          assert_raise File.Error, ~r/could not write to file/, fn ->
            fun.(where, window: 1000, lib: @lib)
          end
        end)

      assert said == ""
    end

    # a named pipe is opened once, when written: a reader at its other end
    # gets the whole file, not an end of file before the window
    fifo = path <> ".fifo"
    {_, 0} = System.cmd("mkfifo", [fifo])
    reader = Task.async(fn -> System.cmd("cat", [fifo]) end)

    {writer, watch} =
      spawn_monitor(fn ->
        capture_io(fn -> Mtrace.export(fifo, format: :json, window: 200, lib: @lib) end)
      end)

    read = Task.yield(reader, 10_000) || Task.shutdown(reader, :brutal_kill)

    # a writer left waiting for a reader holds the VM's file server: one more
    # reader, started without asking it (os:cmd/1), lets it go
    receive do
      {:DOWN, ^watch, _, _, _} -> :ok
    after
      2_000 -> :os.cmd(~c"timeout 5 cat '#{fifo}' > /dev/null")
    end

    Process.exit(writer, :kill)
    assert {:ok, {text, 0}} = read
    assert %{"window_ms" => 200} = JSONParser.decode!(text)

    # a link to no file yet stays a link, and the file is made where it points
    target = path <> ".target"
    link = path <> ".link"
    File.ln_s!(target, link)
    capture_io(fn -> assert :ok = Mtrace.export(link, format: :json, window: 100) end)
    assert {:ok, %{type: :symlink}} = File.lstat(link)
    assert %{"window_ms" => 100} = target |> File.read!() |> JSONParser.decode!()

    # a snapshot of everything live: no mark, no growth
    assert :ok = Mtrace.export(path, format: :json, lib: @lib)
    doc = path |> File.read!() |> JSONParser.decode!()
    assert Map.fetch!(doc, "since") == nil and Map.fetch!(doc, "window_ms") == nil
    refute Enum.any?(doc["sites"], &Map.has_key?(&1, "growth_per_s"))
  end

  test "flamegraph/2 writes a well-formed SVG with the leaking functions", %{dir: dir} do
    path = Path.join(dir, "native.svg")
    assert :ok = Mtrace.flamegraph(path, lib: @lib, title: "leaks & more")

    # with a limit, the total says what the sites drawn leave out
    limited = path <> ".limited.svg"
    assert :ok = Mtrace.flamegraph(limited, lib: @lib, limit: 1)
    all = Mtrace.sites(lib: @lib, limit: :all)

    assert length(all) > 1
    blocks = all |> Enum.map(& &1.count) |> Enum.sum()

    assert File.read!(limited) =~
             ~r/\(the 1 largest site of [\d.]+ \w+ in #{Mtrace.VM.Format.int(blocks)} blocks that match; width by bytes\)/

    svg = File.read!(path)
    {doc, _rest} = :xmerl_scan.string(String.to_charlist(svg), quiet: true)
    assert xml_element(doc, :name) == :svg
    assert svg =~ "leaks &amp; more"

    for name <- ["fixture_leak_malloc", "fixture_leak_calloc", "fixture_leak_strdup"] do
      assert svg =~ "<title>#{name}"
    end
  end

  # The test VM traces every allocation: sampling is seen on a peer of its own.
  test "sampling: the JSON total and the flame graph's total give the estimates", %{dir: dir} do
    env = [{~c"MTRACE_SAMPLE_BYTES", ~c"524288"}, {~c"MTRACE_ENABLED", false}]
    Remote.distribute!()
    {:ok, peer, node} = :peer.start_link(%{name: :peer.random_name(), env: env})

    try do
      :ok = :erpc.call(node, :code, :add_paths, [:code.get_path()])
      # 200 blocks of 100 KB: about 36 of them sampled, each standing for about 5
      :ok = :erpc.call(node, LeakyNif, :leak, [:malloc, 200, 100_000])

      json = Path.join(dir, "sampled.json")
      assert :ok = Mtrace.export(json, format: :json, node: node, lib: @lib)
      doc = json |> File.read!() |> JSONParser.decode!()
      total = doc["total"]
      assert doc["stats"]["sampled"] == true and total["sampled"] == true
      assert total["est_bytes"] == doc["sites"] |> Enum.map(& &1["est_bytes"]) |> Enum.sum()
      assert total["est_count"] == doc["sites"] |> Enum.map(& &1["est_count"]) |> Enum.sum()
      assert total["bytes"] > 0 and total["est_bytes"] > total["bytes"]

      svg = Path.join(dir, "sampled.svg")
      assert :ok = Mtrace.flamegraph(svg, node: node, lib: @lib)
      assert File.read!(svg) =~ ~r/Total: about [\d.]+ \w+ in about [\d_]+ live blocks/
      # the heading names the node graphed, and when
      assert File.read!(svg) =~
               ~r/live native memory by call stack on #{node}, \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC/
    after
      Remote.stop_peer(peer)
    end
  end

  test "an empty flame graph or export says why: tracking off, filter missed", %{dir: dir} do
    svg = Path.join(dir, "empty.svg")
    folded = Path.join(dir, "empty.folded")
    json = Path.join(dir, "empty.json")

    # a filter that matches nothing in a table that holds blocks
    log = capture_log(fn -> assert :ok = Mtrace.flamegraph(svg, lib: "no_such_lib") end)
    missed = ~s|No live allocation matches the filter (with a frame in "no_such_lib")|
    assert svg |> File.read!() |> String.replace("&quot;", ~s|"|) |> unwrapped() =~ missed
    assert unwrapped(log) =~ "Mtrace.flamegraph/2: #{svg} draws no allocation. " <> missed

    log = capture_log(fn -> assert :ok = Mtrace.export(folded, lib: "no_such_lib") end)
    assert File.read!(folded) == ""
    assert unwrapped(log) =~ "Mtrace.export/2: #{folded} holds no allocation site. " <> missed

    # tracking switched off, the table empty
    on_exit(fn -> Mtrace.enable() end)
    Mtrace.disable()
    Mtrace.reset()
    off = "Tracking is switched off (Mtrace.disable/0 or MTRACE_ENABLED=0)"

    log = capture_log(fn -> assert :ok = Mtrace.flamegraph(svg) end)
    assert svg |> File.read!() |> unwrapped() =~ off
    assert unwrapped(log) =~ off

    log = capture_log(fn -> assert :ok = Mtrace.export(folded) end)
    assert File.read!(folded) == ""
    assert unwrapped(log) =~ "Mtrace.export/2: #{folded} holds no allocation site. " <> off
    # logged within 80 columns, the logger's prefix included
    assert log |> String.split("\n") |> Enum.all?(&(String.length(&1) <= 80)), log

    log = capture_log(fn -> assert :ok = Mtrace.export(json, format: :json) end)
    assert unwrapped(log) =~ off

    assert %{"sites" => [], "stats" => %{"enabled" => false}} =
             JSONParser.decode!(File.read!(json))

    # a window would record nothing: refused at once, not waited out
    for output <- [
          fn -> Mtrace.report(window: 60_000) end,
          fn -> Mtrace.export(folded, window: 60_000) end,
          fn -> Mtrace.flamegraph(svg, window: 60_000) end,
          fn -> Mtrace.sites(window: 60_000) end
        ] do
      error = assert_raise Mtrace.Error, fn -> capture_io(output) end
      assert error.reason == :tracking_off
      message = unwrapped(Exception.message(error))
      assert message =~ ~r/tracking is switched off in (this VM|the VM of #{node()}) /
      assert message =~ "Mtrace.enable()"
    end

    # a file that holds sites logs nothing
    Mtrace.enable()
    LeakyNif.leak(:malloc, 2, 3001)
    assert capture_log(fn -> assert :ok = Mtrace.export(folded, lib: @lib) end) == ""
  end

  defp unwrapped(text), do: String.replace(text, ~r/\s*\n\s*/, " ")

  test "errors name the function as it is called, Mtrace.name/arity" do
    for {call, where} <- [
          {fn -> Mtrace.olds(-1) end, "Mtrace.olds/2"},
          {fn -> Mtrace.cluster(:sites, limit: 1) end, "Mtrace.cluster/3"},
          {fn -> Mtrace.cluster(:sites, [1, 2, 3]) end, "Mtrace.cluster/3"},
          {fn -> Mtrace.cluster(:sites, [[node: node()]]) end, "Mtrace.cluster/3"},
          {fn -> Mtrace.sites(window: 10, since: Mtrace.mark()) end, "Mtrace.sites/1"},
          {fn -> Mtrace.VM.diagnose(thresholds: [native_growt: 1]) end, "Mtrace.VM.diagnose/1"},
          {fn -> Mtrace.VM.diagnose(thresholds: [window_steps: 0]) end, "Mtrace.VM.diagnose/1"}
        ] do
      error = assert_raise ArgumentError, call
      assert String.starts_with?(error.message, where <> ": "), error.message
    end
  end

  test "outputs refuse bad options and write nothing", %{dir: dir} do
    path = Path.join(dir, "never")
    assert_raise ArgumentError, ~r/:format/, fn -> Mtrace.export(path, format: :csv) end
    assert_raise ArgumentError, ~r/:weight/, fn -> Mtrace.flamegraph(path, weight: :age) end
    assert_raise ArgumentError, ~r/:width/, fn -> Mtrace.flamegraph(path, width: 0) end
    assert_raise ArgumentError, ~r/:frames/, fn -> Mtrace.report(frames: -1) end

    assert_raise ArgumentError,
                 ~r/^Mtrace.export\/2: path must be a non-empty string or charlist/,
                 fn ->
                   Mtrace.export(:nowhere, [])
                 end

    for bad <- [~c"", [?a | :b], [0x110000]] do
      assert_raise ArgumentError, ~r/^Mtrace.flamegraph\/2: path must be/, fn ->
        Mtrace.flamegraph(bad)
      end
    end

    refute File.exists?(path)
  end

  test "a path may be a charlist, as an Erlang caller gives it", %{dir: dir} do
    folded = Path.join(dir, "erlang.folded")
    svg = Path.join(dir, "erlang.svg")
    assert :ok = Mtrace.export(String.to_charlist(folded))
    assert :ok = Mtrace.flamegraph(String.to_charlist(svg))
    assert File.read!(svg) =~ "<svg"
    assert File.exists?(folded)
  end

  defp folded_weights(path) do
    for line <- path |> File.read!() |> String.split("\n", trim: true), into: %{} do
      [_, stack, weight] = Regex.run(~r/^(.*) (\d+)$/, line)
      {stack, String.to_integer(weight)}
    end
  end
end

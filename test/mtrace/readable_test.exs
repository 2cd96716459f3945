defmodule Mtrace.ReadableTest do
  # What people read: the stats as IEx shows them, growth ordering, and the
  # VM queries leaving out the process that asks.
  # Not async: the tests read the one allocation table of this VM.
  use ExUnit.Case, async: false
  doctest Mtrace.Stats
  doctest Mtrace.Error
  doctest Mtrace.VM.Memory

  alias Mtrace.Test.{ErlangCallers, LeakyNif}

  setup do
    LeakyNif.fresh_table(&on_exit/1)
  end

  test "stats: grouped and humanized in IEx, a map of figures for programs" do
    LeakyNif.leak(:malloc, 3, 4096)
    stats = Mtrace.stats()
    text = inspect(stats)
    lines = String.split(text, "\n")
    # lines wrapped for an 80-column shell continue four spaces in
    groups = text |> String.replace(~r/\n    (?=\S)/, " ") |> String.split("\n")

    assert [
             "#Mtrace.Stats<" <> live,
             "  calls: " <> calls,
             "  table: " <> _,
             "  tracking: " <> on,
             "  glibc heap: " <> _
           ] = groups

    assert live =~
             ~r/^[\d.]+ (B|KiB|MiB|GiB) live in [\d_]+ blocks?( since a reset \S+ ago)?, [\d_]+ dropped/

    assert calls =~ ~r/\d malloc/
    assert on =~ "lossless" and on =~ "Erlang frames on"
    assert Enum.all?(lines, &(String.length(&1) <= 80)), text

    # nested, as Mtrace.cluster/3 returns it: every line indented under its key
    nested = inspect(%{node() => {:ok, stats}})
    [_first | rest] = String.split(nested, "\n")
    assert length(rest) >= 4
    assert Enum.all?(rest, &String.starts_with?(&1, "     ")), nested

    # as IEx shows Mtrace.cluster(:stats): 80 columns however deep the value
    # starts, an error beside it included
    error = %Mtrace.Error{reason: :not_loaded, message: String.duplicate("mtrace ", 30)}
    key = String.to_atom("app-with-a-long-name@" <> String.duplicate("h", 30))
    iex = inspect(%{key => stats, node() => {:error, error}}, pretty: true, width: 80)
    assert Enum.all?(String.split(iex, "\n"), &(String.length(&1) <= 80)), iex

    assert inspect(stats, pretty: true, width: 80) |> String.replace(~r/\n    (?=\S)/, " ") ==
             Enum.join(groups, "\n")

    # for programs: fields, Access, pattern matching, a plain map of values
    assert is_integer(stats.live_bytes) and stats[:live_bytes] == stats.live_bytes
    assert %{live_count: n} = stats
    assert n >= 3

    for {key, value} <- Map.from_struct(stats) do
      assert is_integer(value) or is_boolean(value) or is_list(value) or is_binary(value) or
               is_nil(value),
             "#{key}: #{inspect(value)}"
    end
  end

  test "stats(heap: false) says the heap was not read, not that the C library cannot" do
    assert Mtrace.stats().heap == true
    text = inspect(Mtrace.stats(heap: false))
    assert text =~ "C library heap: not read (heap: false)>"

    assert_raise ArgumentError, ~r/option :heap of Mtrace.stats\/1 must be a boolean/, fn ->
      Mtrace.stats(heap: 1)
    end
  end

  test "a report's header never turns an age bound around" do
    LeakyNif.leak(:malloc, 1, 4096)
    big = ExUnit.CaptureIO.capture_io(fn -> Mtrace.report(max_age: 1.0e11, limit: 1) end)
    refute big =~ "over 1000y", big
    old = ExUnit.CaptureIO.capture_io(fn -> Mtrace.report(min_age: 1.0e11, limit: 1) end)
    assert old =~ "over 1000y old", old
  end

  test "a size just under a unit rounds up into that unit, never to 1024 of the one below" do
    alias Mtrace.VM.Format

    assert Format.bytes(1023) == "1023 B"
    assert Format.bytes(1023.6) == "1.0 KiB"
    assert Format.bytes(1_048_524) == "1023.9 KiB"
    assert Format.bytes(1_048_575) == "1.0 MiB"
    assert Format.bytes(1024 ** 3 - 1) == "1.0 GiB"
    # sampling's largest setting, 1 TiB
    assert Format.bytes(1024 ** 4 - 1) == "1.0 TiB"
    assert Format.bytes(1024 ** 4) == "1.0 TiB"
    assert Format.bytes(-5) == "-5 B"
    assert Format.rate(1023.97) == "+1.0 KiB/s (+3.5 MiB/h)"
  end

  test "after a reset, the stats' first line says how long ago it was" do
    LeakyNif.fresh_table(&on_exit/1)
    LeakyNif.leak(:malloc, 2, 4096)
    [first | _] = Mtrace.stats() |> inspect() |> String.split("\n")
    assert first =~ ~r/^#Mtrace.Stats<.* live in .* since a reset \d+s ago, /, first
  end

  test "not preloaded, the message says what the LD_PRELOAD that is set did wrong" do
    two = "/r/lib/mtrace-0.1.9/priv/mtrace.so\n/r/lib/mtrace-0.2.0/priv/mtrace.so"

    message = fn value ->
      String.replace(Mtrace.Error.not_preloaded(value).message, ~r/\s+/, " ")
    end

    refute message.(nil) =~ "LD_PRELOAD is"
    assert message.(nil) == message.("")
    assert message.(two) =~ "LD_PRELOAD names more than one mtrace.so"
    assert message.(two) =~ "rm -rf _build/prod/rel/<app>"
    assert message.(two) =~ "mtrace-<%= @release.applications[:mtrace][:vsn] %>/priv/mtrace.so"
    assert message.("/gone/mtrace.so") =~ ~s(LD_PRELOAD is "/gone/mtrace.so", but the loader did)
    assert message.("/usr/lib/libjemalloc.so.2") =~ "which names no mtrace.so"
    # and the line to use, on a line of its own
    for value <- [nil, "/gone/mtrace.so"] do
      assert Mtrace.Error.not_preloaded(value).message =~
               "\n    export LD_PRELOAD=$(ls $RELEASE_ROOT/lib/mtrace-*/priv/mtrace.so)\n"
    end

    assert Mtrace.Error.not_preloaded(two).message =~
             ~s(\n    export LD_PRELOAD="$RELEASE_ROOT/lib/mtrace-<%= @release.applications[:mtrace][:vsn] %>/priv/mtrace.so"\n)
  end

  test "an error inspects as one short line: reason and first words; the message keeps every word, in 80 columns" do
    message = "on node :\"worker@host\": " <> Mtrace.Error.not_preloaded().message
    e = %Mtrace.Error{reason: :not_preloaded, message: message}
    [line] = Regex.run(~r/#Mtrace.Error<.*?>(?=})/, inspect(%{worker@host: {:error, e}}))
    assert line =~ ~r/^#Mtrace.Error<:not_preloaded: on node :"worker@host": the .* \.\.\.>$/
    assert String.length(line) <= 78 and not String.contains?(line, "\\n")
    text = Exception.message(e)
    assert String.split(text) == String.split(message)

    for line <- String.split(text, "\n"), not String.starts_with?(line, " ") do
      assert String.length(line) <= 80, line
    end

    short = %Mtrace.Error{reason: :nodedown, message: "mtrace: cannot connect to node :a@b"}
    assert inspect(short) == "#Mtrace.Error<:nodedown: cannot connect to node :a@b>"

    # a cut never leaves a number without its unit
    slow = %Mtrace.Error{
      reason: :timeout,
      message: "mtrace: node :leaky1@vm did not answer within 2000 ms (the call may still run)"
    }

    assert inspect(slow) == "#Mtrace.Error<:timeout: node :leaky1@vm did not answer within ...>"

    # as a map's value after a long key, the words go below the reason
    key = :"my_app@ip-10-0-12-34.eu"
    text = inspect(%{key => slow, a@b: slow}, pretty: true, width: 80)

    assert text =~
             ~s(  "my_app@ip-10-0-12-34.eu": #Mtrace.Error<:timeout:\n    node :leaky1@vm did)

    assert text =~ "\n  a@b: #Mtrace.Error<:timeout: node :leaky1@vm did not answer within ...>"
    assert text |> String.split("\n") |> Enum.all?(&(String.length(&1) <= 80)), text

    # after a longer key, the reason goes below as well
    key = :"my_app@ip-10-0-12-34.eu-west-1.compute.internal.example.org"
    text = inspect(%{key => slow, a@b: {:error, slow}, z@h: :ok}, pretty: true, width: 80)
    assert text =~ ~s(  "#{key}": #Mtrace.Error<\n    :timeout: node :leaky1@vm did)
    # in a tuple, as Mtrace.cluster/3 returns errors: below the tuple's head
    assert text =~ "  a@b: {:error,\n   #Mtrace.Error<:timeout: node :leaky1@vm did not answer"
    assert text |> String.split("\n") |> Enum.all?(&(String.length(&1) <= 80)), text
  end

  test "Mtrace.cluster/2's map of nodes, diagnoses and errors, fits iex's 80 columns" do
    finding = %{kind: :process_leak, score: 100.0, summary: "", evidence: %{}, next: ""}
    findings = [finding, finding, %{finding | score: 30.0}]
    long = :"my_app@ip-10-0-12-34.eu-west-1.compute.internal"
    diagnosis = %Mtrace.VM.Diagnosis{verdict: :process_leak, node: :a@b, findings: findings}
    error = Mtrace.Error.not_preloaded()

    results = %{
      a@b: {:ok, diagnosis},
      b@c: {:error, %{error | message: "on node :b@c: " <> Mtrace.Error.not_preloaded().message}},
      "#{long}": {:ok, %{diagnosis | node: long}}
    }

    text = inspect(results, pretty: true, width: 80)
    assert text |> String.split("\n") |> Enum.all?(&(String.length(&1) <= 80)), text
    assert text =~ "#Mtrace.VM.Diagnosis<a@b:"
    assert text =~ "process_leak (score 100.0), 2 findings, 1 below 50>"

    # not pretty (a log line): one line, whatever its length
    refute inspect(%{diagnosis | node: long}) =~ "\n"
    refute inspect(%{diagnosis | node: long}, pretty: true, width: :infinity) =~ "\n"
  end

  test "sort: :growth ranks what grew over a window, with each site's rate" do
    parent = self()

    leaker =
      spawn(fn ->
        send(parent, :started)
        grow = fn grow -> ErlangCallers.append(2) && Process.sleep(50) && grow.(grow) end
        grow.(grow)
      end)

    on_exit(fn -> Process.exit(leaker, :kill) end)
    assert_receive :started
    ErlangCallers.audit(50)
    sites = Mtrace.sites(sort: :growth, window: 500, lib: "leaky_nif")

    report =
      ExUnit.CaptureIO.capture_io(fn ->
        Mtrace.report(sort: :growth, window: 1_000, lib: "leaky_nif", frames: 4)
      end)

    Process.exit(leaker, :kill)

    # audit's 50 blocks came before the window: only append grew
    assert [%{growth_per_s: rate, frames: frames} | _] = sites
    assert Enum.any?(frames, &(&1[:function] == :append))
    refute Enum.any?(sites, fn s -> Enum.any?(s.frames, &(&1[:function] == :audit)) end)
    # about 2 blocks of 1000 bytes every 50 ms
    assert rate > 10_000 and rate < 80_000, "#{rate} B/s"

    # a window of a second or more is said before it is waited for, and
    # not when the call fails first
    assert report =~ ~r/\ARecording what .* allocates for 1s; the report follows.\n/

    said = fn error, call -> ExUnit.CaptureIO.capture_io(fn -> assert_raise(error, call) end) end

    assert said.(ArgumentError, fn -> Mtrace.report(window: 1_000, since: Mtrace.mark()) end) ==
             ""

    assert said.(Mtrace.Error, fn -> Mtrace.report(window: 1_000, node: :none@nowhere) end) == ""

    assert said.(Mtrace.Error, fn -> Mtrace.VM.diagnose(window: 1_000, node: :none@nowhere) end) ==
             ""

    # the report shows the rate next to the size, and the Erlang caller
    assert report =~ ~r/^#1  .* in \d+ blocks  \+[\d.]+ KiB\/s \(\+[\d.]+ MiB\/h\)/m
    assert report =~ "Mtrace.Test.ErlangCallers.append/1"
  end

  test "a report's header gives an age filter as asked: fractions kept, absurd ones in words" do
    header = fn opts ->
      ExUnit.CaptureIO.capture_io(fn -> Mtrace.report(opts) end)
      |> String.split("\n")
      |> Enum.take(3)
      # continuation lines are indented; where they break depends on the
      # node's name
      |> Enum.map_join(" ", &String.trim/1)
    end

    assert header.(min_age: 1.5) =~ "at least 1.5s old"
    assert header.(max_age: 90) =~ "at most 1m 30s old"
    text = header.(min_age: 1.0e11)
    assert text =~ "over 1000y old"
    refute text =~ "at least over"
  end

  test "sites name C++ functions demangled by default" do
    # loading a module makes the JIT (C++) allocate
    Code.put_compiler_option(:ignore_module_conflict, true)
    on_exit(fn -> Code.put_compiler_option(:ignore_module_conflict, false) end)
    Code.compile_string("defmodule Mtrace.ReadableTest.Loaded, do: def(f, do: 1)")

    symbols = for s <- Mtrace.sites(limit: :all), f <- s.frames, is_binary(f.symbol), do: f.symbol
    assert Enum.any?(symbols, &String.starts_with?(&1, "beamasm_metadata_update("))
    refute Enum.any?(symbols, &String.starts_with?(&1, "_Z"))

    mangled = for s <- Mtrace.sites(limit: :all, demangle: false), f <- s.frames, do: f.symbol
    assert Enum.any?(mangled, &(is_binary(&1) and String.starts_with?(&1, "_Z")))

    # the original tuple form too, unless asked otherwise
    n = Mtrace.stats().live_count

    tuples = fn olds ->
      for {_, _, _, _, stack} <- olds, {_, sym} <- stack, is_binary(sym), do: sym
    end

    refute Enum.any?(tuples.(Mtrace.olds(n)), &String.starts_with?(&1, "_Z"))
    assert Enum.any?(tuples.(Mtrace.olds(n, false)), &String.starts_with?(&1, "_Z"))
  end

  test "VM rankings leave out processes with nothing to rank" do
    busy = spawn(fn -> receive do: (:never -> :ok) end)
    on_exit(fn -> Process.exit(busy, :kill) end)
    send(busy, :a)
    send(busy, :b)

    top = Mtrace.VM.top(:message_queue_len, 100_000)
    assert Enum.any?(top, &match?({^busy, 2, _}, &1))
    refute Enum.any?(top, &match?({_, 0, _}, &1)), inspect(top)

    spawn(fn -> Process.sleep(100) && send(busy, :c) end)
    window = Mtrace.VM.window(:message_queue_len, 100_000, 500)
    assert Enum.any?(window, &match?({^busy, 1, _}, &1))
    refute Enum.any?(window, &match?({_, 0, _}, &1)), inspect(window)
  end

  test "VM queries leave out the process that asks" do
    # a process with more memory than any other: this one
    hoard = :binary.copy("x", 32 * 1024 * 1024) |> :binary.bin_to_list() |> Enum.take(2_000_000)
    pids = for {pid, _, _} <- Mtrace.VM.top(:memory, 10_000), do: pid
    refute self() in pids
    assert length(hoard) == 2_000_000
    assert [] == for({pid, _, _} <- Mtrace.VM.window(:memory, 10_000, 10), pid == self(), do: pid)
  end
end

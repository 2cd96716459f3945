defmodule Mtrace.ReportTest do
  use ExUnit.Case, async: true

  alias Mtrace.Report

  doctest Mtrace.Report
  doctest Mtrace.VMSites

  @exact %{
    live_count: 3072,
    live_bytes: 12 * 1024 * 1024,
    sampled: false,
    dropped: 0,
    stacks_dropped: 0,
    replaced: 0
  }

  defp frame(symbol, opts \\ []) do
    %{
      symbol: symbol,
      lib: Keyword.get(opts, :lib, "/usr/lib/x86_64-linux-gnu/libcache.so.2"),
      file: Keyword.get(opts, :file),
      line: Keyword.get(opts, :line),
      addr: 0x7F00_0000_2000,
      inlined: Keyword.get(opts, :inlined, false),
      offset: Keyword.get(opts, :offset, 0x2000)
    }
  end

  defp site(bytes, count, oldest, newest, frames),
    do: %{count: count, bytes: bytes, oldest: oldest, newest: newest, frames: frames}

  defp lines(sites, stats, opts \\ []) do
    sites
    |> Report.format(stats, [node: :app@host] ++ opts)
    |> IO.iodata_to_binary()
    |> String.split("\n", trim: true)
  end

  test "a site: humanized size and ages, frames with file:line, lib basename, inlined marked" do
    frames = [
      frame("cache_put", file: "src/cache.c", line: 88),
      frame("lookup", file: "src/cache.c", line: 120, inlined: true),
      frame("nif_lookup", file: "nif.c", lib: "/srv/app/priv/cache_nif.so"),
      frame(nil, offset: 0x1F2E),
      frame(nil, lib: nil)
    ]

    assert lines([site(12 * 1024 * 1024, 3072, 7380, 5, frames)], @exact) == [
             "Native memory live on app@host: 12.0 MiB in 3_072 blocks",
             "#1  12.0 MiB in 3_072 blocks  oldest 2h 03m  newest 5s",
             "    cache_put (src/cache.c:88) libcache.so.2",
             "    lookup (src/cache.c:120) libcache.so.2 [inlined]",
             "    nif_lookup (nif.c) cache_nif.so",
             "    libcache.so.2+0x1f2e",
             "    ?? 0x7f0000002000 (JIT or unloaded code)"
           ]
  end

  test "an absolute source path shows its last two parts, a relative one as it is" do
    frames = [
      frame("leak", file: "/home/build/src/leaky_app/c_src/leaky.c", line: 33),
      frame("helper", file: "c_src/more/helper.c", line: 7),
      # one directory deep, whole: "tmp/ledger.exs" would read as relative
      frame("append", file: "/tmp/ledger.exs", line: 2)
    ]

    assert Enum.drop(lines([site(1, 1, 1, 1, frames)], @exact), 2) == [
             "    leak (c_src/leaky.c:33) libcache.so.2",
             "    helper (c_src/more/helper.c:7) libcache.so.2",
             "    append (/tmp/ledger.exs:2) libcache.so.2"
           ]
  end

  test "names and paths that are not UTF-8 or hold controls print, on one line each" do
    frames = [
      frame("ab\xFFc(int)"),
      frame("esc\e[2J\e[31mred", file: "/opt/caf\xE9/x.c", line: 3),
      frame("semi;space newline\n", lib: "/opt/caf\xE9/libcaf\xE9.so"),
      frame("Cafe\u0301 mylib::make<int>(int)"),
      frame("नमस्ते mylib::make<int>(int)")
    ]

    text =
      [site(1, 1, 1, 1, frames)] |> Report.format(@exact, node: :a@h) |> IO.iodata_to_binary()

    assert String.valid?(text)
    refute text =~ ~r/[\x{0}-\x{9}\x{b}-\x{1f}\x{7f}]/u

    assert Enum.drop(String.split(text, "\n", trim: true), 2) == [
             "    ab\uFFFDc libcache.so.2",
             "    esc?[2J?[31mred (caf\uFFFD/x.c:3) libcache.so.2",
             "    semi;space newline? libcaf\uFFFD.so",
             "    mylib::make<int> libcache.so.2",
             "    mylib::make<int> libcache.so.2"
           ]
  end

  test "a long frame fits 80 columns: templates collapse, paths give way, then it wraps" do
    frames = [
      frame(
        "void Asm::emit_fallback_body<unsigned long (process*, unsigned long, unsigned long)>(int)",
        lib: "/usr/lib/erlang/erts-13.1.5/bin/beam.smp"
      ),
      frame("_dlfo_mappings_segment_allocate",
        file: "./elf/dl-find_object.c",
        line: 217,
        lib: "/lib/ld-linux-x86-64.so.2",
        inlined: true
      )
    ]

    assert Enum.drop(lines([site(1, 1, 1, 1, frames)], @exact), 2) == [
             "    Asm::emit_fallback_body<...> beam.smp",
             "    _dlfo_mappings_segment_allocate (dl-find_object.c:217) ld-linux-x86-64.so.2",
             "      [inlined]"
           ]
  end

  test "a mangled name (demangle: false) is never shortened: it is kept whole for c++filt" do
    mangled =
      "_ZNSt6vectorIN13BeamAssembler8AsmRangeESaIS1_EE17_M_realloc_insertIJRKS1_EEEvN9" <>
        "__gnu_cxx17__normal_iteratorIPS1_S3_EEDpOT_"

    frames = [frame(mangled, lib: "/usr/lib/erlang/erts-13.1.5/bin/beam.smp")]
    text = [site(1, 1, 1, 1, frames)] |> lines(@exact) |> Enum.join("\n")
    assert text =~ "    " <> mangled
    refute text =~ "..."
  end

  test "the VM's own sites say what they are; a NIF's does not" do
    beam = "/usr/lib/erlang/erts-13.1.5/bin/beam.smp"
    jit = [frame("beamasm_metadata_update", lib: beam), frame("erts_finish_loading", lib: beam)]
    carrier = [frame("erts_sys_aligned_alloc", lib: beam), frame(nil, lib: beam)]

    nif = [
      frame("leak", lib: "/srv/app/priv/leaky_nif.so"),
      frame("erts_call_dirty_nif", lib: beam)
    ]

    sites = [site(4096, 2, 10, 1, jit), site(2048, 1, 10, 10, carrier), site(1024, 1, 5, 5, nif)]

    assert lines(sites, @exact, frames: 1) == [
             "Native memory live on app@host: 12.0 MiB in 3_072 blocks",
             "#1  4.0 KiB in 2 blocks  oldest 10s  newest 1s",
             "    (the VM's own loaded code and its metadata, which grow as modules load)",
             "    beamasm_metadata_update beam.smp",
             "    ... 1 more",
             "#2  2.0 KiB in 1 block  oldest 10s  newest 10s",
             "    (a carrier of the VM's own allocators, whose use Mtrace.VM shows)",
             "    erts_sys_aligned_alloc beam.smp",
             "    ... 1 more",
             "#3  1.0 KiB in 1 block  oldest 5s  newest 5s",
             "    leak leaky_nif.so",
             "    ... 1 more"
           ]
  end

  # The names Mtrace.VMSites knows are those of this VM: a JIT node's
  # loaded code is among its live sites, a module loaded now for certain.
  test "on this node, the VM's loaded code is recognized" do
    if :erlang.system_info(:emu_flavor) == :jit do
      Code.compile_string("defmodule Mtrace.ReportTest.Loaded, do: def(f, do: :ok)")
      notes = Mtrace.sites(boot: true, limit: :all) |> Enum.map(&Mtrace.VMSites.note(&1.frames))
      assert "the VM's own loaded code and its metadata, which grow as modules load" in notes
    end
  end

  test "sites are numbered in the order given, one block is singular" do
    sites = [site(2048, 2, 90_000, 61, [frame("a")]), site(100, 1, 59, 0, [frame("b")])]

    assert [
             _header,
             "#1  2.0 KiB in 2 blocks  oldest 1d 01h  newest 1m 01s",
             _,
             "#2  100 B in 1 block  oldest 59s  newest 0s",
             _
           ] = lines(sites, @exact)
  end

  test "sites that would read the same are told apart" do
    # two calls in one function, no line numbers: where in the object each is
    here = [frame("cache_put", offset: 0x1A2B), frame("main")]
    there = [frame("cache_put", offset: 0x1A40), frame("main")]
    other = [frame("other")]
    sites = [site(300, 3, 9, 1, here), site(200, 2, 9, 1, other), site(100, 1, 9, 1, there)]

    assert [
             _header,
             "#1  300 B in 3 blocks  oldest 9s  newest 1s",
             "    cache_put libcache.so.2+0x1a2b",
             "    main libcache.so.2+0x2000",
             "#2  200 B in 2 blocks  oldest 9s  newest 1s",
             "    other libcache.so.2",
             "#3  100 B in 1 block  oldest 9s  newest 1s",
             "    cache_put libcache.so.2+0x1a40",
             "    main libcache.so.2+0x2000"
           ] = lines(sites, @exact)

    # stacks that part below the frames shown: offsets would not tell them
    # apart, the later one says which it reads as
    deep = [frame("a"), frame("b", offset: 1)]
    deeper = [frame("a"), frame("b", offset: 2)]

    assert [_, _, "    a libcache.so.2", "    ... 1 more", _, _, _, note] =
             lines([site(2, 2, 1, 1, deep), site(1, 1, 1, 1, deeper)], @exact, frames: 1)

    assert note == "    (reads as #1: the two stacks differ in frames not shown)"

    # two calls on one line: every frame gives its offset, and no note
    once = [frame("put", file: "c.c", line: 9, offset: 0x10), frame("main", line: 2)]
    twice = [frame("put", file: "c.c", line: 9, offset: 0x18), frame("main", line: 2)]

    assert [
             _,
             _,
             "    put (c.c:9) libcache.so.2+0x10",
             "    main libcache.so.2+0x2000",
             _,
             "    put (c.c:9) libcache.so.2+0x18",
             "    main libcache.so.2+0x2000"
           ] = lines([site(2, 2, 1, 1, once), site(1, 1, 1, 1, twice)], @exact)

    # stacks that differ in no frame shown, none cut (two addresses in one
    # Erlang function): the later one says so, and no offsets are added
    erl = fn addr -> %{symbol: "m:f/1", lib: nil, file: nil, line: nil, addr: addr} end

    assert [_, _, "    m:f/1", _, "    m:f/1", note] =
             lines([site(2, 2, 1, 1, [erl.(1)]), site(1, 1, 1, 1, [erl.(2)])], @exact)

    assert note == "    (reads as #1: the two stacks differ at an address not shown)"

    # the same two, cut (more frames below): they still differ at a frame
    # shown, not below
    below = [frame("main"), frame("start")]

    assert [_, _, "    m:f/1", "    ... 2 more", _, "    m:f/1", "    ... 2 more", note] =
             lines(
               [site(2, 2, 1, 1, [erl.(1) | below]), site(1, 1, 1, 1, [erl.(2) | below])],
               @exact,
               frames: 1
             )

    assert note == "    (reads as #1: the two stacks differ at an address not shown)"
  end

  test "one-line stacks (Watch, diagnose) tell frames in no object apart by address" do
    nameless = fn addr -> %{symbol: nil, lib: nil, file: nil, line: nil, addr: addr} end
    a = Mtrace.VMSites.one_line([frame("leak"), nameless.(0x7F11AA001000)])
    b = Mtrace.VMSites.one_line([frame("leak"), nameless.(0x7F11AA002000)])
    assert a =~ "?? 0x7f11aa001000"
    assert a != b
  end

  test "frames are cut at :frames (default 8) with the number left out" do
    frames = for i <- 1..11, do: frame("f#{i}")
    [_header, _site | default] = lines([site(1, 1, 1, 1, frames)], @exact)
    assert length(default) == 9
    assert List.last(default) == "    ... 3 more"

    assert [_, _, "    f1 libcache.so.2", "    f2 libcache.so.2", "    ... 9 more"] =
             lines([site(1, 1, 1, 1, frames)], @exact, frames: 2)

    assert [_, _, "    ... 11 more"] = lines([site(1, 1, 1, 1, frames)], @exact, frames: 0)
    assert length(lines([site(1, 1, 1, 1, frames)], @exact, frames: 11)) == 13
    assert_raise ArgumentError, fn -> Report.format([], @exact, frames: -1) end
  end

  test "a deep native stack keeps the code that called the NIF, the Erlang frame after the NIF's" do
    nif = %{module: Tls, function: :handshake, arity: 0, file: nil, line: nil}
    caller = %{module: Tls, function: :connect, arity: 0, file: "lib/tls.ex", line: 40}
    outer = %{caller | function: :start, line: 7}
    frames = for(i <- 1..10, do: frame("l#{i}")) ++ [nif, caller]

    assert [_, _ | lines] = lines([site(1, 1, 1, 1, frames)], @exact, frames: 4)

    assert lines == [
             "    l1 libcache.so.2",
             "    l2 libcache.so.2",
             "    l3 libcache.so.2",
             "    ... 8 more",
             "    Tls.connect/0 (lib/tls.ex:40)"
           ]

    frames = for(i <- 1..4, do: frame("l#{i}")) ++ [nif, caller, outer]

    assert [_, _ | lines] = lines([site(1, 1, 1, 1, frames)], @exact, frames: 4)

    assert lines == [
             "    l1 libcache.so.2",
             "    l2 libcache.so.2",
             "    l3 libcache.so.2",
             "    ... 2 more",
             "    Tls.connect/0 (lib/tls.ex:40)",
             "    ... 1 more"
           ]

    # right after the frames shown: in the row a "... N more" would take
    frames = for(i <- 1..3, do: frame("l#{i}")) ++ [nif, caller, outer]

    assert [_, _, _, _, _, _, "    Tls.connect/0 (lib/tls.ex:40)", "    ... 1 more"] =
             lines([site(1, 1, 1, 1, frames)], @exact, frames: 4)

    # the NIF's own frame, when it is the only Erlang one
    frames = for(i <- 1..3, do: frame("l#{i}")) ++ [nif]

    assert [_, _, _, _, _, "    Tls.handshake/0"] =
             lines([site(1, 1, 1, 1, frames)], @exact, frames: 3)

    assert [_, _, "    ... 1 more"] = lines([site(1, 1, 1, 1, [nif])], @exact, frames: 0)

    frames = for(i <- 1..10, do: frame("l#{i}")) ++ [nif, caller]

    # shown anyway, or no room: as before
    assert [_, _, "    l1 libcache.so.2", "    ... 11 more"] =
             lines([site(1, 1, 1, 1, frames)], @exact, frames: 1)

    assert length(lines([site(1, 1, 1, 1, frames)], @exact, frames: 11)) == 2 + 11 + 1
  end

  test "sites whose frames shown read the same say so, whatever was left out below" do
    nif = %{module: Leaky, function: :leak, arity: 1, file: nil, line: nil}
    a = [frame("l1"), frame("l2"), nif, %{nif | function: :append, file: "a.ex", line: 3}]
    b = [frame("l1"), frame("l2"), nif, %{nif | function: :audit, file: "a.ex", line: 9}, nif]
    text = [site(2, 2, 1, 1, a), site(1, 1, 1, 1, b)] |> lines(@exact, frames: 2)

    assert Enum.drop(text, 1) == [
             "#1  2 B in 2 blocks  oldest 1s  newest 1s",
             "    l1 libcache.so.2",
             "    ... 2 more",
             "    Leaky.append/1 (a.ex:3)",
             "#2  1 B in 1 block  oldest 1s  newest 1s",
             "    l1 libcache.so.2",
             "    ... 2 more",
             "    Leaky.audit/1 (a.ex:9)",
             "    ... 1 more"
           ]

    text = [site(2, 2, 1, 1, a), site(1, 1, 1, 1, a ++ [nif])] |> lines(@exact, frames: 1)
    assert List.last(text) == "    (reads as #1: the two stacks differ in frames not shown)"
  end

  test "sampled: the header gives the estimates and the sample" do
    stats =
      %{@exact | sampled: true}
      |> Map.merge(%{est_live_count: 1_500_000, est_live_bytes: 3 * 1024 ** 3})

    assert Enum.take(lines([], stats), 2) == [
             "Native memory live on app@host: about 3.0 GiB in about 1_500_000 blocks",
             "  (estimated from a sample of 3_072 blocks, 12.0 MiB)"
           ]

    boot = %{count: 12, bytes: 4 * 1024 ** 2, est_count: 136, est_bytes: 8 * 1024 ** 2}

    assert Enum.slice(lines([], stats, boot: boot), 2, 2) == [
             "Boot (before mtrace started): about 8.0 MiB in about 136 blocks (12 sampled);",
             "  boot: true ranks them"
           ]

    # nothing since mtrace started matches, but boot blocks do: not "nothing"
    assert List.last(lines([], stats, boot: boot)) ==
             "No live allocations made since mtrace started match."
  end

  test "without the mtrace application started, boot blocks rank, and a line says so" do
    assert Enum.slice(lines([], @exact, boot: :not_started), 1, 2) == [
             "Boot blocks are ranked too: the mtrace application is not started, and its start",
             "  marks the end of boot (Application.ensure_all_started(:mtrace))."
           ]
  end

  test "tracking switched off is said before anything is read as no growth" do
    assert Enum.slice(lines([], Map.put(@exact, :enabled, false)), 1, 2) == [
             "Tracking is switched off (Mtrace.disable/0 or MTRACE_ENABLED=0): blocks",
             "  allocated since are not recorded; Mtrace.enable/0 switches it on."
           ]

    refute Enum.any?(lines([], Map.put(@exact, :enabled, true)), &(&1 =~ "switched off"))
  end

  test "every line fits 80 columns, continuations indented" do
    stats = %{@exact | sampled: true, dropped: 1234, stacks_dropped: 5, replaced: 7}
    stats = Map.merge(stats, %{est_live_count: 1_500_000, est_live_bytes: 3 * 1024 ** 3})
    site = %{site(4096, 3, 7380, 5, [frame("f")]) | count: 3} |> Map.put(:growth_per_s, 87_040)
    site = Map.merge(site, %{est_count: 1_500_000, est_bytes: 3 * 1024 ** 3})
    boot = %{count: 12, bytes: 4 * 1024 ** 2, est_count: 136, est_bytes: 8 * 1024 ** 2}
    total = %{count: 3, bytes: 4096, est_count: 1_500_000, est_bytes: 3 * 1024 ** 3}

    text =
      [site]
      |> Report.format(stats,
        node: :"a-long-node-name@a-long-host-name",
        boot: boot,
        filter: ~s|allocated since the mark, with a frame in "leaky"|,
        total: total
      )
      |> IO.iodata_to_binary()

    lines = String.split(text, "\n", trim: true)
    assert Enum.all?(lines, &(String.length(&1) <= 80)), text
    assert length(lines) > 6
    # a wrapped line goes on indented, never at the margin
    for line <- lines,
        not String.starts_with?(line, ["Native", "Incomplete", "Boot", "#", " "]) do
      flunk("continuation at the margin: #{inspect(line)}\n" <> text)
    end
  end

  test "filtered: the header gives the matching total and the filter, then the node's" do
    total = %{count: 3, bytes: 12_288, est_count: 3, est_bytes: 12_288}

    assert hd(lines([], @exact, filter: ~s|with a frame in "leaky"|, total: total)) ==
             ~s|Native memory live on app@host: 12.0 KiB in 3 blocks with a frame in "leaky"|

    assert Enum.at(lines([], @exact, filter: ~s|with a frame in "leaky"|, total: total), 1) ==
             "  (of 12.0 MiB in 3_072 blocks in all)"

    # the boot blocks that match are counted in what matches, as they are in
    # the node's whole without a filter; the boot line says how much
    boot = %{count: 12, bytes: 4 * 1024 ** 2, est_count: 12, est_bytes: 4 * 1024 ** 2}
    filtered = lines([], @exact, filter: "of at least 0 B each", total: total, boot: boot)

    assert Enum.take(filtered, 3) == [
             "Native memory live on app@host: 4.0 MiB in 15 blocks of at least 0 B each",
             "  (of 12.0 MiB in 3_072 blocks in all)",
             "Boot (before mtrace started): 4.0 MiB in 12 blocks; boot: true ranks them"
           ]

    # no filter: the query's total, with the boot's, is the node's whole (the
    # same moment as the sites; stats are read after them)
    assert hd(lines([], @exact, total: total)) ==
             "Native memory live on app@host: 12.0 KiB in 3 blocks"

    assert hd(lines([], @exact, total: total, boot: boot)) ==
             "Native memory live on app@host: 4.0 MiB in 15 blocks"

    assert hd(lines([], @exact)) == "Native memory live on app@host: 12.0 MiB in 3_072 blocks"
  end

  test "losses are never hidden" do
    stats = %{@exact | dropped: 1234, stacks_dropped: 5, replaced: 0}

    assert Enum.slice(lines([], stats), 1, 2) == [
             "Incomplete: 1_234 allocations not recorded since start (h Mtrace.stats: why),",
             "  5 recorded without a stack"
           ]

    refute Enum.any?(lines([], @exact), &String.starts_with?(&1, "Incomplete"))
    assert Enum.at(lines([], %{@exact | replaced: 2}), 1) =~ "2 entries replaced"
  end

  test "no sites" do
    assert lines([], @exact) == [
             "Native memory live on app@host: 12.0 MiB in 3_072 blocks",
             "No live allocations match."
           ]
  end

  test "ages" do
    ages = [0, 59, 60, 3599, 3600, 86_399, 86_400, 364 * 86_400, 400 * 86_400]

    assert Enum.map(ages, &Report.age/1) ==
             [
               "0s",
               "59s",
               "1m 00s",
               "59m 59s",
               "1h 00m",
               "23h 59m",
               "1d 00h",
               "364d 00h",
               "1y 35d"
             ]
  end
end

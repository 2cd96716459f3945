defmodule Mtrace.ExportTest do
  use ExUnit.Case, async: true

  alias Mtrace.Export
  alias Mtrace.JSON
  alias Mtrace.Test.JSONParser

  doctest Mtrace.JSON
  doctest Mtrace.JSON.Encoded
  doctest Mtrace.Export
  doctest Mtrace.Test.JSONParser

  # OTP 27 and later have a JSON parser of their own: check exports against
  # it there, as an independent reader. Called through apply/3 so that this
  # file compiles without warnings where :json does not exist.
  defp decode!(iodata) do
    text = IO.iodata_to_binary(iodata)

    if Code.ensure_loaded?(:json) do
      {value, :ok, rest} = apply(:json, :decode, [text, :ok, %{null: nil}])
      assert String.trim(rest) == ""
      value
    else
      JSONParser.decode!(text)
    end
  end

  defp frame(symbol, opts \\ []) do
    %{
      symbol: symbol,
      lib: Keyword.get(opts, :lib, "/usr/lib/libleak.so"),
      file: Keyword.get(opts, :file),
      line: Keyword.get(opts, :line),
      addr: Keyword.get(opts, :addr, 0x7F00_0000_1000),
      inlined: Keyword.get(opts, :inlined, false),
      offset: Keyword.get(opts, :offset, 0x1000)
    }
  end

  defp site(count, bytes, frames),
    do: %{count: count, bytes: bytes, oldest: 60, newest: 1, frames: frames}

  defp parse_folded(iodata) do
    iodata
    |> IO.iodata_to_binary()
    |> String.split("\n", trim: true)
    |> Enum.map(fn line ->
      assert [_, stack, weight] = Regex.run(~r/\A(.+) (\d+)\z/, line)
      {stack, String.to_integer(weight)}
    end)
  end

  defp sites do
    [
      site(3, 300, [frame("cache_put"), frame("nif_call"), frame("main")]),
      site(1, 4096, [frame(nil, offset: 0xABC), frame("main")]),
      site(5, 50, [frame("cache_put"), frame("nif_call"), frame("main")]),
      site(2, 20, [frame("strdup", lib: nil), frame("main")])
    ]
  end

  describe "Mtrace.Frame.name/1" do
    test "symbol, else lib basename and lowercase hex offset, else ??" do
      assert Mtrace.Frame.name(frame("f", lib: nil)) == "f"

      assert Mtrace.Frame.name(frame(nil, lib: "/a/b/libz.so.1", offset: 0xBEEF)) ==
               "libz.so.1+0xbeef"

      assert Mtrace.Frame.name(frame(nil, lib: nil)) == "?? (JIT or unloaded code)"
      assert Mtrace.Frame.name(frame("", lib: "", offset: 1)) == "?? (JIT or unloaded code)"
    end

    test "a compiler's clone is named as its function; a symbol naming nothing, by where it is" do
      for suffix <- [" [clone .isra.0]", " [clone .cold]", " [clone .constprop.0] [clone .cold]"] do
        assert Mtrace.Frame.name(frame("ns::f(std::string const&)" <> suffix)) == "ns::f"
      end

      for blank <- [" (x)", "   "] do
        assert Mtrace.Frame.name(frame(blank, lib: "/a/libq.so", offset: 0x10)) == "libq.so+0x10"
      end
    end
  end

  describe "folded/2" do
    test "one line per stack, outermost first, weights summing to the sites' bytes" do
      lines = parse_folded(Export.folded(sites()))

      assert lines == [
               {"main;libleak.so+0xabc", 4096},
               {"main;nif_call;cache_put", 350},
               {"main;strdup", 20}
             ]

      assert lines |> Enum.map(&elem(&1, 1)) |> Enum.sum() ==
               sites() |> Enum.map(& &1.bytes) |> Enum.sum()
    end

    test "counts as weight, merged and sorted heaviest first" do
      assert parse_folded(Export.folded(sites(), :count)) == [
               {"main;nif_call;cache_put", 8},
               {"main;strdup", 2},
               {"main;libleak.so+0xabc", 1}
             ]
    end

    test "stacks whose names differ only in an inlined frame's flag still merge" do
      sites = [
        site(1, 8, [frame("f", inlined: true), frame("g")]),
        site(1, 8, [frame("f"), frame("g")])
      ]

      assert parse_folded(Export.folded(sites)) == [{"g;f", 16}]
    end

    test "separators and line breaks in names cannot break the format" do
      nasty = frame("operator;(std::string)\nsecond line")
      sites = [site(1, 10, [nasty, frame("main")]), site(1, 5, [frame("main; x")])]
      text = IO.iodata_to_binary(Export.folded(sites))

      assert text == "main;operator:(std::string)?second line 10\nmain: x 5\n"
      assert [{_, 10}, {_, 5}] = parse_folded(text)
    end

    test "an innermost name ending in a number is not read as a second weight" do
      sites = [site(1, 12, [frame("digits 99"), frame("main 7")]), site(1, 3, [frame("v 1.5")])]
      text = IO.iodata_to_binary(Export.folded(sites))

      # flamegraph.pl's and inferno's reading: a line ending in two numbers
      # is a differential one
      refute text =~ ~r/\s\d+(\.\d*)? \d+$/m
      assert parse_folded(text) == [{"main 7;digits_99", 12}, {"v_1.5", 3}]
    end

    test "a site without a stack, and weight 0 lines left out" do
      sites = [site(2, 0, [frame("zero")]), site(1, 7, [])]
      assert parse_folded(Export.folded(sites)) == [{"[no stack]", 7}]
      assert parse_folded(Export.folded(sites, :count)) == [{"zero", 2}, {"[no stack]", 1}]
    end

    test "no sites, no lines; an unknown weight raises" do
      assert IO.iodata_to_binary(Export.folded([])) == ""
      assert_raise ArgumentError, fn -> Export.folded(sites(), :age) end
    end
  end

  describe "json/3" do
    @meta %{node: :app@host, generated_at: ~U[2024-05-01 12:34:56.789Z]}
    @stats %{
      live_count: 11,
      live_bytes: 4466,
      sampled: false,
      dropped: 0,
      config_errors: ["MTRACE_X"]
    }

    test "sampling: the estimated count of the same sites is the tracer's, rounded once" do
      sampled =
        for i <- 1..3, do: Map.merge(site(1, 100 * i, []), %{est_count: 2, est_bytes: 150})

      stats = %{@stats | sampled: true}
      total = %{count: 3, bytes: 600, est_count: 5, est_bytes: 450}

      doc = fn meta ->
        Export.json(sampled, stats, meta) |> IO.iodata_to_binary() |> JSONParser.decode!()
      end

      # three sites of weight 1.58 each, rounded to 2 each: 6; the tracer's 5
      assert doc.(Map.put(@meta, :total, total))["total"]["est_count"] == 5
      # a total of other sites (a limit) is not theirs: their own sum
      assert doc.(Map.put(@meta, :total, %{total | count: 9}))["total"]["est_count"] == 6
      assert doc.(@meta)["total"]["est_count"] == 6
    end

    test "frames that many stacks share are encoded once; each site is one binary" do
      outer = for i <- 1..20, do: frame("outer_#{i}", file: "src/outer.c", line: i)
      many = for i <- 1..500, do: site(i, i, [frame("own_#{i}") | outer])
      json = Export.json(many, @stats, @meta)
      doc = json |> IO.iodata_to_binary() |> JSONParser.decode!()
      assert length(doc["sites"]) == 500
      assert Enum.all?(doc["sites"], &(length(&1["frames"]) == 21))
      # what the encoding keeps on the heap is a list of binaries, not
      # iodata for each occurrence of each frame (some 300 words a frame)
      assert :erts_debug.flat_size(json) < 20 * 500, "#{:erts_debug.flat_size(json)} words"
    end

    test "round-trips: totals, stats, sites and frames" do
      frames = [
        frame("leak", file: "src/leak.c", line: 42, inlined: true),
        frame(nil, lib: nil, offset: 16)
      ]

      sites = [site(3, 300, frames) | sites()]
      decoded = decode!(Export.json(sites, @stats, @meta))

      assert decoded["generated_at"] == "2024-05-01T12:34:56.789Z"
      assert decoded["node"] == "app@host"

      assert decoded["total"] == %{
               "count" => 14,
               "bytes" => 4766,
               "est_count" => 14,
               "est_bytes" => 4766,
               "sampled" => false
             }

      assert decoded["stats"] == %{
               "live_count" => 11,
               "live_bytes" => 4466,
               "sampled" => false,
               "dropped" => 0,
               "config_errors" => ["MTRACE_X"]
             }

      assert [first | _] = decoded["sites"]
      assert length(decoded["sites"]) == 5

      assert Map.delete(first, "frames") == %{
               "count" => 3,
               "bytes" => 300,
               "oldest" => 60,
               "newest" => 1
             }

      assert first["frames"] == [
               %{
                 "name" => "leak",
                 "symbol" => "leak",
                 "lib" => "/usr/lib/libleak.so",
                 "file" => "src/leak.c",
                 "line" => 42,
                 "addr" => 0x7F00_0000_1000,
                 "offset" => 0x1000,
                 "inlined" => true
               },
               %{
                 "name" => "?? (JIT or unloaded code)",
                 "symbol" => nil,
                 "lib" => nil,
                 "file" => nil,
                 "line" => nil,
                 "addr" => 0x7F00_0000_1000,
                 "offset" => 16,
                 "inlined" => false
               }
             ]
    end

    test "an Erlang frame carries its module, function and arity" do
      erlang = %{
        module: Ledger,
        function: :append,
        arity: 2,
        symbol: "Ledger.append/2",
        file: "lib/ledger.ex",
        line: 7,
        addr: 0x7F00_0000_2000,
        lib: nil,
        inlined: false,
        offset: 0
      }

      unnamed = %{erlang | module: nil, function: nil, arity: nil, symbol: nil, file: nil}
      site = site(1, 64, [frame("enif_alloc"), erlang, unnamed])

      [%{"frames" => [native, named, unknown]}] =
        decode!(Export.json([site], %{}, @meta))["sites"]

      refute Map.has_key?(native, "module")
      assert %{"name" => "Ledger.append/2", "line" => 7} = named
      assert %{"module" => "Elixir.Ledger", "function" => "append", "arity" => 2} = named
      assert %{"module" => nil, "function" => nil, "arity" => nil} = unknown
      assert unknown["name"] == "?? (Erlang code)"
    end

    test "sampling: the total gives the estimates too, and says it is sampled" do
      sampled = fn count, bytes, est_count, est_bytes ->
        Map.merge(site(count, bytes, [frame("leak")]), %{
          est_count: est_count,
          est_bytes: est_bytes
        })
      end

      sites = [sampled.(3, 1_572_864, 24, 12_582_912), sampled.(20, 20_480, 2_000, 1_024_000)]
      stats = %{sampled: true, live_count: 23, est_live_count: 2_024}
      decoded = decode!(Export.json(sites, stats, @meta))

      assert decoded["total"] == %{
               "count" => 23,
               "bytes" => 1_593_344,
               "est_count" => 2_024,
               "est_bytes" => 13_606_912,
               "sampled" => true
             }

      assert [%{"est_count" => 24, "est_bytes" => 12_582_912} | _] = decoded["sites"]
    end

    test "since a mark: the mark, the window and each site's growth are written" do
      sites = [Map.put(site(3, 300, [frame("grow")]), :growth_per_s, 75.5)]
      mark = %Mtrace.Mark{node: :app@host, t_ms: 98_765}

      decoded =
        decode!(Export.json(sites, %{}, Map.merge(@meta, %{since: mark, window_ms: 4000})))

      assert decoded["since"] == 98_765
      assert decoded["window_ms"] == 4000
      assert [%{"growth_per_s" => 75.5, "bytes" => 300}] = decoded["sites"]

      # a mark given, no window
      decoded = decode!(Export.json(sites, %{}, Map.put(@meta, :since, mark)))
      assert {decoded["since"], decoded["window_ms"]} == {98_765, nil}

      # a plain snapshot says so, and its sites have no growth
      plain = decode!(Export.json(sites(), %{}, @meta))
      assert Map.fetch!(plain, "since") == nil and Map.fetch!(plain, "window_ms") == nil
      refute Enum.any?(plain["sites"], &Map.has_key?(&1, "growth_per_s"))

      assert_raise ArgumentError, ~r/:since/, fn ->
        Export.json(sites, %{}, Map.put(@meta, :since, 98_765))
      end

      assert_raise ArgumentError, ~r/:window_ms/, fn ->
        Export.json(sites, %{}, Map.put(@meta, :window_ms, -1))
      end
    end

    test "fields sites may gain later are not exported" do
      site = Map.put(site(1, 1, [Map.put(frame("f"), :cache_slot, {1, 2})]), :internal, self())
      [decoded] = decode!(Export.json([site], %{}, @meta))["sites"]
      refute Map.has_key?(decoded, "internal")
      refute Map.has_key?(hd(decoded["frames"]), "cache_slot")
    end

    test "nasty names survive the round trip" do
      names = [
        "quote\" backslash\\ slash/",
        "controls \u0000\u0001\b\f\n\r\t\u001f end",
        "unicode é ∑ 𝄞 \u2028\u2029",
        "operator<<(std::ostream&, char const*)"
      ]

      sites = Enum.map(names, &site(1, 1, [frame(&1)]))
      decoded = decode!(Export.json(sites, %{}, @meta))

      assert Enum.map(decoded["sites"], &hd(&1["frames"])["symbol"]) == names
    end

    test "bad meta and unencodable values raise" do
      assert_raise ArgumentError, fn -> Export.json(sites(), %{}, %{node: node()}) end
      assert_raise ArgumentError, fn -> Export.json(sites(), %{odd: {1, 2}}, @meta) end
    end

    test "names and paths that are not UTF-8 are written with U+FFFD, not refused" do
      # a NIF linking a library from a directory named in Latin-1
      latin1 =
        frame("inner_leak",
          lib: "/tmp/caf\xE9/libinner.so",
          file: "src/\xFFinner.c",
          line: 2
        )

      unnamed = frame(nil, lib: "/tmp/libcaf\xE9.so", offset: 0x10)
      sites = [site(1, 64, [latin1, frame(<<0xC3>>), unnamed]) | sites()]
      decoded = decode!(Export.json(sites, %{}, @meta))

      [bad | rest] = decoded["sites"]
      assert length(rest) == 4
      [first, cut, offset] = bad["frames"]
      assert first["lib"] == "/tmp/caf\uFFFD/libinner.so"
      assert first["file"] == "src/\uFFFDinner.c"
      assert first["symbol"] == "inner_leak"
      assert cut["symbol"] == "\uFFFD"
      assert offset["name"] == "libcaf\uFFFD.so+0x10"
    end
  end

  describe "why_empty/2" do
    test "tracking off, a filter that matched nothing, an empty table: each said" do
      off = "Tracking is switched off (Mtrace.disable/0 or MTRACE_ENABLED=0)"
      missed = ~s|No live allocation matches the filter (with a frame in "nif")|
      empty = "The allocation table is empty"
      live = %{enabled: true, live_count: 3, live_bytes: 3072}
      why = &Export.why_empty/2

      assert why.(%{live | enabled: false, live_count: 0}, nil) =~ ~r/^#{Regex.escape(off)}/
      # switched off after blocks were recorded: the filter missed those
      both = why.(%{live | enabled: false}, ~s|with a frame in "nif"|)
      assert both =~ off and both =~ missed
      refute why.(%{live | enabled: false, live_count: 0}, "x") =~ "filter"

      assert why.(live, ~s|with a frame in "nif"|) ==
               missed <> "; the table holds 3.0 KiB in 3 live blocks."

      sampled = Map.merge(live, %{sampled: true, est_live_count: 300, est_live_bytes: 307_200})
      assert why.(sampled, "x") =~ "the table holds about 300.0 KiB in about 300 live blocks."
      assert why.(%{live | live_count: 0, live_bytes: 0}, "x") =~ ~r/^#{empty}/
      # the stats unknown, the filter still said
      assert why.(nil, "x") == "No live allocation matches the filter (x)."
      assert why.(live, nil) == nil
    end
  end

  describe "Mtrace.JSON" do
    defp encode(term), do: IO.iodata_to_binary(JSON.encode(term))

    test "scalars" do
      assert encode(nil) == "null"
      assert encode(true) == "true"
      assert encode(:some_atom) == ~s|"some_atom"|
      assert encode(-12) == "-12"
      assert encode(123_456_789_012_345_678_901_234_567_890) == "123456789012345678901234567890"
      assert encode(0.1) == "0.1"
      assert decode!(encode(1.0e300)) == 1.0e300
      assert decode!(encode(-2.5e-300)) == -2.5e-300
    end

    test "escapes exactly what JSON requires (and the JavaScript line separators)" do
      assert encode("a\"b\\c/d") == ~S|"a\"b\\c/d"|
      assert encode("\n\u0000\u001f\u007f") == ~s|"\\u000a\\u0000\\u001f\u007f"|
      assert encode("é∑𝄞") == ~s|"é∑𝄞"|
      assert encode("x\u2028y\u2029") == ~S|"x\u2028y\u2029"|
      assert encode("") == ~s|""|
    end

    test "every control character round-trips" do
      all = for c <- 0..0x7F, into: "", do: <<c>>
      assert decode!(encode(all)) == all
    end

    test "maps and lists nest; keys are sorted" do
      term = %{"b" => [1, [2, %{}], []], :a => %{"x" => nil}}
      assert encode(term) == ~s|{"a":{"x":null},"b":[1,[2,{}],[]]}|
      assert decode!(encode(term)) == %{"a" => %{"x" => nil}, "b" => [1, [2, %{}], []]}
    end

    test "anything else raises" do
      for bad <- [
            {1, 2},
            self(),
            make_ref(),
            <<0xFF, 0xFE>>,
            <<0xED, 0xA0, 0x80>>,
            [1 | 2],
            %{{:tuple} => 1},
            %{1 => 2},
            %{:a => 1, "a" => 2},
            ~U[2024-01-01 00:00:00Z],
            [ok: 1],
            &Enum.map/2
          ] do
        assert_raise ArgumentError, fn -> JSON.encode(bad) end
      end
    end
  end

  describe "the test parser" do
    test "reads what it should" do
      assert JSONParser.decode!(~s| {"a" : [ true , false , null , -0 , 1.5e2 , 2E-1, 1e2 ] } |) ==
               %{"a" => [true, false, nil, 0, 150.0, 0.2, 100.0]}

      assert JSONParser.decode!(~S|"\ud834\udd1e \u00E9 \/ \b\f\n\r\t"|) == "𝄞 é / \b\f\n\r\t"
      assert JSONParser.decode!("[]") == []
      assert JSONParser.decode!("{}") == %{}
    end

    test "refuses malformed input" do
      for bad <- [
            "",
            " ",
            "[1,]",
            "{\"a\":1,}",
            "[1 2]",
            "{'a':1}",
            "{a:1}",
            "{\"a\" 1}",
            "{\"a\":1,\"a\":2}",
            "\"unterminated",
            "\"tab\there\"",
            "\"bad \\x escape\"",
            "\"\\u12\"",
            "\"\\ud834\"",
            "\"\\udd1e\"",
            "\"\\ud834\\u0041\"",
            <<?", 0xFF, ?">>,
            "01",
            "1.",
            ".5",
            "-",
            "+1",
            "1e",
            "1e400",
            "tru",
            "nul",
            "True",
            "[1] [2]",
            "[1]x",
            "NaN"
          ] do
        assert_raise ArgumentError, fn -> JSONParser.decode!(bad) end
      end
    end
  end
end

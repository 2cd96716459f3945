defmodule Mtrace.FlamegraphTest do
  use ExUnit.Case, async: true

  import Bitwise
  import Record, only: [defrecordp: 2, extract: 2]

  alias Mtrace.Flamegraph
  alias Mtrace.Test.PNG

  doctest Mtrace.Flamegraph

  defrecordp :xml_attribute, extract(:xmlAttribute, from_lib: "xmerl/include/xmerl.hrl")
  defrecordp :xml_text, extract(:xmlText, from_lib: "xmerl/include/xmerl.hrl")

  # Found when this file is compiled, that is when the tests run: the browser
  # check runs where chromium is installed and is skipped elsewhere.
  @chromium System.find_executable("chromium")
  @chromium_timeout_ms 60_000

  @width 1200
  # The drawing spans the image minus a 10 px margin on each side.
  @drawing_width @width - 20

  ## Building sites

  defp frame(symbol, opts \\ []) do
    %{
      symbol: symbol,
      lib: Keyword.get(opts, :lib, "/usr/lib/libapp.so"),
      file: Keyword.get(opts, :file),
      line: Keyword.get(opts, :line),
      addr: 0x7F00_0000_1000,
      inlined: Keyword.get(opts, :inlined, false),
      offset: Keyword.get(opts, :offset, 0x1000)
    }
  end

  # `symbols` outermost first, as one reads a call chain; sites store them
  # innermost first.
  defp site(symbols, bytes, count) do
    frames = symbols |> Enum.reverse() |> Enum.map(&frame/1)
    %{count: count, bytes: bytes, oldest: 120, newest: 3, frames: frames}
  end

  ## Reading the SVG back

  defp render(sites, opts \\ []), do: sites |> Flamegraph.svg(opts) |> IO.iodata_to_binary()

  defp parse!(svg) do
    {doc, rest} = :xmerl_scan.string(:binary.bin_to_list(svg), quiet: true)
    assert rest == []
    doc
  end

  # Every box: a <g> holding a <title> and a <rect>.
  defp boxes(svg) do
    doc = parse!(svg)

    for g <- :xmerl_xpath.string(~c"//g[title and rect]", doc) do
      title = :xmerl_xpath.string(~c"title/text()", g) |> Enum.map_join(&text_value/1)
      label = :xmerl_xpath.string(~c"text/text()", g) |> Enum.map_join(&text_value/1)
      rect = fn name -> attribute(g, "rect/@" <> name) end

      %{
        title: title,
        name: title |> String.split("\n") |> hd(),
        label: label,
        x: number(rect.("x")),
        y: number(rect.("y")),
        width: number(rect.("width")),
        height: number(rect.("height")),
        fill: rect.("fill")
      }
    end
  end

  # The text of each element `path` selects.
  defp texts(doc, path) do
    for element <- :xmerl_xpath.string(String.to_charlist(path), doc) do
      :xmerl_xpath.string(~c"text()", element) |> Enum.map_join(&text_value/1)
    end
  end

  defp text_value(node), do: node |> xml_text(:value) |> List.to_string()

  defp attribute(element, path) do
    [attr] = :xmerl_xpath.string(String.to_charlist(path), element)
    attr |> xml_attribute(:value) |> List.to_string()
  end

  defp number(text) do
    {value, ""} = Float.parse(text)
    value
  end

  defp box!(boxes, name) do
    case Enum.filter(boxes, &(&1.name == name)) do
      [box] -> box
      other -> flunk("expected one box named #{inspect(name)}, found #{length(other)}")
    end
  end

  ## The graph

  describe "svg/2" do
    test "blocks of 0 bytes count in the total, and nothing is said left out" do
      sites = [site(["main", "leak"], 18_000, 2), site(["main", "zero"], 0, 3)]
      svg = render(sites, matched: %{bytes: 18_000, count: 5})
      assert svg =~ "Total: 17.6 KiB in 5 live blocks (width by bytes)"
      refute svg =~ "largest site"
    end

    test "under sampling, sites rounded one by one are not taken for sites left out" do
      # 10 sites of one sampled 24 KiB block each at R = 16 KiB: each
      # weighs 1.29 and shows as 1, the total (rounded once) as 13.
      sites =
        for i <- 1..10,
            do: Map.put(site(["main", "s#{i}"], 31_720, 1), :samples, 1)

      stats = %{sampled: true}
      all = %{bytes: 317_200, count: 13, samples: 10}
      svg = render(sites, stats: stats, matched: all)

      assert svg =~
               "Total: about 309.8 KiB in about 13 live blocks (estimated from a sample; width"

      refute svg =~ "largest site"

      # one sampled block more matched than the sites drawn hold: left out
      more = %{bytes: 349_000, count: 14, samples: 11}

      assert render(sites, stats: stats, matched: more) =~
               "the 10 largest sites of about 340.8 KiB in about 14 live blocks; "

      assert_raise ArgumentError, ~r/option :matched must be/, fn ->
        render(sites, matched: %{all | samples: -1})
      end

      # sites without their samples (or with nil): the bytes tell, which
      # estimates add up exactly
      for plain <- [
            Enum.map(sites, &Map.delete(&1, :samples)),
            Enum.map(sites, &%{&1 | samples: nil})
          ] do
        refute render(plain, stats: stats, matched: all) =~ "largest site"
        assert render(plain, stats: stats, matched: more) =~ "the 10 largest sites of"
      end

      # ten sites of 1.6 blocks, each shown as 2, and one sampled block left
      # out: what is drawn is not said to be more than what matched (18)
      twos = Enum.map(sites, &%{&1 | count: 2})
      svg = render(twos, stats: stats, matched: %{bytes: 349_000, count: 18, samples: 11})

      assert svg =~
               "Total: about 309.8 KiB in about 18 live blocks (estimated from a sample; the 10"
    end

    test "what a limit leaves out is named by the order the sites were picked in" do
      sites = [site(["main", "old"], 1000, 1)]
      matched = %{bytes: 9000, count: 5}

      for {sort, words} <- [
            bytes: "the 1 largest site of",
            count: "the 1 site with the most blocks of",
            oldest: "the 1 oldest site of",
            growth: "the 1 fastest-growing site of"
          ] do
        assert render(sites, matched: matched, sort: sort) =~ words
      end

      assert_raise ArgumentError, ~r/option :sort must be one of/, fn ->
        render(sites, sort: :size)
      end
    end

    test "widths are proportional to bytes by default" do
      svg = render([site(["main", "big"], 3000, 1), site(["main", "small"], 1000, 3)])
      boxes = boxes(svg)

      assert_in_delta box!(boxes, "all").width, @drawing_width, 0.01
      assert_in_delta box!(boxes, "main").width, @drawing_width, 0.01
      assert_in_delta box!(boxes, "big").width, @drawing_width * 0.75, 0.01
      assert_in_delta box!(boxes, "small").width, @drawing_width * 0.25, 0.01
    end

    test "widths are proportional to allocation counts with weight: :count" do
      svg =
        render([site(["main", "big"], 3000, 1), site(["main", "small"], 1000, 3)], weight: :count)

      boxes = boxes(svg)

      assert_in_delta box!(boxes, "big").width, @drawing_width * 0.25, 0.01
      assert_in_delta box!(boxes, "small").width, @drawing_width * 0.75, 0.01
      assert svg =~ "width by block count"
    end

    test "width: sets the image width" do
      svg = render([site(["main"], 10, 1)], width: 500)
      assert svg =~ ~s(width="500")
      assert_in_delta box!(boxes(svg), "main").width, 480, 0.01
    end

    test "stacks merge from the outermost frame; children lie within their parents" do
      sites = [
        site(["main", "run", "parse", "alloc_node"], 5000, 5),
        site(["main", "run", "parse", "alloc_token"], 700, 70),
        site(["main", "run", "render"], 1200, 2),
        site(["main", "init"], 64, 1),
        site(["main", "run", "render", "alloc_node"], 333, 3),
        site(["worker", "alloc_node"], 1, 1)
      ]

      boxes = boxes(render(sites))

      assert length(Enum.filter(boxes, &(&1.name == "run"))) == 1
      assert length(Enum.filter(boxes, &(&1.name == "alloc_node"))) == 3

      rows = boxes |> Enum.map(& &1.y) |> Enum.uniq() |> Enum.sort()

      for {parent_y, child_y} <- Enum.zip(rows, tl(rows)),
          child <- Enum.filter(boxes, &(&1.y == child_y)) do
        parents = Enum.filter(boxes, &(&1.y == parent_y))

        assert Enum.any?(parents, fn parent ->
                 child.x >= parent.x - 0.01 and
                   child.x + child.width <= parent.x + parent.width + 0.01
               end),
               "#{child.name} at x=#{child.x} is not inside a box of the row above"
      end

      # A parent is as wide as its children together, plus what it allocated itself.
      run = box!(boxes, "run")
      children = Enum.filter(boxes, &(&1.name in ["parse", "render"]))
      assert_in_delta run.width, Enum.sum(Enum.map(children, & &1.width)), 0.05
    end

    test "boxes too narrow to see are not drawn but still count in their parent" do
      svg = render([site(["main", "huge"], 10_000_000, 1), site(["main", "tiny"], 1, 1)])
      boxes = boxes(svg)

      refute Enum.any?(boxes, &(&1.name == "tiny"))
      assert box!(boxes, "main").title =~ "(10_000_001 bytes) in 2 blocks"
    end

    test "names, labels and hover text are XML-escaped" do
      nasty = ~s|put<std::ostream&, "x">|
      quote_name = "it's <b>bold</b> & 'quoted'"
      svg = render([site(["main", nasty], 1000, 1), site(["main", quote_name], 1000, 1)])

      assert svg =~ "put&lt;std::ostream&amp;, &quot;x&quot;&gt;"
      assert svg =~ "it&apos;s &lt;b&gt;bold&lt;/b&gt; &amp; &apos;quoted&apos;"
      refute svg =~ "put<"
      refute svg =~ "<b>"

      boxes = boxes(svg)
      assert box!(boxes, nasty).label == nasty
      assert box!(boxes, quote_name).label == quote_name
    end

    test "stays well-formed with bytes that are not UTF-8 and control characters" do
      svg = render([site(["main", "bad\xFF\xFEname", "ctl\x01\x1Bchar"], 100, 1)])

      assert is_tuple(parse!(svg))
      assert svg =~ "bad\uFFFD\uFFFDname"
      assert svg =~ "ctl??char"
    end

    test "every box has hover text: name, location, library, bytes, count, share" do
      leak = frame("leak_alloc", lib: "/usr/lib/libleak.so", file: "leak.c", line: 42)

      main = frame("main", lib: nil)
      inlined = frame("inline_helper", file: "helper.h", line: 7, inlined: true)
      unknown = frame(nil, lib: nil)

      sites = [
        %{
          count: 8,
          bytes: 8 * 1024 * 1024,
          oldest: 3600,
          newest: 5,
          frames: [leak, main, unknown]
        },
        %{
          count: 2,
          bytes: 2 * 1024 * 1024,
          oldest: 60,
          newest: 1,
          frames: [inlined, main, unknown]
        }
      ]

      boxes = boxes(render(sites))
      assert Enum.all?(boxes, &(&1.title != ""))

      leak_title = box!(boxes, "leak_alloc").title
      assert leak_title =~ ~r/^leak_alloc\n/
      assert leak_title =~ "at leak.c:42"
      assert leak_title =~ "in /usr/lib/libleak.so"
      assert leak_title =~ "8.0 MiB"
      assert leak_title =~ "in 8 blocks"
      assert leak_title =~ "80.00% of live bytes"
      assert leak_title =~ "oldest 1h 00m"

      assert box!(boxes, "inline_helper").title =~ "(inlined into its caller)"
      assert box!(boxes, "?? (JIT or unloaded code)").title =~ "100.00%"
      assert box!(boxes, "all").title =~ "10.0 MiB"
    end

    test "sampling: the total and the hover texts say the figures are estimates" do
      sites = [site(["main", "leak"], 12 * 1024 * 1024, 24)]
      svg = render(sites, stats: %{sampled: true, enabled: true})
      assert [total] = texts(parse!(svg), "/svg/text")

      assert total ==
               "Total: about 12.0 MiB in about 24 live blocks " <>
                 "(estimated from a sample; width by bytes)"

      assert box!(boxes(svg), "leak").title =~
               "about 12.0 MiB (12_582_912 bytes) in about 24 blocks"

      # lossless, the figures are exact
      svg = render(sites, stats: %{sampled: false, enabled: true})
      assert [total] = texts(parse!(svg), "/svg/text")
      assert total == "Total: 12.0 MiB in 24 live blocks (width by bytes)"
      refute svg =~ "about"
    end

    test "the title and the total are at the top" do
      svg = render([site(["main"], 1536, 3)], title: "leaks on node@host")

      doc = parse!(svg)
      # the heading, then the controls: reset (hidden until zoomed), search, matched share
      assert [heading, "Reset zoom", "Search", ""] = texts(doc, "/svg/g/text")
      assert [total] = texts(doc, "/svg/text")

      assert heading == "leaks on node@host"
      assert total =~ "Total: 1.5 KiB in 3 live blocks"
    end

    test "a heading or a total too long for its room is squeezed into it, its text whole" do
      filter = ~s|allocated in the last 2s, with a frame in "leaky", of at least 10 B each|
      # at the default width a shorter one fits
      svg = render([site(["main"], 1536, 3)], filter: ~s|with a frame in "leaky"|)
      refute svg =~ "textLength"

      # at 800 pixels the total would run under "Matched: ..." (and at 300
      # the heading under "Search"): each is drawn within its room
      svg = render([site(["main"], 1536, 3)], filter: filter, width: 800, title: "t")
      [total] = Regex.run(~r/<text x="400.0" y="44"[^>]*>/, svg)
      assert total =~ ~s(textLength="520" lengthAdjust="spacingAndGlyphs")
      assert [_] = texts(parse!(svg), "/svg/text")

      svg =
        render([site(["main"], 1536, 3)], width: 300, title: "leaks on my_app@a-long-host-name")

      [heading] = Regex.run(~r/<text x="150.0" y="22"[^>]*>/, svg)
      assert heading =~ ~s(textLength="40")
      assert [heading_text, "Reset zoom", "Search", ""] = texts(parse!(svg), "/svg/g/text")
      assert heading_text == "leaks on my_app@a-long-host-name"
    end

    test "a filtered graph says, as report/1's header does, that its total is what matched" do
      filter = ~s|allocated in the last 2s, with a frame in "leaky"|
      svg = render([site(["main"], 1536, 3)], filter: filter)
      assert [total] = texts(parse!(svg), "/svg/text")
      assert total == "Total: 1.5 KiB in 3 live blocks #{filter} (width by bytes)"
    end

    test "labels are truncated with .. when the box is too narrow" do
      long = String.duplicate("very_long_function_name_", 10)
      boxes = boxes(render([site(["main", long], 1, 1)], width: 300))

      label = box!(boxes, long).label
      assert String.ends_with?(label, "..")
      assert String.starts_with?(long, String.trim_trailing(label, ".."))
      assert String.length(label) < 300 / 6
    end

    test "colors are warm, explicit and the same for a name in every graph" do
      a = boxes(render([site(["main", "alloc_a"], 10, 1), site(["other", "alloc_b"], 20, 1)]))
      b = boxes(render([site(["x", "alloc_a"], 99, 9)], width: 400))

      assert box!(a, "alloc_a").fill == box!(b, "alloc_a").fill

      for %{fill: fill} <- a do
        assert <<"#", hex::binary-6>> = fill
        <<r, g, bl>> = Base.decode16!(hex, case: :lower)
        assert r >= 205 and g <= 230 and bl <= 55, "#{fill} is not warm"
      end
    end

    test "output does not depend on the order of sites" do
      sites = [site(["main", "a"], 10, 1), site(["main", "b"], 10, 1), site(["c"], 5, 2)]
      assert render(sites) == render(Enum.reverse(sites))
    end

    test "an empty list gives a valid SVG saying so" do
      for sites <- [[], [site(["main"], 0, 0)]] do
        svg = render(sites)
        assert is_tuple(parse!(svg))
        assert svg =~ "no live allocations"
        assert boxes(svg) == []
      end
    end

    test "an empty graph says why: tracking off, a filter that matched nothing, no blocks" do
      off = %{enabled: false, live_count: 0, live_bytes: 0}
      live = %{enabled: true, live_count: 1_266, live_bytes: 11_010_048}

      for {opts, says} <- [
            {[stats: off], "Tracking is switched off (Mtrace.disable/0 or MTRACE_ENABLED=0)"},
            {[stats: live, filter: ~s|with a frame in "libinner"|],
             ~s|No live allocation matches the filter (with a frame in "libinner"); | <>
               "the table holds 10.5 MiB in 1_266 live blocks."},
            {[stats: %{live | live_count: 0, live_bytes: 0}], "The allocation table is empty"}
          ] do
        # narrow: the reason is wrapped onto lines of their own, within the image
        svg = render([], [width: 300] ++ opts)
        doc = parse!(svg)
        assert boxes(svg) == []
        assert texts(doc, "/svg/text") == ["no live allocations"]
        [_title | lines] = texts(doc, "/svg/g/text")
        assert length(lines) > 1
        assert Enum.join(lines, " ") =~ says
        assert Enum.all?(lines, &(String.length(&1) <= 35))
        assert number(attribute(doc, "/svg/@height")) >= 80 + 18 * length(lines)
      end

      # blocks that match but hold 0 bytes (malloc(0)) are not "none"
      svg = render([site(["main"], 0, 4)], stats: live, filter: "x")
      assert svg =~ "The 4 live blocks that match hold 0 bytes."
      refute svg =~ "No live allocation matches"
    end

    test "unknown options and bad values raise ArgumentError naming the option" do
      sites = [site(["main"], 1, 1)]

      for {opts, named} <- [
            {[weight: :pages], ":weight"},
            {[width: 0], ":width"},
            {[width: "wide"], ":width"},
            {[title: :leaks], ":title"},
            {[colour: :red], ":colour"},
            {[stats: [sampled: true]], ":stats"},
            {[filter: :lib], ":filter"}
          ] do
        error = assert_raise ArgumentError, fn -> render(sites, opts) end
        assert error.message =~ named
      end

      assert_raise ArgumentError, fn -> render(sites, [:weight]) end
    end
  end

  ## The PNG decoder the browser check relies on

  describe "Mtrace.Test.PNG" do
    test "decodes RGB and RGBA through all five scanline filters" do
      for channels <- [3, 4] do
        width = 7
        rows = for y <- 0..9, do: pattern_row(y, width * channels)

        png = PNG.decode!(encode_png(rows, width, channels))

        assert {png.width, png.height, png.channels} == {width, 10, channels}
        assert png.pixels == IO.iodata_to_binary(rows)
        assert PNG.pixel(png, 1, 2) |> tuple_size() == channels
      end
    end

    test "refuses what it does not handle" do
      assert_raise ArgumentError, ~r/signature/, fn -> PNG.decode!("GIF89a") end

      for {header, message} <- [
            {[depth: 16], ~r/bit depth 16/},
            {[color_type: 3], ~r/color type 3/},
            {[interlace: 1], ~r/interlaced/}
          ] do
        png = encode_png([<<1, 2, 3>>], 1, 3, header)
        assert_raise ArgumentError, message, fn -> PNG.decode!(png) end
      end

      # One bit flipped in the image height, inside IHDR.
      <<good::binary-size(20), byte, rest::binary>> = encode_png([<<1, 2, 3>>], 1, 3)

      assert_raise ArgumentError, ~r/CRC/, fn ->
        PNG.decode!(<<good::binary, bxor(byte, 1), rest::binary>>)
      end
    end
  end

  # A PNG of `rows` (unfiltered pixel bytes), row y stored with filter y mod 5
  # so that every filter meets a prior row. `header` overrides IHDR fields.
  defp encode_png(rows, width, channels, header \\ []) do
    {filtered, _prior} =
      rows
      |> Enum.with_index()
      |> Enum.map_reduce(:binary.copy(<<0>>, width * channels), fn {row, y}, prior ->
        filter = rem(y, 5)
        {[filter, filter_row(filter, row, prior, channels)], row}
      end)

    depth = Keyword.get(header, :depth, 8)
    color_type = Keyword.get(header, :color_type, if(channels == 3, do: 2, else: 6))
    interlace = Keyword.get(header, :interlace, 0)
    ihdr = <<width::32, length(rows)::32, depth, color_type, 0, 0, interlace>>

    IO.iodata_to_binary([
      <<137, 80, 78, 71, 13, 10, 26, 10>>,
      chunk("IHDR", ihdr),
      chunk("tEXt", "Comment\0ancillary chunks are skipped"),
      chunk("IDAT", :zlib.compress(filtered)),
      chunk("IEND", "")
    ])
  end

  # Bytes that differ along the row and from row to row, so that every filter
  # predicts something other than the byte itself.
  defp pattern_row(y, bytes), do: for(x <- 1..bytes, into: <<>>, do: <<x * 37 + y * 91 &&& 0xFF>>)

  defp chunk(type, data),
    do: <<byte_size(data)::32, type::binary, data::binary, :erlang.crc32(type <> data)::32>>

  # The encoder's side of PNG filtering: each byte minus its predictor.
  defp filter_row(filter, row, prior, bpp) do
    for i <- 0..(byte_size(row) - 1), into: <<>> do
      a = if i >= bpp, do: :binary.at(row, i - bpp), else: 0
      b = :binary.at(prior, i)
      c = if i >= bpp, do: :binary.at(prior, i - bpp), else: 0
      <<:binary.at(row, i) - predictor(filter, a, b, c) &&& 0xFF>>
    end
  end

  defp predictor(0, _a, _b, _c), do: 0
  defp predictor(1, a, _b, _c), do: a
  defp predictor(2, _a, b, _c), do: b
  defp predictor(3, a, b, _c), do: div(a + b, 2)

  # Paeth: ties prefer a, then b, then c; sort_by is stable.
  defp predictor(4, a, b, c) do
    p = a + b - c

    [{_, best} | _] =
      Enum.sort_by([{abs(p - a), a}, {abs(p - b), b}, {abs(p - c), c}], &elem(&1, 0))

    best
  end

  ## In a browser

  describe "in headless Chromium" do
    @describetag :chromium
    if @chromium == nil, do: @describetag(skip: "chromium is not on PATH")

    @tag timeout: 2 * @chromium_timeout_ms
    test "the leaking function's box is drawn where the SVG says, in its color" do
      mib = 1024 * 1024

      sites = [
        site(["main", "worker_loop", "handle_request", "leaky_big_alloc"], 80 * mib, 800),
        site(["main", "worker_loop", "handle_request", "parse_body"], 9 * mib, 90),
        site(["main", "worker_loop", "cache_put"], 6 * mib, 60),
        site(["main", "init_tables"], 5 * mib, 5)
      ]

      svg = render(sites)
      leak = box!(boxes(svg), "leaky_big_alloc")
      assert_in_delta leak.width / @drawing_width, 0.8, 0.001
      doc = parse!(svg)
      height = doc |> attribute("/svg/@height") |> String.to_integer()
      background = attribute(doc, "/svg/rect/@fill")

      dir =
        Path.join(System.tmp_dir!(), "mtrace_flamegraph_#{System.unique_integer([:positive])}")

      File.mkdir_p!(dir)
      on_exit(fn -> File.rm_rf!(dir) end)
      svg_path = Path.join(dir, "leak.svg")
      png_path = Path.join(dir, "leak.png")
      File.write!(svg_path, svg)

      screenshot!(svg_path, png_path, @width, height, dir)
      png = PNG.decode!(File.read!(png_path))
      assert {png.width, png.height} == {@width, height}

      centre_x = round(leak.x + leak.width / 2)
      centre_y = round(leak.y + leak.height / 2)
      assert_colour(PNG.pixel(png, centre_x, centre_y), leak.fill)
      # Below the deepest row, at the right edge: only the background.
      assert_colour(PNG.pixel(png, @width - 3, height - 3), background)
    end
  end

  defp assert_colour(pixel, <<"#", hex::binary-6>>) do
    <<r, g, b>> = Base.decode16!(hex, case: :lower)
    {pr, pg, pb} = {elem(pixel, 0), elem(pixel, 1), elem(pixel, 2)}

    assert abs(pr - r) <= 6 and abs(pg - g) <= 6 and abs(pb - b) <= 6,
           "pixel #{inspect(pixel)} is not ##{hex}"
  end

  # Runs chromium through a port rather than System.cmd so that, on timeout,
  # the browser itself can be killed instead of left running.
  defp screenshot!(svg_path, png_path, width, height, dir) do
    args = [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--hide-scrollbars",
      "--force-device-scale-factor=1",
      "--user-data-dir=#{Path.join(dir, "profile")}",
      "--screenshot=#{png_path}",
      "--window-size=#{width},#{height}",
      "file://#{svg_path}"
    ]

    # The browser has no use for the tracer this test VM runs under.
    port =
      Port.open({:spawn_executable, @chromium}, [
        :binary,
        :exit_status,
        :stderr_to_stdout,
        args: args,
        env: [{~c"LD_PRELOAD", false}]
      ])

    {:os_pid, os_pid} = Port.info(port, :os_pid)
    deadline = System.monotonic_time(:millisecond) + @chromium_timeout_ms

    case collect(port, deadline, []) do
      {:exit, 0, _output} ->
        assert File.exists?(png_path), "chromium exited without writing #{png_path}"

      {:exit, status, output} ->
        flunk("chromium exited with status #{status}:\n#{output}")

      {:timeout, output} ->
        System.cmd("kill", ["-KILL", Integer.to_string(os_pid)])
        flunk("chromium did not finish in #{@chromium_timeout_ms} ms:\n#{output}")
    end
  end

  defp collect(port, deadline, output) do
    remaining = max(deadline - System.monotonic_time(:millisecond), 0)

    receive do
      {^port, {:data, data}} -> collect(port, deadline, [output, data])
      {^port, {:exit_status, status}} -> {:exit, status, IO.iodata_to_binary(output)}
    after
      remaining -> {:timeout, IO.iodata_to_binary(output)}
    end
  end
end

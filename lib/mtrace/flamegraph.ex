defmodule Mtrace.Flamegraph do
  @moduledoc """
  Renders live native memory by call stack as a standalone SVG flame graph.

  The graph is drawn icicle style: the root box ("all") is on top, under the
  title and the total, and each function's callees hang below it, down to the
  functions that called malloc. A box's width is proportional to the bytes (or
  the number of allocations) still held by the stacks that pass through it.
  Stacks are merged from the outermost frame inwards by frame name and
  library, so one box stands for every call site of a function below the same
  callers; its hover text lists the source lines merged into it. Children are
  ordered heaviest first. Boxes narrower than 0.1 px are left out of the
  drawing but still count in their parent's width.

  The SVG needs no script: hovering a box shows its `<title>` (name, source
  location, library, bytes, allocations, share of the total). Colors are hashed
  from the name, so a function keeps its color from one graph to the next.

  Input is a list of sites as `Mtrace.sites/1` returns them:

      %{count: 3, bytes: 4096, oldest: 60, newest: 2,
        frames: [%{lib: "/usr/lib/libfoo.so", symbol: "foo_alloc", file: "foo.c", line: 12,
                   addr: 0x7F00_0000_1234, inlined: false, offset: 0x1234}, ...]}

  `frames` is innermost first (frame 0 called malloc).
  """

  alias Mtrace.VM.Format

  @typedoc "A site as `Mtrace.sites/1` returns it."
  @type site :: Mtrace.site()

  @type option ::
          {:weight, :bytes | :count}
          | {:title, String.t()}
          | {:matched,
             %{
               required(:bytes) => non_neg_integer,
               required(:count) => non_neg_integer,
               optional(:samples) => non_neg_integer
             }
             | nil}
          | {:width, pos_integer()}
          | {:stats, map() | nil}
          | {:filter, String.t() | nil}
          | {:sort, :bytes | :count | :oldest | :growth}

  @defaults [
    weight: :bytes,
    title: "mtrace: live native memory by call stack",
    width: 1200,
    stats: nil,
    filter: nil,
    sort: :bytes
  ]

  # Layout, in pixels. Labels use a monospace font so that how many characters
  # fit in a box can be computed here, without measuring text.
  @header 60
  # room kept on each side of the heading and the total for the controls
  @controls_width 130
  @row 17
  @box_height 16
  @footer 10
  @font_size 12
  @char_width 0.62 * @font_size
  @min_drawn_width 0.1
  @background "#f8f8f8"
  @max_locations 3
  @why_row 18

  # Click to zoom, reset, search: a script kept in the SVG itself.
  @external_resource Path.join(__DIR__, "flamegraph/interactive.js")
  @script File.read!(Path.join(__DIR__, "flamegraph/interactive.js"))

  @doc """
  A standalone SVG flame graph of `sites`, as iodata.

  Options:

    * `:weight` - `:bytes` (default) or `:count`: what a box's width measures.
    * `:title` - the heading (default `"mtrace: live native memory by call stack"`).
    * `:width` - the image width in pixels (default 1200).
    * `:stats` - `Mtrace.stats/0` of the node the sites come from (default
      none). With `sampled: true` the sites' `bytes` and `count` are taken to
      be the estimates (`est_bytes`, `est_count`, as `Mtrace.flamegraph/2`
      gives them), and the total and hover texts say "about". When there
      is nothing to draw, the image says why: tracking switched off, the
      filter matched nothing, or the table is empty
      (`Mtrace.Export.why_empty/2`).
    * `:filter` - the query's filter in words (`"with a frame in
      \\"libfoo\\""`), nil (default) for none: the total says its figures
      are what matched, and an empty graph says why nothing did.
    * `:matched` - `%{bytes, count}` of every site that matched (nil by
      default): the total gives these figures, and when `sites` are only
      the largest of them (a `limit:`), it says how much they leave out.
      Under sampling, a site's estimated count is rounded on its own and
      the total's once, so the sum of the sites' may differ from it: a
      `samples` key here and in each site (the sampled blocks, as
      `Mtrace.flamegraph/2` gives them) then tells what is left out.
    * `:sort` - the order `sites` were picked by under a `limit:` (`:bytes`,
      the default, `:count`, `:oldest` or `:growth`, as `Mtrace.sites/1`
      takes it), named where the total says what it leaves out.

  Raises `ArgumentError` on an unknown option or a bad value.

  ## Example

      iex> site = %{count: 2, bytes: 2048, oldest: 9, newest: 1,
      ...>          frames: [%{lib: "/lib/libleak.so", symbol: "leak", file: nil, line: nil,
      ...>                     addr: 0x1000, inlined: false, offset: 0x10}]}
      iex> svg = IO.iodata_to_binary(Mtrace.Flamegraph.svg([site], width: 600))
      iex> svg =~ "<title>leak\\n"
      true
      iex> IO.iodata_to_binary(Mtrace.Flamegraph.svg([])) =~ "no live allocations"
      true
      iex> svg = Mtrace.Flamegraph.svg([site], stats: %{sampled: true}) |> IO.iodata_to_binary()
      iex> svg =~ "Total: about 2.0 KiB in about 2 live blocks"
      true
      iex> stats = %{enabled: false, live_count: 0}
      iex> IO.iodata_to_binary(Mtrace.Flamegraph.svg([], stats: stats)) =~ "Tracking is switched off"
      true
  """
  @spec svg([site()], [option()]) :: iodata()
  def svg(sites, opts \\ []) when is_list(sites) do
    opts = validate_options!(opts)
    tree = build_tree(sites, opts[:weight])

    if weight(tree, opts[:weight]) == 0 do
      empty_svg(sites, opts)
    else
      graph_svg(tree, Keyword.put(opts, :sites, length(sites)))
    end
  end

  ## Options

  @options [:weight, :title, :width, :stats, :filter, :matched, :sort]

  defp validate_options!(opts) do
    unless Keyword.keyword?(opts) do
      raise ArgumentError, "options must be a keyword list, got: #{inspect(opts)}"
    end

    Enum.each(opts, &validate_option!/1)
    Keyword.merge(@defaults, opts)
  end

  defp validate_option!({:weight, w}) when w in [:bytes, :count], do: :ok
  defp validate_option!({:title, t}) when is_binary(t), do: :ok
  defp validate_option!({:width, w}) when is_integer(w) and w > 0, do: :ok
  defp validate_option!({:stats, s}) when is_map(s) or is_nil(s), do: :ok
  defp validate_option!({:filter, f}) when is_binary(f) or is_nil(f), do: :ok
  defp validate_option!({:matched, nil}), do: :ok
  defp validate_option!({:sort, s}) when s in [:bytes, :count, :oldest, :growth], do: :ok

  defp validate_option!({:matched, %{bytes: b, count: c} = m})
       when is_integer(b) and b >= 0 and is_integer(c) and c >= 0 and
              (not is_map_key(m, :samples) or
                 (is_integer(:erlang.map_get(:samples, m)) and :erlang.map_get(:samples, m) >= 0)),
       do: :ok

  defp validate_option!({key, value}) when key in @options do
    expected = %{
      weight: ":bytes or :count",
      title: "a string",
      width: "a positive integer",
      stats: "a map (Mtrace.stats/0) or nil",
      filter: "a string or nil",
      matched:
        "%{bytes: non-negative integer, count: non-negative integer} " <>
          "(and samples: non-negative integer) or nil",
      sort: "one of :bytes, :count, :oldest, :growth"
    }

    raise ArgumentError,
          "option #{inspect(key)} must be #{expected[key]}, got: #{inspect(value)}"
  end

  defp validate_option!({key, _value}) do
    raise ArgumentError,
          "unknown option #{inspect(key)}; known options: " <>
            Enum.map_join(@options, ", ", &inspect/1)
  end

  ## The tree of merged stacks

  # Each node is built from the sites whose stacks pass through it, paired
  # with the frames left below it; grouping those by their next frame gives
  # the children. Every frame of every site is handled once. Sites of zero
  # weight would only add invisible boxes.
  defp build_tree(sites, weight) do
    paths = for site <- sites, Map.fetch!(site, weight) > 0, do: {Enum.reverse(site.frames), site}
    root = build_node({"all", nil, false}, [], paths, weight)
    # the total is every site's, those of zero weight (blocks of 0 bytes) too
    %{root | bytes: sum(sites, :bytes), count: sum(sites, :count)}
    |> Map.put(
      :samples,
      if(Enum.all?(sites, &is_integer(&1[:samples])), do: sum(sites, :samples))
    )
  end

  defp sum(sites, key), do: sites |> Enum.map(&Map.fetch!(&1, key)) |> Enum.sum()

  defp build_node({name, lib, inlined}, frames, paths, weight) do
    sites = Enum.map(paths, fn {_below, site} -> site end)

    children =
      paths
      |> Enum.filter(fn {below, _site} -> below != [] end)
      |> Enum.group_by(fn {[frame | _], _site} -> node_key(frame) end)
      |> Enum.map(fn {key, group} ->
        {frames, paths} =
          Enum.unzip(for {[frame | below], site} <- group, do: {frame, {below, site}})

        build_node(key, frames, paths, weight)
      end)
      # Heaviest first, so the biggest holder of memory is at the left; then
      # by name, so equal weights still give the same picture every time.
      |> Enum.sort_by(&{-weight(&1, weight), &1.name, &1.lib || ""})

    %{
      name: name,
      lib: lib,
      inlined: inlined,
      locations: locations(frames),
      bytes: sum(sites, :bytes),
      count: sum(sites, :count),
      oldest: sites |> Enum.map(& &1.oldest) |> Enum.max(fn -> 0 end),
      depth: 1 + (children |> Enum.map(& &1.depth) |> Enum.max(fn -> 0 end)),
      children: children
    }
  end

  # Frames merge into one box when they show the same name from the same
  # library, inlined or not alike.
  defp node_key(frame), do: {Mtrace.Frame.name(frame), frame.lib, frame.inlined}

  # Kept as {file, line} and written out only for the few a hover text shows.
  defp locations(frames) do
    for %{file: file, line: line} <- frames, is_binary(file), into: MapSet.new() do
      {file, if(is_integer(line) and line > 0, do: line)}
    end
  end

  defp weight(node, :bytes), do: node.bytes
  defp weight(node, :count), do: node.count

  ## Drawing

  defp graph_svg(tree, opts) do
    width = opts[:width]
    pad = min(10, div(width, 20))
    height = @header + tree.depth * @row + @footer
    total = weight(tree, opts[:weight])
    scale = (width - 2 * pad) / total
    about = if estimated?(opts), do: "about ", else: ""

    ctx = %{
      weight: opts[:weight],
      total: total,
      scale: scale,
      about: about,
      filter: opts[:filter],
      matched: opts[:matched],
      sites: opts[:sites],
      sort: opts[:sort]
    }

    [
      svg_open(width, height, pad),
      heading(opts[:title], width),
      fitted_text(width / 2, 44, total_line(tree, ctx), width - 2 * (pad + @controls_width), 8),
      controls(width, pad),
      ~s(<g font-family="monospace" font-size="#{@font_size}">\n),
      boxes(tree, pad, 0, ctx),
      "</g>\n",
      ~s(<script type="text/ecmascript"><![CDATA[\n),
      @script,
      "]]></script>\n</svg>\n"
    ]
  end

  # Nothing to draw: said, and why, so that an empty image does not read as
  # "nothing is held" when tracking is off or the filter missed.
  defp empty_svg(sites, opts) do
    width = opts[:width]
    why = why_empty(sites |> Enum.map(& &1.count) |> Enum.sum(), opts)
    lines = width |> Kernel.-(20) |> div(8) |> max(20) |> wrap_words(why)
    height = 80 + @why_row * length(lines)

    [
      svg_open(width, height, 0),
      heading(opts[:title], width),
      text(width / 2, 50, "middle", "no live allocations"),
      ~s(<g font-family="sans-serif" font-size="14">),
      lines |> Enum.with_index() |> Enum.map(fn {line, i} -> why_line(width, i, line) end),
      "</g>\n</svg>\n"
    ]
  end

  defp why_line(width, i, line), do: text(width / 2, 74 + @why_row * i, "middle", line)

  # Sites that match but hold 0 bytes (blocks of malloc(0)) are not "none".
  defp why_empty(count, opts) when count > 0 do
    zero = "The #{Format.count(count, "live block")} that match hold 0 bytes."
    Enum.join([zero | List.wrap(Mtrace.Export.why_empty(opts[:stats], nil))], " ")
  end

  defp why_empty(0, opts), do: Mtrace.Export.why_empty(opts[:stats], opts[:filter])

  # Greedy, at spaces; a word longer than a line stays whole.
  defp wrap_words(_chars, nil), do: []

  defp wrap_words(chars, text) do
    text
    |> String.split(" ", trim: true)
    |> Enum.reduce([], fn
      word, [] ->
        [word]

      word, [line | done] ->
        if String.length(line) + 1 + String.length(word) <= chars,
          do: [line <> " " <> word | done],
          else: [word, line | done]
    end)
    |> Enum.reverse()
  end

  defp svg_open(width, height, pad) do
    [
      ~s(<?xml version="1.0" encoding="UTF-8" standalone="no"?>\n),
      ~s(<svg xmlns="http://www.w3.org/2000/svg" version="1.1" ),
      ~s(width="#{width}" height="#{height}" viewBox="0 0 #{width} #{height}" ),
      ~s(data-pad="#{num(pad)}" data-char-width="#{num(@char_width)}">\n),
      ~s(<rect x="0" y="0" width="#{width}" height="#{height}" fill="#{@background}"/>\n)
    ]
  end

  # Between "Reset zoom" and "Search", as the total is between the middle
  # and "Matched: ...": each squeezed to its room when longer.
  defp heading(title, width) do
    [
      ~s(<g font-family="sans-serif" font-size="17">),
      fitted_text(width / 2, 22, title, width - 2 * @controls_width, 9.5),
      "</g>\n"
    ]
  end

  # Centred text that, at about px_per_char a character, would be wider
  # than room: drawn squeezed to room (textLength), not off the image or
  # under the controls.
  defp fitted_text(x, y, content, room, px_per_char) do
    room = max(room, 40)

    if String.length(content) * px_per_char <= room do
      text(x, y, "middle", content)
    else
      ~s(<text x="#{num(x)}" y="#{y}" text-anchor="middle" textLength="#{num(room)}" ) <>
        ~s(lengthAdjust="spacingAndGlyphs">#{escape(content)}</text>\n)
    end
  end

  # "Reset zoom" (shown once zoomed), "Search" and the matched share.
  defp controls(width, pad) do
    [
      ~s(<g font-family="sans-serif" font-size="14" style="cursor:pointer">),
      ~s(<text id="reset" x="#{num(pad)}" y="22" style="display:none">Reset zoom</text>),
      ~s(<text id="search" x="#{num(width - pad)}" y="22" text-anchor="end">Search</text>),
      ~s(<text id="matched" x="#{num(width - pad)}" y="44" text-anchor="end"></text>),
      "</g>\n"
    ]
  end

  defp text(x, y, anchor, content) do
    ~s(<text x="#{num(x)}" y="#{y}" text-anchor="#{anchor}">#{escape(content)}</text>\n)
  end

  # Sampling, the figures are estimates from the sample, said as report/1 does.
  defp estimated?(opts), do: match?(%{sampled: true}, opts[:stats])

  # Filtered, the total is what matched, said as report/1's header says it;
  # limited, it says what the sites drawn leave out. With every site drawn,
  # the figures are what matched (the better estimate under sampling:
  # rounded once); with some left out, what is drawn, never said to be more
  # than what matched (sites rounded one by one can add up to more).
  defp total_line(tree, %{weight: weight, about: about} = ctx) do
    left_out? = left_out?(tree, ctx.matched, about != "")

    shown =
      cond do
        ctx.matched == nil ->
          tree

        left_out? ->
          %{bytes: min(tree.bytes, ctx.matched.bytes), count: min(tree.count, ctx.matched.count)}

        true ->
          ctx.matched
      end

    "Total: #{about}#{Format.bytes(shown.bytes)} in #{about}" <>
      "#{Format.count(shown.count, "live block")} " <>
      if(is_binary(ctx[:filter]), do: ctx.filter <> " ", else: "") <>
      "(#{if about != "", do: "estimated from a sample; "}" <>
      if(left_out?, do: left_out(ctx), else: "") <>
      "width by #{if weight == :bytes, do: "bytes", else: "block count"})"
  end

  # Sampled blocks, when both sides give them, are exact where rounded
  # estimates are not.
  defp left_out?(_tree, nil, _estimated), do: false

  defp left_out?(%{samples: drawn}, %{samples: samples}, _estimated) when is_integer(drawn),
    do: samples > drawn

  # Estimated bytes add up exactly; estimated counts, rounded site by site,
  # do not.
  defp left_out?(tree, matched, true), do: matched.bytes > tree.bytes

  defp left_out?(tree, matched, false),
    do: matched.count > tree.count or matched.bytes > tree.bytes

  defp left_out(%{matched: %{count: count, bytes: bytes}, sites: n, about: about} = ctx) do
    blocks = if ctx.filter, do: "block", else: "live block"

    "the #{picked(n, ctx.sort)} of #{about}#{Format.bytes(bytes)} in " <>
      "#{about}#{Format.count(count, blocks)}#{if ctx.filter, do: " that match"}; "
  end

  # The sites drawn are the first of the order they were picked by.
  defp picked(n, :count), do: Format.count(n, "site") <> " with the most blocks"
  defp picked(n, :oldest), do: Format.count(n, "oldest site")
  defp picked(n, :growth), do: Format.count(n, "fastest-growing site")
  defp picked(n, _bytes), do: Format.count(n, "largest site")

  # A node and, left to right below it, its children. A node too narrow to see
  # is not drawn, nor are its descendants (they are narrower still), but it
  # still counts in its parent's width.
  defp boxes(node, x, depth, ctx) do
    width = weight(node, ctx.weight) * ctx.scale

    if width < @min_drawn_width do
      []
    else
      {children, _x} =
        node.children
        |> Enum.map_reduce(x, fn child, child_x ->
          {boxes(child, child_x, depth + 1, ctx), child_x + weight(child, ctx.weight) * ctx.scale}
        end)

      [box(node, x, @header + depth * @row, width, ctx) | children]
    end
  end

  defp box(node, x, y, width, ctx) do
    [
      ~s(<g class="f" data-name="),
      escape(node.name),
      ~s("><title>),
      escape(hover_text(node, ctx)),
      "</title>",
      ~s(<rect x="#{num(x)}" y="#{y}" width="#{num(width)}" height="#{@box_height}" ),
      ~s(fill="#{color(node.name)}"/>),
      label(node.name, x, y, width),
      "</g>\n"
    ]
  end

  defp label(name, x, y, width) do
    case fit(name, trunc((width - 6) / @char_width)) do
      "" -> []
      fitted -> ~s(<text x="#{num(x + 3)}" y="#{y + 12}">#{escape(fitted)}</text>)
    end
  end

  # The name, or as much of it as fits followed by "..", or nothing when not
  # even one character and the dots fit.
  defp fit(name, chars) do
    cond do
      String.length(name) <= chars -> name
      chars < 3 -> ""
      true -> String.slice(name, 0, chars - 2) <> ".."
    end
  end

  defp hover_text(node, ctx) do
    share = weight(node, ctx.weight) * 100 / ctx.total
    unit = if ctx.weight == :bytes, do: "bytes", else: "blocks"

    [
      node.name,
      if(node.inlined, do: "(inlined into its caller)"),
      locations_line(node.locations),
      if(node.lib, do: "in #{node.lib}"),
      "#{ctx.about}#{Format.bytes(node.bytes)} (#{Format.int(node.bytes)} bytes) " <>
        "in #{ctx.about}#{Format.count(node.count, "block")}",
      "#{:erlang.float_to_binary(share, decimals: 2)}% of live #{unit}",
      "oldest #{Format.age(node.oldest)}"
    ]
    |> Enum.reject(&is_nil/1)
    |> Enum.join("\n")
  end

  defp locations_line(locations) do
    shown =
      locations |> Enum.sort() |> Enum.take(@max_locations) |> Enum.map_join(", ", &location/1)

    case MapSet.size(locations) do
      0 -> nil
      n when n <= @max_locations -> "at " <> shown
      n -> "at #{shown} and #{n - @max_locations} more"
    end
  end

  defp location({file, nil}), do: file
  defp location({file, line}), do: "#{file}:#{line}"

  # flamegraph.pl's "hot" palette: red high, green anywhere, blue low. Hashing
  # the name keeps a function's color across graphs.
  defp color(name) do
    <<r, g, b, _::binary>> = :erlang.md5(name)
    rgb = <<205 + rem(r, 51), rem(g, 231), rem(b, 56)>>
    "#" <> Base.encode16(rgb, case: :lower)
  end

  defp num(x) when is_integer(x), do: Integer.to_string(x)
  defp num(x), do: :erlang.float_to_binary(x * 1.0, [:compact, decimals: 2])

  ## XML text

  # Names come from symbol tables and debug info: besides XML's special
  # characters they may hold bytes that are not UTF-8, or control characters
  # that XML 1.0 forbids; either would make the document unreadable. A graph
  # holds thousands of boxes and most of their text is plain ASCII, which a
  # byte scan recognizes cheaply and which is kept as is.
  defp escape(text) do
    if plain_ascii?(text), do: text, else: escape_chars(text)
  end

  defp plain_ascii?(<<c, rest::binary>>)
       when (c in 0x20..0x7E or c == ?\n) and c not in [?&, ?<, ?>, ?", ?'],
       do: plain_ascii?(rest)

  defp plain_ascii?(<<>>), do: true
  defp plain_ascii?(_other), do: false

  defp escape_chars(text) do
    for <<char::utf8 <- Mtrace.JSON.valid_utf8(text)>>, into: "" do
      case char do
        ?& -> "&amp;"
        ?< -> "&lt;"
        ?> -> "&gt;"
        ?" -> "&quot;"
        ?' -> "&apos;"
        c when c in [?\n, ?\t] -> <<c::utf8>>
        c when c < 0x20 or c in [0xFFFE, 0xFFFF] -> "?"
        c -> <<c::utf8>>
      end
    end
  end
end

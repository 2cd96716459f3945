defmodule Mtrace.Report do
  @moduledoc """
  Live allocation sites as a table to read in IEx.

  A header gives the node's live native memory and, when it is not the whole
  picture, why: sampling, allocations that could not be recorded. Then each
  site, in the order given (top first), with its size, number of blocks and
  the ages of its oldest and newest block, what it is when it is one of the
  VM's own (`Mtrace.VMSites`), and its stack from the function that called
  malloc outwards:

      #1  12.0 MiB in 3_072 blocks  oldest 2h 03m  newest 5s
          cache_put (cache.c:88) libcache.so
          lookup (cache.c:120) libcache.so [inlined]
          nif_lookup (nif.c:41) cache_nif.so
          ... 9 more

  Two sites are two distinct stacks; when they would read the same (calls
  from two places in a function built without line numbers), their frames
  without a line give their offset in the object (`libcache.so+0x1a2b`),
  then, if they still do (two calls on one line), every frame does; when
  the stacks differ only below the frames shown, the later site says which
  one it reads as.

  Sites and frames are maps as `Mtrace.sites/1` returns them.
  """

  alias Mtrace.VM.Format

  @default_frames 8

  @doc """
  The report for `sites` (as `Mtrace.sites/1` returns them) and `stats` (as
  `Mtrace.stats/0` returns them), as iodata for `IO.puts/1`.

  Options:

    * `:frames` - frames shown per site (default #{@default_frames}); the rest
      are counted in a `... N more` line. When the Erlang code that called
      the NIF (`Mtrace.Frame.caller_at/1`, the Erlang frame after the
      NIF's own) is not among them, the last of them gives way to it,
      after a `... N more` line for the frames between. Sites whose frames
      shown read the same say which earlier site they read as.
    * `:node` - the node named in the header (default `node()`).
    * `:boot` - what was left out as allocated before mtrace started
      (`%{count, bytes, est_count, est_bytes}`), summarized in one line;
      `:not_started` when the mtrace application has not started (`mix run
      --no-start`), so that boot blocks rank with the rest, as a line says.
    * `:since` - the table's time of the `since:` mark the query was given
      (`Mtrace.Mark`'s `t_ms`): when `stats` says the table was reset after
      it (`reset_ms`), a line says that what the reset forgot is not counted.
    * `:filter` - what the query kept, in words (`"with a frame in
      \"leaky\""`), and `:total`, the sum over what it kept (as
      `Mtrace.Query.sites/1` gives it): the header then gives that total
      and the filter, and the node's whole after them; without a filter,
      the total (with `:boot`'s) is the node's whole, taken with the
      sites, where `stats` were read after them.

  Lines longer than 80 columns are wrapped, continuations indented.

  The header uses `est_live_bytes`/`est_live_count` when `stats` says
  `sampled: true`, and reports `dropped`, `stacks_dropped` and `replaced`
  whenever they are not zero: the table is then incomplete.

  ## Example

      iex> frame = %{symbol: "leak", lib: "/opt/leaky_nif.so", file: "leaky_nif.c", line: 12,
      ...>           addr: 0x7F00, inlined: false, offset: 0x1234}
      iex> site = %{count: 3, bytes: 12288, oldest: 7380, newest: 5, frames: [frame]}
      iex> stats = %{live_count: 3, live_bytes: 12288, sampled: false, dropped: 0}
      iex> text = Mtrace.Report.format([site], stats, node: :"app@host") |> IO.iodata_to_binary()
      iex> String.split(text, "\\n", trim: true)
      [
        "Native memory live on app@host: 12.0 KiB in 3 blocks",
        "#1  12.0 KiB in 3 blocks  oldest 2h 03m  newest 5s",
        "    leak (leaky_nif.c:12) leaky_nif.so"
      ]
  """
  @spec format([Mtrace.site()], map(), keyword()) :: iodata()
  def format(sites, stats, opts \\ []) do
    max_frames = Keyword.get(opts, :frames, @default_frames)

    unless is_integer(max_frames) and max_frames >= 0 do
      raise ArgumentError,
            "Mtrace.Report.format/3: :frames must be a non-negative integer, got: #{inspect(max_frames)}"
    end

    node = Keyword.get(opts, :node, node())
    total = with_boot(opts[:total], opts[:boot])

    [
      header(stats, node, opts[:filter], total),
      reset_since(stats, opts[:since]),
      off(stats),
      incomplete(stats),
      boot(opts[:boot]),
      body(sites, max_frames, opts[:boot])
    ]
  end

  # Switched off, nothing allocated since is recorded: said before any figure
  # is read as "nothing grew".
  defp off(%{enabled: false}) do
    fit(
      "Tracking is switched off (Mtrace.disable/0 or MTRACE_ENABLED=0): blocks allocated " <>
        "since are not recorded; Mtrace.enable/0 switches it on."
    )
  end

  defp off(_stats), do: []

  # A reset forgets every block, those allocated since a mark taken before
  # it too: what "since the mark" counts is then less than what was held.
  defp reset_since(%{reset_ms: reset}, since)
       when is_integer(since) and is_integer(reset) and reset > 0 and reset >= since do
    fit(
      "The table was reset (Mtrace.reset/0) within the time this report covers: " <>
        "blocks allocated before the reset were forgotten and are not counted here."
    )
  end

  defp reset_since(_stats, _since), do: []

  # A line as it is when it fits 80 columns, else wrapped (VM.Format.wrap/2).
  defp fit(line), do: fit_lines(line) |> Enum.map(&[&1, "\n"])

  defp fit_lines(line) do
    if String.length(line) <= 80, do: [line], else: Format.wrap(line, 80)
  end

  # Boot-time memory is real but rarely the leak: one line, not ranked.
  defp boot(%{count: count} = boot) when count > 0 do
    fit("Boot (before mtrace started): #{size(boot)}; boot: true ranks them")
  end

  # Started with `mix run --no-start`, say: the VM's own boot blocks rank.
  defp boot(:not_started) do
    fit(
      "Boot blocks are ranked too: the mtrace application is not started, and its " <>
        "start marks the end of boot (Application.ensure_all_started(:mtrace))."
    )
  end

  defp boot(_), do: []

  # The boot blocks that match are part of what matches: the filtered header
  # counts them, as the node's whole does without a filter, and the boot
  # line below says how much of it they are.
  defp with_boot(%{count: _} = total, %{count: _} = boot) do
    Enum.reduce([:count, :bytes, :est_count, :est_bytes], total, fn key, acc ->
      case {acc, boot} do
        {%{^key => a}, %{^key => b}} -> Map.put(acc, key, a + b)
        _ -> acc
      end
    end)
  end

  defp with_boot(total, _boot), do: total

  # Filtered, what matches comes first, the node's whole after it.
  defp header(stats, node, filter, %{count: _} = total) when is_binary(filter) do
    head = "Native memory live on #{node}: #{size(total)} #{filter}"
    tail = "(of #{live(stats, :short)} in all)"

    if String.length(head) + 1 + String.length(tail) <= 80,
      do: fit(head <> " " <> tail),
      else: [fit(head), fit("  " <> tail)]
  end

  # The query's own total, when given, is of the same moment as its sites;
  # the stats are read after them (and the modules an output loads first
  # allocate meanwhile).
  defp header(stats, node, _filter, %{count: _} = total) do
    live = %{
      live_count: total.count,
      live_bytes: total.bytes,
      est_live_count: total[:est_count] || total.count,
      est_live_bytes: total[:est_bytes] || total.bytes
    }

    header(Map.merge(stats, live), node, nil, nil)
  end

  defp header(stats, node, _filter, _total),
    do: fit("Native memory live on #{node}: #{live(stats)}")

  defp live(%{sampled: true} = stats, :short) do
    "about #{Format.bytes(stats[:est_live_bytes])} in about #{blocks(stats[:est_live_count])}"
  end

  defp live(stats, _), do: live(stats)

  defp live(stats) do
    if stats[:sampled] do
      "about #{Format.bytes(stats[:est_live_bytes])} in about " <>
        "#{blocks(stats[:est_live_count])} (estimated from a sample of " <>
        "#{blocks(stats[:live_count])}, #{Format.bytes(stats[:live_bytes])})"
    else
      "#{Format.bytes(stats[:live_bytes])} in #{blocks(stats[:live_count])}"
    end
  end

  # Losses make every figure below an underestimate, so they are always shown
  # (counted since the program started: a reset does not clear them).
  defp incomplete(stats) do
    losses =
      [
        {stats[:dropped], "allocations not recorded since start (h Mtrace.stats: why)"},
        {stats[:stacks_dropped], "recorded without a stack"},
        {stats[:replaced], "entries replaced after a missed free"}
      ]
      |> Enum.filter(fn {n, _what} -> is_integer(n) and n > 0 end)
      |> Enum.map(fn {n, what} -> "#{Format.int(n)} #{what}" end)

    if losses == [], do: [], else: fit("Incomplete: " <> Enum.join(losses, ", "))
  end

  defp body([], _max_frames, %{count: count}) when count > 0,
    do: "No live allocations made since mtrace started match.\n"

  defp body([], _max_frames, _boot), do: "No live allocations match.\n"

  # Sites are distinct stacks, yet two may read the same: calls from two
  # places in one function without line numbers, two calls on one line, or
  # stacks that part below the frames shown. Such sites show where in its
  # object each frame without a line is, then each frame, and if they still
  # read the same, which site they read like.
  defp body(sites, max_frames, _boot) do
    plain = Enum.map(sites, &IO.iodata_to_binary(frame_lines(&1.frames, max_frames, nil)))

    texts =
      Enum.reduce([:unlined, :all], plain, fn offsets, texts ->
        alike = Enum.frequencies_by(texts, &reads/1)

        more =
          Enum.zip_with(sites, texts, fn site, text ->
            if alike[reads(text)] > 1,
              do: IO.iodata_to_binary(frame_lines(site.frames, max_frames, offsets)),
              else: text
          end)

        # a group that reads the same takes the offsets if they tell it apart
        tells =
          Enum.zip(texts, more)
          |> Enum.uniq_by(fn {text, more} -> {reads(text), reads(more)} end)
          |> Enum.frequencies_by(&reads(elem(&1, 0)))

        Enum.zip_with(texts, more, &if(tells[reads(&1)] > 1, do: &2, else: &1))
      end)

    sites
    |> Enum.zip(texts)
    |> Enum.with_index(1)
    |> Enum.map_reduce(%{}, fn {{site, text}, rank}, seen ->
      shown = for {:frame, frame} <- shown(site.frames, max_frames), do: frame
      # the frames shown are the same ones: the stacks part below them
      same =
        case seen[reads(text)] do
          {first, ^shown} -> reads_as(first, :below)
          {first, _other} -> reads_as(first, :unshown)
          nil -> []
        end

      {[site_line(site, rank), vm_note(site.frames), text, same],
       Map.put_new(seen, reads(text), {rank, shown})}
    end)
    |> elem(0)
  end

  defp reads_as(first, :below),
    do: fit("    (reads as ##{first}: the two stacks differ in frames not shown)")

  defp reads_as(first, :unshown),
    do: fit("    (reads as ##{first}: the two stacks differ at an address not shown)")

  defp site_line(site, rank) do
    growth = if site[:growth_per_s], do: "  #{Format.rate(site.growth_per_s)}", else: ""

    fit(
      "##{rank}  #{size(site)}#{growth}  oldest #{age(site.oldest)}  newest #{age(site.newest)}"
    )
  end

  # The VM's own sites lead on every node: what they are, so as not to be chased.
  defp vm_note(frames) do
    case Mtrace.VMSites.note(frames) do
      nil -> []
      what -> fit("    (" <> what <> ")")
    end
  end

  # With sampling a site's estimates differ from its recorded samples.
  defp size(%{est_bytes: est_bytes, est_count: est_count, count: count} = site)
       when est_count != count or est_bytes != site.bytes do
    "about #{Format.bytes(est_bytes)} in about #{blocks(est_count)} (#{Format.int(count)} sampled)"
  end

  defp size(site), do: "#{Format.bytes(site.bytes)} in #{blocks(site.count)}"

  defp blocks(n), do: Format.count(n, "block")

  # offsets: nil, or which frames with a symbol also give their place in
  # their object, :unlined (those without a line) or :all.
  defp frame_lines(frames, max_frames, offsets) do
    for part <- shown(frames, max_frames) do
      case part do
        {:frame, frame} -> frame_line(frame, offsets)
        {:more, n} -> "    ... #{n} more\n"
      end
    end
  end

  # What a site reads as: its lines without the counts of frames left out
  # (two stacks that differ only below the frames shown read the same).
  defp reads(text), do: String.replace(text, ~r/^    \.\.\. \d+ more$/m, "    ...")

  # The first max_frames frames, and how many are left out; but a stack that
  # goes on into Erlang code keeps the code that called the NIF
  # (Frame.caller_at/1) in the last place (a NIF deep in a C library has
  # more native frames than are shown, and which code called it is half of
  # the answer).
  defp shown(frames, max_frames) do
    {shown, cut} = Enum.split(frames, max_frames)

    case Mtrace.Frame.caller_at(frames) do
      at when is_integer(at) and at > max_frames and max_frames >= 2 ->
        {kept, rest} = Enum.split(frames, max_frames - 1)
        {between, [caller | rest]} = Enum.split(rest, at - (max_frames - 1))
        frames_and_more(kept, between) ++ frames_and_more([caller], rest)

      # right after the cut: in the row a "... N more" would take
      at when at == max_frames and max_frames >= 1 ->
        [caller | rest] = cut
        frames_and_more(shown ++ [caller], rest)

      _ ->
        frames_and_more(shown, cut)
    end
  end

  defp frames_and_more(frames, []), do: Enum.map(frames, &{:frame, &1})
  defp frames_and_more(frames, cut), do: frames_and_more(frames, []) ++ [{:more, length(cut)}]

  # The lib is named only next to a symbol: without one, the frame's name
  # already is the lib and an offset. A source path is shown as the
  # compiler was given it when relative (most often from the project's
  # root), else by its last two parts: the build machine's directories say
  # little on the node. One directory deep (/tmp/x.exs), it is shown whole:
  # "tmp/x.exs" would read as relative. Within 80 columns: a long source path gives way to
  # its file name, then a long C++ name is shortened (Frame.fit/2), and only
  # then is the line wrapped. A mangled name is never shortened.
  defp frame_line(frame, offsets) do
    name = frame |> Mtrace.Frame.name() |> with_address(frame[:addr])

    lib =
      if known?(frame[:symbol]) and known?(frame[:lib]),
        do: Mtrace.Frame.printable(Path.basename(frame[:lib]))

    at? = offsets == :all or (offsets == :unlined and !frame[:line])
    lib = if lib && at?, do: lib <> offset(frame[:offset]), else: lib
    inlined = if frame[:inlined], do: "[inlined]"
    line = &frame_text(&1, &2, lib, inlined)
    full = line.(name, location(source(frame[:file]), frame[:line]))

    if String.length(full) <= 80 do
      [full, "\n"]
    else
      short_file = location(frame[:file] && Path.basename(frame[:file]), frame[:line])
      # templates collapse to make room; a plain name is cut only when it
      # alone would not fit, else the line wraps (at spaces, which a name
      # may hold too)
      room = 80 - String.length(line.("", short_file))

      # a mangled name (demangle: false) is kept whole, to be pasted into
      # c++filt: the terminal wraps it
      name =
        cond do
          String.starts_with?(name, "_Z") -> name
          name =~ "<" -> name |> Mtrace.Frame.fit(max(room, 24)) |> Mtrace.Frame.fit(76)
          true -> Mtrace.Frame.fit(name, 76)
        end

      text = line.(name, short_file)
      [text |> Format.wrap(80) |> Enum.join("\n"), "\n"]
    end
  end

  # A frame in no loaded object has no name: its address tells two such
  # sites apart (JIT code of different Erlang functions).
  defp with_address("?? (JIT or unloaded code)", addr) when is_integer(addr),
    do: "?? 0x#{String.downcase(Integer.to_string(addr, 16))} (JIT or unloaded code)"

  defp with_address(name, _addr), do: name

  defp offset(n) when is_integer(n), do: "+0x" <> String.downcase(Integer.to_string(n, 16))
  defp offset(_n), do: ""

  defp frame_text(name, location, lib, inlined) do
    "    " <> ([name, location, lib, inlined] |> Enum.reject(&is_nil/1) |> Enum.join(" "))
  end

  defp known?(field), do: field not in [nil, ""]

  defp source("/" <> _ = path) do
    case Path.split(path) do
      parts when length(parts) > 3 -> parts |> Enum.take(-2) |> Path.join()
      _ -> path
    end
  end

  defp source(path), do: path

  defp location(file, _line) when file in [nil, ""], do: nil
  defp location(file, nil), do: "(#{Mtrace.Frame.printable(file)})"
  defp location(file, line), do: "(#{Mtrace.Frame.printable(file)}:#{line})"

  @doc """
  An age in seconds, to the two largest units.

  ## Examples

      iex> Mtrace.Report.age(5)
      "5s"
      iex> Mtrace.Report.age(187)
      "3m 07s"
      iex> Mtrace.Report.age(7380)
      "2h 03m"
      iex> Mtrace.Report.age(190_800)
      "2d 05h"
  """
  @spec age(non_neg_integer()) :: String.t()
  def age(seconds), do: Format.age(seconds)
end

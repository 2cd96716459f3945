defmodule Mtrace.Top do
  @moduledoc """
  The refreshing view of `Mtrace.top/1`: a renderer process samples the
  watched node every interval (`Mtrace.Top.Sample`, run there) and draws
  the screen, while the calling process waits for `q` and Enter on its
  input. With ANSI escapes (a local IEx) the screen is redrawn in place;
  without them (a remote shell, a pipe) each refresh is printed below the
  previous one, headed by a rule. A node that stops answering is reported
  on the screen and asked again at the next refresh: the view never raises
  once it runs. A node that restarted meanwhile is measured afresh.

  A refresh starts `interval` after the previous one started; when
  sampling takes longer (scanning hundreds of thousands of processes can
  take seconds), the next starts as soon as one is drawn, and the title
  gives the time between them. The view leaves one process on the watched
  node between refreshes, which keeps each process's memory for the next
  comparison and ends with the view (`Mtrace.Top.Sample`). Each refresh
  reads the node's memory from `/proc` through the file server and then
  collects the file server's garbage, so that the binaries of those reads
  are not shown as a driver's memory. When the
  tracer samples (`MTRACE_SAMPLE_BYTES`), the native figures are
  estimates, and say "about".
  """

  alias Mtrace.Top.Sample
  alias Mtrace.VM.{Format, Native}

  @defaults [
    interval: 2_000,
    node: nil,
    rows: 5,
    ansi: nil,
    refreshes: :infinity,
    timeout: 10_000
  ]

  @rules [
    interval: {:ms, 100},
    node: {:or, :node, nil},
    # rows of sites: the tracer's limit, a 64-bit word
    rows: {:pos_int, 0xFFFF_FFFF_FFFF_FFFF},
    ansi: {:one_of, [nil, true, false]},
    refreshes: {:or, :pos_int, :infinity},
    timeout: {:ms, 1}
  ]

  @doc """
  Runs the view; see `Mtrace.top/1`. Returns `:ok` when the user quits or
  after `refreshes` refreshes.

  ## Example

      Mtrace.Top.run(interval: 500, refreshes: 2, ansi: false)
      #=> :ok
  """
  @spec run(keyword) :: :ok
  def run(opts) do
    o = check!(Mtrace.Options.parse!(opts, @defaults, "top/1", @rules))
    caller = self()
    reader = spawn_link(fn -> read_keys(caller) end)
    # the view's own processes are not among those it shows growing
    o = Map.put(o, :viewers, [caller, reader])
    renderer = spawn_link(fn -> refresh_loop(o, caller, nil, 0, nil) end)
    wait(renderer, reader)
  end

  # This node is watched as itself, whatever its name later (distribution
  # started or stopped while the view runs).
  defp check!(o) do
    local = o.node in [nil, node()]
    node = o.node || node()
    Mtrace.Remote.reachable!(node, Sample, o.timeout)
    ansi = if o.ansi == nil, do: IO.ANSI.enabled?(), else: o.ansi
    Map.merge(o, %{node: node, ansi: ansi, local: local})
  end

  defp wait(renderer, reader) do
    receive do
      {:top_input, line} when is_binary(line) ->
        if String.trim(line) in ["q", "Q"],
          do: stop([renderer, reader]),
          else: wait(renderer, reader)

      {:top_input, {:error, :interrupted}} ->
        # Ctrl-G i in the shell: the interrupt fails the pending read
        # instead of reaching the shell, so it is the user's quit
        stop([renderer, reader])

      {:top_input, _eof} ->
        # no more input (a closed stdin): the view runs until `refreshes`
        wait(renderer, reader)

      :top_done ->
        stop([renderer, reader])
    end
  end

  defp stop(pids) do
    for pid <- pids do
      Process.unlink(pid)
      Process.exit(pid, :kill)
    end

    :ok
  end

  # Each line typed, until q: other lines are ignored.
  defp read_keys(caller) do
    line = IO.gets("")
    send(caller, {:top_input, line})

    if is_binary(line) and String.trim(line) not in ["q", "Q"], do: read_keys(caller)
  end

  # Each refresh starts `interval` after the previous one started, or as
  # soon as it is drawn when sampling took longer (the title then says so).
  defp refresh_loop(o, caller, state, done, last) do
    start = System.monotonic_time(:millisecond)
    o = Map.put(o, :period, last && start - last)

    {cols, _rows} = size = size()

    {screen, state} =
      case sample(o, state) do
        {:ok, s} -> {render(s, o, size), s.state}
        # The state is kept: a scan slower than the timeout goes on in the
        # helper, which the next refresh asks again; a node that comes back
        # restarted is told by the sample (Sample's incarnation).
        {:error, message} -> {render_error(o, message, size, last?(o, done)), state}
      end

    # printed one below the other, the refreshes are told apart by a rule
    rule = if done > 0, do: [String.duplicate("-", cols), "\n"], else: []
    IO.write(if o.ansi, do: [IO.ANSI.home(), IO.ANSI.clear(), screen], else: [rule, screen])

    if last?(o, done) do
      send(caller, :top_done)
    else
      Process.sleep(pause(o.interval, start, System.monotonic_time(:millisecond)))
      refresh_loop(o, caller, state, done + 1, start)
    end
  end

  defp last?(o, done), do: o.refreshes != :infinity and done + 1 >= o.refreshes

  @doc false
  # The wait before the next refresh, for one started at `start` that is
  # drawn at `now`: what is left of `interval`, if anything.
  @spec pause(pos_integer, integer, integer) :: non_neg_integer
  def pause(interval, start, now), do: max(start + interval - now, 0)

  # On the watched node, a helper keeps each process's memory between
  # refreshes (Mtrace.Top.Sample); it ends with this renderer, or when no
  # refresh has come for a while.
  defp sample(%{local: true} = o, state),
    do: {:ok, Sample.take(state, o.rows, owner: self(), viewers: o.viewers, keep: keep(o))}

  defp sample(o, state) do
    opts = [owner: self(), keep: keep(o)]
    {:ok, Mtrace.Remote.call(o.node, Sample, :take, [state, o.rows, opts], o.timeout)}
  rescue
    e in Mtrace.Error -> {:error, e.message}
  end

  defp keep(o), do: 2 * o.interval + o.timeout

  defp size do
    cols = with {:ok, c} <- :io.columns(), do: c, else: (_ -> 80)
    rows = with {:ok, r} <- :io.rows(), do: r, else: (_ -> 24)
    {cols, rows}
  end

  @doc """
  The screen for sample `s` in a terminal of `{columns, rows}`: lines
  broken to the width where they can be (names shortened, what is still
  too long cut), sections cut to the height, a site or process whole or
  not at all, and a heading only with something under it (one row is left
  for typing).
  `o` gives the `interval` asked for (ms) and, optionally, `period`, the
  ms since the previous refresh started, which the title says instead
  when sampling made it longer.

  ## Example

      s = Mtrace.Top.Sample.take(nil, 5)
      Mtrace.Top.render(s, %{interval: 2000, ansi: false}, {80, 24}) |> IO.puts()
  """
  @spec render(Sample.t(), map, {pos_integer, pos_integer}) :: iodata
  def render(s, o, {cols, rows}) do
    head = [title(s.node, o, cols) | memory_lines(s, cols)]
    # Untraced, no site can show: the native line says why.
    sites =
      if Map.get(s, :traced, true),
        do: section("native sites growing fastest", site_lines(s, cols)),
        else: nil

    procs = section("processes growing fastest", proc_lines(s, cols))
    room = max(rows - 1 - length(head), 0)

    (head ++ fit([sites, procs], room))
    |> Enum.map(&cut(&1, cols))
    |> Enum.map(&[&1, "\n"])
  end

  @doc false
  # The screen while the watched node does not answer: the error wrapped
  # to the width (its "mtrace: " prefix says nothing here), and whether
  # another refresh will try again.
  @spec render_error(map, String.t(), {pos_integer, pos_integer}, boolean) :: iodata
  def render_error(o, message, {cols, _rows}, last) do
    text = "the node is not answering: " <> String.replace_prefix(message, "mtrace: ", "")
    again = if last, do: [], else: ["trying again..."]

    lines = for line <- String.split(Mtrace.Error.wrap(text, cols, cols), "\n"), do: whole(line)

    ([title(o.node, o, cols), ""] ++ lines ++ again)
    |> Enum.map(&[cut(&1, cols), "\n"])
  end

  # The quit hint always shows. Then, while there is room, the node's name
  # (a name too long for the width shortened to no less than 8 columns,
  # while the room allows), the interval and the clock: the clock goes
  # first, then the interval, then the name's room.
  defp title(node, o, cols) do
    name = to_string(node)
    quit = "q + Enter quits"
    time = (Time.utc_now() |> Time.truncate(:second) |> Time.to_string()) <> " UTC"
    every = "  #{every(o)}  " <> quit

    layouts = [{every, time, 8}, {every, nil, 8}, {"  " <> quit, nil, 8}, {"  " <> quit, nil, 1}]

    Enum.find_value(layouts, quit, fn {rest, time, least} ->
      room =
        cols - String.length("mtrace top " <> rest) -
          if(time, do: String.length(time) + 1, else: 0)

      if room >= min(String.length(name), least) do
        left = "mtrace top " <> shorten(name, room) <> rest

        if time,
          do: left <> String.duplicate(" ", max(cols - String.length(left <> time), 1)) <> time,
          else: left
      end
    end)
  end

  # `text` in `room` columns, its end cut off with "…".
  defp shorten(text, room) do
    if String.length(text) > room, do: String.slice(text, 0, max(room - 1, 0)) <> "…", else: text
  end

  # The interval asked for, or the time the last refresh really took when
  # sampling made it longer.
  defp every(%{period: ms, interval: interval}) when is_integer(ms) and ms > interval * 1.1,
    do: "every #{Float.round(ms / 1000, 1)}s (asked #{interval / 1000}s)"

  defp every(o), do: "every #{o.interval / 1000}s"

  defp memory_lines(%{memory: m} = s, cols) do
    left_out = Map.get(s, :left_out, false)

    # pieces a narrow line breaks between (the RSS piece's space and the
    # joining one set it apart from the rest)
    vm =
      if m.total,
        do: [
          "VM #{Format.bytes(m.total)}:",
          "processes #{Format.bytes(m.processes)},",
          "binary #{Format.bytes(m.binary)},",
          "ets #{Format.bytes(m.ets)}"
        ],
        else: ["VM: erlang:memory/0 not available here"]

    native =
      case m.native do
        _ when left_out ->
          prose("native: not traced (MTRACE_PROGRAMS does not name beam.smp: unset it)", cols)

        %{enabled: false, live_bytes: _, live_count: _} = native ->
          two_parts(native_held(native), "tracking switched off: Mtrace.enable/0", cols)

        %{live_bytes: _, live_count: _} = native when s.reset == true ->
          two_parts(native_held(native), "table reset since the last refresh", cols)

        # switched on since the last refresh: no rate over part of the time
        %{live_bytes: _, live_count: _} = native when is_map_key(s, :resumed) and s.resumed ->
          two_parts(native_held(native), "tracking on again: rate from the next refresh", cols)

        %{live_bytes: _, live_count: _} = native when is_number(s.native_per_s) ->
          two_parts(native_held(native), about(native) <> Format.rate(s.native_per_s), cols)

        %{live_bytes: _, live_count: _} = native ->
          native_held(native)

        _ ->
          not_traced(Map.get(s, :not_traced), Map.get(s, :so), cols)
      end

    pack(["RSS #{Format.bytes(m.rss)} " | vm], cols, "  ") ++
      List.wrap(native) ++ nif_line(s.nif, cols)
  end

  # `pieces` joined by spaces on as few lines as `cols` allows, breaking
  # between pieces only; the lines after the first indented by `indent`.
  defp pack([first | rest], cols, indent) do
    rest
    |> Enum.reduce([first], fn piece, [line | done] ->
      joined = line <> " " <> piece

      if String.length(joined) <= cols,
        do: [joined | done],
        else: [indent <> piece, String.trim_trailing(line) | done]
    end)
    |> Enum.reverse()
  end

  # Preloaded, but the tracer cannot answer (another release's library, the
  # NIF not loaded): what Mtrace.Error says of it, commands kept whole.
  defp not_traced({reason, message}, _so, cols) when reason != :not_preloaded do
    ("native: not traced: " <> String.replace_prefix(message, "mtrace: ", ""))
    |> Mtrace.Error.wrap(cols, cols)
    |> String.split("\n")
    |> Enum.map(&whole/1)
  end

  # The watched node's own path first, then the release's line, which
  # holds anywhere (a sample from an older mtrace has no path).
  defp not_traced(_why, so, cols) when is_binary(so) do
    prose("native: not traced (the tracer is not preloaded); start the node with", cols) ++
      [{:whole, "  LD_PRELOAD=" <> so}, "  or, in a release, add to rel/env.sh.eex:"] ++
      [{:whole, "  " <> Native.enable_hint()}]
  end

  defp not_traced(_why, _so, cols) do
    prose("native: not traced (the tracer is not preloaded); in rel/env.sh.eex:", cols) ++
      [{:whole, "  " <> Native.enable_hint()}]
  end

  defp prose(text, cols), do: String.split(Mtrace.Error.wrap(text, cols, cols), "\n")

  # An indented line is a command to copy: never cut (the terminal wraps it).
  defp whole(" " <> _ = line), do: {:whole, line}
  defp whole(line), do: line

  # Under sampling (MTRACE_SAMPLE_BYTES) the native figures are estimates.
  defp about(%{sampled: true}), do: "about "
  defp about(_native), do: ""

  defp native_held(%{live_bytes: bytes, live_count: count} = native) do
    about = about(native)
    "native #{about}#{Format.bytes(bytes)} in #{about}#{Format.count(count, "block")}"
  end

  # On one line, or on two when one is too narrow.
  defp two_parts(first, second, cols) do
    line = first <> "  " <> second
    if String.length(line) <= cols, do: line, else: [first, "  " <> second]
  end

  defp nif_line([], _cols), do: []

  # The module and what it holds; on two lines when one is too narrow, so
  # that neither is cut off.
  defp nif_line([top | _] = rows, cols) do
    more = if length(rows) > 1, do: " (+#{length(rows) - 1} more)", else: ""
    held = Native.nif_held(top)
    line = "NIF/driver #{inspect(top.module)} #{held}#{more}"

    if String.length(line) <= cols,
      do: [line],
      else: ["NIF/driver #{inspect(top.module)}#{more}", "  " <> held]
  end

  defp nif_line({:error, _}, _cols), do: []

  # What a section says instead of entries, indented, wrapped to the width.
  defp said(text, cols) do
    [first | rest] = String.split(text, " ")
    pack(["  " <> first | rest], cols, "    ")
  end

  # A section is its heading and its entries, each entry one or more lines.
  defp section(_title, []), do: nil
  defp section(title, entries), do: {["", title], entries}

  # Each entry's lines: a site's second line names its caller, a process's
  # what it was started as, when one line is too narrow.
  defp site_lines(%{memory: %{native: %{enabled: false}}}, cols),
    do: [said("none can show: tracking is switched off, new blocks are not recorded", cols)]

  defp site_lines(%{secs: nil}, cols), do: [said("(growth shows from the next refresh on)", cols)]

  defp site_lines(%{resumed: true}, cols),
    do: [
      said("(tracking was off for part of the time: growth shows from the next refresh)", cols)
    ]

  defp site_lines(%{sites: []}, cols),
    do: [said("none: no native memory allocated since the last refresh is held", cols)]

  # The rate says how much grew (the bytes since the last refresh would only
  # repeat it), so the room goes to who allocated: the site with its source
  # line, as Mtrace.Watch names it (two sites of one function differ in it),
  # and the Erlang code that called it.
  defp site_lines(%{sites: sites} = s, cols) do
    about = about(s.memory.native)

    sites
    |> Mtrace.VMSites.merge(& &1.growth_per_s)
    |> Enum.map(fn site ->
      count = about <> Format.count(site.est_count, "block")

      head =
        "  #{rate(site.growth_per_s, about)}  " <>
          String.pad_leading(count, 11 + String.length(about)) <> "  "

      case Mtrace.VMSites.note(site.frames, :short) || stack(site.frames) do
        {first, caller} ->
          site_entry(head, first, caller, cols)

        what ->
          if String.length(head <> what) <= cols,
            do: [head <> what],
            else: [String.trim_trailing(head), "      " <> what]
      end
    end)
  end

  # On one line when it fits; else the caller on a second, and the site on
  # a line of its own too when it does not fit beside the figures. A name
  # too long even for a line of its own is shortened (label/2).
  defp site_entry(head, first, nil, cols) do
    site = head <> Mtrace.Frame.label(first)

    if String.length(site) <= cols,
      do: [site],
      else: [String.trim_trailing(head), "      " <> label(first, cols - 6)]
  end

  defp site_entry(head, first, caller, cols) do
    site = head <> Mtrace.Frame.label(first)
    line = site <> " <- " <> Mtrace.Frame.label(caller)
    below = "      <- " <> label(caller, cols - 9)

    cond do
      String.length(line) <= cols -> [line]
      String.length(site) <= cols -> [site, below]
      true -> [String.trim_trailing(head), "      " <> label(first, cols - 6), below]
    end
  end

  # Mtrace.Frame.label/1 in `width` columns where its name can be shortened
  # to fit, where it is (file:line) kept whole: an Erlang function's module
  # loses its first parts ("…ErlangCallers.append/1"), a C or C++ name its
  # templates, then its start (Mtrace.Frame.fit/2, to no less than 12
  # columns), which leaves the function's own name. What still does not fit
  # is cut at the end, as every line.
  defp label(frame, width) do
    label = Mtrace.Frame.label(frame)
    name = Mtrace.Frame.name(frame)

    if String.length(label) <= width or not String.starts_with?(label, name) do
      label
    else
      where = String.replace_prefix(label, name, "")
      shorter(name, width - String.length(where), Mtrace.Frame.erlang?(frame)) <> where
    end
  end

  # The fewest parts dropped that fit; else all but the function's.
  defp shorter(name, width, true = _erlang) do
    parts = String.split(name, ".")

    shorts =
      for drop <- 1..(length(parts) - 1)//1, do: "…" <> Enum.join(Enum.drop(parts, drop), ".")

    Enum.find(shorts, List.last(shorts, name), &(String.length(&1) <= width))
  end

  defp shorter(name, width, false), do: Mtrace.Frame.fit(name, max(width, 12))

  # Frame 0, and the Erlang code that called the NIF (or frame 1) outside it
  # (nil when there is none); the VM's own sites say instead what they are
  # (Mtrace.VMSites).
  defp stack([first | rest] = frames) do
    caller =
      case Mtrace.Frame.caller_at(frames) do
        at when is_integer(at) and at > 0 -> Enum.at(frames, at)
        _none -> List.first(rest)
      end

    {first, caller}
  end

  defp stack([]), do: "[no stack]"

  defp proc_lines(%{secs: nil}, _cols), do: []
  # the helper on the node is new: nothing to compare with yet
  defp proc_lines(%{procs_secs: nil}, _cols), do: []
  defp proc_lines(%{procs: []}, cols), do: [said("none grew since the last refresh", cols)]

  # The sizes aligned (10 columns hold "1023.9 KiB"); what the process is
  # goes on as many lines as the width needs, broken before "(in" and
  # "started as", as a site's caller goes on a line of its own.
  defp proc_lines(%{procs: procs}, cols) do
    Enum.map(procs, fn {pid, bytes, per_s, info} ->
      [pid | what] = process_pieces(Format.process(pid, info))
      head = "  #{rate(per_s)}  #{String.pad_leading(Format.bytes(bytes), 10)}  "
      pack([head <> pid | what], cols, "      ")
    end)
  end

  # "#PID<0.5.0> (in m.f/1, started as m.g/0)" as ["#PID<0.5.0>", "(in m.f/1,",
  # "started as m.g/0)"]; a registered name's "(name)" as one piece.
  defp process_pieces(text) do
    case String.split(text, " (", parts: 2) do
      [pid, what] -> [pid | String.split("(" <> what, ~r/(?<=,) (?=started as )/)]
      [text] -> [text]
    end
  end

  defp rate(per_s, about \\ ""),
    do: String.pad_leading("#{about}+#{Format.bytes(per_s)}/s", 12 + String.length(about))

  # Sections in order within the rows there are, whole entries only: a
  # section shows when its heading and at least one entry fit, and the
  # sections after one cut short do not show. Each section leaves room for
  # the heading and first entry of those after it while it can still show
  # one entry itself: on a short screen every section shows its top.
  defp fit(sections, room) do
    sections = Enum.reject(sections, &is_nil/1)

    least = for {heading, [first | _]} <- sections, do: length(heading) + length(first)

    sections
    |> Enum.with_index()
    |> Enum.reduce_while({[], room}, fn {{heading, entries}, i}, {lines, room} ->
      later = least |> Enum.drop(i + 1) |> Enum.sum()
      mine = Enum.at(least, i)
      own = if room - later >= mine, do: room - later, else: room

      {shown, left} =
        Enum.reduce_while(entries, {[], own - length(heading)}, fn entry, {shown, left} ->
          if length(entry) <= left,
            do: {:cont, {shown ++ entry, left - length(entry)}},
            else: {:halt, {shown, left}}
        end)

      cond do
        shown == [] ->
          {:halt, {lines, room}}

        length(shown) < Enum.sum(Enum.map(entries, &length/1)) and own == room ->
          {:halt, {lines ++ heading ++ shown, left}}

        true ->
          {:cont, {lines ++ heading ++ shown, left + room - own}}
      end
    end)
    |> elem(0)
  end

  defp cut({:whole, line}, _cols), do: line

  defp cut(line, cols) do
    if String.length(line) > cols, do: String.slice(line, 0, cols - 1) <> "…", else: line
  end
end

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
  comparison and ends with the view (`Mtrace.Top.Sample`). When the
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
  The screen for sample `s` in a terminal of `{columns, rows}`: lines cut
  to the width, sections cut to the height (one row is left for typing).
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
        else: []

    procs = section("processes growing fastest", proc_lines(s))
    room = max(rows - 1 - length(head), 0)
    {sites, procs} = fit(sites, procs, room)

    (head ++ sites ++ procs)
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

  # A node name too long for the width is shortened, so that the quit hint
  # always shows, and the clock while there is room for it.
  defp title(node, o, cols) do
    rest = "  #{every(o)}  q + Enter quits"
    time = (Time.utc_now() |> Time.truncate(:second) |> Time.to_string()) <> " UTC"
    room = cols - String.length("mtrace top " <> rest)
    name = to_string(node)
    clock? = room - String.length(time) - 1 >= min(String.length(name), 8)
    room = if clock?, do: room - String.length(time) - 1, else: room

    name =
      if String.length(name) > room,
        do: String.slice(name, 0, max(room - 1, 1)) <> "…",
        else: name

    left = "mtrace top " <> name <> rest
    pad = max(cols - String.length(left) - String.length(time), 1)
    if clock?, do: left <> String.duplicate(" ", pad) <> time, else: left
  end

  # The interval asked for, or the time the last refresh really took when
  # sampling made it longer.
  defp every(%{period: ms, interval: interval}) when is_integer(ms) and ms > interval * 1.1,
    do: "every #{Float.round(ms / 1000, 1)}s (asked #{interval / 1000}s)"

  defp every(o), do: "every #{o.interval / 1000}s"

  defp memory_lines(%{memory: m} = s, cols) do
    left_out = Map.get(s, :left_out, false)

    vm =
      if m.total,
        do:
          "  VM #{Format.bytes(m.total)}: processes #{Format.bytes(m.processes)}, binary " <>
            "#{Format.bytes(m.binary)}, ets #{Format.bytes(m.ets)}",
        else: "  VM: erlang:memory/0 not available here"

    native =
      case m.native do
        _ when left_out ->
          "native: not traced (MTRACE_PROGRAMS does not name beam.smp: unset it)"

        %{enabled: false, live_bytes: _, live_count: _} = native ->
          two_parts(native_held(native), "tracking switched off: Mtrace.enable/0", cols)

        %{live_bytes: _, live_count: _} = native when s.reset == true ->
          two_parts(native_held(native), "table reset since the last refresh", cols)

        %{live_bytes: _, live_count: _} = native when is_number(s.native_per_s) ->
          two_parts(native_held(native), about(native) <> Format.rate(s.native_per_s), cols)

        %{live_bytes: _, live_count: _} = native ->
          native_held(native)

        _ ->
          not_traced(Map.get(s, :not_traced), Map.get(s, :so), cols)
      end

    ["RSS #{Format.bytes(m.rss)}" <> vm | List.wrap(native)] ++ nif_line(s.nif, cols)
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

  defp section(_title, []), do: []
  defp section(title, lines), do: ["", title | lines]

  defp site_lines(%{memory: %{native: %{enabled: false}}}, _cols),
    do: ["  none can show: tracking is switched off, new blocks are not recorded"]

  defp site_lines(%{secs: nil}, _cols), do: ["  (growth shows from the next refresh on)"]

  defp site_lines(%{sites: []}, _cols),
    do: ["  none: no native memory allocated since the last refresh is held"]

  # The rate says how much grew (the bytes since the last refresh would only
  # repeat it), so the room goes to who allocated: the site and the Erlang
  # code that called it, on a second line when one is too narrow.
  defp site_lines(%{sites: sites} = s, cols) do
    about = about(s.memory.native)

    sites
    |> Mtrace.VMSites.merge(& &1.growth_per_s)
    |> Enum.flat_map(fn site ->
      count = about <> Format.count(site.est_count, "block")

      head =
        "  #{rate(site.growth_per_s, about)}  " <>
          String.pad_leading(count, 11 + String.length(about)) <> "  "

      case Mtrace.VMSites.note(site.frames, :short) || stack(site.frames) do
        {first, caller} ->
          line = head <> first <> " <- " <> caller
          if String.length(line) <= cols, do: [line], else: [head <> first, "      <- " <> caller]

        what ->
          [head <> what]
      end
    end)
  end

  # Frame 0, and the Erlang code that called the NIF (or frame 1) outside it;
  # the VM's own sites say instead what they are (Mtrace.VMSites).
  defp stack([first | rest]) do
    caller =
      case Enum.filter(rest, &Mtrace.Frame.erlang?/1) do
        [_nif, caller | _] -> caller
        [nif] -> nif
        [] -> List.first(rest)
      end

    if caller,
      do: {Mtrace.Frame.name(first), Mtrace.Frame.label(caller)},
      else: Mtrace.Frame.label(first)
  end

  defp stack([]), do: "[no stack]"

  defp proc_lines(%{secs: nil}), do: []
  # the helper on the node is new: nothing to compare with yet
  defp proc_lines(%{procs_secs: nil}), do: []
  defp proc_lines(%{procs: []}), do: ["  none grew since the last refresh"]

  defp proc_lines(%{procs: procs}) do
    Enum.map(procs, fn {pid, bytes, per_s, info} ->
      "  #{rate(per_s)}  #{Format.bytes(bytes)}  #{Format.process(pid, info)}"
    end)
  end

  defp rate(per_s, about \\ ""),
    do: String.pad_leading("#{about}+#{Format.bytes(per_s)}/s", 12 + String.length(about))

  # Sites first, then processes, within the rows there are.
  defp fit(sites, procs, room) do
    sites = Enum.take(sites, room)
    {sites, Enum.take(procs, max(room - length(sites), 0))}
  end

  defp cut({:whole, line}, _cols), do: line

  defp cut(line, cols) do
    if String.length(line) > cols, do: String.slice(line, 0, cols - 1) <> "…", else: line
  end
end

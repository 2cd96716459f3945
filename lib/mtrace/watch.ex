defmodule Mtrace.Watch do
  @moduledoc """
  Watches native memory and warns when it keeps growing.

  Add it to a supervision tree:

      children = [
        {Mtrace.Watch,
         interval: :timer.minutes(5), intervals: 6, min_growth: 10 * 1024 * 1024}
      ]

  Every `interval` it reads `Mtrace.stats/0` (a few counters, no table scan)
  and takes a `Mtrace.mark/1`. When live native bytes grew by at least
  `min_growth` in each of `intervals` consecutive intervals, it logs a
  `Logger.warning/1` naming the growth and the sites that grew most since the
  growth began (`Mtrace.sites/1` with `since:`, one scan), then starts
  counting again. Live bytes are `est_live_bytes` when sampling.

  Options:

    * `:interval` — ms between samples (default 60_000, at least 100: each
      sample's mark waits for the tracer's coarse clock, a few ms);
    * `:intervals` — consecutive growing intervals before a warning (default 5);
    * `:min_growth` — bytes an interval must add to count as growth
      (default 1 MiB), so that allocator noise stays quiet; an interval
      counts only if live bytes went up, even with `min_growth: 0`;
    * `:limit` — sites named in the warning (default 5);
    * `:name` — registered name (default `Mtrace.Watch`; `nil` for none).

  Not started, it costs nothing. Started on a node without the tracer
  preloaded, or whose program `MTRACE_PROGRAMS` leaves untraced, it logs one
  warning saying what to change and returns `:ignore`, so the supervision
  tree starts as usual (likewise, with the reason, when the preloaded
  library is another mtrace release's or the NIF cannot load). A
  `Mtrace.reset/0` ends a streak: what it forgot cannot be compared with
  what was live before; the watcher says so at level info and counts again
  from there. While tracking is switched off (`Mtrace.disable/0`,
  `MTRACE_ENABLED=0`) no growth can be seen: it logs that once, and once
  more when tracking is back on; either ends a streak, as a reset does
  (an interval tracked for part of its time is no growth to count).
  """
  use GenServer
  require Logger

  alias Mtrace.VM.Format

  @defaults [interval: 60_000, intervals: 5, min_growth: 1_048_576, limit: 5, name: __MODULE__]
  @rules [
    interval: {:ms, 100},
    intervals: :pos_int,
    min_growth: :non_neg_int,
    # the sites query's limit, a 64-bit word
    limit: {:pos_int, 0xFFFF_FFFF_FFFF_FFFF}
  ]

  @doc """
  Starts the watcher (see the module doc for the options).

      {:ok, _pid} = Mtrace.Watch.start_link(interval: 10_000)
  """
  @spec start_link(keyword()) :: GenServer.on_start()
  def start_link(opts \\ []) do
    o = Mtrace.Options.parse!(opts, @defaults, "Watch.start_link/1", @rules)
    GenServer.start_link(__MODULE__, o, name: o.name)
  end

  @doc """
  The watcher's state: `%{streak, last_bytes, warnings}` (intervals grown in
  a row, live bytes at the last sample, warnings logged so far).

      Mtrace.Watch.info()
      #=> %{streak: 2, last_bytes: 48_213_004, warnings: 0}
  """
  @spec info(GenServer.server()) :: %{atom() => non_neg_integer()}
  def info(server \\ __MODULE__)

  def info(server) do
    unless server?(server) do
      raise ArgumentError,
            "Mtrace.Watch.info/1: server must be a pid, a registered name, {name, node}, " <>
              "{:global, _} or {:via, module, _}, got: #{inspect(server)}"
    end

    GenServer.call(server, :info)
  catch
    :exit, {:noproc, _} ->
      raise ArgumentError,
            "Mtrace.Watch.info/1: no watcher is running as #{inspect(server)} " <>
              "(start one with Mtrace.Watch.start_link/1; it returns :ignore where " <>
              "the tracer is not preloaded or does not trace the program)"
  end

  # What GenServer.call/2 takes as a server.
  defp server?(s) when is_pid(s) or is_atom(s), do: true
  defp server?({name, node}) when is_atom(name) and is_atom(node), do: true
  defp server?({:global, _}), do: true
  defp server?({:via, module, _}) when is_atom(module), do: true
  defp server?(_), do: false

  @impl true
  def init(o) do
    # mark/1 and stats/1 raise the reason themselves: not preloaded, another
    # release's library, the NIF not loaded; the mark first, as each sample
    # takes it (handle_info/2)
    mark = Mtrace.mark()

    case Mtrace.stats(heap: false) do
      %{active: false} ->
        not_started(Mtrace.Error.not_traced())

      stats ->
        schedule(o)

        {:ok,
         %{
           o: o,
           last_bytes: live_bytes(stats),
           last_mark: mark,
           enabled: enabled?(stats, true),
           streak: 0,
           since: nil,
           warnings: 0,
           about: ""
         }}
    end
  rescue
    e in Mtrace.Error -> not_started(e)
  end

  defp not_started(%Mtrace.Error{message: why}) do
    why = String.replace_prefix(why, "mtrace: ", "")
    Logger.warning(wrapped("Mtrace.Watch not started: ", why))
    :ignore
  end

  # 80 columns, continuations indented, as the growth warning. Logger's
  # default line starts "12:00:00.000 [warning] ": the first line of the
  # message is that much shorter than the rest.
  defp wrapped(lead, text) do
    (lead <> Mtrace.Error.wrap(text, 80 - 24 - String.length(lead), 78))
    |> String.replace("\n", "\n  ")
    # a blank line stays blank, not two spaces
    |> String.replace(~r/ +$/m, "")
  end

  @impl true
  def handle_call(:info, _from, s) do
    {:reply, Map.take(s, [:streak, :last_bytes, :warnings]), s}
  end

  @impl true
  def handle_info(:tick, s) do
    schedule(s.o)
    # this table's mark, whatever the node is named now (a local query
    # always is this node's); taken before the figures, so that a reset
    # after it is after it on the table's clock too (after_reset/2)
    mark = %Mtrace.Mark{node: node(), t_ms: Mtrace.Query.next_tick()}
    # the table's figures only: glibc's heap walk would make the node's
    # threads wait on its arenas at every tick
    stats = Mtrace.stats(heap: false)
    bytes = live_bytes(stats)
    enabled = enabled?(stats, s.enabled)

    {:noreply,
     s
     |> Map.put(:about, if(stats[:sampled], do: "about ", else: ""))
     |> after_reset(stats)
     |> after_switch(enabled)
     |> step(bytes, mark)
     |> Map.merge(%{last_bytes: bytes, last_mark: mark, enabled: enabled})}
  end

  # Anything else (a stray message to the registered name) is not the
  # watcher's business and must not end its streak.
  def handle_info(_other, s), do: {:noreply, s}

  # A reset since the last sample forgot blocks: live bytes before it and
  # after it do not compare, so a streak across it would add unlike figures.
  defp after_reset(%{last_mark: %{t_ms: last}} = s, %{reset_ms: reset})
       when is_integer(reset) and reset >= last do
    Logger.info(
      wrapped(
        "Mtrace.Watch: ",
        "the table was reset (Mtrace.reset/0); growth is counted again from here"
      )
    )

    %{s | streak: 0, since: nil, last_bytes: :reset}
  end

  defp after_reset(s, _stats), do: s

  # Tracking switched off or on since the last sample: the interval was
  # tracked for part of its time only, and what grew in it is no growth of
  # a streak; counting starts again from this sample.
  defp after_switch(%{enabled: was} = s, now) when was != now,
    do: %{s | streak: 0, since: nil, last_bytes: :reset}

  defp after_switch(s, _now), do: s

  # Tracking switched off or on since the last sample is said once: while it
  # is off, live bytes cannot grow, and silence would read as "no leak".
  defp enabled?(%{enabled: now}, before) do
    cond do
      now == before ->
        :ok

      now ->
        Logger.info(
          wrapped("Mtrace.Watch: ", "tracking is on again; watching native memory grow")
        )

      true ->
        Logger.warning(
          wrapped(
            "Mtrace.Watch: ",
            "tracking is switched off (Mtrace.disable/0 or MTRACE_ENABLED=0), so native " <>
              "memory cannot be seen to grow; Mtrace.enable/0 switches it on"
          )
        )
    end

    now
  end

  # One sample: extend or end the streak, warn when it is long enough. An
  # interval grows only if live bytes went up, min_growth: 0 included: flat
  # memory (tracking switched off, say) is no growth.
  defp step(%{last_bytes: :reset} = s, _bytes, _mark), do: s

  defp step(s, bytes, now) do
    growth = bytes - s.last_bytes

    cond do
      growth <= 0 or growth < s.o.min_growth ->
        %{s | streak: 0, since: nil}

      s.streak + 1 < s.o.intervals ->
        %{s | streak: s.streak + 1, since: s.since || {s.last_mark, s.last_bytes}}

      true ->
        {mark, start_bytes} = s.since || {s.last_mark, s.last_bytes}
        warn(s.o, {mark, now}, start_bytes, bytes, s.about)
        %{s | streak: 0, since: nil, warnings: s.warnings + 1}
    end
  end

  # The sites of the blocks allocated from the streak's first mark up to
  # this sample's, on this node's table.
  defp warn(o, {from_mark, to_mark}, from, to, about) do
    q = Mtrace.Options.parse!([limit: o.limit], [sort: :bytes, limit: 10], "sites/1")
    {_total, sites} = Mtrace.Query.sites_between(q, from_mark, to_mark)
    sites = Mtrace.VMSites.merge(sites, &Mtrace.VMSites.bytes/1)
    Logger.warning(warning(o, sites, from, to, about))
  end

  # The warning's text, 80 columns wide, from live bytes `from` to `to` and
  # the sites that grew; sampling (about = "about "), the figures are
  # estimates, as in report/1.
  @doc false
  @spec warning(map, [map], non_neg_integer, non_neg_integer, String.t()) :: String.t()
  def warning(o, sites, from, to, about) do
    # A short first line, for the logger's prefix (time, level) before it.
    head = [
      "mtrace: native live memory keeps growing",
      "  #{about}+#{Format.bytes(to - from)} in #{o.intervals} consecutive intervals of " <>
        "#{Format.duration_ms(o.interval)}, to #{about}#{Format.bytes(to)} live; " <>
        if(sites == [],
          do: "no block allocated since then is still live",
          else: "sites that grew most since then:"
        )
    ]

    lines = head ++ Enum.map(Enum.with_index(sites, 1), &site_line/1)
    # 80 columns: wrapped at spaces, continuations indented (VM.Format.wrap/2)
    lines |> Enum.flat_map(&Format.wrap/1) |> Enum.join("\n")
  end

  defp site_line({site, i}) do
    "  ##{i}  " <>
      grew(site) <>
      Mtrace.VMSites.at_sites(site) <>
      ": " <>
      Mtrace.VMSites.one_line(site.frames)
  end

  # What the site's new blocks hold: estimated from the sampled ones when
  # sampling (the estimates differ from the recorded figures).
  defp grew(%{est_bytes: bytes, est_count: count} = site)
       when bytes != site.bytes or count != site.count do
    "about +#{Format.bytes(bytes)} in about #{Format.count(count, "block")}" <>
      " (#{Format.int(site.count)} sampled)"
  end

  defp grew(site), do: "+#{Format.bytes(site.bytes)} in #{Format.count(site.count, "block")}"

  defp live_bytes(stats) do
    if stats[:sampled], do: stats.est_live_bytes, else: stats.live_bytes
  end

  defp schedule(o), do: Process.send_after(self(), :tick, o.interval)
end

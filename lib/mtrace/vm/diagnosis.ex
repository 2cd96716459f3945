defmodule Mtrace.VM.Diagnosis do
  @moduledoc """
  What `Mtrace.VM.diagnose/1` returns: the verdict, the findings, and the
  state it judged. A struct so that IEx, after the printed report, echoes
  one line instead of every figure; the fields are plain data for programs,
  and `render/1` gives the report `diagnose/1` prints.

    * `verdict` — the kind of the first finding scoring 50 or more, else
      `:healthy`;
    * `findings` — `[Mtrace.VM.Findings.finding()]`, highest score first
      (with a window, what held still after what grew:
      `Mtrace.VM.Findings`), with those scoring under 50 (leads, not
      problems), which the report lists apart, below the problems;
    * `node`, `window` (ms or nil), `memory`, `counts`, `native`
      (`%{preloaded, program_traced, so, stats, sites, judged_by,
      tracking_off}`) — what was measured; `judged_by` is `:tracer` when
      native memory was judged by the tracer's live bytes, `:rss` when by
      RSS outside the ERTS allocators (no tracer, or tracking switched off
      at the start, the end or a step of the window: `tracking_off`);
    * `growth` — with a window, bytes per second for each category of
      `:erlang.memory/0` (`:total`, `:processes`, `:binary`, `:ets`,
      `:code`, `:atom`) and `:native`, a `t:Mtrace.VM.Findings.growth/0`
      of native memory (as `judged_by` says) sampled across the window;
      `nil` without one;
    * `nif` — `{:ok, rows}` of `Mtrace.VM.Native.nif_memory/0` (memory NIFs
      hold in the VM's allocators), or `{:error, reason}`.

  ## Example

      iex> d = %Mtrace.VM.Diagnosis{verdict: :healthy, findings: [],
      ...>                          node: :"app@host"}
      iex> inspect(d)
      "#Mtrace.VM.Diagnosis<app@host: healthy, no findings>"
  """

  defstruct verdict: :healthy,
            findings: [],
            node: nil,
            window: nil,
            memory: %{},
            counts: %{},
            growth: nil,
            native: %{},
            nif: nil

  alias Mtrace.VM.{Findings, Format, Native}

  # The score from which a finding is a problem (see Mtrace.VM.Findings).
  @problem 50

  @type t :: %__MODULE__{
          verdict: atom,
          findings: [Mtrace.VM.Findings.finding()],
          node: node | nil,
          window: pos_integer | nil,
          memory: map,
          counts: map,
          growth: map | nil,
          native: map,
          nif: {:ok, [map]} | {:error, atom} | nil
        }

  @doc """
  The report `Mtrace.VM.diagnose/1` prints, as text: what was measured,
  then the findings, lines wrapped for an 80-column shell.

  ## Example

      Mtrace.VM.diagnose(print: false)
      |> Mtrace.VM.Diagnosis.render()
      |> IO.puts()
  """
  @spec render(map) :: String.t()
  def render(result) do
    [
      "mtrace diagnose #{result.node}: verdict #{result.verdict}",
      memory_lines(result.memory),
      counts_line(result.counts),
      native_lines(result.native, result.window),
      nif_lines(Map.get(result, :nif)),
      window_line(result.window),
      growth_lines(Map.get(result, :growth), traced?(result.native)),
      "",
      finding_lines(result.findings, tracking_off?(result.native))
    ]
    |> List.flatten()
    |> Enum.flat_map(&Format.wrap/1)
    |> Enum.join("\n")
  end

  defp memory_lines(m) do
    vm =
      if m.total do
        "memory  VM #{Format.bytes(m.total)} (processes #{Format.bytes(m.processes)}, " <>
          "binary #{Format.bytes(m.binary)}, ets #{Format.bytes(m.ets)}, " <>
          "code #{Format.bytes(m.code)})"
      else
        "memory  erlang:memory/0 is not supported here (allocators disabled, e.g. +Mea min)"
      end

    [
      vm <> " | RSS #{Format.bytes(m.rss)} (peak #{Format.bytes(m.rss_peak)})",
      "        ERTS allocators #{Format.bytes(m.allocated)} allocated, " <>
        "#{Format.bytes(m.used)} used",
      "        outside the VM #{Format.bytes(m.outside_vm)} (RSS the ERTS allocators do not " <>
        "hold" <> jit(m) <> ")" <> cached(m)
    ]
  end

  # The JIT's code is the VM's, though no allocator holds it: left out.
  defp jit(%{jit_code: jit}) when is_integer(jit) and jit > 0,
    do: ", the JIT's #{Format.bytes(jit)} of code left out"

  defp jit(_m), do: ""

  # Carriers the VM freed but still maps (Mtrace.VM.Memory.carrier_cache/0)
  # are part of outside_vm: said when they are a good part of it.
  defp cached(%{carrier_cache: cache, outside_vm: outside})
       when is_integer(cache) and is_integer(outside) and cache >= 1_048_576 and
              outside >= 1_048_576 and cache * 10 >= outside,
       do:
         "; up to #{Format.bytes(min(cache, outside))} of it carriers the VM freed and keeps mapped"

  defp cached(_m), do: ""

  # fds only where /proc told them
  defp counts_line(c) do
    "counts  " <>
      Enum.join(
        for(
          key <- [:processes, :ports, :atoms, :ets, :fds],
          {count, limit} <- [Map.get(c, key)],
          do: "#{key} #{Format.int(count)}/#{Format.int(limit)}"
        ),
        " | "
      )
  end

  defp native_lines(%{preloaded: true, program_traced: false}, _window) do
    [
      "native  not traced: the tracer is preloaded, but this program is not one",
      "        MTRACE_PROGRAMS names; start the node with it unset (beam.smp)"
    ]
  end

  defp native_lines(%{preloaded: true, stats: nil}, _window) do
    "native  the tracer is preloaded but its figures could not be read (Mtrace.stats/0 failed)"
  end

  defp native_lines(%{preloaded: true, stats: stats, sites: sites} = native, window) do
    # When sampling, live figures are estimates, as Mtrace.report/1 says.
    about = if stats[:sampled], do: "about ", else: ""

    live =
      "#{about}#{Format.bytes(stats[:live_bytes])} live in " <>
        "#{about}#{Format.count(stats[:live_count] || 0, "block")}" <>
        if(stats[:sampled], do: " (estimated from samples)", else: "")

    off =
      cond do
        stats[:enabled] == false ->
          [
            "        tracking is switched off (Mtrace.disable/0 or MTRACE_ENABLED=0): new " <>
              "blocks are not recorded, so native memory is judged by RSS outside the VM; " <>
              "Mtrace.enable/0 switches it on"
          ]

        tracking_off?(native) ->
          [
            "        tracking was off for part of the window, so native memory is " <>
              "judged by RSS outside the VM; a diagnosis run again judges the tracer's"
          ]

        native[:tracer_unread] ->
          [
            "        the tracer's figures could not be read at every step of the window, " <>
              "so native memory is judged by RSS outside the VM"
          ]

        true ->
          []
      end

    [
      "native  #{live}; heap " <>
        "#{Format.bytes(stats[:used_bytes])} used, #{Format.bytes(stats[:free_bytes])} free, " <>
        "#{Format.bytes(stats[:mmap_bytes])} mmapped"
    ] ++
      off ++
      Enum.map(Mtrace.VMSites.merge(sites, &Mtrace.VMSites.bytes/1), &site_line(&1, window))
  end

  defp native_lines(native, _window) do
    # The diagnosed node's path: the report may be printed on another node.
    so = native[:so] || Native.so_path()

    [
      "native  not traced; to see what native code holds memory, add to rel/env.sh.eex:",
      "          #{Native.enable_hint()}",
      "        or start the node (iex -S mix, erl) with:",
      "          LD_PRELOAD=#{so}"
    ]
  end

  # Whether the native figures judged are the tracer's (a result without
  # judged_by is of a node before it was given: as it was judged there).
  defp traced?(%{judged_by: by}), do: by == :tracer
  defp traced?(%{preloaded: true, program_traced: false}), do: false
  defp traced?(%{preloaded: true, stats: %{enabled: false}}), do: false
  defp traced?(%{preloaded: true, stats: %{}}), do: true
  defp traced?(_native), do: false

  # Tracking switched off, at the start, the end or a step of the window:
  # native memory was judged by RSS.
  defp tracking_off?(%{tracking_off: off}), do: off
  defp tracking_off?(%{stats: %{enabled: false}}), do: true
  defp tracking_off?(_native), do: false

  # Without a window a site's figure is what it holds; with one (and a mark
  # the tracer could take), only what it allocated during the window and
  # still holds, which is growth. The VM's own sites say what they are
  # instead of their stack (Mtrace.VMSites).
  defp site_line(site, window) do
    what = site |> Map.get(:frames, []) |> Mtrace.VMSites.one_line()

    if window && Map.has_key?(site, :growth_per_s),
      do:
        "          #{site_held(site, "+")} over the #{Format.duration_ms(window)} window: #{what}",
      else: "          #{site_held(site, "")}, oldest #{Format.age(site[:oldest] || 0)}: #{what}"
  end

  # When sampling, a site's estimates, not the samples it recorded.
  defp site_held(%{est_bytes: bytes, est_count: count} = site, sign)
       when count != site.count or bytes != site.bytes,
       do:
         "about #{sign}#{Format.bytes(bytes)} in about #{Format.count(count, "block")}" <>
           Mtrace.VMSites.at_sites(site)

  defp site_held(site, sign),
    do:
      "#{sign}#{Format.bytes(site[:bytes])} in #{Format.count(site[:count] || 0, "block")}" <>
        Mtrace.VMSites.at_sites(site)

  defp nif_lines({:ok, []}), do: ["nif     no NIF or driver holds memory in the VM's allocators"]

  defp nif_lines({:ok, rows}) do
    shown =
      rows
      |> Enum.take(3)
      |> Enum.map_join("; ", fn r ->
        "#{inspect(r.module)} #{Native.nif_held(r)}"
      end)

    ["nif     " <> shown <> if(length(rows) > 3, do: "; ...", else: "")]
  end

  defp nif_lines({:error, reason}), do: ["nif     " <> Native.nif_explain(reason)]
  defp nif_lines(_), do: []

  defp growth_lines(nil, _traced), do: []

  # Untraced (or tracking switched off), the native series is RSS outside
  # the ERTS allocators: named as on the memory line, not as the tracer's
  # native heap.
  defp growth_lines(g, traced) do
    vm =
      [:total, :processes, :binary, :ets, :code, :atom]
      # a figure that stood still says nothing ("code +0 B/s")
      |> Enum.filter(&(is_number(g[&1]) and round(g[&1]) != 0))
      |> Enum.map_join(", ", &"#{&1} #{per_s(g[&1])}")

    native =
      case g[:native] do
        %{} = n when traced -> ["        native " <> Findings.describe_growth(n)]
        %{} = n -> ["        outside the VM " <> Findings.describe_growth(n)]
        _ -> []
      end

    ["growth  " <> if(vm == "", do: "VM memory unchanged", else: vm) | native]
  end

  defp per_s(rate) when rate < 0, do: "-#{Format.bytes(-rate)}/s"
  defp per_s(rate), do: "+#{Format.bytes(rate)}/s"

  defp window_line(nil), do: "window  none: sizes only; pass window: 10_000 to judge growth too"
  defp window_line(ms), do: "window  #{Format.int(ms)} ms: growth judged as well as size"

  # Findings that reach the problem score are listed first, under their
  # kind; those below it follow under their own heading, as what they
  # measured, since the kind would claim what they do not show.
  defp finding_lines([], true),
    do: ["findings: none, the node looks healthy (native memory judged by RSS: tracking was off)"]

  defp finding_lines([], _off), do: ["findings: none, the node looks healthy"]

  defp finding_lines(findings, off) do
    {problems, leads} = Enum.split_with(findings, &(&1.score >= @problem))

    head =
      cond do
        problems != [] ->
          ["findings (a score of #{@problem} or more is a problem):"]

        off ->
          [
            "findings: none scores #{@problem} or more (a problem); the node looks healthy " <>
              "(native memory judged by RSS: tracking was off)"
          ]

        true ->
          ["findings: none scores #{@problem} or more (a problem); the node looks healthy"]
      end

    below =
      if leads == [],
        do: [],
        else: ["below #{@problem}, not a problem on its own:"]

    head ++
      Enum.flat_map(problems, &finding_line(&1, "#{&1.kind}: ")) ++
      below ++ Enum.flat_map(leads, &finding_line(&1, ""))
  end

  defp finding_line(f, label) do
    score = :erlang.float_to_binary(f.score * 1.0, decimals: 1)

    [
      "  #{String.pad_leading(score, 6)}  #{label}#{f.summary}",
      "          next: #{f.next}"
    ]
  end

  defimpl Inspect do
    import Inspect.Algebra

    def inspect(%{verdict: verdict, findings: findings, node: node}, opts) do
      top =
        case findings do
          [%{score: score} | _] when verdict != :healthy -> " (score #{score})"
          _ -> ""
        end

      {problems, leads} = Enum.split_with(findings, &(&1.score >= 50))

      listed =
        case {problems, leads} do
          {[], []} -> "no findings"
          {[], _} -> "#{count(leads)} below 50"
          {_, []} -> count(problems)
          _ -> "#{count(problems)}, #{length(leads)} below 50"
        end

      head = "#Mtrace.VM.Diagnosis<#{node}:"
      rest = "#{verdict}#{top}, #{listed}>"

      # One line where it fits, else the node on the first and the rest
      # below. The layout does not count what follows a value (the "}," of
      # a map of nodes, as Mtrace.cluster/2 returns): room is left for it.
      if opts.pretty and is_integer(opts.width) and
           String.length(head) + 1 + String.length(rest) > opts.width - 4,
         do: concat([head, nest(concat(line(), rest), 2)]),
         else: group(concat([head, nest(concat(break(" "), rest), 2)]))
    end

    defp count(findings), do: Mtrace.VM.Format.count(length(findings), "finding")
  end
end

defmodule Mtrace.Export do
  @moduledoc """
  Live allocation sites in formats other tools read.

  * `folded/2`: collapsed stacks, the input of `flamegraph.pl`, inferno and
    speedscope, to draw where live native memory was allocated.
  * `json/3`: the sites, totals and tracer statistics as one JSON object, to
    keep a snapshot or compare two of them.
  * `why_empty/2`: why an output holds no site, in words.

  A site is a map `%{count:, bytes:, oldest:, newest:, frames:}` as
  `Mtrace.sites/1` returns it; its frames go from the function that called
  malloc outwards, each `%{lib:, symbol:, file:, line:, addr:, inlined:, offset:}`.
  """

  alias Mtrace.JSON
  alias Mtrace.VM.Format

  @typedoc "A site as `Mtrace.sites/1` returns it."
  @type site :: Mtrace.site()

  @frame_fields [:lib, :symbol, :file, :line, :addr, :inlined, :offset]
  @erlang_fields @frame_fields ++ [:module, :function, :arity]
  @site_fields [:count, :bytes, :est_count, :est_bytes, :oldest, :newest, :growth_per_s]

  @doc """
  Collapsed stacks: a line `outermost;...;innermost weight` per distinct stack.

  `weight` is `:bytes` (default) or `:count` (blocks). Sites whose stacks read
  the same are merged and their weights summed; lines come heaviest first
  (ties by stack), and stacks of weight 0 are left out since they draw
  nothing. Frame names are `Mtrace.Frame.name/1` (which holds no line break),
  with `;` (the frame separator) replaced by `:`, so every line parses; spaces are
  kept, as readers split the weight off at the last one. A site without a
  stack is drawn as the single frame `[no stack]`.

  ## Example

      iex> frames = [%{symbol: "malloc_wrapper", lib: "a.so", offset: 1}, %{symbol: "main", lib: "a.so", offset: 2}]
      iex> sites = [%{count: 2, bytes: 64, oldest: 9, newest: 1, frames: frames}]
      iex> Mtrace.Export.folded(sites) |> IO.iodata_to_binary()
      "main;malloc_wrapper 64\\n"
      iex> Mtrace.Export.folded(sites, :count) |> IO.iodata_to_binary()
      "main;malloc_wrapper 2\\n"
  """
  @spec folded([site()], :bytes | :count) :: iodata()
  def folded(sites, weight \\ :bytes)

  def folded(sites, weight) when weight in [:bytes, :count] do
    sites
    |> Enum.reduce(%{}, fn site, acc ->
      Map.update(acc, stack_line(site.frames), site[weight], &(&1 + site[weight]))
    end)
    |> Enum.reject(fn {_stack, total} -> total == 0 end)
    |> Enum.sort_by(fn {stack, total} -> {-total, stack} end)
    |> Enum.map(fn {stack, total} -> [stack, ?\s, Integer.to_string(total), ?\n] end)
  end

  def folded(_sites, weight) do
    raise ArgumentError,
          "Mtrace.Export.folded/2: weight must be :bytes or :count, got: #{inspect(weight)}"
  end

  defp stack_line([]), do: "[no stack]"

  defp stack_line(frames) do
    frames
    |> Enum.reverse()
    |> Enum.map_join(";", &folded_name/1)
    |> weight_apart()
  end

  # flamegraph.pl and inferno take a number after a space at a line's end as
  # a second weight (a differential graph's), so an innermost name that ends
  # in one keeps it joined to the name.
  defp weight_apart(line), do: Regex.replace(~r/\s+(\d+(?:\.\d*)?)\z/, line, "_\\1")

  defp folded_name(frame) do
    frame
    |> Mtrace.Frame.name()
    |> String.replace(";", ":")
  end

  @doc """
  The sites as one JSON object (iodata):

      {"generated_at": "2024-05-01T12:00:00Z", "node": "app@host",
       "since": null, "window_ms": null,
       "total": {"count":, "bytes":, "est_count":, "est_bytes":, "sampled":},
       "stats": {...},
       "sites": [{"count":, "bytes":, "est_count":, "est_bytes":,
                  "oldest":, "newest":, "growth_per_s":,
                  "frames": [{"name":, "symbol":, "lib":, "file":, "line":,
                              "addr":, "offset":, "inlined":}]}]}

  `stats` is `Mtrace.stats/0`; `meta` gives `:node` and `:generated_at` (a
  `DateTime`, written in ISO 8601), and for a query since a mark `:since`
  (the `Mtrace.Mark`) and, when the mark was taken for a `window:`,
  `:window_ms`, and may give `:total`, the query's own total
  (`%{count, bytes, est_count, est_bytes}`, as `Mtrace.Query.sites/1`
  returns it). `since` is written as the mark's `t_ms` (the table's clock,
  as `stats.now_ms`) and `window_ms` as the window's length; both are null
  for a snapshot of everything live, so a file of what grew since a mark
  does not read as one. `total` sums the sites given: `count` and `bytes`
  what the table recorded, `est_count` and `est_bytes` the estimates of all
  live allocations (the same figures without sampling; a site without
  estimates counts as recorded); when `meta.total` is of the same sites
  (the same `count` and `bytes`), its `est_count` is taken instead, rounded
  once where a site's is rounded on its own; and `sampled` is `stats.sampled`, so that
  under `MTRACE_SAMPLE_BYTES` a reader knows which figures to take. A site has
  `growth_per_s` (estimated bytes per second since the mark) when the
  query was `sort: :growth`, and not otherwise. Each frame
  also carries its display `name` (`Mtrace.Frame.name/1`), so readers need not
  repeat the rule. An Erlang frame also has `"module"`, `"function"` and
  `"arity"`, the atoms as the VM writes them (`"Elixir.Ledger"`, `"ets"`;
  null where the VM named no function), so a reader can match them without
  parsing the name. Bytes of a frame's strings that are not UTF-8 (a
  library under a directory named in Latin-1) are written as U+FFFD
  (`Mtrace.JSON.valid_utf8/1`). Keys are written sorted. Raises
  `ArgumentError` if something else cannot be encoded (see `Mtrace.JSON`).

  ## Example

      iex> site = %{count: 1, bytes: 16, oldest: 3, newest: 3, frames: []}
      iex> meta = %{node: :"app@host", generated_at: ~U[2024-05-01 12:00:00Z]}
      iex> Mtrace.Export.json([site], %{dropped: 0}, meta) |> IO.iodata_to_binary()
      ~s|{"generated_at":"2024-05-01T12:00:00Z","node":"app@host","since":null,| <>
        ~s|"sites":[{"bytes":16,"count":1,"frames":[],"newest":3,"oldest":3}],| <>
        ~s|"stats":{"dropped":0},"total":{"bytes":16,"count":1,"est_bytes":16,| <>
        ~s|"est_count":1,"sampled":false},"window_ms":null}|
      iex> grown = Map.put(site, :growth_per_s, 4.0)
      iex> mark = %Mtrace.Mark{node: :"app@host", t_ms: 120_500}
      iex> meta = Map.merge(meta, %{since: mark, window_ms: 4000})
      iex> json = Mtrace.Export.json([grown], %{}, meta) |> IO.iodata_to_binary()
      iex> json =~ ~s|"growth_per_s":4.0| and json =~ ~s|"since":120500,|
      true
      iex> json =~ ~s|"window_ms":4000}|
      true
  """
  @spec json([site()], map(), %{
          required(:node) => node(),
          required(:generated_at) => DateTime.t(),
          optional(:since) => Mtrace.Mark.t() | nil,
          optional(:window_ms) => non_neg_integer() | nil,
          optional(:total) => map() | nil
        }) :: iodata()
  def json(sites, stats, %{node: node, generated_at: %DateTime{} = generated_at} = meta) do
    JSON.encode(%{
      generated_at: DateTime.to_iso8601(generated_at),
      node: node,
      since: since_ms(meta),
      window_ms: window_ms(meta),
      total: total(sites, stats, meta[:total]),
      stats: stats,
      sites: encoded_sites(sites)
    })
  end

  def json(_sites, _stats, meta) do
    raise ArgumentError,
          "Mtrace.Export.json/3: meta must hold :node and :generated_at (a DateTime), got: #{inspect(meta)}"
  end

  defp since_ms(meta) do
    case meta[:since] do
      nil ->
        nil

      %Mtrace.Mark{t_ms: t_ms} ->
        t_ms

      other ->
        raise ArgumentError,
              "Mtrace.Export.json/3: meta :since must be a Mtrace.Mark, got: #{inspect(other)}"
    end
  end

  defp window_ms(meta) do
    case meta[:window_ms] do
      ms when is_nil(ms) or (is_integer(ms) and ms >= 0) ->
        ms

      other ->
        raise ArgumentError,
              "Mtrace.Export.json/3: meta :window_ms must be a non-negative integer, got: #{inspect(other)}"
    end
  end

  # Sampling, the recorded figures are a sample: the estimates are summed
  # too, and the flag says which to read. The tracer's own total of a query,
  # when it is of the same sites, gives the estimated count: a site's is
  # rounded, and summing rounded counts drifts with the number of sites.
  defp total(sites, stats, tracers) do
    total = %{
      count: sum(sites, :count),
      bytes: sum(sites, :bytes),
      est_count: sum(sites, :est_count, :count),
      est_bytes: sum(sites, :est_bytes, :bytes),
      sampled: stats[:sampled] == true
    }

    case tracers do
      %{count: count, bytes: bytes, est_count: est} when is_integer(est) ->
        if {count, bytes} == {total.count, total.bytes},
          do: %{total | est_count: est},
          else: total

      _ ->
        total
    end
  end

  defp sum(sites, field), do: sites |> Enum.map(& &1[field]) |> Enum.sum()

  defp sum(sites, field, otherwise),
    do: sites |> Enum.map(&(&1[field] || &1[otherwise])) |> Enum.sum()

  # Each site is encoded to one binary as it comes, and each distinct frame
  # once: thousands of stacks share their outer frames, and the iodata of
  # every occurrence held until the end took some 20 times the file's size.
  defp encoded_sites(sites) do
    {encoded, _frames} =
      Enum.map_reduce(sites, %{}, fn site, frames ->
        {objects, frames} = Enum.map_reduce(site.frames, frames, &encoded_frame/2)
        object = site |> Map.take(@site_fields) |> Map.put(:frames, objects)
        {object |> JSON.encode() |> IO.iodata_to_binary(), frames}
      end)

    %JSON.Encoded{iodata: [?[, Enum.intersperse(encoded, ?,), ?]]}
  end

  defp encoded_frame(frame, known) do
    case known do
      %{^frame => encoded} ->
        {encoded, known}

      _ ->
        encoded = %JSON.Encoded{
          iodata: frame |> frame_object() |> JSON.encode() |> IO.iodata_to_binary()
        }

        {encoded, Map.put(known, frame, encoded)}
    end
  end

  # Only the documented fields, so the file's shape does not change when
  # sites and frames gain internal fields.

  defp frame_object(frame) do
    fields = if Mtrace.Frame.erlang?(frame), do: @erlang_fields, else: @frame_fields

    frame
    |> Map.take(fields)
    |> Map.put(:name, Mtrace.Frame.name(frame))
    |> Map.new(fn {key, value} -> {key, text(value)} end)
  end

  # Paths and names are bytes as the objects and the disk hold them (a
  # library under a directory named in Latin-1): JSON strings must be UTF-8.
  defp text(value) when is_binary(value), do: JSON.valid_utf8(value)
  defp text(value), do: value

  @doc """
  Why an output of the sites holds none, in sentences: tracking switched
  off, a filter that matched nothing, or an empty table. `stats` is
  `Mtrace.stats/0` of the node queried (or nil when unknown) and `filter`
  the query's filter in words (`"with a frame in \\"libfoo\\""`, as
  `Mtrace.report/1`'s header gives it), nil for none. Returns nil when
  neither tells anything.

  An empty folded file or flame graph reads as "nothing is held": this says
  what the emptiness means, for the flame graph's text and the warning
  `Mtrace.export/2` and `Mtrace.flamegraph/2` log.

  ## Examples

      iex> Mtrace.Export.why_empty(%{enabled: false, live_count: 0}, nil)
      "Tracking is switched off (Mtrace.disable/0 or MTRACE_ENABLED=0): blocks " <>
        "allocated since are not recorded; Mtrace.enable/0 switches it on."
      iex> stats = %{enabled: true, live_count: 1_266, live_bytes: 11_010_048}
      iex> Mtrace.Export.why_empty(stats, ~s|with a frame in "libinner"|)
      ~s|No live allocation matches the filter (with a frame in "libinner"); | <>
        "the table holds 10.5 MiB in 1_266 live blocks."
      iex> Mtrace.Export.why_empty(%{enabled: true, live_count: 0}, nil)
      "The allocation table is empty: no live allocation is recorded."
      iex> Mtrace.Export.why_empty(nil, nil)
      nil
  """
  @spec why_empty(map() | nil, String.t() | nil) :: String.t() | nil
  def why_empty(stats, filter) do
    stats = stats || %{}
    live = stats[:live_count]

    [
      stats[:enabled] == false &&
        "Tracking is switched off (Mtrace.disable/0 or MTRACE_ENABLED=0): blocks " <>
          "allocated since are not recorded; Mtrace.enable/0 switches it on.",
      is_binary(filter) and live != 0 &&
        "No live allocation matches the filter (#{filter})#{in_all(stats)}.",
      live == 0 and stats[:enabled] != false &&
        "The allocation table is empty: no live allocation is recorded."
    ]
    |> Enum.filter(&is_binary/1)
    |> case do
      [] -> nil
      sentences -> Enum.join(sentences, " ")
    end
  end

  # What the whole table holds, as report/1's header gives it.
  defp in_all(%{sampled: true, est_live_bytes: bytes, est_live_count: count}),
    do: "; the table holds about #{Format.bytes(bytes)} in about #{blocks(count)}"

  defp in_all(%{live_bytes: bytes, live_count: count}),
    do: "; the table holds #{Format.bytes(bytes)} in #{blocks(count)}"

  defp in_all(_stats), do: ""

  defp blocks(count), do: Format.count(count, "live block")
end

defmodule Mtrace do
  @moduledoc """
  Finds native memory leaks on a live node: allocations made with malloc and
  friends (by NIFs, drivers and the C libraries they link) that are still held,
  oldest first, with the call stack that made them.

  The work is done by `priv/mtrace.so`, preloaded into `beam.smp` with
  `LD_PRELOAD`: it records every live allocation in a lossless table of its
  own. These functions read that table through a NIF. Without the preload they
  raise `Mtrace.Error`, whose message gives the `LD_PRELOAD` line to use;
  `preloaded?/0` tells beforehand. Preloaded into a program that
  `MTRACE_PROGRAMS` does not name, the tracer records nothing: the queries
  then raise `Mtrace.Error` (reason `:not_traced`) rather than answer with
  an empty table, and `stats/1` says `active: false`. For memory the VM
  itself accounts for (processes, binaries, ETS), see `Mtrace.VM`.
  """

  import Bitwise
  require Logger
  alias Mtrace.{Export, Flamegraph, Mark, Native, Options, Query, Remote, Report}

  @typedoc """
  One frame of a stack in the original form: the object file and the
  function name (nil if unknown). An Erlang frame reads
  `{"erlang", "Module.function/arity"}` (`{"erlang", nil}` when the VM named
  no function there).
  """
  @type frame :: {lib :: binary() | nil, symbol :: binary() | nil}

  @typedoc """
  One live allocation: its age in seconds, size in bytes, address, the
  nanoseconds spent naming its stack, and the stack (frame 0 called malloc).
  """
  @type old ::
          {age_s :: non_neg_integer(), size :: non_neg_integer(), addr :: non_neg_integer(),
           ns :: non_neg_integer(), stack :: [frame()]}

  @typedoc """
  One frame of a stack. A stack lists native frames from the function that
  called malloc outwards; when a NIF made the allocation, they stop where
  the NIF was called and the Erlang frames follow: the NIF itself, then the
  Erlang functions that called it (see `t:erlang_frame_map/0`).

  A native frame is named from the ELF symbol table and, when the object has
  debug info, DWARF: `file`/`line` of the call, and one map per level of
  inlined code (`inlined: true`) before the function that holds it. `addr`
  is the return address; `offset` is it minus the object's load address, for
  `addr2line -e lib offset` on another machine.
  """
  @type frame_map ::
          %{
            lib: binary() | nil,
            symbol: binary() | nil,
            file: binary() | nil,
            line: pos_integer() | nil,
            addr: non_neg_integer(),
            inlined: boolean(),
            offset: non_neg_integer()
          }
          | erlang_frame_map()

  @typedoc """
  An Erlang frame: `module`, `function` and `arity` (nil where the VM named
  no function at that address), and `file`/`line` of the call where the VM
  knows them (the NIF's own frame has none). `symbol` is the same name as
  text, `"Module.function/arity"`; `addr` the return address into the
  Erlang code; `lib` is nil, `inlined` false and `offset` 0. Names are taken
  when a stack is first seen, so they stay right after the code is purged.
  """
  @type erlang_frame_map :: %{
          module: module() | nil,
          function: atom() | nil,
          arity: non_neg_integer() | nil,
          symbol: binary(),
          file: binary() | nil,
          line: pos_integer() | nil,
          addr: non_neg_integer(),
          lib: nil,
          inlined: false,
          offset: 0
        }

  @typedoc "One live allocation, as the keyword form of `olds/2` returns it."
  @type old_map :: %{
          age: non_neg_integer(),
          size: non_neg_integer(),
          addr: non_neg_integer(),
          ns: non_neg_integer(),
          frames: [frame_map()]
        }

  @typedoc """
  A leak site: the live allocations made by one call stack, how many, how
  many bytes, and the ages in seconds of the oldest and newest of them.

  With sampling (`MTRACE_SAMPLE_BYTES`), `count` and `bytes` are of the
  recorded samples and `est_count`/`est_bytes` estimate all live
  allocations of the site (sites are ranked by the estimates); without
  sampling they are equal.
  """
  @type site :: %{
          required(:count) => non_neg_integer(),
          required(:bytes) => non_neg_integer(),
          required(:est_count) => non_neg_integer(),
          required(:est_bytes) => non_neg_integer(),
          required(:oldest) => non_neg_integer(),
          required(:newest) => non_neg_integer(),
          required(:frames) => [frame_map()],
          optional(:growth_per_s) => float() | nil
        }

  @typedoc """
  Query options, shared by `olds/2` (keyword form), `sites/1`, `report/1`,
  `export/2` and `flamegraph/2`:

    * `since: mark` — only allocations made after `mark/1` took `mark`;
    * `min_age: s`, `max_age: s` — at least / at most `s` seconds old;
    * `min_size: b`, `max_size: b` — blocks of at least / at most `b` bytes;
    * `lib: "substring"` — only stacks with a frame in an object (shared
      library or executable) whose path contains the substring;
    * `boot: false` — leaves out what was allocated before the mtrace
      application started (VM boot, code loading). The default is `true`
      (everything, as the table holds it), except in `report/1`, which is
      read by people: it sums those blocks in one line unless `boot: true`;
    * `demangle: false` — C++ names left mangled (they are demangled by default);
    * `node: node` — run on that node over distributed Erlang (a query
      given a mark from another node runs there);
    * `timeout: ms` — how long to wait for `node` (default 300_000).
  """
  @type query_opt ::
          {:since, Mark.t()}
          | {:min_age, number()}
          | {:max_age, number()}
          | {:min_size, non_neg_integer()}
          | {:max_size, non_neg_integer()}
          | {:lib, String.t()}
          | {:boot, boolean()}
          | {:demangle, boolean()}
          | {:node, node()}
          | {:timeout, timeout()}

  @remote_timeout 300_000
  @site_defaults [sort: :bytes, limit: 10, window: nil]

  @doc """
  Whether the tracer library is preloaded into this VM (and its NIF loaded):
  whether the other functions can answer rather than raise `:not_preloaded`.

  It is true also when the preload does not trace this program (the
  executable is not one `MTRACE_PROGRAMS` names): `Mtrace.stats().active`
  tells that, and the queries (`olds/2`, `sites/1`, `report/1`, ...) then
  raise `Mtrace.Error` with reason `:not_traced` and the setting to use.

      iex> is_boolean(Mtrace.preloaded?())
      true
  """
  @spec preloaded?() :: boolean()
  def preloaded? do
    Native.preloaded()
  rescue
    _ -> false
  end

  @doc """
  The `n` oldest live native allocations, oldest first.

  Two forms:

    * `olds(n, demangle)` (the original form): each allocation is
      `{age_seconds, size, addr, ns, stack}`; `stack` is a list of
      `{lib, symbol}` from the function that called malloc outwards, then,
      for memory a NIF allocated, its Erlang callers as
      `{"erlang", "Module.function/arity"}`. C++ names are demangled, as in
      every output; `olds(n, false)` leaves them mangled.
    * `olds(n, opts)` with keyword options (see `t:query_opt/0`): each
      allocation is a map `%{age, size, addr, ns, frames}` whose frames are
      maps with source file and line (`t:frame_map/0`).

  `ns` is the time spent naming that stack (cached names cost next to
  nothing). The selection happens in C, so `olds(10)` is cheap even with
  millions of live allocations; the scan runs on a dirty scheduler.

      iex> for {age, size, _addr, _ns, stack} <- Mtrace.olds(3) do
      ...>   is_integer(age) and size >= 0 and is_list(stack)
      ...> end
      ...> |> Enum.all?()
      true

      iex> olds = Mtrace.olds(3, min_age: 0, min_size: 1)
      iex> Enum.all?(olds, &(is_integer(&1.age) and is_list(&1.frames)))
      true
  """
  @spec olds(non_neg_integer(), boolean()) :: [old()]
  @spec olds(non_neg_integer(), [query_opt()]) :: [old_map()]
  def olds(n \\ 10, demangle_or_opts \\ true)

  def olds(n, demangle) when is_integer(n) and n >= 0 and is_boolean(demangle) do
    Query.olds_tuples(count!(n, "olds/2"), demangle)
  end

  def olds(n, opts) when is_integer(n) and n >= 0 and is_list(opts) do
    o = Options.parse!(opts, [], "olds/2")
    n = count!(n, "olds/2")

    case Options.target(o) do
      target when target == node() ->
        Query.olds(n, o)

      # each stack sent once, not once per entry
      target ->
        timeout = Map.get(o, :timeout, @remote_timeout)
        Query.with_stacks(Remote.call(target, Query, :olds_by_stack, [n, o], timeout))
    end
  end

  def olds(n, demangle) when is_boolean(demangle) or is_list(demangle) do
    raise ArgumentError, "Mtrace.olds/2: n must be a non-negative integer, got: #{inspect(n)}"
  end

  def olds(_n, demangle) do
    raise ArgumentError,
          "Mtrace.olds/2: the second argument must be a boolean (demangle) or a keyword list of " <>
            "options, got: #{inspect(demangle)}"
  end

  @doc """
  The call sites holding the most live native memory: live allocations
  grouped by the call stack that made them, ranked in C (one pass over the
  table on a dirty scheduler; only the top sites are named).

  Options (besides those of `t:query_opt/0`):

    * `sort:` — `:bytes` (default), `:count`, `:oldest` (oldest allocation
      first), or `:growth`: what was allocated since the `since:` mark (or
      the `window:`) and is still live, by bytes, each site with its
      `growth_per_s` (bytes per second since the mark; `nil` within
      100 ms of it, where the table's coarse clock makes a rate meaningless);
    * `window: ms` — takes a mark where the table is, waits `ms`, and
      queries since it (with tracking switched off it raises
      `Mtrace.Error` `:tracking_off` at once: nothing would be recorded);
    * `limit:` — how many sites (default 10), or `:all`.

  Each site is `%{count, bytes, est_count, est_bytes, oldest, newest,
  frames}` (`t:site/0`; the `est_` figures are estimates when sampling, the
  same as the others when not); ages in seconds; frames innermost first.

      iex> Mtrace.sites(limit: 2, sort: :count) |> length() <= 2
      true

      Mtrace.sites(limit: 1, lib: "leaky")
      #=> [%{count: 3072, bytes: 12582912, est_count: 3072, est_bytes: 12582912,
      #=>    oldest: 7380, newest: 5,
      #=>    frames: [%{symbol: "leak_buffer", file: "c_src/leaky.c",
      #=>               line: 42, inlined: false,
      #=>               lib: "/srv/app/lib/leaky-0.1.0/priv/leaky.so",
      #=>               addr: 140210745012345, offset: 4665}, ...]}]
  """
  @spec sites([
          query_opt()
          | {:sort, :bytes | :count | :oldest | :growth}
          | {:limit, pos_integer() | :all}
          | {:window, pos_integer()}
        ]) :: [site()]
  def sites(opts \\ []) do
    o = Options.parse!(opts, @site_defaults, "sites/1")
    {o, opts} = after_window(o, opts, "sites/1")
    remote(o, :sites, [drop_node(opts)], fn -> o |> Query.sites() |> elem(1) end)
  end

  @doc """
  Marks "now" on the node's allocation table (`node:` for another node).

  Give the mark as `since:` to the queries to see only what was allocated
  after it and is still live: what grew since you looked, without `reset/0`
  forgetting the past. (A `reset/0` after the mark forgets what was
  allocated since it too; `report/1` then says so.) Waits for the next
  tick of the table's coarse clock (a few ms), so the line between before
  and after is exact.

      iex> mark = Mtrace.mark()
      iex> Mtrace.sites(since: mark, lib: "no-such-library")
      []
  """
  @spec mark([{:node, node()} | {:timeout, timeout()}]) :: Mark.t()
  def mark(opts \\ []) do
    o = Options.parse_remote!(opts, "mark/1")
    remote(o, :mark, [drop_node(opts)], fn -> %Mark{node: node(), t_ms: Query.next_tick()} end)
  end

  @doc """
  Prints the top sites as a readable table: live bytes and blocks with
  humanized sizes and ages, then one line per frame, `symbol (file:line)
  lib`. Takes the options of `sites/1` (top 10 by default) plus `frames:`
  (frames shown per site, default 8). What was allocated before the mtrace
  application started (VM boot, code loading) is summed in one line rather
  than ranked, unless `boot: true`. With `sort: :growth` each site shows its
  rate. With a filter (`lib:`, `since:`, `min_size:`, ...) the header
  gives what matches, the filter, and the node's whole after it. Lines are
  wrapped to 80 columns. Returns `:ok`.

      Mtrace.report(limit: 3, boot: true)
      # prints:
      # Native memory live on a@vm: 14.2 MiB in 25_610 blocks
      # #1  12.0 MiB in 3_072 blocks  oldest 2h 03m  newest 5s
      #     leak_buffer (c_src/leaky.c:42) leaky.so
      #     ...

      Mtrace.report(lib: "nif", limit: 1)
      # prints:
      # Native memory live on a@vm: 12.0 MiB in 3_072 blocks with a frame in "nif"
      #   (of 14.2 MiB in 25_610 blocks in all)
      # #1  12.0 MiB in 3_072 blocks  oldest 2h 03m  newest 5s
      #     ...
  """
  @spec report(keyword()) :: :ok
  def report(opts \\ []) do
    o = Options.parse!(opts, @site_defaults ++ [frames: 8, boot: false], "report/1")
    filter = filter_words(o)

    {o, opts} = after_window(o, opts, "report/1", recording(o, "the report follows"))
    snap = snapshot(o, Keyword.put_new(opts, :boot, false), [:frames])

    IO.write(
      Report.format(snap.sites, snap.stats,
        frames: o.frames,
        node: snap.node,
        boot: snap[:boot],
        sort: o.sort,
        filter: filter,
        total: snap.total,
        since: o[:since] && o.since.t_ms
      )
    )
  end

  # An age filter as given: "at least 1.5s old" for min_age: 1.5 (not the
  # rounded "2s", which a block of 1.7s would seem to contradict).
  defp age_bound(word, seconds) do
    case Mtrace.VM.Format.age(seconds) do
      "over " <> _ = age when word == "at least" -> "#{age} old"
      # "at most over 1000y" reads oddly; no block is that old anyway
      "over " <> _ -> nil
      _ when is_float(seconds) and seconds < 60 -> "#{word} #{Float.round(seconds, 1)}s old"
      age -> "#{word} #{age} old"
    end
  end

  # A size bound as given: "2.0 KiB" for 2048, but "2_000 B" for 2000
  # (humanized, a bound would move).
  defp bound_bytes(n) do
    human = Mtrace.VM.Format.bytes(n)

    exact? =
      case Float.parse(human) do
        {x, " KiB"} -> x * 1024 == n
        {x, " MiB"} -> x * 1024 * 1024 == n
        {x, " GiB"} -> x * 1024 * 1024 * 1024 == n
        {x, " TiB"} -> x * 1024 * 1024 * 1024 * 1024 == n
        _bytes -> true
      end

    if exact?, do: human, else: "#{Mtrace.VM.Format.int(n)} B"
  end

  # The filters of a query in words, for the report's header; nil for none.
  defp filter_words(o) do
    size = &bound_bytes/1

    [
      o[:window] && "allocated in the last #{Mtrace.VM.Format.duration_ms(o.window)}",
      o[:since] && "allocated since the mark",
      o[:min_age] && age_bound("at least", o.min_age),
      o[:max_age] && age_bound("at most", o.max_age),
      o[:min_size] && "of at least #{size.(o.min_size)} each",
      o[:max_size] && "of at most #{size.(o.max_size)} each",
      o[:lib] && "with a frame in #{inspect(o.lib)}"
    ]
    |> Enum.filter(&is_binary/1)
    |> case do
      [] -> nil
      words -> Enum.join(words, ", ")
    end
  end

  @doc """
  A view that refreshes every `interval` until you type `q` and Enter:
  memory at a glance (RSS, the VM's categories, the native heap and its
  rate, NIF memory in the VM's allocators), the native sites that grew most
  since the last refresh with their rate and the Erlang code that called
  them, and the processes whose memory grew most. It fits the terminal
  (80×24 and up). In a local IEx it redraws in place; where ANSI escapes are
  off (a remote shell, `bin/app remote`) each refresh is printed below the
  last. A node that stops answering is said so on the screen, and asked
  again at the next refresh. To compare processes between refreshes, one
  helper process on the watched node (`{Mtrace.Top.Sample, :helper, 0}`)
  keeps their memory; it ends with the view. Returns `:ok`.

  Options:

    * `interval:` — ms from the start of one refresh to the next (default
      2000, at least 100); when a refresh takes longer (a node with very
      many processes), the title gives the real period;
    * `node:` — the node to watch (mtrace loaded there), default this one;
      one that cannot be reached raises `Mtrace.Error` (reason `:nodedown`,
      or `:not_distributed` when this node has no name);
    * `rows:` — sites and processes listed (default 5, fewer if the
      terminal is short);
    * `ansi:` — `true`/`false` to force redrawing in place or not;
    * `refreshes:` — stop by itself after this many (default `:infinity`);
    * `timeout:` — ms to wait for `node` each refresh (default 10_000).

  `bin/mtrace-top NODE [COOKIE]` runs it from a terminal, as a hidden node.

      Mtrace.top(interval: 1_000)
      # mtrace top app@host  every 1.0s  q + Enter quits          14:20:01 UTC
      # RSS 81.2 MiB  VM 25.1 MiB: processes 5.2 MiB, binary 107.7 KiB, ...
      # native 10.4 MiB in 1_320 blocks  +82.9 KiB/s (+291.6 MiB/h)
      # ...
  """
  @spec top(keyword()) :: :ok
  def top(opts \\ []), do: Mtrace.Top.run(opts)

  @doc """
  Writes the live sites to `path`, for other tools:

    * `format: :folded` (default) — collapsed stacks, one line per stack,
      `outer;...;inner weight`, as read by flamegraph.pl, inferno and
      speedscope; `weight: :bytes` (default) or `:count`;
    * `format: :json` — `%{generated_at, node, since, window_ms, total,
      stats, sites}` (`Mtrace.Export.json/3`): `since` and `window_ms` say
      what a query since a mark or over a window covered, and with
      `sort: :growth` each site has its `growth_per_s`.

  Takes the options of `sites/1`, with `limit: :all` and `demangle: true` by
  default. Returns `:ok`; the file is written only at `path`, on the
  calling node (with `node:` the sites come from that node; a relative
  path is the calling node's working directory's, and `~` is not
  expanded: `Path.expand/1` does). When it holds
  no site, a warning is logged saying why (tracking switched off, a filter
  that matched nothing, an empty table: `Mtrace.Export.why_empty/2`).

      path = Path.join(System.tmp_dir!(), "native.folded")
      Mtrace.export(path, format: :folded, weight: :bytes)
      #=> :ok
  """
  @spec export(Path.t(), keyword()) :: :ok
  def export(path, opts \\ []) do
    path = path!(path, "export/2")

    o =
      Options.parse!(
        opts,
        [sort: :bytes, limit: :all, window: nil, format: :folded, weight: :bytes],
        "export/2"
      )

    if o.format == :json and Keyword.has_key?(opts, :weight),
      do: raise(ArgumentError, "Mtrace.export/2: weight: applies to format: :folded only")

    {window_ms, filter} = {o.window, filter_words(o)}
    if o.window, do: writable!(path)
    {o, opts} = after_window(o, opts, "export/2", recording(o, "then #{path} is written"))
    snap = snapshot(o, opts, [:format, :weight])

    {data, weight} =
      case o.format do
        :folded ->
          {Export.folded(estimated(snap), o.weight), o.weight}

        :json ->
          meta = %{node: snap.node, generated_at: snap.generated_at, since: o[:since]}
          meta = Map.put(meta, :total, snap[:total])
          {Export.json(snap.sites, snap.stats, Map.put(meta, :window_ms, window_ms)), :count}
      end

    write!(path, data)
    empty_warning(snap, weight, filter, "export/2: #{path} holds no allocation site")
  end

  @doc """
  Writes a standalone SVG flame graph of live native memory by call stack to
  `path` (open it in a browser; hover a box for its name, source line, bytes
  and share). Takes the options of `sites/1` (`limit: :all` and
  `demangle: true` by default) plus
  `weight:` (`:bytes` or `:count`), `title:` (by default it names the node
  and the time, so that graphs of several nodes are told apart) and
  `width:` (pixels). Returns
  `:ok`; `path` is on the calling node, as for `export/2`. With nothing to draw, the image says why (tracking switched off, a
  filter that matched nothing, an empty table), and so does a warning in
  the log.

      Mtrace.flamegraph("/tmp/native.svg", min_age: 3600)
      #=> :ok
  """
  @spec flamegraph(Path.t(), keyword()) :: :ok
  def flamegraph(path, opts \\ []) do
    path = path!(path, "flamegraph/2")
    defaults = [sort: :bytes, limit: :all, window: nil, weight: :bytes, title: nil, width: 1200]
    o = Options.parse!(opts, defaults, "flamegraph/2")
    filter = filter_words(o)
    if o.window, do: writable!(path)
    {o, opts} = after_window(o, opts, "flamegraph/2", recording(o, "then #{path} is written"))
    snap = snapshot(o, opts, [:weight, :title, :width])
    render = [weight: o.weight, width: o.width, stats: snap.stats, filter: filter, sort: o.sort]
    render = render ++ [title: o.title || default_title(snap), matched: matched(snap)]
    write!(path, Flamegraph.svg(estimated(snap), render))
    empty_warning(snap, o.weight, filter, "flamegraph/2: #{path} draws no allocation")
  end

  # Graphs of several nodes, or of one node at several times, are told
  # apart by their heading.
  defp default_title(snap) do
    at = snap.generated_at |> DateTime.truncate(:second) |> Calendar.strftime("%Y-%m-%d %H:%M:%S")
    "mtrace: live native memory by call stack on #{snap.node}, #{at} UTC"
  end

  # A file that shows nothing cannot say why (folded lines have no room for
  # it): tracking off, a filter that matched nothing or an empty table is
  # logged, as Mtrace.Watch logs what it cannot see. Still :ok, the file is
  # what the table holds. Logger's prefix shortens the first line.
  defp empty_warning(snap, weight, filter, what) do
    if snap |> estimated() |> Enum.all?(&(&1[weight] == 0)) do
      why = Export.why_empty(snap.stats, filter)
      text = Enum.join(["Mtrace.#{what}." | List.wrap(why)], " ")
      Logger.warning(Mtrace.Error.wrap(text, 80 - 24))
    end

    :ok
  end

  @doc """
  Runs `Mtrace.fun(args...)` on this node and every node connected to it
  (`Node.list/0`; from a node started hidden, `Node.list(:connected)`) at
  once and returns `%{node => {:ok, result} | {:error, exception}}`; a node where
  mtrace is missing, not preloaded or unreachable gets its error, the others
  still answer. `fun` is one of `:stats`, `:sites`, `:olds`, `:mark`,
  `:reset`, `:enable`, `:disable`, `:preloaded?`. `args` is the list of
  the function's arguments, so its options are a list inside it:
  `Mtrace.cluster(:sites, [[limit: 3]])`. Each node answers for itself, so
  the options `:node` and `:timeout` have no place there, nor `:since`: a
  mark belongs to one node (ask it with `sites(since: mark)`). Raises
  `ArgumentError` for them.

      iex> %{} = result = Mtrace.cluster(:preloaded?)
      iex> {:ok, answer} = result[node()]
      iex> is_boolean(answer)
      true
  """
  @spec cluster(atom(), list(), timeout()) :: %{node() => {:ok, term()} | {:error, Exception.t()}}
  def cluster(fun, args \\ [], timeout \\ @remote_timeout)

  def cluster(fun, args, timeout)
      when fun in [:stats, :sites, :olds, :mark, :reset, :enable, :disable, :preloaded?] and
             is_list(args) do
    # cluster(:sites, limit: 1) reads as options but gives sites/1 the
    # argument {:limit, 1}: told here once, not by every node.
    if args != [] and Keyword.keyword?(args) do
      raise ArgumentError,
            "Mtrace.cluster/3: args is the list of arguments of Mtrace.#{fun}, so options go in a " <>
              "list of their own: cluster(#{inspect(fun)}, [#{inspect(args)}]), got: " <>
              inspect(args)
    end

    arity = proper_length(args)

    unless arity && function_exported?(__MODULE__, fun, arity) do
      raise ArgumentError,
            "Mtrace.cluster/3: args must be a list of arguments of Mtrace.#{fun}, got: #{inspect(args)}"
    end

    unless timeout == :infinity or (is_integer(timeout) and timeout > 0 and timeout < 1 <<< 32) do
      raise ArgumentError,
            "Mtrace.cluster/3: timeout must be a positive integer of ms or :infinity, got: " <>
              inspect(timeout)
    end

    Enum.each(args, &each_node_own!(&1, fun))
    nodes = [node() | cluster_nodes()]

    case {fun, args} do
      # each stack sent once by each node, not once per entry (olds/2's
      # remote path), and put back here
      {:olds, [n, opts]} when is_integer(n) and n >= 0 and is_list(opts) ->
        count!(n, "olds/2")
        o = Options.parse!(opts, [], "olds/2")

        for {node, answer} <- Remote.multicall(nodes, Query, :olds_by_stack, [n, o], timeout),
            into: %{},
            do: {node, with_ok(answer, &Query.with_stacks/1)}

      _ ->
        Remote.multicall(nodes, __MODULE__, fun, args, timeout)
    end
  end

  def cluster(fun, args, _timeout) when is_list(args) do
    raise ArgumentError,
          "Mtrace.cluster/3: fun must be one of :stats, :sites, :olds, :mark, :reset, :enable, " <>
            ":disable, :preloaded?, got: #{inspect(fun)}"
  end

  def cluster(_fun, args, _timeout) do
    raise ArgumentError, "Mtrace.cluster/3: args must be a list, got: #{inspect(args)}"
  end

  # The nodes this one is connected to: the visible ones (remote consoles
  # and other hidden nodes have no table of their own to read), or, from a
  # hidden node, whose connections are all hidden, every one.
  defp cluster_nodes do
    # started -hidden, or with net_kernel:start/2's hidden => true
    hidden =
      :persistent_term.get({:net_kernel, :publish_type}, nil) == :hidden or
        match?({:ok, _}, :init.get_argument(:hidden))

    if hidden, do: Node.list(:connected), else: Node.list()
  end

  # Each node answers for itself: options that would send its query to
  # another node (:node, or a :since mark, which belongs to the node that
  # took it) would file one node's answer under another's name.
  defp each_node_own!([_ | _] = opts, fun) do
    if Keyword.keyword?(opts) do
      for key <- [:node, :since, :timeout], Keyword.has_key?(opts, key) do
        raise ArgumentError,
              "Mtrace.cluster/3: option #{inspect(key)} has no place in Mtrace.#{fun}'s options " <>
                "here, as #{own_reason(key)}, got: #{inspect(opts)}"
      end
    end
  end

  defp each_node_own!(_arg, _fun), do: :ok

  defp own_reason(:node), do: "every node answers for itself"
  defp own_reason(:since), do: "a mark belongs to the node that took it: ask that node alone"
  defp own_reason(:timeout), do: "the timeout is cluster/3's third argument"

  defp with_ok({:ok, answer}, fun), do: {:ok, fun.(answer)}
  defp with_ok(error, _fun), do: error

  @doc """
  Counters and table figures.

  Call counters (`malloc_cnt`, `calloc_cnt`, `realloc_cnt`, `free_cnt`,
  `posix_memalign_cnt`, `strdup_cnt`, `strndup_cnt`, and the same for
  `reallocarray`, `aligned_alloc`, `memalign`, `valloc`, `pvalloc`) count calls
  seen while tracking was on. `live_count`/`live_bytes` describe the table;
  `dropped` counts allocations that could not be recorded (no memory for the
  table, more than 65,535 blocks of 128 MiB or more at once, a signal
  handler's while its thread was inside the tracer, or one waiting on a fork
  that held the table's locks too long), `replaced` entries overwritten
  because a free was missed, `stacks_dropped` allocations recorded without a
  stack; the three count from the program's start (`reset/0` does not clear
  them). `enabled`, `active`
  (this executable is traced) and `depth` are the effective settings.
  `allocated_bytes`, `used_bytes`, `free_bytes`, `mmap_chunks` and
  `mmap_bytes` come from glibc's `mallinfo2()`, which locks each malloc
  arena in turn while it walks the arena's free chunks (some 20-40 ms with
  a million of them); `heap: false` leaves them `nil` (and `heap` false),
  for a caller that reads the figures every few seconds (`top/1`,
  `Mtrace.Watch` do).

  In sampling mode (`MTRACE_SAMPLE_BYTES`, `sampled: true`) the table holds a
  sample: `live_count`/`live_bytes` are what was recorded, and
  `est_live_count`/`est_live_bytes` are estimates of all live allocations,
  each sample weighted by the inverse of its chance to be sampled (without
  sampling they equal the exact figures). `fast_unwind` tells which stack
  walker runs and `unwind_fallbacks` how many stacks it handed to libunwind
  (`libunwind`: whether `libunwind.so.8` could be loaded; without it those
  stacks end where the own walker stopped, and `MTRACE_UNWIND=libunwind`
  walks with the own walker, which `config_errors` says), `unwind_cut` how many stacks it kept cut at the frames it had found
  (libunwind busy in another thread for milliseconds, a fork under way, or
  a coroutine's stack whose frames point past its readable end);
  `config_errors` names the `MTRACE_` variables whose value was not
  understood and fell back to the default, and the variables whose name
  reads like a misspelled setting (`"MTRACE_SAMPLE_BYTE (did you mean
  MTRACE_SAMPLE_BYTES?)"`, `Mtrace.Stats.misspelled/1`), which leave that
  setting at its default.

  `reset_ms` is the table's time of the last `reset/0` (0 if none), and
  `now_ms` its time when these figures were read, on the clock of
  `Mtrace.Mark`'s `t_ms`; inspected, the figures say how long ago the reset
  was.

  `erlang_frames` says whether stacks of allocations made by NIFs carry the
  Erlang frames of the calling process; when it is `false`,
  `erlang_frames_off` says why (e.g. `"off: MTRACE_ERLANG=0"`, or which check
  of the VM's layout failed), else it is nil. `erlang_stacks` counts the
  interned stacks that carry Erlang frames.

  `node:` reads another node's figures (`timeout:` as for the queries).

  The answer is a `Mtrace.Stats` struct: a map of these fields for programs,
  shown grouped and humanized in IEx.

      iex> %{live_count: n, enabled: true, active: true, config_errors: []} =
      ...>   Mtrace.stats()
      iex> is_integer(n)
      true
  """
  @spec stats([{:node, node()} | {:timeout, timeout()} | {:heap, boolean()}]) ::
          Mtrace.Stats.t()
  def stats(opts \\ []) do
    o = Options.parse_remote!(opts, "stats/1", [:heap])

    heap = Map.get(o, :heap, true)

    o
    |> remote(:stats, [drop_node(opts)], fn ->
      stats =
        if heap,
          do: call(&Native.stats/0),
          else: call(fn -> Native.stats(false) end)

      typos = Mtrace.Stats.misspelled(System.get_env())
      stats = Map.update(stats, :config_errors, typos, &(&1 ++ typos))
      Mtrace.Stats.new(Map.merge(stats, %{now_ms: call(&Native.now_ms/0), heap: heap}))
    end)
    |> Mtrace.Stats.from_node(heap)
  end

  @doc """
  Forgets every recorded allocation and returns how many were forgotten.

  Later frees of forgotten blocks are harmless. Useful to drop what the node
  allocated while booting; `olds/2` then shows only what came after.

      iex> is_integer(Mtrace.reset())
      true
  """
  @spec reset() :: non_neg_integer()
  def reset, do: call(&Native.reset/0)

  @doc """
  Stops recording new allocations (frees are still honoured, so nothing
  recorded goes stale). Returns `:ok`. While blocks recorded before are in
  the table, each free still asks it about its block; when the table is
  empty as tracking goes off, or once `reset/0` empties it, calls go
  straight to libc. Switching off lossless tracking first rebuilds the
  table's filter, which lossless recording leaves alone: about 9 ms per
  million recorded blocks, on a dirty scheduler, holding one shard's lock
  at a time.

      iex> Mtrace.disable()
      :ok
      iex> Mtrace.enable()
      :ok
  """
  @spec disable() :: :ok
  def disable, do: call(fn -> Native.set_enabled(false) end)

  @doc """
  Starts recording new allocations again (also undoes `MTRACE_ENABLED=0`).
  In a program the tracer does not trace (`MTRACE_PROGRAMS` leaves it out),
  nothing can be recorded: raises `Mtrace.Error` with reason `:not_traced`
  and the setting to use, as the queries do.

      iex> Mtrace.enable()
      :ok
  """
  @spec enable() :: :ok
  def enable do
    :ok = call(fn -> Native.set_enabled(true) end)
    Query.ensure_traced!()
  end

  defp call(fun), do: Query.native!(fun)

  # The length of a proper list, nil for an improper one.
  defp proper_length(list, n \\ 0)
  defp proper_length([], n), do: n
  defp proper_length([_ | rest], n), do: proper_length(rest, n + 1)
  defp proper_length(_, _n), do: nil

  # Runs locally, or the same public function on option :node's node.
  defp remote(o, fun, args, local) do
    case Options.target(o) do
      target when target == node() -> local.()
      target -> Remote.call(target, __MODULE__, fun, args, Map.get(o, :timeout, @remote_timeout))
    end
  end

  defp drop_node(opts), do: Keyword.drop(opts, [:node, :timeout])

  # window: ms takes a mark where the table is, waits, and queries since it;
  # sort: :growth needs a mark to measure growth from.
  # say: what to print (a line of Format.waiting/3) once the window starts.
  defp after_window(o, opts, where, say \\ fn _ms -> nil end)

  defp after_window(%{window: ms} = o, opts, where, say) when is_integer(ms) do
    if o[:since],
      do: raise(ArgumentError, "Mtrace.#{where}: give either :since or :window, not both")

    remote_opts = Keyword.take(opts, [:node, :timeout])

    # nothing allocated in the window could be recorded: said now, not after it
    target = Options.target(o)
    Remote.call(target, Query, :ensure_traced!, [], Map.get(o, :timeout, @remote_timeout))

    if stats([heap: false] ++ remote_opts).enabled == false,
      do: raise(Mtrace.Error.tracking_off(where, target))

    mark = mark(remote_opts)
    if line = say.(ms), do: IO.puts(line)
    Process.sleep(ms)
    opts = opts |> Keyword.delete(:window) |> Keyword.put(:since, mark)
    {o |> Map.put(:since, mark) |> Map.put(:window, nil), opts}
  end

  defp after_window(%{sort: :growth} = o, _opts, where, _say) when not is_map_key(o, :since) do
    raise ArgumentError,
          "Mtrace.#{where}: sort: :growth measures growth since a mark: give since: Mtrace.mark() " <>
            "or window: ms"
  end

  defp after_window(o, opts, _where, _say), do: {o, opts}

  # What an output that waits out a window says first, so that a shell that
  # prints nothing for a minute does not look hung.
  defp recording(o, then) do
    fn ms ->
      if ms >= 1000 do
        "Recording what #{Options.target(o)} allocates for " <>
          "#{Mtrace.VM.Format.duration_ms(ms)}; #{then}."
      end
    end
  end

  # The data of an output, taken where the table is; render-only options
  # stay here.
  defp snapshot(o, opts, render_keys) do
    # Outputs are read by people: C++ names demangled unless asked otherwise;
    # the function's own defaults (report's limit of 10) apply there too.
    query =
      opts
      |> drop_node()
      |> Keyword.drop(render_keys)
      |> Keyword.put_new(:demangle, true)
      |> Keyword.put_new(:limit, o.limit)
      |> Keyword.put_new(:sort, o.sort)

    Remote.call(
      Options.target(o),
      Query,
      :snapshot,
      [query],
      Map.get(o, :timeout, @remote_timeout)
    )
  end

  # Under sampling, drawings weigh each site by its estimates, not by the
  # samples (which over-represent large blocks).
  defp estimated(%{stats: %{sampled: true}, sites: sites}) do
    Enum.map(
      sites,
      &Map.put(%{&1 | bytes: &1.est_bytes, count: &1.est_count}, :samples, &1.count)
    )
  end

  defp estimated(snap), do: snap.sites

  # What every matching site holds, in the figures the sites are drawn in.
  defp matched(%{stats: %{sampled: true}, total: %{est_bytes: b, est_count: c, count: n}}),
    do: %{bytes: b, count: c, samples: n}

  defp matched(%{total: %{bytes: b, count: c}}), do: %{bytes: b, count: c}
  defp matched(_snap), do: nil

  defp count!(n, _where) when n <= 0xFFFF_FFFF_FFFF_FFFF, do: n

  defp count!(n, where) do
    raise ArgumentError, "Mtrace.#{where}: n must be at most 2^64 - 1, got: #{inspect(n)}"
  end

  # A path as Path.t() has it: a string, or chardata (an Erlang caller's
  # charlist, "/tmp/native.svg" in an Erlang shell).
  defp path!(path, where) when is_list(path) do
    string =
      try do
        IO.chardata_to_string(path)
      rescue
        _ in [ArgumentError, UnicodeConversionError] -> nil
      end

    if string, do: path!(string, where), else: path!(nil, where, path)
  end

  defp path!(path, where) when is_binary(path) and path != "" do
    if String.contains?(path, <<0>>),
      do:
        raise(
          ArgumentError,
          "Mtrace.#{where}: path must not contain NUL bytes, got: #{inspect(path)}"
        )

    path
  end

  defp path!(path, where), do: path!(nil, where, path)

  defp path!(nil, where, given) do
    raise ArgumentError,
          "Mtrace.#{where}: path must be a non-empty string or charlist, got: #{inspect(given)}"
  end

  # mtrace writes files only where the caller said.
  defp write!(path, data), do: File.write!(path, data)

  # Before a window, the mistakes File.write! would only report after it
  # (no such directory, a directory where the file should be, no right to
  # write there, a read-only file system). A regular file is opened for
  # appending, which changes nothing in it; a new one is made (never through
  # a symbolic link) and taken away again. A link, a pipe or a device is
  # opened once only, when written: a reader at a pipe's other end would
  # take a first open and close for the end of the file.
  defp writable!(path) do
    case File.lstat(path) do
      {:ok, %{type: :directory}} -> cannot_write!(path, :eisdir)
      {:ok, %{type: :regular}} -> try_open!(path, [:append], false)
      {:ok, _link_pipe_or_device} -> if File.dir?(path), do: cannot_write!(path, :eisdir)
      {:error, :enoent} -> try_open!(path, [:write, :exclusive], true)
      {:error, reason} -> cannot_write!(path, reason)
    end
  end

  defp try_open!(path, modes, made?) do
    case File.open(path, modes) do
      {:ok, io} ->
        File.close(io)
        if made?, do: File.rm(path)
        :ok

      {:error, reason} ->
        cannot_write!(path, reason)
    end
  end

  defp cannot_write!(path, reason),
    do: raise(File.Error, reason: reason, action: "write to file", path: path)
end

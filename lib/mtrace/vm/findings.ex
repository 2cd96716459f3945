defmodule Mtrace.VM.Findings do
  @moduledoc """
  Turns samples into scored findings and a verdict: the scoring every check
  shares, how growth across a window is measured, and the checks that look
  at processes (mailbox build-up, process leaks, monitor leaks). The checks
  that look at where memory sits are in `Mtrace.VM.MemoryChecks`.

  ## Scores

  Every check measures something against its threshold and scores the ratio
  the same way: 50 at the threshold, proportionally less below it, and 50
  more each time the measure doubles above it (`50 + 50 * log2(ratio)`). A
  finding scoring 50 or more is a problem; the verdict is the kind of the
  first problem in the order below (highest score first, except that with
  a window what held still comes after what grew). Findings scoring under 20 are not reported. When a
  window was sampled, growth is scored alongside size and the larger score
  counts; growth of less than a minimum over the whole window (1_000
  messages, processes or monitors; 8 MiB of memory) is ignored as noise.

  ## Thresholds

  `Mtrace.VM.Thresholds` lists them all with their defaults; option
  `thresholds:` of `Mtrace.VM.diagnose/1` overrides any of them. What
  each kind of finding measures against them, by size and, when a window
  was sampled, by growth:

  * `:mailbox_buildup` — size: a process with `mailbox_len` messages
    waiting; growth over a window: one mailbox growing by
    `mailbox_growth` messages/s;
  * `:port_queue` — size: one port with `port_queue` bytes queued to be
    written (`Mtrace.VM.PortChecks`), or all ports together with
    `port_queue_all`; growth over a window: their queues growing by
    `port_queue_growth`/s together;
  * `:process_leak` — size: processes at `process_share` of the limit,
    or `idle_group`+ idle processes (waiting, mailbox empty) sharing
    what they were started as (proc_lib's record for a GenServer, an
    Agent, a Task) and current function and making up `idle_share` of
    all processes; growth over a window: the process count growing by
    `process_growth`/s;
  * `:monitor_leak` — size: a process holding `monitors` monitors;
    growth over a window: one process gaining `monitor_growth`
    monitors/s;
  * `:process_memory` — size: one process holding `process_memory`
    (its heap and mailbox: what it keeps), or `process_memory_min`+ that
    is `process_memory_share` of the VM's memory; growth over a window:
    one process growing by `process_memory_growth`/s (processes under 1
    MiB are not followed: one that grew past it counts from 1 MiB); when
    it scores higher than the largest, the largest is still named after
    it if its size alone is a problem; a process whose memory is mostly
    messages waiting is said to be, and with 1_000 or more waiting its
    next step is no `:sys` call (which would wait behind them all);
  * `:limit_near` — size: atoms, ports or open file descriptors (the
    OS's soft `RLIMIT_NOFILE`, where `/proc` tells it; else not judged)
    at `limit_share` of their limit (at the limit the VM stops, or
    refuses new ports, sockets and files; atoms are never freed); growth over a window: at the rate they grew (by at
    least `limit_growth_min` over the window, or 5% of the limit if that
    is less), the limit reached within
    `limit_time` seconds (scoring 50 then, 100 within half that or less,
    as a count at its limit does), said with the rate and the time left;
  * `:ets_growth` — size: a table holding `ets_bytes`, or
    `ets_share_min`+ that is `ets_share` of the VM's memory, counting
    the binaries it references (estimated from 64 objects of each of
    the 3 largest tables, and when binaries are `binary_gc_share` of
    the VM's memory from 8 of each of the next 256 too: a small table
    can keep large binaries); growth over a window: a table growing by
    `ets_growth`/s, with its binaries (estimated in proportion to its own
    memory's growth);
  * `:persistent_term` — size: terms in `persistent_term` holding
    `persistent_term_bytes`, or `persistent_term_share_min`+ that is
    `persistent_term_share` of the VM's memory; growth over a window:
    growing by `persistent_term_growth`/s;
  * `:binary_leak` — size: a forced GC freeing `binary_freed` of
    binaries, or `binary_freed_share` of the VM's memory if larger
    (without the GC, binaries holding half of the VM's memory score at
    most 45);
  * `:binary_held` — size, after the forced GC: one process still
    referencing binaries as `:process_memory` judges a heap, or binaries
    left at `binary_gc_share` of the VM's memory (and `binary_gc_min`),
    whoever holds them (at most 45): held, not leaked, but named;
  * `:native_leak` — size: `native_bytes` (or the VM's own memory if
    larger) of native memory, or `native_vm_min`+ that is
    `native_vm_ratio` times what the VM accounts for: the tracer's live
    malloc bytes, or RSS outside the ERTS allocators when it is not
    preloaded or tracking is switched off; growth over a window: native memory growing *steadily* by
    `native_growth`/s: sampled `window_steps` times across the window,
    it went up in at least `native_steady` of the steps (RSS, by at
    least `native_rss_growth_min` over the window as well);
  * `:native_heap` — size: with a window, the same sizes when native
    memory did not grow steadily: large, but not leaking while it was
    watched;
  * `:nif_alloc_leak` — size: one NIF module holding `nif_bytes` in the
    VM's allocators (enif_alloc, resources, binaries:
    `Mtrace.VM.nif_memory/1`), or `nif_share_min`+ that is `nif_share`
    of the VM's memory (after a forced GC, its resources and binaries
    count for at most what processes and ETS tables holding binaries do
    not explain: `Mtrace.VM.MemoryChecks.nif/5`); growth over a window:
    that memory growing by `nif_growth`/s;
  * `:fragmentation` — size: an allocator type used below `frag_usage`,
    wasting `frag_wasted`.

  Growth below a minimum over the whole window (`*_growth_min`) is ignored
  as noise; native growth is judged by its steadiness instead, so that a
  node that churns, or takes a working set and gives it back, stays
  healthy while a slow steady leak does not.

  When scores tie, the more specific cause wins: a stuck mailbox or a
  process leak inflates memory everywhere else as a consequence. With a
  window, memory that held still while watched (`:native_heap`, a NIF
  module's memory not growing steadily) ranks after the problems that
  grew, whatever its score: the verdict names what leaks, not what is
  merely large.

  ## Growth

  How a figure moved across a window is measured from samples taken at
  even steps (`growth/2`): its rate, and how steadily it grew (the share of
  steps in which it went up). A leak grows in almost every step; churn and
  a working set taken and given back go up and down, and score low on
  steadiness whatever their net change.
  """

  alias Mtrace.VM.{Diagnose, Format, MemoryChecks, PortChecks, Procs, Thresholds}

  @typedoc "One finding of `Mtrace.VM.diagnose/1`."
  @type finding :: %{
          kind: atom,
          score: float,
          summary: String.t(),
          evidence: term,
          next: String.t()
        }

  @typedoc "`from`/`to` are the first and last samples; `per_s` the rate between them."
  @type growth :: %{
          from: number,
          to: number,
          per_s: float,
          ups: non_neg_integer,
          steps: pos_integer,
          steadiness: float
        }

  @problem 50.0
  @listed 20.0
  @priority [
    :mailbox_buildup,
    :port_queue,
    :process_leak,
    :monitor_leak,
    :process_memory,
    :limit_near,
    :binary_leak,
    :binary_held,
    :ets_growth,
    :persistent_term,
    :nif_alloc_leak,
    :native_leak,
    :native_heap,
    :fragmentation
  ]

  @doc """
  All findings for sample `snap` (and `prev`, the sample a window earlier, or
  `nil`), problems first (highest score first, what a window saw hold still
  after what grew), then the leads below 50. `extra` carries what is measured once, after
  sampling: `:bin_leak` (a `Mtrace.VM.bin_leak/1` result or `nil`),
  `:preloaded` and `:sites`, and optionally `:thresholds`,
  `:native_series`, `:limit` and `:nif` (see `Mtrace.VM.MemoryChecks.run/4`).

  ## Example

      snap = Mtrace.VM.Diagnose.snapshot()
      Mtrace.VM.Findings.judge(nil, snap, %{bin_leak: nil, preloaded: false, sites: []})
      #=> []
  """
  @spec judge(Diagnose.snapshot() | nil, Diagnose.snapshot(), map) :: [finding]
  def judge(prev, snap, extra) do
    secs = if prev, do: max(snap.at_ms - prev.at_ms, 1) / 1000

    thresholds = Map.get(extra, :thresholds, Thresholds.defaults())

    (process_checks(prev, snap, secs, thresholds) ++
       [PortChecks.queue(prev, snap, secs, thresholds)] ++
       MemoryChecks.run(prev, snap, secs, extra))
    |> Enum.reject(&is_nil/1)
    |> Enum.filter(&(&1.score >= @listed))
    |> Enum.sort_by(&{tier(&1), -&1.score, Enum.find_index(@priority, fn k -> k == &1.kind end)})
  end

  # Problems first, then what a window saw hold still (large, but not what
  # grows: a native heap, a NIF module's memory not growing steadily), then
  # the leads below a problem's score.
  defp tier(%{score: score}) when score < @problem, do: 2
  defp tier(%{kind: :native_heap}), do: 1
  defp tier(%{kind: :nif_alloc_leak, evidence: %{growth_per_s: per_s}}) when per_s == 0, do: 1
  defp tier(_finding), do: 0

  @doc """
  The kind of the first finding (as `judge/3` orders them) at or above 50, else
  `:healthy`.

  ## Example

      iex> Mtrace.VM.Findings.verdict([%{kind: :ets_growth, score: 63.0}])
      :ets_growth
      iex> Mtrace.VM.Findings.verdict([%{kind: :ets_growth, score: 30.0}])
      :healthy
  """
  @spec verdict([finding]) :: atom
  def verdict(findings) do
    case findings do
      [%{kind: kind, score: score} | _] when score >= @problem -> kind
      _ -> :healthy
    end
  end

  @doc """
  The score for a measure at `ratio` times its threshold.

  ## Examples

      iex> Mtrace.VM.Findings.score(1)
      50.0
      iex> Mtrace.VM.Findings.score(4)
      150.0
      iex> Mtrace.VM.Findings.score(0.5)
      25.0
  """
  @spec score(number) :: float
  def score(ratio) when ratio <= 0, do: 0.0
  def score(ratio) when ratio <= 1, do: Float.round(50.0 * ratio, 1)
  def score(ratio), do: Float.round(50.0 + 50.0 * :math.log2(ratio), 1)

  @doc """
  Builds a finding scored from `ratio`.

  ## Example

      iex> Mtrace.VM.Findings.finding(:ets_growth, 2, "big", %{}, "Mtrace.VM.ets_top(5)").score
      100.0
  """
  @spec finding(atom, number, String.t(), term, String.t()) :: finding
  def finding(kind, ratio, summary, evidence, next) do
    %{kind: kind, score: score(ratio), summary: summary, evidence: evidence, next: next}
  end

  @doc """
  An ETS table's owner as findings name a process (its registered name,
  else where it waits and how it started) and the call that shows what it
  runs, to follow a finding's summary and its next step: `{"", ""}` for no
  owner.

  ## Example

      iex> {", owned by " <> _, "; Process.info(pid(" <> _} = Mtrace.VM.Findings.table_owner(self())
      iex> Mtrace.VM.Findings.table_owner(nil)
      {"", ""}
  """
  @spec table_owner(pid | nil) :: {String.t(), String.t()}
  def table_owner(pid) when is_pid(pid) do
    {", owned by #{Format.process(pid, Procs.info(pid))},",
     "; Process.info(#{Format.pid_expr(pid)}, [:current_stacktrace, :dictionary]) " <>
       "shows what its owner runs and who started it"}
  end

  def table_owner(_pid), do: {"", ""}

  @doc """
  A rate per second over a window of `secs` seconds, or `nil` without one.

  ## Example

      iex> Mtrace.VM.Findings.rate(500, 2.0)
      250.0
  """
  @spec rate(number, number | nil) :: float | nil
  def rate(_delta, nil), do: nil
  def rate(delta, secs), do: delta / secs

  @doc """
  How far growth of `delta` over `secs` seconds goes past `per_s` per second,
  as a ratio; 0 without a window or when `delta` is under `min`, so that a
  short window's noise (a module loaded, a burst of messages) is not taken
  for a trend.

  ## Examples

      iex> Mtrace.VM.Findings.growth_ratio(2_000, 2.0, 500, 1_000)
      2.0
      iex> Mtrace.VM.Findings.growth_ratio(900, 0.5, 500, 1_000)
      0
  """
  @spec growth_ratio(number | nil, number | nil, number, number) :: number
  def growth_ratio(delta, secs, per_s, min)
      when is_number(delta) and is_number(secs) and delta >= min,
      do: ratio(delta / secs, per_s)

  def growth_ratio(_delta, _secs, _per_s, _min), do: 0

  @doc """
  `value / threshold`, or 0 when either is missing.

  ## Example

      iex> Mtrace.VM.Findings.ratio(nil, 10)
      0
  """
  @spec ratio(number | nil, number) :: number
  def ratio(value, threshold) when is_number(value) and threshold > 0, do: value / threshold
  def ratio(_, _), do: 0

  @doc """
  The growth of `samples` (oldest first, taken evenly over `secs` seconds),
  or `nil` without at least two samples and a window.

  ## Examples

      iex> g = Mtrace.VM.Findings.growth([0, 100, 200, 300, 400, 500], 5.0)
      iex> {g.per_s, g.ups, g.steps, g.steadiness}
      {100.0, 5, 5, 1.0}
      iex> Mtrace.VM.Findings.growth([0, 900, 0, 900, 0, 900], 5.0).steadiness
      0.6
      iex> Mtrace.VM.Findings.growth([5], 5.0)
      nil
  """
  @spec growth([number] | nil, number | nil) :: growth | nil
  def growth(samples, secs)
      when is_list(samples) and length(samples) >= 2 and is_number(secs) and secs > 0 do
    if Enum.all?(samples, &is_number/1) do
      steps = length(samples) - 1
      ups = samples |> Enum.chunk_every(2, 1, :discard) |> Enum.count(fn [a, b] -> b > a end)
      from = hd(samples)
      to = List.last(samples)

      %{
        from: from,
        to: to,
        per_s: (to - from) / secs,
        ups: ups,
        steps: steps,
        steadiness: ups / steps
      }
    end
  end

  def growth(_samples, _secs), do: nil

  @doc """
  A `growth/2` in words.

  ## Example

      iex> Mtrace.VM.Findings.growth([0, 100, 200, 300, 400, 500], 5.0)
      ...> |> Mtrace.VM.Findings.describe_growth()
      "grew by 100 B/s (351.6 KiB/h), up in 5 of 5 steps"
      iex> Mtrace.VM.Findings.describe_growth(%{per_s: -2048, ups: 0, steps: 5})
      "shrank by 2.0 KiB/s, up in 0 of 5 steps"
  """
  @spec describe_growth(growth) :: String.t()
  # "grew by +2.0 KiB/s" or "shrank by -2.0 KiB/s" would say it twice; a
  # shrinking figure is not projected over an hour (it cannot lose more
  # than it holds)
  def describe_growth(%{per_s: per_s, ups: ups, steps: steps}) when per_s >= 0,
    do:
      "grew by #{Format.bytes(per_s)}/s (#{Format.bytes(per_s * 3600)}/h), " <>
        "up in #{ups} of #{steps} steps"

  def describe_growth(%{per_s: per_s, ups: ups, steps: steps}),
    do: "shrank by #{Format.bytes(-per_s)}/s, up in #{ups} of #{steps} steps"

  @doc """
  Seconds until the figure has grown by `room` more at this rate, `0` when
  there is no room left, `nil` when it is not growing.

  ## Example

      iex> Mtrace.VM.Findings.time_to(%{per_s: 100.0}, 3600 * 100)
      3600
  """
  @spec time_to(%{per_s: number}, number) :: non_neg_integer | nil
  def time_to(%{per_s: per_s}, _room) when per_s <= 0, do: nil
  def time_to(_growth, room) when room <= 0, do: 0
  def time_to(%{per_s: per_s}, room), do: round(room / per_s)

  @doc """
  Runs the checks that look at processes: mailbox build-up, process leaks,
  monitor leaks, the process holding the most memory, and the counts of
  atoms and ports against their limits (`nil` where there is nothing to
  report); `secs` is the window length, or `nil` without one.

  ## Example

      snap = Mtrace.VM.Diagnose.snapshot()
      [_mailbox, _processes, _monitors, _memory, _limits] =
        Mtrace.VM.Findings.process_checks(nil, snap, nil)
  """
  @spec process_checks(
          Diagnose.snapshot() | nil,
          Diagnose.snapshot(),
          number | nil,
          Thresholds.t()
        ) :: [finding | nil]
  def process_checks(prev, snap, secs, t \\ Thresholds.defaults()) do
    [
      mailbox(snap, secs, t),
      processes(prev, snap, secs, t),
      monitors(snap, secs, t),
      process_memory(snap, secs, t),
      limits(prev, snap, secs, t)
    ]
  end

  # The process holding the most memory, against the VM's: a cache or a
  # state that only grows shows here (the seeds' proc_count(memory)); with
  # a window, the fastest-growing one when its growth scores higher.
  defp process_memory(snap, secs, t) do
    total = snap.memory[:total] || 0

    size = fn {pid, bytes} ->
      share =
        if pid && bytes >= t.process_memory_min and total > 0,
          do: ratio(bytes / total, t.process_memory_share),
          else: 0

      max(ratio(bytes, t.process_memory), share)
    end

    largest = first(snap.procs.memory_top)
    {gpid, delta} = first(Map.get(snap.procs, :memory_growth, []))

    growth = growth_ratio(delta, secs, t.process_memory_growth, t.process_memory_growth_min)

    # what the growing one held when sampled (a snapshot remembers memory
    # for every process it ranks by growth)
    {pid, bytes, score, per_s} =
      if gpid && growth > size.(largest) do
        bytes = Map.get(Map.get(snap.procs, :memory, %{}), gpid, 0)
        {gpid, bytes, max(growth, size.({gpid, bytes})), rate(delta, secs)}
      else
        {pid, bytes} = largest
        {pid, bytes, size.(largest), nil}
      end

    if pid do
      of = if total > 0, do: " (#{Format.percent(bytes, total)} of the VM's memory)", else: ""

      grew =
        if per_s && per_s > 0,
          do: ", growing by #{Format.bytes(per_s)}/s",
          else: ""

      # A process that grew is named first; one holding enough to be a
      # problem on its own is not left unsaid for it.
      {lpid, lbytes} = largest

      also =
        if lpid && lpid != pid && size.(largest) >= 1,
          do:
            "; #{Format.process(lpid, Procs.info(lpid))} holds the most, " <>
              "#{Format.bytes(lbytes)}" <>
              if(total > 0, do: " (#{Format.percent(lbytes, total)})", else: ""),
          else: ""

      queue = message_queue(pid)

      finding(
        :process_memory,
        score,
        "#{Format.process(pid, Procs.info(pid))} holds #{Format.bytes(bytes)}" <>
          of <> queue_text(queue) <> grew <> also,
        %{
          pid: pid,
          memory: bytes,
          vm_total: total,
          growth_per_s: per_s,
          largest: if(also != "", do: largest),
          message_queue: queue
        },
        process_memory_next(pid, queue)
      )
    end
  end

  # Messages waiting from which a :sys call (it waits behind them all) is
  # no longer the way to look at a process.
  @long_queue 1_000

  # The messages waiting in a process and about the bytes they take, or
  # nil for none: its memory less its heap proper. Messages that arrive
  # (on_heap, the default) sit in heap fragments until it receives them
  # or collects, and off_heap outside its heap; each has an entry of its
  # own in the queue; a process's own structure, a few KiB, is counted in.
  defp message_queue(pid) do
    items = [:message_queue_len, :memory, :total_heap_size, :garbage_collection_info]

    case :erlang.process_info(pid, items) do
      [message_queue_len: len, memory: memory, total_heap_size: heap, garbage_collection_info: gc]
      when len > 0 ->
        heap = heap - Keyword.get(gc, :mbuf_size, 0)
        %{len: len, bytes: max(memory - heap * :erlang.system_info(:wordsize), 0), memory: memory}

      _ ->
        nil
    end
  end

  defp queue_text(%{len: len, bytes: bytes, memory: memory}) when bytes * 2 >= memory,
    do:
      ", mostly its message queue: #{Format.count(len, "message")} waiting in about " <>
        Format.bytes(bytes)

  defp queue_text(%{len: len}) when len >= @long_queue,
    do: ", #{Format.count(len, "message")} waiting"

  defp queue_text(_queue), do: ""

  defp process_memory_next(pid, %{len: len}) when len >= @long_queue,
    do:
      "Process.info(#{Format.pid_expr(pid)}, [:current_stacktrace, :status]) shows why it " <>
        "does not take its messages (a :sys call would wait behind all #{Format.int(len)})"

  defp process_memory_next(pid, _queue),
    do:
      ":sys.get_state(#{Format.pid_expr(pid)}) shows what a GenServer or an Agent keeps; " <>
        "Process.info(#{Format.pid_expr(pid)}, [:current_stacktrace, :message_queue_len, " <>
        ":total_heap_size]) what any process is doing"

  @ports_held "Port.list() |> Enum.map(&Port.info(&1, :connected)) |> Enum.frequencies() " <>
                "shows which processes hold the ports (files, sockets) left open"

  # What to look at when a count nears its limit.
  @limit_next %{
    atoms:
      "atoms are never freed: look for String.to_atom/1, :erlang.list_to_atom/1 or " <>
        ":erlang.binary_to_term/1 on outside data (use String.to_existing_atom/1, " <>
        "binary_to_term(bin, [:safe]))",
    ports: @ports_held,
    fds:
      @ports_held <>
        "; NIFs and drivers open descriptors of their own; raise the limit with " <>
        "ulimit -n before starting the node"
  }

  # Atoms, ports and (where /proc tells them) open file descriptors against
  # the OS's limit: the one scoring highest, by how near its limit it is,
  # and with a window by how soon it would reach it at the rate it grew
  # (processes have their own check, with idle groups and growth; ETS
  # tables are limited only by memory since OTP 20, whatever ets_limit
  # says).
  defp limits(prev, snap, secs, t) do
    scored =
      for key <- [:atoms, :ports, :fds],
          {count, limit} <- [Map.get(snap.counts, key)],
          is_integer(count) and is_integer(limit) and limit > 0 do
        before = prev && Map.get(prev.counts, key)
        delta = if match?({n, _} when is_integer(n), before), do: count - elem(before, 0)
        # a limit of 1_024 descriptors grows by less than 1_000 in a window
        floor = min(t.limit_growth_min, div(limit, 20))
        per_s = if delta && secs && delta >= max(floor, 1), do: rate(delta, secs)
        eta = per_s && time_to(%{per_s: per_s}, limit - count)
        # Reaching the limit at this rate is no more urgent than being at
        # it: scored up to 100, as a count at its limit is.
        growth = if eta, do: min(ratio(t.limit_time, max(eta, 1)), 2), else: 0
        {key, count, limit, per_s, eta, max(ratio(count / limit, t.limit_share), growth)}
      end

    case Enum.max_by(scored, fn {_k, c, l, _, _, r} -> {r, c / l} end, fn -> nil end) do
      {key, count, limit, per_s, eta, score} ->
        finding(
          :limit_near,
          score,
          "#{key} at #{Format.int(count)} of a limit of #{Format.int(limit)} " <>
            "(#{Format.percent(count, limit)})" <> limit_growth_text(key, per_s, eta),
          %{what: key, count: count, limit: limit, growth_per_s: per_s, seconds_to_limit: eta},
          Map.fetch!(@limit_next, key)
        )

      nil ->
        nil
    end
  end

  defp limit_growth_text(key, per_s, eta) when is_number(per_s) and is_integer(eta),
    do:
      ", growing by #{count_rate(per_s, key)}: at this rate " <>
        "the limit is reached in #{Format.age(eta)}"

  defp limit_growth_text(_key, _per_s, _eta), do: ""

  defp mailbox(snap, secs, t) do
    {pid, score, _per_s, own_per_s} =
      leader(snap.procs.mql_top, snap.procs.mql_growth, secs, t.mailbox_len,
        growth: t.mailbox_growth,
        min: t.mailbox_growth_min
      )

    if pid do
      info = Procs.info(pid)
      len = Map.get(snap.procs.mql, pid, 0)

      finding(
        :mailbox_buildup,
        score,
        "#{Format.process(pid, info)} has #{Format.int(len)} messages waiting" <>
          growth_text(own_per_s, "messages"),
        %{
          pid: pid,
          message_queue_len: len,
          # its own rate, not the fastest-growing process's
          growth_per_s: own_per_s,
          info: info,
          top: snap.procs.mql_top
        },
        "Process.info(#{Format.pid_expr(pid)}, [:current_stacktrace, :status]) shows " <>
          "why it is not receiving; Mtrace.VM.top(:message_queue_len, 5) lists the others"
      )
    end
  end

  defp processes(prev, snap, secs, t) do
    {count, limit} = snap.counts.processes
    group = snap.procs.idle_groups
    delta = prev && count - elem(prev.counts.processes, 0)
    per_s = delta && rate(delta, secs)
    share = ratio(count / limit, t.process_share)

    grouped =
      if group,
        do: min(ratio(group.count, t.idle_group), ratio(group.count / count, t.idle_share)),
        else: 0

    growth = growth_ratio(delta, secs, t.process_growth, t.process_growth_min)

    # The idle group is named whenever there is one: first when it scores
    # highest, else after the count and its growth.
    summary =
      cond do
        group == nil ->
          "#{Format.int(count)} processes of a limit of #{Format.int(limit)}" <>
            growth_text(per_s, "processes")

        grouped >= max(share, growth) ->
          "#{Format.int(group.count)} of #{Format.int(count)} processes are idle in " <>
            "#{idle_as(group)}" <> growth_text(per_s, "processes")

        true ->
          "#{Format.int(count)} processes of a limit of #{Format.int(limit)}" <>
            growth_text(per_s, "processes") <>
            "; #{Format.int(group.count)} of them are idle in #{idle_as(group)}"
      end

    next =
      if group,
        do:
          "Process.info(#{Format.pid_expr(group.sample)}, [:current_stacktrace, :parent, " <>
            ":dictionary]) shows one of the idle ones and who started it",
        else: "Mtrace.VM.top(:memory, 10)"

    finding(
      :process_leak,
      Enum.max([share, grouped, growth]),
      summary,
      %{processes: count, limit: limit, idle_group: group, growth_per_s: per_s},
      next
    )
  end

  defp idle_as(group),
    do: "#{Format.mfa(group.current_function)}, started as #{Format.mfa(group.started_as)}"

  defp monitors(snap, secs, t) do
    {pid, score, _per_s, own_per_s} =
      leader(snap.procs.monitors_top, snap.procs.monitors_growth, secs, t.monitors,
        growth: t.monitor_growth,
        min: t.monitor_growth_min
      )

    if pid do
      n = Map.get(snap.procs.monitors, pid, 0)
      targets = monitor_targets(pid)

      finding(
        :monitor_leak,
        score,
        "#{Format.process(pid, Procs.info(pid))} holds #{Format.int(n)} monitors" <>
          growth_text(own_per_s, "monitors"),
        %{pid: pid, monitors: n, growth_per_s: own_per_s, targets: targets},
        "Process.info(#{Format.pid_expr(pid)}, :monitors); look for Process.monitor/1 " <>
          "calls in its code that are never matched by a demonitor or a :DOWN"
      )
    end
  end

  # The processes or ports monitored most often by one process: a leak
  # usually monitors the same few targets over and over, or a stream of new ones.
  defp monitor_targets(pid) do
    case :erlang.process_info(pid, :monitors) do
      {:monitors, list} ->
        list
        |> Enum.frequencies_by(&elem(&1, 1))
        |> Enum.sort_by(fn {_, times} -> -times end)
        |> Enum.take(3)

      _ ->
        []
    end
  end

  # The process to report for a per-process measure: the largest one, or the
  # fastest-growing one when its growth scores higher. Returns {pid, score,
  # growth_per_s, growth_per_s when it is that process's own (else nil)}.
  defp leader(top, growth_top, secs, size_limit, growth: growth_limit, min: growth_min) do
    {pid, value} = first(top)
    {gpid, delta} = first(growth_top)
    per_s = rate(delta, secs)
    size = ratio(value, size_limit)
    growth = growth_ratio(delta, secs, growth_limit, growth_min)
    pid = if growth > size, do: gpid, else: pid
    {pid, max(size, growth), per_s, if(per_s && gpid == pid, do: per_s)}
  end

  defp first([head | _]), do: head
  defp first([]), do: {nil, 0}

  defp growth_text(per_s, what) when is_number(per_s) and per_s > 0,
    do: ", growing by #{count_rate(per_s, what)}"

  defp growth_text(_, _), do: ""

  @doc """
  A count's rate of growth in words: per second, or per minute or hour when
  less than one a second would read "0 ... /s".

  ## Examples

      iex> Mtrace.VM.Findings.count_rate(451.4, "processes")
      "451 processes/s"
      iex> Mtrace.VM.Findings.count_rate(0.43, :fds)
      "26 fds/min"
      iex> Mtrace.VM.Findings.count_rate(0.001, "monitors")
      "4 monitors/h"
  """
  @spec count_rate(number, atom | String.t()) :: String.t()
  def count_rate(per_s, what) when per_s >= 0.5, do: "#{Format.int(round(per_s))} #{what}/s"

  def count_rate(per_s, what) when per_s * 60 >= 0.5,
    do: "#{Format.int(round(per_s * 60))} #{what}/min"

  def count_rate(per_s, what), do: "#{Format.int(round(per_s * 3600))} #{what}/h"
end

defmodule Mtrace.VM do
  @moduledoc """
  Leak hunting inside the VM: where a node's memory sits, which processes,
  tables and allocators hold it, and a one-call diagnosis that names the
  likely kind of leak and the next call to make.

  It covers the classic BEAM leaks — refc binaries kept alive by processes
  that rarely collect, mailboxes nobody reads, ETS tables that only grow,
  processes spawned and never stopped, monitors never removed, fragmented
  allocators — and ties them to native memory: RSS that the ERTS allocators
  do not explain, and, when the `mtrace.so` malloc tracer is preloaded, the
  native heap itself (`Mtrace.stats/0`, `Mtrace.sites/1`).

  Memory NIFs hold in the VM's own allocators (`enif_alloc`, resources,
  binaries), which the malloc tracer cannot see, is named by NIF module and
  kind by `nif_memory/1`.

  Everything here uses only the Erlang/OTP standard library (`instrument`
  of `tools` for `nif_memory/1`), reads
  processes one at a time, and skips processes and tables that disappear
  while being read. Nothing here needs the native tracer: without it, native
  figures are `nil` and `diagnose/1` explains how to enable it.

  Start with:

      Mtrace.VM.diagnose()
      Mtrace.VM.diagnose(window: 60_000)   # judge growth over a minute as well

  ## Layout

  What is read: `Mtrace.VM.Memory` (memory, ERTS allocators, RSS, the
  memory limit), `Mtrace.VM.Procs` (processes, counts against limits, and
  the bounded rankings behind every top n), `Mtrace.VM.ETS` (tables),
  `Mtrace.VM.Ports` (what ports hold queued to write),
  `Mtrace.VM.Native` (the malloc tracer, and NIF memory in the VM's
  allocators). How it is judged: `Mtrace.VM.Diagnose` samples and runs a
  diagnosis, `Mtrace.VM.Findings` (scores, growth, process checks),
  `Mtrace.VM.MemoryChecks`, `Mtrace.VM.BinaryChecks` (refc binaries) and
  `Mtrace.VM.PortChecks` (ports' queues) turn samples into findings against
  `Mtrace.VM.Thresholds`, and `Mtrace.VM.Diagnosis` is the result and its
  report. `Mtrace.VM.Format` writes figures for people. Arguments and
  options are checked by `Mtrace.Options`, as for `Mtrace`'s queries.
  """

  alias Mtrace.Options
  alias Mtrace.VM.{Diagnose, ETS, Memory, Native, Ports, Procs}

  @typedoc "How a process is named in results: see `top/2`."
  @type proc_info :: Procs.info()

  @typedoc "A measure processes can be ranked by: see `top/2`."
  @type attr :: Procs.attr()

  @doc """
  Where the node's memory is, in bytes.

  Returns a map with:

    * the categories of `erlang:memory/0` (`:total`, `:processes`,
      `:processes_used`, `:system`, `:atom`, `:atom_used`, `:binary`, `:code`,
      `:ets`). When the allocators they are summed from are disabled (for
      instance with `+Mea min`) `erlang:memory/0` raises `notsup`; these
      values are then `nil`;
    * `:rss` and `:rss_peak`: resident set size now and at its peak (VmRSS,
      VmHWM from `/proc/self/status`; `nil` where there is no `/proc`);
    * `:allocated` and `:used`: what the ERTS allocators took from the OS as
      carriers and what they hand out as blocks, read in one snapshot so
      that `used <= allocated`. `allocated - used` is allocator overhead and
      fragmentation;
    * `:jit_code`: the RSS of the JIT's code, which it maps twice (writable
      and executable) from one shared memory file, so that RSS counts it
      twice: the pages of those mappings present (`Mtrace.VM.JitCode`), so
      that shared memory a NIF maps stays outside the VM; `nil` where there
      is no `/proc`;
    * `:outside_vm`: RSS not explained by the ERTS allocators nor the JIT's
      code (`rss - allocated - jit_code`, floored at 0): the emulator's own
      static data, and memory taken directly from malloc/mmap by NIFs,
      drivers and libraries. A large or growing value points at native code;
    * `:carrier_cache`: carriers the VM freed that its segment allocator
      keeps mapped for reuse for a few seconds (an upper bound of the RSS
      they hold, part of `:outside_vm`; `nil` without mseg_alloc). Right
      after a large process dies it can be most of `:outside_vm`;
    * `:native`: when the `mtrace.so` tracer is preloaded, its counters
      (`:live_count`, `:live_bytes`, `:dropped`, `:enabled`, `:reset_ms`, the
      table's time of the last `Mtrace.reset/0`; estimates when
      `:sampled` is true, see `MTRACE_SAMPLE_BYTES`) and the C heap's
      mallinfo2 figures (`:allocated_bytes`, `:used_bytes`, `:free_bytes`,
      `:mmap_bytes`); else `nil`.

  Cheap: a few system_info calls, one small file read and, with the
  tracer, its counters and glibc's `mallinfo2`, read on a dirty scheduler
  because it walks the heap's free chunks (tens of µs; 140 ms for a heap
  left with a million free chunks).

  ## Example

      iex> m = Mtrace.VM.memory()
      iex> m.used <= m.allocated
      true
  """
  @spec memory() :: Memory.t()
  def memory, do: Memory.read()

  @doc """
  The `n` processes with the largest `attr`, largest first, as
  `[{pid, value, info}]`.

  `attr` is one of:

    * `:memory` — bytes, as `Process.info(pid, :memory)`;
    * `:binary_memory` — bytes of refc binaries the process references,
      each binary counted once even if referenced several times;
    * `:message_queue_len` — messages waiting;
    * `:reductions` — work done since the process started;
    * `:total_heap_size`, `:heap_size` — in words, as `Process.info/2` reports;
    * `:monitors`, `:links` — how many the process holds.

  `info` is `[registered_name: name]` for a registered process, else
  `[current_function: mfa, initial_call: mfa]`, where `initial_call` is
  what a GenServer, Agent or Task was started as (proc_lib's record, not
  `:proc_lib.init_p/5`; before OTP 26.2 that record is read by copying the
  process's dictionary, which is not done for a heap over 64 MiB, so such
  a process reads `:proc_lib.init_p/5`). Processes where `attr` is 0 (an empty mailbox)
  and processes that exit during the scan are left out, so fewer than `n`
  entries may come back.

  Cost: one `Process.info/2` per process; only `n` results are kept while
  scanning, so memory use does not grow with the number of processes (beyond
  the list of pids). `:binary_memory` copies each process's binary list and
  is the slowest.

  ## Example

      Mtrace.VM.top(:message_queue_len, 3)
      #=> [{#PID<0.312.0>, 100_000,
      #=>   [current_function: {MyApp.Sink, :loop, 1},
      #=>    initial_call: {:erlang, :apply, 2}]},
      #=>  {#PID<0.45.0>, 2, [registered_name: :logger]}]
  """
  @spec top(attr, pos_integer) :: [{pid, non_neg_integer, proc_info}]
  def top(attr, n \\ 10) do
    Procs.top(attr!(attr, "VM.top/2"), Options.arg!(n, :pos_int, "n", "VM.top/2"))
  end

  @doc """
  Like `top/2`, ranked by how much `attr` changed over `ms` milliseconds.

  Samples every process, sleeps `ms`, samples again. Processes born in
  between count from 0; processes that died, and processes where `attr`
  did not change, are left out. Values can be negative when everything
  shrank.

  Cost: the first sample keeps one entry per process (with a non-zero
  value), and the caller blocks for `ms`.

  ## Example

      Mtrace.VM.window(:reductions, 3, 1_000)
      #=> [{#PID<0.250.0>, 4_000_000, [registered_name: :busy_worker]}, ...]
  """
  @spec window(attr, pos_integer, non_neg_integer) :: [{pid, integer, proc_info}]
  def window(attr, n, ms) do
    where = "VM.window/3"

    Procs.window(
      attr!(attr, where),
      Options.arg!(n, :pos_int, "n", where),
      Options.arg!(ms, {:ms, 0}, "ms", where)
    )
  end

  @doc """
  Finds processes that hold refc binaries they no longer need.

  **Garbage-collects every process that references refc binaries.** Counts
  the refc binaries each process references, forces a garbage collection of
  each of them, and counts again (a process that takes binaries meanwhile is
  not counted). Returns, as `top`, the `n` processes whose count dropped most
  (negative deltas, like `recon:bin_leak/1`; processes that freed none are
  left out); as `top_bytes`, the `n` processes that let go of the most bytes
  of binaries, which names a process hoarding a few large binaries rather
  than one passing many small ones; as `held`, the `n` processes that still
  reference the most bytes of binaries after the collection (binaries in
  use, which no collection frees), and as `held_bytes` the bytes of the
  distinct binaries they reference together (one they share counts once);
  the total number of references dropped;
  and the node's binary memory before and after (`nil` when
  `erlang:memory/1` is unsupported). A large drop in
  binary memory means binaries were kept alive only by processes that had
  not collected; run `top(:binary_memory, n)` first if you only want to know
  who holds them.

  GC requests run in parallel; processes that do not answer within 60 s are
  not waited for.

  ## Example

      Mtrace.VM.bin_leak(2)
      #=> %{top: [{#PID<0.4612.0>, -5580,
      #=>          [current_function: {:gen_server, :loop, 7},
      #=>           initial_call: {MyApp.Cache, :init, 1}]},
      #=>         {#PID<0.1747.0>, -3724, [registered_name: :router]}],
      #=>   top_bytes: [{#PID<0.1747.0>, 380_000_000, [registered_name: :router]},
      #=>               {#PID<0.4612.0>, 2_000_000,
      #=>                [current_function: {:gen_server, :loop, 7},
      #=>                 initial_call: {MyApp.Cache, :init, 1}]}],
      #=>   held: [{#PID<0.4612.0>, 18_000_000,
      #=>           [current_function: {:gen_server, :loop, 7},
      #=>            initial_call: {MyApp.Cache, :init, 1}]}],
      #=>   held_bytes: 18_000_000,
      #=>   freed: 9400, binary_before: 412_000_000, binary_after: 21_000_000}
  """
  @spec bin_leak(pos_integer) :: %{
          top: [{pid, neg_integer, proc_info}],
          top_bytes: [{pid, pos_integer, proc_info}],
          held: [{pid, pos_integer, proc_info}],
          held_bytes: non_neg_integer,
          freed: non_neg_integer,
          binary_before: non_neg_integer | nil,
          binary_after: non_neg_integer | nil
        }
  def bin_leak(n) do
    Procs.bin_leak(Options.arg!(n, :pos_int, "n", "VM.bin_leak/1"))
  end

  @doc """
  The `n` largest ETS tables, by `:memory` (bytes) or `:size` (objects):
  `ets_top(by, n)`, in the order of `top/2` (and recon's). The earlier order
  `ets_top(n, by)` still works, and either argument may be left out
  (`ets_top(5)`, `ets_top(:size)`).

  Returns `[{table, value, [name: name, owner: pid, size: objects,
  memory_bytes: bytes]}]`. Binaries over 64 bytes stored in a table live
  outside it and count under `binary` in `memory/0`, not here.

  ## Example

      Mtrace.VM.ets_top(:memory, 2)
      #=> [{:sessions, 120_000_000,
      #=>   [name: :sessions, owner: #PID<0.300.0>, size: 1_000_000,
      #=>    memory_bytes: 120_000_000]},
      #=>  {:ac_tab, 8_000,
      #=>   [name: :ac_tab, owner: #PID<0.44.0>, size: 6, memory_bytes: 8_000]}]
  """
  # ets_top/2's second argument when it is left out (nil is a wrong `by`).
  @unset :"$mtrace_unset"

  @spec ets_top(:memory | :size | pos_integer, pos_integer | :memory | :size) :: [
          {:ets.table(), non_neg_integer, ETS.info()}
        ]
  def ets_top(by_or_n \\ :memory, n_or_by \\ @unset)

  def ets_top(by, @unset) when by in [:memory, :size], do: ets_top_by(by, 10)
  def ets_top(by, n) when by in [:memory, :size], do: ets_top_by(by, n)

  # A lone atom can only have been meant as `by`; a lone anything else as `n`.
  def ets_top(by, @unset) when is_atom(by) do
    raise ArgumentError,
          "Mtrace.VM.ets_top/2: by must be :memory or :size, or n a positive integer; " <>
            "got: #{inspect(by)}"
  end

  def ets_top(n, @unset), do: ets_top_by(:memory, n)
  # `(by, n)`, top/2's order, with a `by` that is not one
  def ets_top(by, n) when is_atom(by) and is_integer(n), do: ets_top_by(by, n)
  def ets_top(n, by), do: ets_top_by(by, n)

  defp ets_top_by(by, n) do
    ETS.top(
      Options.arg!(by, {:one_of, [:memory, :size]}, "by", "VM.ets_top/2"),
      Options.arg!(n, :pos_int, "n", "VM.ets_top/2")
    )
  end

  @doc """
  The `n` ports with the most bytes queued to be written (`by`
  `:queue_size`, the default) or the largest memory of their own
  (`:memory`), largest first, as `[{port, value, info}]`, `info` as
  `Mtrace.VM.Ports.describe/1` gives it: `[name: driver_or_command, kind:
  :socket | :distribution | :program | :stdio | :other, connected: pid,
  peer: address_or_node | nil, queue_size: bytes, memory: bytes]` (read
  after the ranking, so its figures may have moved since). `n` may be
  given alone (`port_top(5)`); ports where the value is 0 are left out.

  A socket's queue holds what its peer has not read yet, a spawned
  program's what it has not read of its input: the binaries it was sent
  as, under `binary` in `memory/0` (the same binary queued to several
  ports counts in each). A port's `:memory` is its own state, not its queue:
  every socket's is about the same.

  Cost: one `port_info` per port, and for each of the `n` kept five more,
  the VM's list of distribution connections and, for a socket,
  `:inet.peername/1`.

  ## Example

      Mtrace.VM.port_top(2)
      #=> [{#Port<0.8>, 83_886_080,
      #=>   [name: "tcp_inet", kind: :socket, connected: #PID<0.96.0>,
      #=>    peer: "10.0.0.7:443", queue_size: 83_886_080, memory: 40]}]
  """
  @spec port_top(:queue_size | :memory | pos_integer, pos_integer) :: [
          {port, pos_integer, Ports.info()}
        ]
  def port_top(by_or_n \\ :queue_size, n \\ @unset)
  def port_top(n, @unset) when is_integer(n), do: port_top_by(:queue_size, n)
  def port_top(by, @unset), do: port_top_by(by, 10)
  def port_top(by, n), do: port_top_by(by, n)

  defp port_top_by(by, n) do
    where = "VM.port_top/2"

    Ports.top(
      Options.arg!(by, {:one_of, [:queue_size, :memory]}, "by", where),
      Options.arg!(n, :pos_int, "n", where)
    )
  end

  @doc """
  The `n` largest terms kept in `persistent_term`, largest first, as
  `[{key, bytes}]`: the flat size of each value, which is what
  `persistent_term` copies and keeps (refc binaries a value references
  live outside it and count under `binary` in `memory/0`).

  Cost: walks every stored value once (`:erts_debug.flat_size/1`), about
  as long as copying them; only the keys and sizes are kept.

  ## Example

      Mtrace.VM.persistent_terms(2)
      #=> [{{MyApp.Config, :tenant_42}, 12_000_000}, {:router_table, 80_000}]
  """
  @spec persistent_terms(pos_integer) :: [{term, non_neg_integer}]
  def persistent_terms(n \\ 10) do
    n = Options.arg!(n, :pos_int, "n", "VM.persistent_terms/1")
    words = :erlang.system_info(:wordsize)

    :persistent_term.get()
    |> Enum.map(fn {key, value} -> {key, :erts_debug.flat_size(value) * words} end)
    |> Enum.sort_by(&(-elem(&1, 1)))
    |> Enum.take(n)
  end

  @doc """
  Processes, ports, atoms and ETS tables, each as `{count, limit}`, and
  where `/proc` tells them (Linux) `:fds`, the file descriptors the node
  has open against the OS's soft limit (`ulimit -n`): sockets and files
  run out there long before the VM's port limit.

  The VM rounds some limits up (`+P 100000` gives a process limit of
  131_072). Running out of any of these takes the node down or makes it
  refuse work, so a count near its limit is urgent whatever memory says.

  ## Example

      iex> %{processes: {count, limit}} = Mtrace.VM.counts()
      iex> count < limit
      true
  """
  @spec counts() :: Procs.counts()
  def counts, do: Procs.counts()

  @doc """
  Memory NIFs and drivers hold in the VM's own allocators, by module and
  kind, largest first: `enif_alloc` blocks (`:enif_alloc`), resources
  and binaries made with `enif_make_new_binary` (`:resource`: the VM tags
  both alike) and `enif_alloc_binary` binaries (`:binary`). This memory
  never reaches malloc, so the native tracer does not see it; the VM tags
  it with the module that allocated it (see `Mtrace.VM.Native`).

  Each row is `%{module, kind, count, bytes, bytes_min, bytes_max}`: counts
  are those of the blocks `:instrument` scanned (it leaves the carriers it
  could not scan at once aside, and blocks in them are not counted: a lower
  bound, as "at least" in the findings says), bytes estimated from the VM's
  size classes (within a factor of 1.5, bounded by `bytes_min`/`bytes_max`).

  Options:

    * `window: ms` — read twice, `ms` apart, and rank by growth: each row
      gains `growth_per_s` (bytes per second) and `count_delta`;
    * `limit: n` — rows returned (default 10), or `:all`.

  Raises `Mtrace.Error` (reason `:no_tools`) when the `tools` application
  is missing from the release, and (reason `:off`) when the VM runs with
  `+MRe false +MBe false`, where this memory goes through malloc and
  `Mtrace.report/1` shows it with its stacks.

  ## Example

      Mtrace.VM.nif_memory(window: 10_000, limit: 2)
      #=> [%{module: :leaky_nif, kind: :enif_alloc, count: 10240,
      #=>    bytes: 125_829_120, growth_per_s: 1_258_291.2, count_delta: 1024,
      #=>    ...},
      #=>  %{module: :leaky_nif, kind: :resource, count: 1000,
      #=>    bytes: 12_288_000, ...}]
  """
  @spec nif_memory(keyword) :: [map]
  def nif_memory(opts \\ []) do
    o =
      Options.parse!(opts, [window: nil, limit: 10], "VM.nif_memory/1",
        window: {:or, {:ms, 1}, nil},
        limit: {:or, :pos_int, :all}
      )

    first = nif_rows!()

    rows =
      case o.window do
        nil ->
          first

        ms ->
          Process.sleep(ms)
          Native.nif_growth(first, nif_rows!(), ms / 1000)
      end

    if o.limit == :all, do: rows, else: Enum.take(rows, o.limit)
  end

  defp nif_rows! do
    case Native.nif_memory() do
      {:ok, rows} ->
        rows

      {:error, reason} ->
        raise Mtrace.Error,
          reason: reason,
          message: "Mtrace.VM.nif_memory/1: " <> Native.nif_explain(reason)
    end
  end

  @doc """
  Per ERTS allocator type: bytes in carriers (`:allocated`), bytes handed out
  as blocks (`:used`), the difference (`:wasted`) and `:usage`
  (`used / allocated`), summed over the type's instances.

  Most fragmented first: lowest usage first among allocators of 1 MiB or
  more, then the small ones by size (a nearly empty 64 KiB carrier is not
  fragmentation). Allocators that are disabled (e.g. under `+Mea min`) are
  left out. A large allocator with low usage holds memory the OS cannot get
  back: see the `+M<X>as` and `+M<X>lmbcs` emulator flags, `<X>` the
  allocator's letter (`E` for ets_alloc, `B` binary_alloc, `H`
  eheap_alloc, ...); the `:fragmentation` finding of `diagnose/1` gives
  them for the allocator it names (`Mtrace.VM.MemoryChecks.frag_flags/1`).

  ## Example

      Mtrace.VM.allocators()
      #=> [%{allocator: :binary_alloc, allocated: 300_000_000,
      #=>    used: 90_000_000, wasted: 210_000_000, usage: 0.3, instances: 3},
      #=>  %{allocator: :eheap_alloc, allocated: 40_000_000,
      #=>    used: 30_000_000, wasted: 10_000_000, usage: 0.75, instances: 3},
      #=>  ...]
  """
  @spec allocators() :: [Memory.allocator_row()]
  def allocators, do: Memory.allocators()

  @doc """
  Looks for every kind of leak this module knows and names the likeliest.

  Prints a report and returns a `Mtrace.VM.Diagnosis` struct,
  `%{verdict: kind, findings: [finding], ...}` (plus the `:node`, `:window`,
  `:memory`, `:counts` and `:native` state it judged), which IEx shows as
  one line. Each finding is `%{kind:, score:, summary:, evidence:, next:}`:
  `next` is the call to make to dig further. The verdict is the kind of the
  highest-scoring finding scoring 50 or more (with a window, one that grew
  before one that held still), else `:healthy`; the report
  lists findings scoring under 50 apart, as leads, by what they measured.
  Kinds:

    * `:mailbox_buildup` — a process with more than 10_000 messages waiting
      (or a mailbox growing by 500/s);
    * `:port_queue` — a port with 64 MiB queued to be written (a socket
      whose peer does not read, a program that does not read its input,
      the VM's standard output nobody reads), or all ports together with
      256 MiB (or, over a window, the queues of ports already queued at
      its start growing by 1 MiB/s), named with the port, its peer and
      its owner (`port_top/2` lists them);
    * `:process_leak` — processes at half the process limit, or 10_000+
      idle processes sharing what they were started as (a GenServer's
      `init/1`, not `:proc_lib.init_p/5`) and current function that make
      up half of all processes (or the count growing by 100/s). Idle
      connection processes you expect look the same: judge by their owner;
    * `:monitor_leak` — a process holding more than 10_000 monitors (or
      gaining 100/s);
    * `:process_memory` — one process holding 256 MiB, or 64 MiB+ that is
      half of the VM's memory (a cache or a state that only grows), or,
      over a window, one process growing by 1 MiB/s (named with its rate,
      and the largest after it when its size alone is a problem);
    * `:limit_near` — atoms, ports or open file descriptors (against the
      OS's `ulimit -n`, where `/proc` tells it) at half their limit (at
      the limit the VM stops, or refuses new ports, sockets and files;
      atoms are never freed), or, over a
      window, growing fast enough to reach it within a day (said with the
      rate and the time left);
    * `:ets_growth` — a table holding over 100 MiB with the binaries it
      references (estimated from sampled objects; a small table keeping
      large binaries is sampled too when binaries are a quarter of the
      VM's memory), or 64 MiB+ that is half of the VM's memory (or growing
      by 1 MiB/s);
    * `:persistent_term` — terms in `persistent_term` holding 100 MiB, or
      64 MiB+ that is half of the VM's memory (or growing by 1 MiB/s):
      they are under `system`, not processes, binary or ETS, so a store
      that only grows shows nowhere else (`persistent_terms/1` names the
      largest);
    * `:binary_leak` — refc binaries dominate memory and a forced GC frees a
      lot of them (32 MiB, or a quarter of the VM's memory if more);
    * `:binary_held` — refc binaries the forced GC left: in use, not
      leaked, but named with the processes that hold them; a problem when
      one process holds 256 MiB of them, or 64 MiB+ that is half of the
      VM's memory (as `:process_memory`), a lead when they are a quarter
      of the VM's memory whoever holds them;
    * `:native_leak` — native memory of 256 MiB (or more than the VM's
      own), or 64 MiB+ that is twice what the VM accounts for: the tracer's
      live malloc bytes when preloaded and tracking is on, otherwise RSS
      outside the ERTS allocators; or, over a window, growing steadily by
      50 KiB/s (up in most of the window's steps, with the rate and a
      projection to the memory limit; RSS by at least 1 MiB over the window
      as well);
    * `:native_heap` — over a window, native memory of those sizes that
      did not grow steadily: large, but not leaking while watched;
    * `:nif_alloc_leak` — a NIF module holding 64 MiB (or a quarter of the
      VM's memory) in the VM's own allocators through `enif_alloc`,
      resources or binaries (`nif_memory/1`), or growing there steadily by
      50 KiB/s; after a forced GC, its resources and binaries count only
      as far as no process or ETS table is shown holding them (a process
      keeping a NIF's binaries is `:binary_held`);
    * `:fragmentation` — an allocator type less than half used, wasting 64 MiB;
    * `:healthy` — nothing reached its threshold.

  `Mtrace.VM.Findings` documents the scoring.

  Options:

    * `:window` — milliseconds to watch the node (at least 100), so
      growth is judged and not only size: the VM's memory, processes and
      ETS are read at its start and end, native and NIF memory at each of its
      `window_steps` steps (5; `Mtrace.VM.Thresholds`) (default: one
      sample, no growth). A process's heap grows in steps, as garbage
      collections resize it, and may even shrink between two reads: a
      window of 10 s or more tells a growing heap from that;
    * `:gc` — `:auto` (default) runs `bin_leak/1` only when refc binaries
      hold a quarter of the VM's memory (16 MiB at least), `true` always,
      `false` never. It garbage-collects every process;
    * `:node` — diagnose another connected node through `:erpc` (mtrace must
      be loaded there) and print the report here, with each finding's `next`
      written to work here (`node:` given to the calls that take it,
      `:erpc.call/4` around the others, pids as this node writes them); a
      node that cannot be reached raises `Mtrace.Error` (reason
      `:nodedown`), as for `Mtrace`'s queries;
    * `:timeout` — how long to wait for `:node`, in ms (default 300_000,
      plus the window), or `:infinity`;
    * `:print` — print the report (default `true`);
    * `:thresholds` — overrides of any threshold, as a keyword list (see
      `Mtrace.VM.Thresholds` for all of them and their defaults).

  Cost: one `Process.info/2` per process per sample (and for idle
  processes started through proc_lib, a read of proc_lib's record in
  their dictionary: `Mtrace.VM.Diagnose`), a read of the VM's
  allocation tags (`nif_memory/1`) per window step, `bin_leak/1` when
  binaries dominate (with up to 2_240 ETS objects read to find the tables
  that keep binaries; otherwise 192, from the 3 largest tables), and the
  window's sleep. Safe on a production node, but not free on one with
  millions of processes.

  ## Example

      d = Mtrace.VM.diagnose(window: 10_000, print: false)
      #=> #Mtrace.VM.Diagnosis<app@host: mailbox_buildup (score 216.1), 1 finding>
      d.verdict
      #=> :mailbox_buildup
      hd(d.findings).summary
      #=> "#PID<0.312.0> (in MyApp.Sink.loop/1, started as :erlang.apply/2) has
      #=>  100_000 messages waiting"
      hd(d.findings).next
      #=> "Process.info(pid(\"0.312.0\"), [:current_stacktrace, :status]) shows
      #=>  why it is not receiving; ..."

  The struct's fields: `verdict`, `findings` (each `%{kind, score,
  summary, evidence, next}`), `node`, `window`, `memory`, `counts`,
  `growth`, `native`, `nif` (`Mtrace.VM.Diagnosis`).
  """
  @spec diagnose(keyword) :: Mtrace.VM.Diagnosis.t()
  def diagnose(opts \\ []), do: Diagnose.run(opts)

  defp attr!(attr, where), do: Options.arg!(attr, {:one_of, Procs.attrs()}, "attr", where)
end

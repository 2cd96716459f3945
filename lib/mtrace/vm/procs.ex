defmodule Mtrace.VM.Procs do
  @moduledoc """
  Per-process measures behind `Mtrace.VM.top/2`, `Mtrace.VM.window/3` and
  `Mtrace.VM.bin_leak/1`, the counts of `Mtrace.VM.counts/0`, and the
  bounded ranking every "top n" here is built with.

  Processes are read one at a time with `:erlang.process_info/2`; a process
  that dies while it is being read is skipped, never an error. The process
  asking (a shell's evaluator, an rpc) is left out: it is the one holding
  the answers being built.

  ## Rankings

  Scanning hundreds of thousands of processes must not build a list of them
  all just to sort it and keep ten, so values are streamed into a ranking
  (`ranking/1`, `rank/3`, `ranked/1`): an ordered set that never holds more
  than `n` elements, where a new pair either beats the current smallest
  (which is then dropped) or is discarded at once.
  """

  @attrs [
    :memory,
    :binary_memory,
    :message_queue_len,
    :reductions,
    :total_heap_size,
    :heap_size,
    :monitors,
    :links
  ]

  @typedoc "A measure `top/2` and `window/3` can rank processes by."
  @type attr ::
          :memory
          | :binary_memory
          | :message_queue_len
          | :reductions
          | :total_heap_size
          | :heap_size
          | :monitors
          | :links

  @typedoc "How a process is named in results: its registered name, else where it is and how it started."
  @type info :: [registered_name: atom] | [current_function: mfa, initial_call: mfa]

  # Asynchronous GC replies that have not arrived by then are given up on, so
  # one process stuck in a long NIF cannot hang bin_leak/1.
  @gc_timeout 60_000

  @doc """
  The measures processes can be ranked by.

  ## Example

      iex> :binary_memory in Mtrace.VM.Procs.attrs()
      true
  """
  @spec attrs() :: [attr]
  def attrs, do: @attrs

  @doc """
  The value of `attr` for `pid`, or `nil` when the process is gone.

  ## Example

      iex> is_integer(Mtrace.VM.Procs.value(self(), :memory))
      true
  """
  @spec value(pid, attr) :: non_neg_integer | nil
  def value(pid, :binary_memory) do
    case :erlang.process_info(pid, :binary) do
      {:binary, bins} -> binary_bytes(bins)
      _ -> nil
    end
  end

  def value(pid, attr) when attr in [:monitors, :links] do
    case :erlang.process_info(pid, attr) do
      {^attr, list} -> length(list)
      _ -> nil
    end
  end

  def value(pid, attr) do
    case :erlang.process_info(pid, attr) do
      {^attr, value} -> value
      _ -> nil
    end
  end

  @doc """
  Bytes of refc binaries referenced from a `process_info(pid, :binary)` list.

  A binary referenced several times by one process (say, received in two
  messages) appears once per reference; it is counted once.

  ## Example

      iex> Mtrace.VM.Procs.binary_bytes([{1, 100, 2}, {1, 100, 2}, {2, 50, 1}])
      150
  """
  @spec binary_bytes([{term, non_neg_integer, non_neg_integer}]) :: non_neg_integer
  def binary_bytes(bins) do
    :lists.ukeysort(1, bins) |> Enum.reduce(0, fn {_, size, _}, acc -> acc + size end)
  end

  # The most of a process's heap (bytes) for which its whole dictionary is
  # copied to read proc_lib's record, where the VM cannot read that one
  # entry (before OTP 26.2): a copy that grows with what the process keeps.
  # The dictionary's terms live on the heap, and no process_info item tells
  # their size short of copying them, so the heap bounds the copy; the
  # process's memory would also count what the dictionary cannot be in (a
  # message queue kept off the heap, messages not yet moved onto it, the
  # process's own structures). Passes over every process copy little each;
  # a process named in an answer (a few) may copy more, so that a large
  # GenServer is named.
  @dictionary_max 256 * 1024
  @named_dictionary_max 64 * 1024 * 1024

  @doc """
  How a process is named in results, or `nil` when it is gone.

  `initial_call` is what the process was started as: for a process started
  through `proc_lib` (a GenServer, an Agent, a Task) the function it named,
  not `:proc_lib.init_p/5`, which the VM records for every one of them; for
  a plain spawn, the VM's own (`{:erlang, :apply, 2}` for a fun).

  ## Examples

      iex> Mtrace.VM.Procs.info(Process.whereis(:init))
      [registered_name: :init]

      iex> {:ok, pid} = Agent.start_link(Map, :new, [])
      iex> Mtrace.VM.Procs.info(pid)[:initial_call]
      {Map, :new, 0}
  """
  @spec info(pid) :: info | nil
  def info(pid) do
    case :erlang.process_info(pid, [:registered_name, :current_function, :initial_call]) do
      [registered_name: name, current_function: _, initial_call: _] when is_atom(name) ->
        [registered_name: name]

      [registered_name: _, current_function: mfa, initial_call: init] ->
        [current_function: mfa, initial_call: started_as(pid, init, @named_dictionary_max)]

      _ ->
        nil
    end
  end

  @doc """
  What a process was started as: proc_lib's record of it
  (`$initial_call` in its dictionary) when it has one, else `initial`, the
  VM's initial call. Unlike `:proc_lib.translate_initial_call/1`, a plain
  spawn keeps its own (`:proc_lib.init_p/5` would name every process not
  started through proc_lib). Where the VM cannot read that one entry of
  another process (before OTP 26.2) its whole dictionary is copied, so only
  for a process whose heap, where the dictionary lives, is at most 256 KiB
  (64 MiB for the few processes `info/1` names): a larger one keeps
  `initial`. A mailbox kept off the heap does not count.

  ## Example

      iex> {:ok, pid} = Agent.start_link(Map, :new, [])
      iex> Mtrace.VM.Procs.started_as(pid, {:proc_lib, :init_p, 5})
      {Map, :new, 0}
  """
  @spec started_as(pid, mfa | nil) :: mfa | nil
  def started_as(pid, initial), do: started_as(pid, initial, @dictionary_max)

  # proc_lib:start* record it (init_p/5), and proc_lib:spawn* (init_p/3)
  defp started_as(pid, {:proc_lib, :init_p, arity} = initial, max) when arity in [3, 5] do
    case initial_call_entry(pid, max) do
      {m, f, a} when is_atom(m) and is_atom(f) and is_integer(a) -> {m, f, a}
      _ -> initial
    end
  end

  defp started_as(_pid, initial, _max), do: initial

  defp initial_call_entry(pid, max) do
    if dictionary_item?() do
      case :erlang.process_info(pid, {:dictionary, :"$initial_call"}) do
        {_, value} -> value
        _ -> nil
      end
    else
      with {:total_heap_size, words} <- :erlang.process_info(pid, :total_heap_size),
           true <- words * :erlang.system_info(:wordsize) <= max,
           {:dictionary, dict} <- :erlang.process_info(pid, :dictionary),
           {_, value} <- List.keyfind(dict, :"$initial_call", 0) do
        value
      else
        _ -> nil
      end
    end
  end

  # Whether this VM reads one dictionary entry of another process (OTP
  # 26.2+); asked once.
  defp dictionary_item? do
    case :persistent_term.get({__MODULE__, :dictionary_item}, nil) do
      nil ->
        item =
          try do
            :erlang.process_info(self(), {:dictionary, :"$initial_call"})
            true
          rescue
            ArgumentError -> false
          end

        :persistent_term.put({__MODULE__, :dictionary_item}, item)
        item

      item ->
        item
    end
  end

  @doc """
  The `n` processes with the largest `attr`, largest first; processes
  where it is 0 (an empty mailbox, no monitors) are left out, so fewer than
  `n` may come back.

  ## Example

      [{_pid, _bytes, _info}] = Mtrace.VM.Procs.top(:memory, 1)
  """
  @spec top(attr, pos_integer) :: [{pid, non_neg_integer, info}]
  def top(attr, n) do
    others()
    |> Enum.reduce(ranking(n), fn pid, acc ->
      case value(pid, attr) do
        nil -> acc
        0 -> acc
        v -> rank(acc, pid, v)
      end
    end)
    |> with_info()
  end

  @doc """
  The `n` processes whose `attr` grew most over `ms` milliseconds;
  processes where it did not change are left out.

  ## Example

      [{_pid, _delta, _info}] = Mtrace.VM.Procs.window(:reductions, 1, 100)
  """
  @spec window(attr, pos_integer, non_neg_integer) :: [{pid, integer, info}]
  def window(attr, n, ms) do
    # The first sample has to remember every process; zero values are left
    # out because a missing pid already reads as 0 (as a newborn does).
    before =
      Enum.reduce(others(), %{}, fn pid, acc ->
        case value(pid, attr) do
          nil -> acc
          0 -> acc
          v -> Map.put(acc, pid, v)
        end
      end)

    Process.sleep(ms)

    others()
    |> Enum.reduce(ranking(n), fn pid, acc ->
      case value(pid, attr) do
        nil -> acc
        v -> rank_change(acc, pid, v - Map.get(before, pid, 0))
      end
    end)
    |> with_info()
  end

  defp rank_change(acc, _pid, 0), do: acc
  defp rank_change(acc, pid, delta), do: rank(acc, pid, delta)

  @doc """
  Garbage-collects every process that references refc binaries and reports
  which let go of the most, by references and by bytes.

  Returns:

    * `top` — the `n` processes with the largest drop in the number of refc
      binary references they hold, as negative deltas (as recon's
      `bin_leak/1` does); processes that dropped none are left out;
    * `top_bytes` — the `n` processes that let go of the most bytes of refc
      binaries, as `{pid, bytes, info}`, each binary counted once per
      process. This is the one that names a process hoarding a few large
      binaries rather than one passing many small ones;
    * `held` — the `n` processes that still reference the most bytes of
      refc binaries after the collections, as `{pid, bytes, info}`: what
      they hold and use, which no collection frees (read in the same pass,
      at no extra cost);
    * `held_bytes` — the bytes of the distinct binaries those `n`
      processes reference together: a binary several of them share counts
      once (their `bytes` count it in each);
    * `freed` — the references dropped by all processes;
    * `binary_before`, `binary_after` — the node's binary memory around the
      collections (`nil` when `erlang:memory/1` is unsupported).

  ## Example

      %{top: _, top_bytes: _, held: _, held_bytes: _, freed: _, binary_before: _} =
        Mtrace.VM.Procs.bin_leak(5)
  """
  @spec bin_leak(pos_integer) :: %{
          top: [{pid, neg_integer, info}],
          top_bytes: [{pid, pos_integer, info}],
          held: [{pid, pos_integer, info}],
          held_bytes: non_neg_integer,
          freed: non_neg_integer,
          binary_before: non_neg_integer | nil,
          binary_after: non_neg_integer | nil
        }
  def bin_leak(n) do
    binary_before = binary_memory()
    before = Enum.reduce(others(), %{}, &count_binaries/2)
    gc_all(Map.keys(before))
    binary_after = settled_binary_memory(binary_memory(), 25)

    {top, top_bytes, held, freed} =
      Enum.reduce(before, {ranking(n), ranking(n), ranking(n), 0}, &after_gc/2)

    held = with_info(held)

    %{
      top: for({pid, drop, info} <- with_info(top), do: {pid, -drop, info}),
      top_bytes: with_info(top_bytes),
      held: held,
      held_bytes: held_together(held),
      freed: freed,
      binary_before: binary_before,
      binary_after: binary_after
    }
  end

  # The bytes of the distinct binaries the held processes reference: one
  # binary that several of them share (a blob handed to workers) counts
  # once, not once per holder.
  defp held_together(held) do
    held
    |> Enum.flat_map(fn {pid, _bytes, _info} ->
      case :erlang.process_info(pid, :binary) do
        {:binary, bins} -> bins
        _ -> []
      end
    end)
    |> binary_bytes()
  end

  # What one process let go of in the collections, and what it still holds.
  defp after_gc({pid, {count, bytes}}, acc) do
    case :erlang.process_info(pid, :binary) do
      {:binary, bins} ->
        kept = binary_bytes(bins)
        dropped(acc, pid, count - length(bins), bytes - kept, kept)

      _ ->
        acc
    end
  end

  defp dropped({top, top_bytes, held, freed}, pid, drop, bytes, kept) do
    {
      if(drop > 0, do: rank(top, pid, drop), else: top),
      if(bytes > 0, do: rank(top_bytes, pid, bytes), else: top_bytes),
      if(kept > 0, do: rank(held, pid, kept), else: held),
      freed + max(drop, 0)
    }
  end

  @doc """
  The node's binary memory in bytes, or `nil` when `erlang:memory/1` cannot tell.

  ## Example

      iex> is_integer(Mtrace.VM.Procs.binary_memory())
      true
  """
  @spec binary_memory() :: non_neg_integer | nil
  def binary_memory do
    :erlang.memory(:binary)
  rescue
    ErlangError -> nil
  end

  # A binary freed on another scheduler than the one that allocated it is
  # handed back to its allocator instance a little later, so right after the
  # collections binary memory still counts some freed binaries. Read again
  # while it keeps falling (within half a second).
  defp settled_binary_memory(nil, _tries), do: nil
  defp settled_binary_memory(bytes, 0), do: bytes

  defp settled_binary_memory(bytes, tries) do
    Process.sleep(20)

    case binary_memory() do
      lower when is_integer(lower) and lower < bytes -> settled_binary_memory(lower, tries - 1)
      _ -> bytes
    end
  end

  defp count_binaries(pid, acc) do
    case :erlang.process_info(pid, :binary) do
      {:binary, []} -> acc
      {:binary, bins} -> Map.put(acc, pid, {length(bins), binary_bytes(bins)})
      _ -> acc
    end
  end

  # GC requests are sent asynchronously from a short-lived helper so that
  # collections run in parallel on all schedulers and late replies land in a
  # mailbox that no longer exists instead of the caller's.
  defp gc_all(pids) do
    caller = self()
    tag = make_ref()

    {helper, mref} =
      spawn_monitor(fn ->
        collect(pids)
        send(caller, {tag, :done})
      end)

    receive do
      {^tag, :done} ->
        Process.demonitor(mref, [:flush])

      {:DOWN, ^mref, :process, ^helper, _} ->
        :ok
    end
  rescue
    # The process table is full (a process leak, often what is being looked
    # for): asked from here instead, and replies that came late cleared.
    SystemLimitError -> pids |> collect() |> flush_gc()
  end

  # Asks each process to collect and waits for the replies, at most
  # @gc_timeout; returns the replies' tag.
  defp collect(pids) do
    ref = make_ref()
    Enum.each(pids, &:erlang.garbage_collect(&1, async: ref))
    await_gc(ref, length(pids), System.monotonic_time(:millisecond) + @gc_timeout)
    ref
  end

  defp flush_gc(ref) do
    receive do
      {:garbage_collect, ^ref, _} -> flush_gc(ref)
    after
      0 -> :ok
    end
  end

  defp await_gc(_ref, 0, _deadline), do: :ok

  defp await_gc(ref, left, deadline) do
    wait = max(deadline - System.monotonic_time(:millisecond), 0)

    receive do
      {:garbage_collect, ^ref, _} -> await_gc(ref, left - 1, deadline)
    after
      wait -> :timeout
    end
  end

  defp others, do: List.delete(:erlang.processes(), self())

  defp with_info(top) do
    for {pid, value} <- ranked(top), info = info(pid), info != nil, do: {pid, value, info}
  end

  @typedoc """
  Each entry is `{count, limit}`; `:fds` (the OS's open file descriptors
  against the soft `RLIMIT_NOFILE`) only where `/proc` tells them.
  """
  @type counts :: %{
          required(:processes) => {non_neg_integer, pos_integer},
          required(:ports) => {non_neg_integer, pos_integer},
          required(:atoms) => {non_neg_integer, pos_integer},
          required(:ets) => {non_neg_integer, pos_integer},
          optional(:fds) => {non_neg_integer, pos_integer}
        }

  @doc """
  How many processes, ports, atoms and ETS tables the node has, against the
  limits it was started with (`+P`, `+Q`, `+t`, `+e`), and on Linux its
  open file descriptors against the OS's limit (`fds/0`). See
  `Mtrace.VM.counts/0`.

  ## Example

      %{processes: {count, limit}} = Mtrace.VM.Procs.counts()
      true = count <= limit
  """
  @spec counts() :: counts
  def counts do
    counts = %{
      processes: pair(:process_count, :process_limit),
      ports: pair(:port_count, :port_limit),
      atoms: pair(:atom_count, :atom_limit),
      ets: pair(:ets_count, :ets_limit)
    }

    case fds() do
      {_count, _limit} = fds -> Map.put(counts, :fds, fds)
      nil -> counts
    end
  end

  @doc """
  The OS file descriptors this node has open and its soft limit on them
  (`RLIMIT_NOFILE`, as `ulimit -n` sets it), from `/proc/self/fd` and
  `/proc/self/limits` (Linux); `nil` where they cannot be read, or the
  limit is unlimited. Every socket, file and pipe a port opens takes one:
  the VM's port limit is no use once the OS refuses a descriptor.

  ## Example

      {open, limit} = Mtrace.VM.Procs.fds()
      true = open <= limit
  """
  @spec fds() :: {non_neg_integer, pos_integer} | nil
  def fds do
    with {:ok, limits} <- File.read("/proc/self/limits"),
         [_, soft] <- Regex.run(~r/^Max open files\s+(\d+)\s/m, limits),
         {:ok, open} <- File.ls("/proc/self/fd") do
      # the listing's own descriptor is among them
      {max(length(open) - 1, 0), String.to_integer(soft)}
    else
      _ -> nil
    end
  end

  defp pair(count, limit), do: {:erlang.system_info(count), :erlang.system_info(limit)}

  @opaque ranking :: {non_neg_integer, pos_integer, :gb_sets.set({number, term})}

  @doc """
  An empty ranking that keeps the `n` largest `{key, value}` pairs offered
  to it, and nothing else.

  ## Example

      iex> Mtrace.VM.Procs.ranking(3) |> Mtrace.VM.Procs.ranked()
      []
  """
  @spec ranking(pos_integer) :: ranking
  def ranking(n) when is_integer(n) and n > 0, do: {0, n, :gb_sets.new()}

  @doc """
  Offers `value` for `key`; it is kept only if it is among the `n` largest.

  Keys must be distinct within one ranking (pids, tables).

  ## Example

      iex> import Mtrace.VM.Procs, only: [ranking: 1, rank: 3, ranked: 1]
      iex> ranking(2) |> rank(:a, 1) |> rank(:b, 3) |> rank(:c, 2) |> ranked()
      [b: 3, c: 2]
  """
  @spec rank(ranking, term, number) :: ranking
  def rank({size, n, set}, key, value) when size < n do
    {size + 1, n, :gb_sets.add({value, key}, set)}
  end

  def rank({size, n, set} = top, key, value) do
    {smallest, _} = :gb_sets.smallest(set)

    if value > smallest do
      {_, rest} = :gb_sets.take_smallest(set)
      {size, n, :gb_sets.add({value, key}, rest)}
    else
      top
    end
  end

  @doc """
  The kept pairs, largest value first.

  ## Example

      iex> import Mtrace.VM.Procs, only: [ranking: 1, rank: 3, ranked: 1]
      iex> ranking(5) |> rank(:x, 10) |> rank(:y, 20) |> ranked()
      [y: 20, x: 10]
  """
  @spec ranked(ranking) :: [{term, number}]
  def ranked({_, _, set}) do
    set |> :gb_sets.to_list() |> Enum.reverse() |> Enum.map(fn {value, key} -> {key, value} end)
  end
end

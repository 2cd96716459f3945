defmodule Mtrace.VMScenarios do
  @moduledoc """
  Leaks and known processes built inside a peer node for `Mtrace.VM` tests.

  Each function runs on the peer (through `:erpc`), starts unlinked
  processes that outlive the call, waits until they are in the wanted state,
  and returns their pids. They stay until the peer is stopped.
  """

  @doc """
  An ETS table `:mtrace_leaky_cache` filled with `n` objects
  `{i, <<65 bytes>>}`; returns the owner.

  ## Example

      owner = Mtrace.VMScenarios.ets_table(1_000)
  """
  @spec ets_table(pos_integer) :: pid
  def ets_table(n) do
    start(fn ->
      table = :ets.new(:mtrace_leaky_cache, [:named_table, :set, :public])
      fill(table, n)
      # The owner's own references to the binaries are garbage now; only the
      # table keeps them.
      :erlang.garbage_collect()
    end)
  end

  @doc """
  A process keeping a list of `mib` MiB of small terms in its heap (a
  state that only grows); returns it.

  ## Example

      keeper = Mtrace.VMScenarios.big_state(1)
  """
  @spec big_state(pos_integer) :: pid
  def big_state(mib) do
    parent = self()

    pid =
      spawn(fn ->
        # 1 MiB is 65_536 cons cells of 2 words
        kept = Enum.to_list(1..(mib * 65_536))
        send(parent, {:kept, self()})

        receive do
          :never -> length(kept)
        end
      end)

    receive do
      {:kept, ^pid} -> pid
    end
  end

  @doc """
  A process whose state grows by about `mib_per_s` MiB a second (a list of
  small terms, added to every 100 ms) for `ms` milliseconds, then stays;
  returns it once it started growing.

  ## Example

      grower = Mtrace.VMScenarios.growing_state(10, 3_000)
  """
  @spec growing_state(pos_integer, pos_integer) :: pid
  def growing_state(mib_per_s, ms) do
    # 1 MiB is 65_536 cons cells of 2 words; a tenth of the rate per tick
    per_tick = div(mib_per_s * 65_536, 10)
    start(fn -> :ok end, [], fn -> grow([], per_tick, div(ms, 100)) end)
  end

  @doc """
  `count` terms put in `persistent_term`, keys `{:mtrace_config, i}`, each a
  list of `kib` KiB of small integers (a store that only grows); returns
  the keys.

  ## Example

      keys = Mtrace.VMScenarios.persistent_terms(2, 1)
  """
  @spec persistent_terms(pos_integer, pos_integer) :: [term]
  def persistent_terms(count, kib) do
    # 1 KiB is 64 cons cells of 2 words
    for i <- 1..count do
      key = {:mtrace_config, i}
      :persistent_term.put(key, Enum.to_list(1..(kib * 64)))
      key
    end
  end

  @doc """
  A process that never reads its mailbox, sent `n` messages.

  ## Example

      sink = Mtrace.VMScenarios.mailbox(10)
  """
  @spec mailbox(non_neg_integer) :: pid
  def mailbox(n) do
    sink = start(fn -> :ok end)
    Enum.each(1..n//1, &send(sink, {:job, &1}))
    sink
  end

  @doc """
  A process that built `count` refc binaries of `size` bytes, dropped them,
  and never collected since: it still references all of them.

  ## Example

      pid = Mtrace.VMScenarios.binary_hoarder(100, 65_536)
  """
  @spec binary_hoarder(pos_integer, pos_integer) :: pid
  def binary_hoarder(count, size) do
    # A large minimum virtual binary heap keeps the binaries from triggering
    # a collection, as in a long-lived process that routes big binaries but
    # allocates little on its own heap.
    words = div(count * size, 8) * 2

    start(fn -> touch_binaries(count, size, 0) end,
      min_bin_vheap_size: words,
      min_heap_size: 200_000
    )
  end

  @doc """
  An Agent registered as `:mtrace_binary_keeper` whose state is `count`
  refc binaries of `size` bytes: binaries in use, which no collection
  frees. Returns it.

  ## Example

      keeper = Mtrace.VMScenarios.binary_keeper(10, 65_536)
  """
  @spec binary_keeper(pos_integer, pos_integer) :: pid
  def binary_keeper(count, size) do
    keep = fn -> for i <- 1..count, do: :binary.copy(<<i>>, size) end
    {:ok, pid} = Agent.start(keep, name: :mtrace_binary_keeper)
    pid
  end

  @doc """
  An Agent registered as `:mtrace_header_cache` whose state is a 100-byte
  sub-binary of each of `count` binaries of `size` bytes that the `crypto`
  NIF made (`:crypto.strong_rand_bytes/1`): each slice keeps its whole
  binary, which the VM tags as the NIF's. Returns it.

  ## Example

      cache = Mtrace.VMScenarios.header_cache(10, 65_536)
  """
  @spec header_cache(pos_integer, pos_integer) :: pid
  def header_cache(count, size) do
    # called through apply: mtrace does not depend on the crypto application
    keep = fn ->
      for _ <- 1..count do
        <<head::binary-size(100), _::binary>> = apply(:crypto, :strong_rand_bytes, [size])
        head
      end
    end

    {:ok, pid} = Agent.start(keep, name: :mtrace_header_cache)
    # the whole binaries are garbage in its heap, but for the slices
    :ok = Agent.cast(pid, fn state -> :erlang.garbage_collect() && state end)
    _ = Agent.get(pid, &length/1)
    pid
  end

  @doc """
  A feeder casting `per_tick` binaries of `size` bytes that `:crypto` made,
  every 100 ms, to a process registered `:mtrace_header_index` that keeps
  a 200-byte slice of each (which keeps the whole binary); with `keep`
  false, the receiver drops them instead and does not collect (a large
  minimum heap). Returns the receiver once the feeder started.

  ## Example

      index = Mtrace.VMScenarios.crypto_feed(20, 64_000, true)
  """
  @spec crypto_feed(pos_integer, pos_integer, boolean) :: pid
  def crypto_feed(per_tick, size, keep) do
    opts = if keep, do: [], else: [min_heap_size: 1_000_000, min_bin_vheap_size: 100_000_000]

    receiver =
      start(fn -> Process.register(self(), :mtrace_header_index) end, opts, fn ->
        receive_binaries([], keep)
      end)

    start(fn -> :ok end, [], fn -> feed(receiver, per_tick, size) end)
    receiver
  end

  defp receive_binaries(kept, keep) do
    receive do
      {:binary, b} when keep -> receive_binaries([binary_part(b, 0, 200) | kept], keep)
      {:binary, _} -> receive_binaries(kept, keep)
    end
  end

  defp feed(receiver, per_tick, size) do
    # called through apply: mtrace does not depend on the crypto application
    for _ <- 1..per_tick,
        do: send(receiver, {:binary, apply(:crypto, :strong_rand_bytes, [size])})

    Process.sleep(100)
    feed(receiver, per_tick, size)
  end

  @doc """
  A small ETS table `:mtrace_blob_cache` of `count` objects `{i, blob}`,
  each blob a refc binary of `size` bytes: little table memory, and large
  binaries only the table keeps; with `named` false, the table is not
  named (reached only by its id). Returns the owner.

  ## Example

      owner = Mtrace.VMScenarios.blob_table(10, 65_536)
  """
  @spec blob_table(pos_integer, pos_integer, boolean) :: pid
  def blob_table(count, size, named \\ true) do
    opts = if named, do: [:named_table, :set, :public], else: [:set, :public]

    start(fn ->
      table = :ets.new(:mtrace_blob_cache, opts)
      for i <- 1..count, do: :ets.insert(table, {i, :binary.copy(<<i>>, size)})
      :erlang.garbage_collect()
    end)
  end

  @doc """
  A pool that started `n` workers and lost track of them: they wait for work
  forever. Returns the pool process.

  ## Example

      pool = Mtrace.VMScenarios.leaking_pool(100)
  """
  @spec leaking_pool(pos_integer) :: pid
  def leaking_pool(n) do
    start(fn -> for _ <- 1..n, do: spawn(&worker_loop/0) end)
  end

  @doc """
  A process starting `per_tick` workers every 10 ms, for at most `ms`
  milliseconds, none of which is ever given work. Returns it.

  ## Example

      spawner = Mtrace.VMScenarios.spawn_flood(20, 3_000)
  """
  @spec spawn_flood(pos_integer, pos_integer) :: pid
  def spawn_flood(per_tick, ms) do
    spawn(fn -> spawn_workers(per_tick, div(ms, 10)) end)
  end

  @doc """
  `servers` idle GenServers running `Mtrace.VMScenarios.IdleServer` and
  `agents` idle Agents, none of them ever called: two kinds of lost
  workers, both `:proc_lib.init_p/5` to the VM, waiting in
  `:gen_server.loop/7`.

  ## Example

      :ok = Mtrace.VMScenarios.idle_servers(10, 5)
  """
  @spec idle_servers(non_neg_integer, non_neg_integer) :: :ok
  def idle_servers(servers, agents) do
    for _ <- 1..servers//1, do: {:ok, _} = GenServer.start(Mtrace.VMScenarios.IdleServer, nil)
    for _ <- 1..agents//1, do: {:ok, _} = Agent.start(fn -> nil end)
    :ok
  end

  @doc """
  A process monitoring one target `n` times; returns `{hog, target}`.

  ## Example

      {hog, target} = Mtrace.VMScenarios.monitor_hog(10)
  """
  @spec monitor_hog(pos_integer) :: {pid, pid}
  def monitor_hog(n) do
    target = start(fn -> :ok end)
    hog = start(fn -> for _ <- 1..n, do: Process.monitor(target) end)
    {hog, target}
  end

  @doc """
  One process standing out on each measure `Mtrace.VM.top/2` ranks by.

  ## Example

      %{fat: _, binaries: _, mailbox: _, burner: _, monitors: _, links: _} =
        Mtrace.VMScenarios.known_processes()
  """
  @spec known_processes() :: %{atom => pid}
  def known_processes do
    fat =
      start(fn ->
        Process.register(self(), :mtrace_fat)
        # Kept in the process dictionary so it stays live while waiting.
        Process.put(:data, Enum.to_list(1..1_000_000))
      end)

    binaries =
      start(fn ->
        bins = for i <- 1..8, do: :binary.copy(<<i>>, 1_048_576)
        # A message to itself makes a second reference to the same binary.
        send(self(), {:again, hd(bins)})
        receive do: ({:again, again} -> Process.put(:data, [again | bins]))
      end)

    monitor_target = start(fn -> :ok end)

    %{
      fat: fat,
      binaries: binaries,
      mailbox: mailbox(3_000),
      # well above what building the fat process's list costs (~5M reductions)
      burner: start(fn -> burn(20_000_000) end),
      monitors: start(fn -> for _ <- 1..500, do: Process.monitor(monitor_target) end),
      links: start(fn -> for _ <- 1..300, do: spawn_link(&worker_loop/0) end)
    }
  end

  @doc """
  Starts, for `Mtrace.VM.window/3`, a process `target` that gets 1_000
  messages after `delay` ms, and a process registered as
  `:mtrace_newborn`, born after `delay` ms with 700 messages. Returns
  `target`.

  ## Example

      target = Mtrace.VMScenarios.window_events(200)
  """
  @spec window_events(non_neg_integer) :: pid
  def window_events(delay) do
    target = mailbox(0)

    spawn(fn ->
      Process.sleep(delay)
      Enum.each(1..1_000, &send(target, {:job, &1}))
      newborn = spawn(&park/0)
      Process.register(newborn, :mtrace_newborn)
      Enum.each(1..700, &send(newborn, {:job, &1}))
    end)

    target
  end

  @doc """
  A sink receiving `per_tick` messages every 10 ms, for at most `ms`
  milliseconds, and never reading them. Returns the sink.

  ## Example

      sink = Mtrace.VMScenarios.mailbox_flood(50, 3_000)
  """
  @spec mailbox_flood(pos_integer, pos_integer) :: pid
  def mailbox_flood(per_tick, ms) do
    sink = mailbox(0)
    spawn(fn -> flood(sink, per_tick, div(ms, 10)) end)
    sink
  end

  @doc """
  `pairs` TCP connections to a listener on this node, both ends held by
  one process registered as `:mtrace_conn_pool` (two file descriptors a
  pair, and the listener's). Returns it.

  ## Example

      pool = Mtrace.VMScenarios.open_sockets(10)
  """
  @spec open_sockets(pos_integer) :: pid
  def open_sockets(pairs) do
    start(fn ->
      Process.register(self(), :mtrace_conn_pool)
      {:ok, listener} = :gen_tcp.listen(0, [:binary, active: false])
      {:ok, port} = :inet.port(listener)

      for _ <- 1..pairs do
        {:ok, client} = :gen_tcp.connect(~c"localhost", port, [:binary, active: false])
        {:ok, server} = :gen_tcp.accept(listener)
        {client, server}
      end
    end)
  end

  @doc """
  A process making `per_tick` new atoms every 10 ms, for at most `ms`
  milliseconds (as code turning outside data into atoms does). Returns it.

  ## Example

      maker = Mtrace.VMScenarios.atom_flood(20, 3_000)
  """
  @spec atom_flood(pos_integer, pos_integer) :: pid
  def atom_flood(per_tick, ms) do
    spawn(fn -> make_atoms(per_tick, div(ms, 10), 0) end)
  end

  @doc """
  Runs `apply(mod, fun, args)` with the process table full (spawned
  processes up to the `+P` limit), then ends those processes; returns
  `{:ok, result}` or `{:raised, exception}`.

  ## Example

      {:ok, _} = Mtrace.VMScenarios.with_full_process_table(Mtrace.VM, :bin_leak, [2])
  """
  @spec with_full_process_table(module, atom, list) :: {:ok, term} | {:raised, Exception.t()}
  def with_full_process_table(mod, fun, args) do
    fillers = fill_process_table([])

    try do
      {:ok, apply(mod, fun, args)}
    rescue
      e -> {:raised, e}
    after
      Enum.each(fillers, &Process.exit(&1, :kill))
    end
  end

  defp fill_process_table(acc) do
    pid = spawn(fn -> Process.sleep(:infinity) end)
    fill_process_table([pid | acc])
  rescue
    SystemLimitError -> acc
  end

  @doc """
  Loads every `Mtrace.VM` module and the option checks they share
  (`Mtrace.Options`), then makes the native module `Mtrace` unloadable, as
  on a node that never had it.

  ## Example

      :ok = Mtrace.VMScenarios.remove_native_module()
  """
  @spec remove_native_module() :: :ok
  def remove_native_module do
    dir = :filename.dirname(:code.which(Mtrace.VM))

    for file <- File.ls!(dir),
        String.starts_with?(file, ["Elixir.Mtrace.VM", "Elixir.Mtrace.Options."]) do
      {:module, _} = :code.ensure_loaded(String.to_atom(Path.rootname(file)))
    end

    true = :code.del_path(dir)
    :code.purge(Mtrace)
    :code.delete(Mtrace)
    :code.purge(Mtrace)
    :ok
  end

  defp worker_loop do
    receive do
      {:work, from} ->
        send(from, :done)
        worker_loop()
    end
  end

  # Waits forever without ever looking at the mailbox, so a long queue
  # costs nothing to keep.
  defp park do
    receive do
    after
      :infinity -> :ok
    end
  end

  defp grow(kept, _per_tick, 0) do
    receive do
      :never -> length(kept)
    end
  end

  defp grow(kept, per_tick, ticks) do
    kept = Enum.to_list(1..per_tick) ++ kept
    Process.sleep(100)
    grow(kept, per_tick, ticks - 1)
  end

  defp spawn_workers(_per_tick, 0), do: :ok

  defp spawn_workers(per_tick, ticks) do
    for _ <- 1..per_tick, do: spawn(&worker_loop/0)
    Process.sleep(10)
    spawn_workers(per_tick, ticks - 1)
  end

  defp make_atoms(_per_tick, 0, _made), do: :ok

  defp make_atoms(per_tick, ticks, made) do
    Enum.each(1..per_tick, &String.to_atom("mtrace_request_#{made + &1}"))
    Process.sleep(10)
    make_atoms(per_tick, ticks - 1, made + per_tick)
  end

  defp flood(_sink, _per_tick, 0), do: :ok

  defp flood(sink, per_tick, ticks) do
    Enum.each(1..per_tick, &send(sink, {:event, &1}))
    Process.sleep(10)
    flood(sink, per_tick, ticks - 1)
  end

  defp fill(_table, 0), do: :ok

  defp fill(table, i) do
    :ets.insert(table, {i, <<i::64, :binary.copy(<<0>>, 57)::binary>>})
    fill(table, i - 1)
  end

  defp touch_binaries(0, _size, total), do: total

  defp touch_binaries(n, size, total) do
    bin = :binary.copy(<<n>>, size)
    touch_binaries(n - 1, size, total + byte_size(bin))
  end

  defp burn(0), do: :ok
  defp burn(n), do: burn(n - 1)

  @doc """
  A TCP connection whose client never reads, and `bytes` sent to it: they
  wait in the server socket's queue. Returns the process owning both ends
  and the server's port.

  ## Example

      {owner, port} = Mtrace.VMScenarios.stalled_socket(16 * 1_048_576)
  """
  @spec stalled_socket(pos_integer) :: {pid, port}
  def stalled_socket(bytes) do
    me = self()

    owner =
      start(fn ->
        {:ok, listener} = :gen_tcp.listen(0, [:binary, active: false, sndbuf: 65_536])
        {:ok, number} = :inet.port(listener)
        opts = [:binary, active: false, recbuf: 65_536]
        {:ok, _client} = :gen_tcp.connect({127, 0, 0, 1}, number, opts)
        {:ok, server} = :gen_tcp.accept(listener)
        spawn(fn -> :gen_tcp.send(server, :binary.copy("x", bytes)) end)
        # (the test then finds less queued than it wants, and says so)
        wait_queued(server, div(bytes, 2), 500)
        send(me, {:stalled, server})
      end)

    receive do: ({:stalled, server} -> {owner, server})
  end

  # At most `tries` times 10 ms.
  defp wait_queued(_port, _at_least, 0), do: :ok

  defp wait_queued(port, at_least, tries) do
    case :erlang.port_info(port, :queue_size) do
      {:queue_size, queued} when queued >= at_least -> :ok
      _ -> Process.sleep(10) && wait_queued(port, at_least, tries - 1)
    end
  end

  # Runs `setup` in a new unlinked process, then parks it; returns once
  # `setup` is done so callers observe the finished state.
  defp start(setup, opts \\ [], then \\ &park/0) do
    caller = self()
    ref = make_ref()

    pid =
      :erlang.spawn_opt(
        fn ->
          setup.()
          send(caller, {ref, :ready})
          then.()
        end,
        opts
      )

    receive do: ({^ref, :ready} -> pid)
  end
end

defmodule Mtrace.VMScenarios.IdleServer do
  @moduledoc """
  A GenServer that waits for calls that never come (see
  `Mtrace.VMScenarios.idle_servers/2`).
  """
  use GenServer

  @impl true
  def init(state), do: {:ok, state}
end

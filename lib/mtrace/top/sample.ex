defmodule Mtrace.Top.Sample do
  @moduledoc """
  What one refresh of `Mtrace.top/1` shows, taken on the node watched (the
  view itself may run elsewhere): memory at a glance, the native sites that
  grew since the previous refresh, and the processes whose memory grew
  most. `traced` says whether the native tracer records this program's
  allocations (preloaded, and the program one `MTRACE_PROGRAMS` names);
  `left_out` that it is preloaded but `MTRACE_PROGRAMS` leaves the program
  out; `not_traced`, when the tracer cannot answer, `{reason, message}` as
  `Mtrace.Error` gives them (`:not_preloaded`, `:preload_mismatch`,
  `:nif_not_loaded`); `so`, when it is not traced, the path of the tracer
  library on that node (for the `LD_PRELOAD=` line the view gives). `take/3` is given the previous sample's `:state` to measure growth
  against; the first refresh has nothing to compare with, nor has one
  given a state from another run of the node (it restarted since: the
  state says which OS process and start time it came from).

  ## Rates

  The native sites that grew are read together with the new mark, before
  the processes are scanned (which takes seconds on a node with hundreds
  of thousands of them), and their rates divide by the time between the
  two marks on the tracer's clock (this node's clock when it is not
  traced): a slow scan neither adds to what they count nor to the time.
  The processes' rates divide by the time between two scans.

  ## What stays on the watched node

  The memory of every process at the last refresh (megabytes with
  hundreds of thousands of processes) does not travel to the view and
  back: a helper process on the watched node keeps it, scans the processes
  at each refresh and hands back only the `n` that grew most. It is the
  one process the view leaves running there between refreshes, and it ends
  when the process it serves (`:owner`, the view's renderer) ends or its
  node disconnects, or when no refresh has asked it for `:keep` ms. `:state`, what the view carries from one
  refresh to the next, is a few words: that helper, the tracer's mark, the
  native bytes, whether tracking was on, and the run of the node they
  belong to.
  """

  alias Mtrace.VM.{Memory, Native, Procs}

  @typedoc "One refresh; see the module documentation."
  @type t :: %{
          node: node,
          at_ms: integer,
          secs: float | nil,
          memory: map,
          traced: boolean,
          not_traced: {Mtrace.Error.reason(), String.t()} | nil,
          left_out: boolean,
          so: String.t() | nil,
          native_per_s: float | nil,
          reset: boolean,
          resumed: boolean,
          nif: [map] | {:error, atom},
          sites: [map],
          procs: [{pid, integer, float, term}],
          procs_secs: float | nil,
          state: map
        }

  @doc """
  A sample, growth measured against `state` (`nil` the first time); `n`
  rows of sites and processes at most. `secs` is the time since the sample
  `state` came from (`nil` for a first one); `procs_secs` the time between
  the two scans of the processes `procs` compares, `nil` (and `procs`
  empty) when the helper has no earlier scan. `reset` says the table was
  reset since `state`: `native_per_s` is then `nil`, and the sites' rates
  are over the time since the reset. `resumed` says tracking was switched
  on since `state`, which found it off: what was allocated between them
  was recorded for part of the time only, so `native_per_s` is `nil` and
  `sites` empty (the next sample has rates again).

  Options: `:viewers`, processes not to show (the view's own, when it runs
  on the node it watches; the caller and the helper are never shown);
  `:owner`, the process the helper serves, which it ends with (default
  none: it then ends only by `:keep`); `:keep`, ms the helper waits for
  the next sample before it ends (default 60_000).

  ## Example

      first = Mtrace.Top.Sample.take(nil, 5)
      second = Mtrace.Top.Sample.take(first.state, 5)
      second.secs > 0
      #=> true
  """
  @spec take(map | nil, pos_integer, keyword) :: t
  def take(state, n, opts \\ []) do
    incarnation = incarnation()
    state = if match?(%{incarnation: ^incarnation}, state), do: state

    at = System.monotonic_time(:millisecond)
    memory = read_memory()
    # The new mark, then the sites allocated from the last mark up to it:
    # the refreshes' windows tile, so a block allocated during the scan is
    # counted once, in the next one; the slow process scan comes after.
    mark = if memory.native, do: Native.mark()
    sites = if state && state.mark && mark, do: sites_between(n, state.mark, mark), else: []
    secs = secs(state, mark, at)
    reset = reset_since(state, memory)
    reset_ms = reset_ms(memory)
    # switched on since the last refresh: what grew since, over part of the time
    resumed = resumed?(state, memory)

    {helper, {procs, procs_secs}} =
      scan(state && state.helper, n, %{
        owner: Keyword.get(opts, :owner),
        keep: Keyword.get(opts, :keep, 60_000),
        viewers: Keyword.get(opts, :viewers, [])
      })

    %{
      node: node(),
      at_ms: at,
      secs: secs,
      memory: memory,
      traced: memory.native != nil,
      not_traced: why_not_traced(memory),
      left_out: match?(%{active: false}, Native.stats(false)),
      so: unless(memory.native, do: Native.so_path()),
      # a reset since the last refresh forgot what it held: no rate over it
      native_per_s: unless(reset || resumed, do: native_rate(state, memory, secs)),
      reset: reset != nil,
      resumed: resumed,
      nif: nif_rows(),
      sites:
        if(secs && state.mark && mark && not resumed,
          do: with_growth(sites, since_reset(reset, state.mark, mark) || secs),
          else: []
        ),
      procs: procs,
      procs_secs: procs_secs,
      state: %{
        incarnation: incarnation,
        at_ms: at,
        mark: mark,
        reset_ms: reset_ms,
        native: native_bytes(memory),
        enabled: enabled?(memory),
        helper: helper
      }
    }
  end

  # The node's memory, read in a short-lived process, whose exit frees what
  # it held. The reads of /proc make binaries (prim_file's) that the reader
  # holds, and the file server that hands them over, until they collect
  # garbage: the NIF/driver line, read next, would show them as a module
  # holding memory, and a process that samples every few seconds seldom
  # collects. The file server's are collected too (Mtrace.top's doc says
  # so): it is one small process, and its other garbage is no NIF's memory
  # either.
  # Not glibc's heap figures: the view does not show them, and reading them
  # every refresh would make the node's threads wait on its arenas.
  defp read_memory do
    memory =
      Task.async(fn -> Memory.read(heap: false) end)
      |> Task.await(:infinity)

    with pid when is_pid(pid) <- Process.whereis(:file_server_2),
         do: :erlang.garbage_collect(pid)

    memory
  end

  # Which run of the node this is: a restarted node has the same name, and
  # in a container often the same OS pid, but its own clocks and allocation
  # table. Its creation (drawn anew each time distribution starts) and the
  # system time it started at tell the runs apart.
  defp incarnation do
    started = :erlang.system_info(:start_time) + :erlang.time_offset()

    {System.pid(), :erlang.system_info(:creation),
     :erlang.convert_time_unit(started, :native, :second)}
  end

  # On the tracer's clock when both marks were taken; else (not traced) on
  # this node's, which the same run of the node keeps.
  defp secs(nil, _mark, _at), do: nil

  defp secs(%{mark: %{t_ms: before}}, %{t_ms: now}, _at), do: max(now - before, 1) / 1000
  defp secs(%{at_ms: before}, _mark, at), do: max(at - before, 1) / 1000

  # The n sites holding most of what was allocated in [from, to) and is
  # still live (estimates when sampling); [] when the tracer cannot say.
  defp sites_between(n, from, to) do
    o = Mtrace.Options.parse!([limit: n], [sort: :bytes, limit: 10], "sites/1")
    {_total, sites} = Mtrace.Query.sites_between(o, from, to)
    sites |> Enum.sort_by(&(-Mtrace.VMSites.bytes(&1))) |> Enum.take(n)
  rescue
    # the tracer cannot list them (switched off in this program, say)
    Mtrace.Error -> []
  end

  # The table's time of a reset made since the last refresh read it, or nil:
  # told by the time having moved, not by its place against the last mark,
  # which a reset made between that refresh's reading and its mark follows.
  defp reset_since(%{reset_ms: was}, memory) when is_integer(was) do
    case reset_ms(memory) do
      ^was -> nil
      now -> now
    end
  end

  # a state from an older mtrace: the reset against the mark
  defp reset_since(%{mark: %{t_ms: before}}, %{native: %{reset_ms: reset}})
       when is_integer(reset) and reset >= before,
       do: reset

  defp reset_since(_state, _memory), do: nil

  # Tracking switched on since the last refresh, which found it off: the
  # blocks allocated between them were recorded for only part of the time.
  defp resumed?(%{enabled: false}, memory), do: enabled?(memory) == true
  defp resumed?(_state, _memory), do: false

  defp enabled?(%{native: %{enabled: enabled}}), do: enabled
  defp enabled?(_memory), do: nil

  defp reset_ms(%{native: %{reset_ms: reset}}) when is_integer(reset), do: reset
  defp reset_ms(_memory), do: nil

  # What the sites hold was allocated since the reset, or since the last
  # mark when the reset came before it.
  defp since_reset(nil, _from, _to), do: nil

  defp since_reset(reset, %{t_ms: before}, %{t_ms: now}),
    do: max(now - max(reset, before), 1) / 1000

  # Why the tracer cannot answer here, as {reason, message}: not preloaded,
  # another release's library, the NIF not loaded; nil when it can.
  defp why_not_traced(%{native: nil}) do
    Mtrace.Query.native!(fn -> Mtrace.Native.stats(false) end)
    nil
  rescue
    e in Mtrace.Error -> {e.reason, Exception.message(e)}
  end

  defp why_not_traced(_memory), do: nil

  defp with_growth(sites, secs) do
    Enum.map(sites, &Map.put(&1, :growth_per_s, Map.get(&1, :est_bytes, &1.bytes) / secs))
  end

  defp native_bytes(%{native: %{live_bytes: bytes}}), do: bytes
  defp native_bytes(_memory), do: nil

  defp native_rate(%{native: before}, memory, secs) when is_integer(before) do
    case native_bytes(memory) do
      now when is_integer(now) -> (now - before) / secs
      _ -> nil
    end
  end

  defp native_rate(_state, _memory, _secs), do: nil

  # All of them (a few dozen modules at most): the view shows the first and
  # counts the rest.
  defp nif_rows do
    case Native.nif_memory() do
      {:ok, rows} -> rows
      {:error, reason} -> {:error, reason}
    end
  end

  # ---- the helper ----------------------------------------------------------------------

  # Asks the helper (a new one if it has ended) for the processes that grew
  # most since its last scan: {helper, {procs, secs}}, secs nil (and no
  # procs) when it has no earlier scan.
  defp scan(helper, n, ask) do
    helper = if alive?(helper), do: helper, else: start_helper(ask.owner)
    ref = Process.monitor(helper)
    send(helper, {:scan, self(), ref, n, ask})

    receive do
      {^ref, procs} ->
        Process.demonitor(ref, [:flush])
        {helper, procs}

      # ended (its keep ran out) between the check and the question
      {:DOWN, ^ref, :process, _, _} ->
        scan(nil, n, ask)
    end
  end

  defp alive?(pid) when is_pid(pid) and node(pid) == node() do
    Process.alive?(pid)
  rescue
    # a pid of an earlier run of the node, which bears its name
    ArgumentError -> false
  end

  defp alive?(_pid), do: false

  defp start_helper(owner) do
    spawn(fn ->
      # what it is, for whoever lists the node's processes
      Process.put(:"$initial_call", {__MODULE__, :helper, 0})
      # Without an owner (a caller that does not say, an older view) only
      # its keep ends it: the caller may be an RPC's short-lived process.
      owner = if is_pid(owner), do: Process.monitor(owner)
      helper(owner, nil, nil, 60_000)
    end)
  end

  # The memory of every process at the last scan, and when it was taken.
  defp helper(owner, procs, at, keep) do
    receive do
      {:scan, from, ref, n, ask} ->
        now = System.monotonic_time(:millisecond)
        now_procs = process_memory([self(), from | ask.viewers])
        secs = procs && max(now - at, 1) / 1000
        send(from, {ref, {if(secs, do: growing(procs, now_procs, secs, n), else: []), secs}})
        helper(owner, now_procs, now, min(ask.keep, 0xFFFF_FFFF))

      {:DOWN, ^owner, :process, _, _} ->
        :ok
    after
      keep -> :ok
    end
  end

  # Every other process's memory: the view leaves itself out.
  defp process_memory(left_out) do
    for pid <- Process.list(), pid not in left_out, into: %{} do
      {pid, Procs.value(pid, :memory) || 0}
    end
  end

  defp growing(before, now, secs, n) do
    now
    |> Enum.map(fn {pid, bytes} -> {pid, bytes, bytes - Map.get(before, pid, 0)} end)
    |> Enum.filter(fn {_pid, _bytes, delta} -> delta > 0 end)
    |> Enum.sort_by(fn {_pid, _bytes, delta} -> -delta end)
    |> Enum.take(n)
    |> Enum.map(fn {pid, bytes, delta} -> {pid, bytes, delta / secs, Procs.info(pid)} end)
  end
end

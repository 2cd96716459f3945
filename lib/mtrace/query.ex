defmodule Mtrace.Query do
  @moduledoc """
  The local half of the `Mtrace` queries: calls the NIF with checked
  arguments and turns its answers and errors into what `Mtrace` returns.

  `Mtrace` checks options and, for `node:`, calls these functions on the other
  node; so they run where the allocation table is.
  """

  alias Mtrace.{Native, Options}

  @doc """
  Runs a NIF call, raising `Mtrace.Error` when the tracer cannot answer.

      iex> is_boolean(Mtrace.Query.native!(&Mtrace.Native.preloaded/0))
      true
  """
  @spec native!((() -> result)) :: result when result: term()
  def native!(fun) do
    case fun.() do
      {:error, :not_preloaded} -> raise Mtrace.Error.not_preloaded()
      {:error, :preload_mismatch} -> raise Mtrace.Error.preload_mismatch()
      result -> result
    end
  rescue
    e in ErlangError ->
      case e do
        %ErlangError{original: :nif_not_loaded} ->
          raise Mtrace.Error.nif_not_loaded(Native.load_error())

        _ ->
          reraise e, __STACKTRACE__
      end
  end

  @doc """
  The `n` oldest live allocations matching the options map `o` (as checked by
  `Mtrace.Options.parse!/3`), as maps.

      iex> Mtrace.Query.olds(1, %{min_size: 1}) |> length() <= 1
      true
  """
  @spec olds(non_neg_integer(), map()) :: [Mtrace.old_map()]
  def olds(n, o), do: n |> olds_by_stack(o) |> with_stacks()

  @doc """
  `olds/2`'s answer with each distinct stack given once: `{stacks,
  entries}`, where `stacks` maps a stack id to its frames and each entry's
  `frames` is that id. This is what another node is sent: a message
  copies every occurrence of a term, so entries that shared one stack
  term would each carry the whole stack (a million entries of a few
  thousand stacks, gigabytes). `with_stacks/1` puts the stacks back.

      iex> {stacks, entries} = Mtrace.Query.olds_by_stack(1, %{min_size: 1})
      iex> Enum.all?(entries, &Map.has_key?(stacks, &1.frames))
      true
  """
  @spec olds_by_stack(non_neg_integer(), map()) ::
          {%{non_neg_integer() => [Mtrace.frame_map()]}, [map()]}
  def olds_by_stack(n, o) do
    filter = Options.filter(o, node())

    native!(fn -> Native.olds(n, Map.get(o, :demangle, true), filter, o[:lib], :maps) end)
    |> traced!()
    |> stacks_apart(& &1.frames, &%{&1 | frames: &2}, &Mtrace.Frame.named_all/1)
  end

  @doc """
  The entries of an `olds_by_stack/2` answer with their stacks put back,
  each stack one term shared by its entries.

      iex> Mtrace.Query.with_stacks({%{7 => []}, [%{age: 1, size: 8, addr: 16, ns: 0, frames: 7}]})
      [%{age: 1, size: 8, addr: 16, ns: 0, frames: []}]
  """
  @spec with_stacks({%{non_neg_integer() => [Mtrace.frame_map()]}, [map()]}) :: [Mtrace.old_map()]
  def with_stacks({stacks, entries}),
    do: Enum.map(entries, &%{&1 | frames: Map.fetch!(stacks, &1.frames)})

  @doc """
  The seed's form of `Mtrace.olds/2`: the `n` oldest allocations as tuples
  `{age_s, size, addr, ns, [{lib, symbol}]}`, Erlang frames as
  `{"erlang", "Module.function/arity"}`.

      iex> Mtrace.Query.olds_tuples(1, false) |> length() <= 1
      true
  """
  @spec olds_tuples(non_neg_integer(), boolean()) :: [Mtrace.old()]
  def olds_tuples(n, demangle) do
    all = {nil, nil, nil, nil, nil, nil}

    {stacks, entries} =
      native!(fn -> Native.olds(n, demangle, all, nil, :seed) end)
      |> traced!()
      |> stacks_apart(
        &elem(&1, 4),
        &put_elem(&1, 4, &2),
        &Mtrace.Frame.named_pairs_all/1
      )

    Enum.map(entries, &put_elem(&1, 4, Map.fetch!(stacks, elem(&1, 4))))
  end

  # The NIF answers {stack_id, entry}, the entries of one stack sharing one
  # term: each distinct stack is named once, apart, and its entries keep
  # its id. Naming entry by entry would build a copy for each, and a
  # million entries of a few thousand stacks would hold a million stacks'
  # frames (gigabytes).
  defp stacks_apart(answer, get, put, name_all) do
    {entries, stacks} =
      Enum.map_reduce(answer, %{}, fn {id, entry}, stacks ->
        {put.(entry, id), Map.put_new_lazy(stacks, id, fn -> get.(entry) end)}
      end)

    # the distinct stacks named together, their shared frames once
    {ids, frames} = Enum.unzip(stacks)
    {Map.new(Enum.zip(ids, name_all.(frames))), entries}
  end

  @doc """
  `{total, sites}`: the top sites matching `o` and the sum over every
  matching allocation (a site-shaped map with no frames).

      iex> {%{count: c}, sites} = Mtrace.Query.sites(%{limit: 3, sort: :bytes})
      iex> is_integer(c) and length(sites) <= 3
      true
  """
  @spec sites(map()) :: {Mtrace.site(), [Mtrace.site()]}
  def sites(o) do
    limit = if o.limit == :all, do: 0xFFFF_FFFF_FFFF_FFFF, else: o.limit
    filter = Options.filter(o, node())
    # Growth since a mark: what was allocated since and is still live, by bytes.
    order = if o.sort == :growth, do: :bytes, else: o.sort

    {total, sites} =
      native!(fn ->
        Native.sites(limit, order, Map.get(o, :demangle, true), filter, o[:lib])
      end)

    sites = traced!(sites)
    named = sites |> Enum.map(& &1.frames) |> Mtrace.Frame.named_all()
    sites = Enum.zip_with(sites, named, &%{&1 | frames: &2})
    {total, if(o.sort == :growth, do: with_growth(sites, o.since), else: sites)}
  end

  @doc """
  `{total, sites}` of the allocations made on this node from mark `from` up
  to mark `to` (before it) that are still live, with `o`'s other options:
  the windows of a watcher or a live view, which tile, so that no block
  falls between two of them or in both. Both marks must be this node's
  table's; the node's name may have changed since they were taken
  (distribution started or stopped), the table and its clock have not.

      iex> from = Mtrace.mark()
      iex> {_total, sites} = Mtrace.Query.sites_between(%{limit: 3, sort: :bytes}, from, Mtrace.mark())
      iex> length(sites) <= 3
      true
  """
  @spec sites_between(map(), Mtrace.Mark.t(), Mtrace.Mark.t()) :: {Mtrace.site(), [Mtrace.site()]}
  def sites_between(o, %Mtrace.Mark{t_ms: from}, %Mtrace.Mark{t_ms: to}) do
    sites(Map.merge(o, %{since: %Mtrace.Mark{node: node(), t_ms: from}, before: to}))
  end

  # An empty answer from a program the tracer does not trace (MTRACE_PROGRAMS
  # names another) would read as "nothing leaks": it raises instead. Only an
  # empty answer asks, so a query that finds something pays nothing more.
  defp traced!([]) do
    ensure_traced!()
    []
  end

  defp traced!(answer), do: answer

  @doc false
  # :ok, or Mtrace.Error :not_traced in a program the tracer does not trace.
  @spec ensure_traced!() :: :ok
  def ensure_traced! do
    # the table's figures only: glibc's heap walk (stats/0) waits on every
    # arena, and a quiet node's top or watcher asks at every refresh
    case native!(fn -> Native.stats(false) end) do
      %{active: false} -> raise Mtrace.Error.not_traced()
      _ -> :ok
    end
  end

  # Each site's bytes per second since the mark; nil within @rate_min_ms
  # of it: the table's clock is coarse (a tick of a few ms), and a block
  # allocated a tick after a mark would read as a thousand times its size
  # a second.
  @rate_min_ms 100
  defp with_growth(sites, %Mtrace.Mark{t_ms: t_ms}) do
    elapsed = native!(&Native.now_ms/0) - t_ms
    per_s = fn bytes -> if elapsed >= @rate_min_ms, do: bytes * 1000 / elapsed end
    Enum.map(sites, &Map.put(&1, :growth_per_s, per_s.(&1.est_bytes)))
  end

  @doc """
  Everything an output (report, export, flame graph) needs, taken on this
  node: `%{node, generated_at, stats, total, sites}`. `opts` are the query
  options of `Mtrace.sites/1` without `:node`.

      iex> %{total: %{bytes: b}, sites: s} = Mtrace.Query.snapshot(limit: 1)
      iex> is_integer(b) and length(s) <= 1
      true
  """
  @spec snapshot(keyword()) :: map()
  def snapshot(opts) do
    o = Options.parse!(opts, [sort: :bytes, limit: :all], "snapshot/1")
    {total, sites} = sites(o)

    %{
      node: node(),
      generated_at: DateTime.utc_now(),
      # as Mtrace.stats/1 gives it (misspelled settings in config_errors,
      # now_ms: a mark's t_ms, an export's `since`, is on that clock)
      stats: Map.from_struct(Mtrace.stats()),
      total: total,
      sites: sites,
      boot: boot(o, total)
    }
  end

  # With boot: false, what it left out: the allocations, matching the other
  # options, made before mtrace started (a site-shaped total); :not_started
  # when the application has not started, so nothing can be left out.
  # Asked for by time, not as all minus the total: blocks allocated between
  # the two queries (the modules an output loads, say) are not the boot's.
  defp boot(%{boot: false} = o, _total) do
    if t = Options.started_ms() do
      {before, _} = sites(Map.merge(o, %{boot: true, limit: 1, sort: :bytes, before: t}))
      Map.take(before, [:count, :bytes, :est_count, :est_bytes])
    else
      :not_started
    end
  end

  defp boot(_o, _total), do: nil

  @doc """
  The first tick of the table's clock after now, so that every allocation
  made before the call is older than the mark and every one made after is
  not (the clock is coarse: a few ms per tick).

      iex> Mtrace.Query.next_tick() > 0
      true
  """
  @spec next_tick() :: non_neg_integer()
  def next_tick do
    t0 = native!(&Native.now_ms/0)
    wait_past(t0)
  end

  defp wait_past(t0) do
    case Native.now_ms() do
      t when t > t0 ->
        t

      _ ->
        Process.sleep(1)
        wait_past(t0)
    end
  end
end

defmodule Mtrace.VM.ETS do
  @moduledoc """
  ETS tables ranked by memory or by number of objects.

  Table memory is the figure `:ets.info(table, :memory)` reports (words,
  converted to bytes). Off-heap binaries larger than 64 bytes stored in a
  table are not part of it: they count under `binary` in `erlang:memory/0`.
  """

  import Mtrace.VM.Procs, only: [ranking: 1, rank: 3, ranked: 1]
  alias Mtrace.VM.Procs

  @typedoc "How a table is described in results."
  @type info :: [
          name: atom,
          owner: pid,
          size: non_neg_integer,
          memory_bytes: non_neg_integer
        ]

  @doc """
  The `n` largest tables by `:memory` (bytes) or `:size` (objects).

  ## Example

      [{_table, _bytes, [name: _, owner: _, size: _, memory_bytes: _]} | _] =
        Mtrace.VM.ETS.top(:memory, 3)
  """
  @spec top(:memory | :size, pos_integer) :: [{:ets.table(), non_neg_integer, info}]
  def top(by, n) do
    word = :erlang.system_info(:wordsize)

    :ets.all()
    |> Enum.reduce({ranking(n), %{}}, fn table, {top, infos} ->
      case describe(table, word) do
        nil -> {top, infos}
        info -> {rank(top, table, info[by_key(by)]), Map.put(infos, table, info)}
      end
    end)
    |> then(fn {top, infos} ->
      for {table, value} <- ranked(top), do: {table, value, Map.fetch!(infos, table)}
    end)
  end

  @doc """
  Every table's memory in bytes, keyed by table; tables deleted meanwhile are
  left out.

  ## Example

      %{} = Mtrace.VM.ETS.sizes()
  """
  @spec sizes() :: %{:ets.table() => non_neg_integer}
  def sizes do
    word = :erlang.system_info(:wordsize)

    for table <- :ets.all(), info = describe(table, word), info != nil, into: %{} do
      {table, info[:memory_bytes]}
    end
  end

  @doc """
  Name, owner, size and memory of one table, or `nil` if it no longer exists.

  ## Example

      [name: :ac_tab, owner: _, size: _, memory_bytes: _] =
        Mtrace.VM.ETS.describe(:ac_tab, 8)
  """
  @spec describe(:ets.table(), pos_integer) :: info | nil
  def describe(table, word) do
    with name when is_atom(name) <- :ets.info(table, :name),
         owner when is_pid(owner) <- :ets.info(table, :owner),
         size when is_integer(size) <- :ets.info(table, :size),
         words when is_integer(words) <- :ets.info(table, :memory) do
      [name: name, owner: owner, size: size, memory_bytes: words * word]
    else
      _ -> nil
    end
  end

  @doc """
  Estimated bytes of refc binaries (over 64 bytes) that `table` references,
  which `:ets.info(table, :memory)` leaves out; `nil` if the table cannot be
  read (private to another process, or deleted), if its objects average
  over 4 MiB (objects read are copied: at most 4 MiB of them are), or if it
  is compressed (its objects' size is known only once copied).

  Measured on the first `samples` objects and scaled to the table's size, so
  binaries shared by many objects are counted once per object (a slice
  counts the whole binary it is part of, which it keeps alive): never more
  than the node's binary memory (`erlang:memory(binary)`), which a table of
  slices of one large binary would pass many times over.

  ## Example

      t = :ets.new(:t, [])
      :ets.insert(t, {1, :binary.copy("x", 1000)})
      1000 = Mtrace.VM.ETS.binary_estimate(t, 64)
  """
  @spec binary_estimate(:ets.table(), pos_integer) :: non_neg_integer | nil
  def binary_estimate(table, samples) do
    with samples when samples > 0 <- affordable(table, samples),
         {objects, _continuation} when objects != [] <-
           :ets.select(table, [{:_, [], [:"$_"]}], samples),
         # deleted between the two reads: :undefined
         size when is_integer(size) <- :ets.info(table, :size) do
      bytes = Enum.reduce(objects, 0, &(offheap(&1, 1_000) + &2))
      estimate = round(bytes / length(objects) * size)

      case Procs.binary_memory() do
        all when is_integer(all) -> min(estimate, all)
        nil -> estimate
      end
    else
      :"$end_of_table" -> 0
      _gone_or_too_large -> nil
    end
  rescue
    ArgumentError -> nil
  end

  # Objects read copies them into the caller: at most @sample_bytes of them
  # by the table's average, and none of objects larger than that.
  @sample_bytes 4 * 1024 * 1024

  defp affordable(table, samples) do
    # compressed, an object's size is known only once it is copied out
    with false <- :ets.info(table, :compressed),
         words when is_integer(words) <- :ets.info(table, :memory),
         size when is_integer(size) and size > 0 <- :ets.info(table, :size) do
      each = div(words * :erlang.system_info(:wordsize), size) + 1
      min(samples, div(@sample_bytes, each))
    else
      true -> 0
      _ -> samples
    end
  end

  @doc """
  `binary_estimate/2` for the tables of `sizes` (bytes by table, as
  `sizes/0` gives them), largest first, in tiers: `{count, samples}` takes
  the next `count` tables with `samples` objects each. Returns
  `{[{table, bytes, binaries | nil}], unsampled}`, `unsampled` being how
  many tables no tier reached. A table's memory leaves out the binaries
  it references, so a small table can keep the most: a wide tier with
  few samples each finds it at a bounded cost (`count * samples` objects
  read at most).

  ## Example

      t = :ets.new(:t, [])
      :ets.insert(t, {1, :binary.copy("x", 1000)})
      {[{^t, _bytes, 1000}], 0} = Mtrace.VM.ETS.binary_estimates(%{t => 100}, [{3, 64}])
  """
  @spec binary_estimates(%{:ets.table() => non_neg_integer}, [{non_neg_integer, pos_integer}]) ::
          {[{:ets.table(), non_neg_integer, non_neg_integer | nil}], non_neg_integer}
  def binary_estimates(sizes, tiers) do
    sizes |> Enum.sort_by(&(-elem(&1, 1))) |> estimate_tiers(tiers, [])
  end

  defp estimate_tiers(left, [], done), do: {Enum.reverse(done), length(left)}

  defp estimate_tiers(left, [{count, samples} | tiers], done) do
    {these, left} = Enum.split(left, count)

    done =
      Enum.reduce(these, done, fn {t, b}, acc -> [{t, b, binary_estimate(t, samples)} | acc] end)

    estimate_tiers(left, tiers, done)
  end

  # Bytes of off-heap binaries in a term, visiting at most about `budget`
  # terms: sampling is meant to be cheap even when objects are huge.
  defp offheap(term, budget) do
    {bytes, _} = walk(term, {0, budget})
    bytes
  end

  defp walk(_term, {_, budget} = acc) when budget <= 0, do: acc

  defp walk(term, {bytes, budget}) when is_binary(term) do
    size = :binary.referenced_byte_size(term)
    {if(size > 64, do: bytes + size, else: bytes), budget - 1}
  end

  defp walk(term, {bytes, budget}) when is_tuple(term) do
    term |> Tuple.to_list() |> walk({bytes, budget - 1})
  end

  defp walk([head | tail], acc), do: walk(tail, walk(head, acc))

  defp walk(term, {bytes, budget}) when is_map(term) do
    term |> Map.to_list() |> walk({bytes, budget - 1})
  end

  defp walk(_term, {bytes, budget}), do: {bytes, budget - 1}

  defp by_key(:memory), do: :memory_bytes
  defp by_key(:size), do: :size
end

defmodule Mtrace.VM.TopN do
  @moduledoc """
  Keeps the `n` largest `{key, value}` pairs seen so far, and nothing else.

  Scanning hundreds of thousands of processes must not build a list of them
  all just to sort it and keep ten, so values are streamed into an ordered
  set that never holds more than `n` elements: a new pair either beats the
  current smallest (which is then dropped) or is discarded at once.
  """

  @opaque t :: {non_neg_integer, pos_integer, :gb_sets.set({number, term})}

  @doc """
  An empty collection that keeps at most `n` pairs.

  ## Example

      iex> Mtrace.VM.TopN.new(3) |> Mtrace.VM.TopN.to_list()
      []
  """
  @spec new(pos_integer) :: t
  def new(n) when is_integer(n) and n > 0, do: {0, n, :gb_sets.new()}

  @doc """
  Offers `value` for `key`; it is kept only if it is among the `n` largest.

  Keys must be distinct within one collection (pids, tables).

  ## Example

      iex> alias Mtrace.VM.TopN
      iex> TopN.new(2) |> TopN.add(:a, 1) |> TopN.add(:b, 3) |> TopN.add(:c, 2) |> TopN.to_list()
      [b: 3, c: 2]
  """
  @spec add(t, term, number) :: t
  def add({size, n, set}, key, value) when size < n do
    {size + 1, n, :gb_sets.add({value, key}, set)}
  end

  def add({size, n, set} = top, key, value) do
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

      iex> alias Mtrace.VM.TopN
      iex> TopN.new(5) |> TopN.add(:x, 10) |> TopN.add(:y, 20) |> TopN.to_list()
      [y: 20, x: 10]
  """
  @spec to_list(t) :: [{term, number}]
  def to_list({_, _, set}) do
    set |> :gb_sets.to_list() |> Enum.reverse() |> Enum.map(fn {value, key} -> {key, value} end)
  end
end

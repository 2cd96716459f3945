defmodule Mtrace.Test.TermGen do
  @moduledoc false
  # A small generator of arbitrary terms for randomized tests.
  #
  # Every choice is drawn from :rand's per-process state (Enum.random/1 draws
  # from it too), so after seed/2 a run reproduces exactly: the tests seed it
  # from ExUnit's --seed. Terms stay small (a few levels deep, a few elements
  # wide) and cover what a careless caller might pass: integers of every size
  # and sign, floats up to the largest double, atoms, binaries with invalid
  # UTF-8 and NUL bytes, charlists, proper and improper lists, tuples, maps,
  # keyword lists mixing known and unknown keys, pids, references and funs.
  #
  # The generator never makes paths: binaries are arbitrary bytes, and the
  # tests decide themselves where a file may be written.

  import Bitwise

  # Integers at the edges of the machine types the C side uses.
  @edges [
    0,
    1,
    2,
    255,
    256,
    (1 <<< 31) - 1,
    1 <<< 31,
    (1 <<< 32) - 1,
    1 <<< 32,
    (1 <<< 63) - 1,
    1 <<< 63,
    (1 <<< 64) - 1,
    1 <<< 64,
    1 <<< 70,
    1 <<< 200
  ]

  @floats [
    0.0,
    -0.0,
    0.5,
    1.5,
    -2.5,
    100.0,
    1.0e-300,
    5.0e-324,
    1.0e18,
    1.0e300,
    1.0e306,
    -1.0e306,
    1.7976931348623157e308,
    -1.7976931348623157e308
  ]

  # Atoms the code under test gives meaning to (option names and values,
  # function names), and some it does not. No atom here names a node (none
  # contains "@"), so a random node: option fails at once instead of
  # waiting for a host lookup.
  @atoms [
    :since,
    :min_age,
    :max_age,
    :min_size,
    :max_size,
    :lib,
    :demangle,
    :node,
    :timeout,
    :sort,
    :limit,
    :frames,
    :format,
    :weight,
    :title,
    :width,
    :interval,
    :intervals,
    :min_growth,
    :name,
    :window,
    :gc,
    :print,
    :bytes,
    :count,
    :oldest,
    :all,
    :folded,
    :json,
    :svg,
    :memory,
    :size,
    :binary_memory,
    :message_queue_len,
    :reductions,
    :heap_size,
    :links,
    :auto,
    :infinity,
    :stats,
    :sites,
    :olds,
    :mark,
    :reset,
    :enable,
    :disable,
    :preloaded?,
    :halt,
    true,
    false,
    nil,
    :ok,
    :error,
    :x,
    :"",
    :"with space",
    :ünïcödé,
    Mtrace,
    Mtrace.Mark
  ]

  @doc "Seeds the generator: the same `seed` and `salt` give the same terms."
  def seed(seed, salt) when is_integer(seed) do
    :rand.seed(:exsss, {seed, :erlang.phash2(salt), 0x5EED})
  end

  @doc "An arbitrary term nested at most `depth` levels."
  def term(depth \\ 3)
  def term(depth) when depth <= 0, do: scalar()

  def term(depth) do
    case :rand.uniform(12) do
      n when n <= 6 -> scalar()
      7 -> list(depth - 1)
      8 -> improper_list(depth - 1)
      9 -> tuple(depth - 1)
      10 -> map(depth - 1)
      11 -> keyword(%{}, depth - 1)
      12 -> charlist()
    end
  end

  @doc "A term that is not a container."
  def scalar do
    case :rand.uniform(9) do
      n when n <= 3 -> integer()
      4 -> float()
      5 -> atom()
      6 -> binary()
      7 -> pid()
      8 -> make_ref()
      9 -> fun()
    end
  end

  @doc "An integer: small, negative, at a machine edge, or a bignum."
  def integer do
    case :rand.uniform(8) do
      1 -> Enum.random(@edges)
      2 -> -Enum.random(@edges)
      3 -> :rand.uniform(100) - 1
      4 -> -:rand.uniform(1000)
      5 -> :rand.uniform(1 <<< 40)
      6 -> :rand.uniform(1 <<< 100) * Enum.random([1, -1])
      7 -> :rand.uniform(1_000_000)
      8 -> Enum.random(@edges) + Enum.random([-1, 0, 1])
    end
  end

  @doc "A float: an edge case of IEEE doubles or a random one."
  def float do
    case :rand.uniform(3) do
      1 -> Enum.random(@floats)
      2 -> :rand.uniform() * 1000.0
      3 -> -:rand.uniform() * 1.0e10
    end
  end

  @doc "An atom from a fixed pool (no new atoms are created)."
  def atom, do: Enum.random(@atoms)

  @doc "A binary: empty, text, random bytes, invalid UTF-8, NUL bytes, or long."
  def binary do
    case :rand.uniform(7) do
      1 -> ""
      2 -> Enum.random(["leaky_nif", "beam.smp", "libc", "x", "ü日本", "a b"])
      3 -> bytes(:rand.uniform(24))
      4 -> <<0xFF, 0xFE, 0xC3>> <> bytes(:rand.uniform(4))
      5 -> "nul" <> <<0>> <> "byte"
      6 -> :binary.copy("a", 500 + :rand.uniform(100))
      7 -> <<0>>
    end
  end

  @doc "`n` random bytes."
  def bytes(n), do: :rand.bytes(n)

  @doc "A charlist, sometimes with code points beyond Latin-1."
  def charlist do
    Enum.random([~c"abc", ~c"", [0x1F600, ?a], [1, 2, 3], ~c"leaky_nif"])
  end

  @doc "A pid: this process, or one that has exited."
  def pid do
    if :rand.uniform(2) == 1, do: self(), else: :erlang.list_to_pid(~c"<0.9999.0>")
  end

  @doc "A fun of some arity."
  def fun do
    Enum.random([fn -> :ok end, fn x -> x end, &Kernel.+/2, &Mtrace.stats/0])
  end

  @doc "A proper list of up to 4 terms."
  def list(depth), do: for(_ <- 1..(:rand.uniform(5) - 1)//1, do: term(depth))

  @doc "A non-empty list whose last tail is not []."
  def improper_list(depth) do
    tail = Enum.random([:tail, 1, "bin", {}])
    [term(depth) | list(depth)] |> Enum.reverse() |> Enum.reduce(tail, &[&1 | &2])
  end

  @doc "A tuple of up to 4 terms."
  def tuple(depth), do: depth |> list() |> List.to_tuple()

  @doc "A map of up to 3 entries."
  def map(depth) do
    for _ <- 1..:rand.uniform(4)//1, into: %{}, do: {term(depth), term(depth)}
  end

  @doc """
  A keyword-like list of up to 4 entries. `known` maps option names to a
  function that draws a valid value; most entries use them, the others are
  a known name with an arbitrary value, an unknown name, a non-atom key or
  a bare term. Sometimes the list is improper.
  """
  def keyword(known, depth \\ 2) do
    keys = Map.keys(known)

    entries =
      for _ <- 1..(:rand.uniform(5) - 1)//1 do
        case {:rand.uniform(100), keys} do
          {n, [_ | _]} when n <= 75 ->
            key = Enum.random(keys)
            {key, Map.fetch!(known, key).()}

          {n, [_ | _]} when n <= 85 ->
            {Enum.random(keys), term(depth)}

          {n, _} when n <= 93 ->
            {atom(), term(depth)}

          {n, _} when n <= 97 ->
            {Enum.random(["limit", 1, {:a}]), term(depth)}

          _ ->
            term(depth)
        end
      end

    if :rand.uniform(20) == 1, do: entries ++ Enum.random([:tail, {:limit, 1}]), else: entries
  end
end

defmodule Mtrace.Options do
  @moduledoc """
  Checks the keyword options of the `Mtrace` queries and turns them into what
  the NIF takes.

  Every check names the option and the function in its `ArgumentError`, so a
  caller sees at once what was wrong; nothing reaches C unchecked. The same
  checks serve the functions with options and arguments of their own
  (`Mtrace.VM`, `Mtrace.top/1`, `Mtrace.Watch`): `parse!/4` and `arg!/4`,
  so that every bad input reads alike.
  """

  import Bitwise
  alias Mtrace.Mark

  # Limits of the C side: counts and sizes are unsigned 64-bit, lib names
  # are matched as C strings of at most 511 bytes.
  @u64_max 0xFFFF_FFFF_FFFF_FFFF
  @lib_max 511

  # What each option must be, for error messages.
  @expected %{
    min_age: "a non-negative number of seconds",
    max_age: "a non-negative number of seconds",
    min_size: "a non-negative integer of bytes",
    max_size: "a non-negative integer of bytes",
    since: "a mark from Mtrace.mark/1",
    lib: "a string",
    demangle: "a boolean",
    heap: "a boolean",
    node: "a node name (atom)",
    sort: "one of :bytes, :count, :oldest, :growth",
    boot: "a boolean",
    window: "a positive integer of milliseconds",
    weight: "one of :bytes, :count",
    format: "one of :folded, :json",
    limit: "a positive integer or :all",
    frames: "a positive integer",
    width: "an integer of pixels from 100 to 100000",
    title: "a string",
    timeout: "a positive integer of milliseconds or :infinity"
  }

  @filter_keys [
    :since,
    :min_age,
    :max_age,
    :min_size,
    :max_size,
    :lib,
    :boot,
    :demangle,
    :node,
    :timeout
  ]

  @doc """
  The option names every query accepts (filters, `:demangle`, `:node`).

      iex> :min_age in Mtrace.Options.filter_keys()
      true
  """
  @spec filter_keys() :: [atom()]
  def filter_keys, do: @filter_keys

  @doc """
  Checks that `opts` is a keyword list of known keys with valid values and
  returns it as a map, `defaults` filled in. `where` names the function in
  error messages.

      iex> Mtrace.Options.parse!([min_size: 10], [limit: 10], "sites/1")
      %{limit: 10, min_size: 10}

      iex> Mtrace.Options.parse!([colour: :red], [], "sites/1")
      ** (ArgumentError) unknown option :colour for Mtrace.sites/1; known options: :since, :min_age, :max_age, :min_size, :max_size, :lib, :boot, :demangle, :node, :timeout
  """
  @spec parse!(term(), keyword(), String.t()) :: map()
  def parse!(opts, defaults, where) do
    opts
    |> parse(defaults, where, Enum.uniq(@filter_keys ++ Keyword.keys(defaults)), &check!/3)
    |> ordered!(:min_size, :max_size, where)
    |> ordered!(:min_age, :max_age, where)
  end

  # A lower bound above its upper bound would quietly match nothing.
  defp ordered!(o, low, high, where) do
    case o do
      %{^low => lo, ^high => hi} when is_number(lo) and is_number(hi) and lo > hi ->
        raise ArgumentError,
              "Mtrace.#{where}: option #{inspect(low)} (#{lo}) is greater than " <>
                "#{inspect(high)} (#{hi}): nothing could match"

      _ ->
        o
    end
  end

  @doc """
  `parse!/3` for a function that only reads counters or the clock
  (`Mtrace.stats/1`, `Mtrace.mark/1`): the filters mean nothing there, so
  only `:node` and `:timeout` are known, and the function's own `extra`
  ones (`stats/1`'s `:heap`).

      iex> Mtrace.Options.parse_remote!([node: :"a@h"], "stats/1")
      %{node: :"a@h"}

      iex> Mtrace.Options.parse_remote!([lib: "x"], "stats/1")
      ** (ArgumentError) unknown option :lib for Mtrace.stats/1; known options: :node, :timeout
  """
  @spec parse_remote!(term(), String.t(), [atom()]) :: map()
  def parse_remote!(opts, where, extra \\ []),
    do: parse(opts, [], where, [:node, :timeout | extra], &check!/3)

  @doc """
  `parse!/3` for a function whose options are its own (`Mtrace.VM`,
  `Mtrace.top/1`, `Mtrace.Watch`): the known options are the keys of
  `defaults` only, and each value given is checked by its rule in `rules`
  (see `arg!/4`); an option without a rule takes any value.

      iex> Mtrace.Options.parse!([print: false], [print: true, window: nil], "VM.diagnose/1",
      ...>   print: :boolean, window: {:or, {:ms, 1}, nil})
      %{print: false, window: nil}

      iex> Mtrace.Options.parse!([print: :maybe], [print: true], "VM.diagnose/1", print: :boolean)
      ** (ArgumentError) option :print of Mtrace.VM.diagnose/1 must be a boolean, got: :maybe
  """
  @spec parse!(term(), keyword(), String.t(), [{atom(), rule()}]) :: map()
  def parse!(opts, defaults, where, rules) do
    parse(opts, defaults, where, Keyword.keys(defaults), fn key, value, where ->
      case Keyword.fetch(rules, key) do
        {:ok, rule} -> if ok?(rule, value), do: value, else: bad!(key, value, where, what(rule))
        :error -> value
      end
    end)
  end

  defp parse(opts, defaults, where, known, check) do
    unless Keyword.keyword?(opts) do
      raise ArgumentError,
            "options for Mtrace.#{where} must be a keyword list, got: #{inspect(opts)}"
    end

    Enum.reduce(opts, Map.new(defaults), fn {key, value}, acc ->
      unless key in known do
        raise ArgumentError,
              "unknown option #{inspect(key)} for Mtrace.#{where}; known options: " <>
                Enum.map_join(known, ", ", &inspect/1)
      end

      Map.put(acc, key, check.(key, value, where))
    end)
  end

  @typedoc """
  What an argument or an option must be, for `arg!/4` and `parse!/4`:

    * `:boolean`;
    * `:pos_int` — an integer greater than zero;
    * `{:pos_int, max}` — an integer from 1 to `max` (a count the tracer
      takes as a 64-bit word: `max` 2^64 - 1);
    * `:non_neg_int` — an integer of zero or more;
    * `:node` — a node name (an atom other than `nil`);
    * `{:ms, min}` — an integer of milliseconds from `min` to 2^32 - 1, as
      the VM's timers take;
    * `{:one_of, values}` — one of `values`;
    * `{:or, rule, value}` — `value` itself, or what `rule` accepts
      (`{:or, :pos_int, :infinity}`).
  """
  @type rule ::
          :boolean
          | :pos_int
          | {:pos_int, pos_integer()}
          | :non_neg_int
          | :node
          | {:ms, non_neg_integer()}
          | {:one_of, [term()]}
          | {:or, rule(), term()}

  @doc """
  Checks a positional argument of function `where`: returns `value` when
  it is what `rule` (see `t:rule/0`) accepts, else raises `ArgumentError`
  naming the argument.

      iex> Mtrace.Options.arg!(5, :pos_int, "n", "VM.top/2")
      5

      iex> Mtrace.Options.arg!(:rows, {:one_of, [:memory, :size]}, "by", "VM.ets_top/2")
      ** (ArgumentError) Mtrace.VM.ets_top/2: by must be one of :memory, :size, got: :rows
  """
  @spec arg!(term(), rule(), String.t(), String.t()) :: term()
  def arg!(value, rule, name, where) do
    if ok?(rule, value) do
      value
    else
      raise ArgumentError,
            "Mtrace.#{where}: #{name} must be #{what(rule)}, got: #{inspect(value)}"
    end
  end

  defp ok?(:boolean, v), do: is_boolean(v)
  defp ok?(:pos_int, v), do: is_integer(v) and v > 0
  defp ok?({:pos_int, max}, v), do: is_integer(v) and v > 0 and v <= max
  defp ok?(:non_neg_int, v), do: is_integer(v) and v >= 0
  defp ok?(:node, v), do: is_atom(v) and v != nil
  defp ok?({:ms, min}, v), do: is_integer(v) and v >= min and v < 1 <<< 32
  defp ok?({:one_of, values}, v), do: v in values
  defp ok?({:or, rule, alt}, v), do: v === alt or ok?(rule, v)

  defp what(:boolean), do: "a boolean"
  defp what(:pos_int), do: "a positive integer"
  defp what({:pos_int, max}), do: "a positive integer up to #{max}"
  defp what(:non_neg_int), do: "a non-negative integer"
  defp what(:node), do: "a node name (atom)"
  defp what({:ms, min}), do: "an integer of milliseconds from #{min} to #{(1 <<< 32) - 1}"
  defp what({:one_of, values}), do: "one of " <> Enum.map_join(values, ", ", &inspect/1)
  defp what({:or, rule, alt}), do: "#{what(rule)} or #{inspect(alt)}"

  @doc """
  The filter tuple the NIF takes, `{since_ms, min_age_ms, max_age_ms,
  min_size, max_size, before_ms}` (`nil` = no bound), after checking that a
  `:since` mark belongs to `node`. `before_ms` (allocated before that time
  on the table's clock) is not a user's option: `report/1` counts the
  boot's blocks with it.

      iex> Mtrace.Options.filter(%{min_age: 2, min_size: 64}, node())
      {nil, 2000, nil, 64, nil, nil}
  """
  @spec filter(map(), node()) :: tuple()
  def filter(o, node) do
    since =
      case o[:since] do
        nil ->
          nil

        %Mark{node: ^node, t_ms: t} ->
          t

        %Mark{node: other} ->
          foreign_mark!(other, node)
      end

    since = if o[:boot] == false, do: max(since || 0, started_ms() || 0), else: since
    {since, ms(o[:min_age]), ms(o[:max_age]), o[:min_size], o[:max_size], o[:before]}
  end

  @doc """
  When the mtrace application started on this node, on the table's clock
  (`nil` if the tracer was not preloaded then). What was allocated before
  it, while the VM booted and loaded code, is what `boot: false` leaves out.

      iex> t = Mtrace.Options.started_ms()
      iex> is_integer(t) or t == nil
      true
  """
  @spec started_ms() :: non_neg_integer() | nil
  def started_ms, do: :persistent_term.get({Mtrace, :started_ms}, nil)

  @doc """
  The node a query runs on: option `:node`; else the node that took the
  `:since` mark (a mark only means something there); else this node.
  Raises `ArgumentError` when `:node` names another node than the mark's.

      iex> Mtrace.Options.target(%{})
      node()
      iex> Mtrace.Options.target(%{since: %Mtrace.Mark{node: :"a@h", t_ms: 5}})
      :"a@h"
  """
  @spec target(map()) :: node()
  def target(%{node: node, since: %Mark{node: other}}) when node != nil and node != other,
    do: foreign_mark!(other, node)

  def target(%{node: node}) when node != nil, do: node
  def target(%{since: %Mark{node: node}}), do: node
  def target(_o), do: node()

  defp foreign_mark!(mark_node, query_node) do
    raise ArgumentError,
          "option :since: the mark was taken on #{inspect(mark_node)}, but the query runs " <>
            "on #{inspect(query_node)}; marks only compare on the node that took them"
  end

  defp ms(nil), do: nil
  defp ms(seconds) when seconds >= @u64_max / 1000, do: @u64_max
  defp ms(seconds), do: min(round(seconds * 1000), @u64_max)

  defp check!(key, value, _where)
       when key in [:min_age, :max_age] and is_number(value) and value >= 0,
       do: value

  defp check!(key, value, _where)
       when key in [:min_size, :max_size] and is_integer(value) and value >= 0 and
              value <= @u64_max,
       do: value

  defp check!(:since, %Mark{node: n, t_ms: t} = mark, _where)
       when is_atom(n) and is_integer(t) and t >= 0 and t <= @u64_max,
       do: mark

  defp check!(:lib, lib, where) when is_binary(lib) do
    cond do
      lib == "" -> bad!(:lib, lib, where, "a non-empty string")
      byte_size(lib) > @lib_max -> bad!(:lib, lib, where, "at most #{@lib_max} bytes")
      String.contains?(lib, <<0>>) -> bad!(:lib, lib, where, "a string without NUL bytes")
      true -> lib
    end
  end

  defp check!(key, value, _where) when key in [:demangle, :boot, :heap] and is_boolean(value),
    do: value

  defp check!(:node, value, _where) when is_atom(value) and not is_nil(value), do: value
  defp check!(:sort, value, _where) when value in [:bytes, :count, :oldest, :growth], do: value

  defp check!(:window, value, _where) when is_integer(value) and value > 0 and value < 1 <<< 32,
    do: value

  defp check!(:weight, value, _where) when value in [:bytes, :count], do: value
  defp check!(:format, value, _where) when value in [:folded, :json], do: value

  defp check!(:limit, value, _where)
       when (is_integer(value) and value > 0 and value <= @u64_max) or value == :all,
       do: value

  defp check!(:frames, value, _where) when is_integer(value) and value > 0, do: value

  defp check!(:width, value, _where)
       when is_integer(value) and value >= 100 and value <= 100_000,
       do: value

  defp check!(:title, value, _where) when is_binary(value), do: value
  defp check!(:timeout, value, _where) when value == :infinity, do: value

  defp check!(:timeout, value, _where) when is_integer(value) and value > 0 and value < 1 <<< 32,
    do: value

  defp check!(key, value, where), do: bad!(key, value, where, expected(key))

  defp expected(key), do: Map.get(@expected, key, "a valid value")

  defp bad!(key, value, where, what) do
    raise ArgumentError,
          "option #{inspect(key)} of Mtrace.#{where} must be #{what}, got: #{inspect(value)}"
  end
end

defmodule Mtrace.JSON do
  @moduledoc """
  A small JSON encoder, so that exports need no dependency.

  | Elixir | JSON |
  | --- | --- |
  | map with atom or binary keys | object, keys sorted |
  | list | array |
  | binary (valid UTF-8) | string |
  | integer, float | number |
  | `true`, `false` | `true`, `false` |
  | `nil` | `null` |
  | other atom | string |

  `Mtrace.JSON.Encoded` holds text already encoded, written as it is.
  Anything else (tuples, pids, other structs, improper lists, binaries that are not
  valid UTF-8, other map keys) raises `ArgumentError` rather than producing
  output a reader would reject or misread.

  Object keys are sorted so that the same data always gives the same text;
  two keys that spell the same string (`:a` and `"a"`) raise, since a reader
  would keep only one of them. In strings, `"`, `\\` and the control
  characters are escaped (controls as `\\u00XX`), as are U+2028 and U+2029 so
  that the text is also valid JavaScript; all other characters pass through
  as UTF-8.
  """

  @doc """
  Encodes `term` as JSON text (iodata; `IO.iodata_to_binary/1` makes it a binary).

  ## Examples

      iex> Mtrace.JSON.encode(%{name: "malloc", frames: [1, 2.5, nil, true]}) |> IO.iodata_to_binary()
      ~s|{"frames":[1,2.5,null,true],"name":"malloc"}|
      iex> Mtrace.JSON.encode("tab\\t\\"quote\\" é") |> IO.iodata_to_binary()
      ~S|"tab\\u0009\\"quote\\" é"|
      iex> Mtrace.JSON.encode({:not, :json})
      ** (ArgumentError) Mtrace.JSON cannot encode {:not, :json}
  """
  @spec encode(term()) :: iodata()
  def encode(nil), do: "null"
  def encode(true), do: "true"
  def encode(false), do: "false"
  def encode(atom) when is_atom(atom), do: string(Atom.to_string(atom))
  def encode(binary) when is_binary(binary), do: string(binary)
  def encode(integer) when is_integer(integer), do: Integer.to_string(integer)
  # :short prints the shortest text that reads back as the same float.
  def encode(float) when is_float(float), do: :erlang.float_to_binary(float, [:short])
  def encode(list) when is_list(list), do: [?[, elements(list, list), ?]]
  def encode(%Mtrace.JSON.Encoded{iodata: iodata}), do: iodata
  def encode(%{__struct__: _} = struct), do: cannot_encode(struct)
  def encode(map) when is_map(map), do: object(map)
  def encode(other), do: cannot_encode(other)

  @doc """
  `text` with every byte that is not part of a valid UTF-8 character
  replaced by U+FFFD (the replacement character); valid text is returned as
  it is.

  Names read from symbol tables, debug info and paths on disk are bytes: a
  library under a directory named in Latin-1 (`caf\\xE9`) is not UTF-8.
  `encode/1` refuses such a binary; outputs pass names through this first,
  as the flame graph does for its XML.

  ## Examples

      iex> Mtrace.JSON.valid_utf8("/opt/caf\\xE9/libinner.so")
      "/opt/caf\uFFFD/libinner.so"
      iex> Mtrace.JSON.valid_utf8("café ∑")
      "café ∑"
  """
  @spec valid_utf8(binary()) :: String.t()
  def valid_utf8(text) when is_binary(text) do
    case :unicode.characters_to_binary(text) do
      valid when is_binary(valid) ->
        valid

      {_error, valid, <<_bad, rest::binary>>} ->
        valid <> "\uFFFD" <> valid_utf8(rest)

      {:incomplete, valid, _rest} ->
        valid <> "\uFFFD"
    end
  end

  defp elements([], _whole), do: []
  defp elements([last], _whole), do: [encode(last)]

  defp elements([head | tail], whole) when is_list(tail),
    do: [encode(head), ?, | elements(tail, whole)]

  defp elements(_improper, whole), do: cannot_encode(whole)

  defp object(map) do
    pairs =
      map
      |> Enum.map(fn {key, value} -> {key_string(key, map), value} end)
      |> Enum.sort_by(&elem(&1, 0))

    check_unique_keys(pairs, map)

    members =
      Enum.map_intersperse(pairs, ?,, fn {key, value} -> [string(key), ?:, encode(value)] end)

    [?{, members, ?}]
  end

  defp key_string(key, _map) when is_binary(key), do: key
  defp key_string(key, _map) when is_atom(key), do: Atom.to_string(key)
  defp key_string(_key, map), do: cannot_encode(map)

  # Sorted, so equal keys are neighbours.
  defp check_unique_keys(pairs, map) do
    pairs
    |> Enum.chunk_every(2, 1, :discard)
    |> Enum.each(fn
      [{key, _}, {key, _}] ->
        raise ArgumentError, "Mtrace.JSON: key #{inspect(key)} appears twice in #{inspect(map)}"

      _ ->
        :ok
    end)
  end

  defp string(binary) do
    if String.valid?(binary) do
      [?", escape(binary, binary, 0, 0), ?"]
    else
      raise ArgumentError, "Mtrace.JSON cannot encode #{inspect(binary)}: not valid UTF-8"
    end
  end

  # Walks the string keeping a run (start, length) of bytes that need no
  # escaping, so that plain text is copied as sub-binaries, not byte by byte.
  # Bytes of multi-byte UTF-8 characters are all >= 0x80 and never escaped,
  # except the two line separators JavaScript does not allow in strings.
  defp escape(<<>>, whole, start, length), do: [binary_part(whole, start, length)]

  defp escape(<<byte, rest::binary>>, whole, start, length)
       when byte < 0x20 or byte == ?" or byte == ?\\ do
    [
      binary_part(whole, start, length),
      escaped(byte) | escape(rest, whole, start + length + 1, 0)
    ]
  end

  defp escape(<<0xE2, 0x80, last, rest::binary>>, whole, start, length)
       when last in [0xA8, 0xA9] do
    separator = if last == 0xA8, do: "\\u2028", else: "\\u2029"
    [binary_part(whole, start, length), separator | escape(rest, whole, start + length + 3, 0)]
  end

  defp escape(<<_byte, rest::binary>>, whole, start, length),
    do: escape(rest, whole, start, length + 1)

  defp escaped(?"), do: "\\\""
  defp escaped(?\\), do: "\\\\"
  defp escaped(control), do: ["\\u00", hex_digit(div(control, 16)), hex_digit(rem(control, 16))]

  defp hex_digit(digit) when digit < 10, do: ?0 + digit
  defp hex_digit(digit), do: ?a + digit - 10

  defp cannot_encode(term), do: raise(ArgumentError, "Mtrace.JSON cannot encode #{inspect(term)}")
end

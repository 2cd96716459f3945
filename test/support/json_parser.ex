defmodule Mtrace.Test.JSONParser do
  @moduledoc """
  A strict JSON parser (RFC 8259) for checking exports on OTP releases
  without the `:json` module (before OTP 27).

  Objects become maps with binary keys, arrays lists, numbers integers (no
  fraction or exponent) or floats, `null` becomes `nil`. Anything a strict
  reader would refuse raises `ArgumentError`: trailing commas, single quotes,
  unescaped control characters, lone surrogates, invalid UTF-8, leading
  zeros, duplicate object keys, text after the value. Refusing duplicate keys
  is stricter than the RFC asks, so that an encoder writing one is caught.

      iex> Mtrace.Test.JSONParser.decode!(~s|{"a": [1, 2.5, "\\\\u00e9", null]}|)
      %{"a" => [1, 2.5, "é", nil]}
  """

  @whitespace [?\s, ?\t, ?\n, ?\r]

  @doc "Parses `text` as one JSON value; raises `ArgumentError` if it is not exactly that."
  @spec decode!(binary()) :: term()
  def decode!(text) when is_binary(text) do
    {value, rest} = value(skip_ws(text), text)

    case skip_ws(rest) do
      "" -> value
      extra -> fail(text, extra, "text after the value")
    end
  end

  defp skip_ws(<<c, rest::binary>>) when c in @whitespace, do: skip_ws(rest)
  defp skip_ws(rest), do: rest

  # Each parser takes the remaining input (and the whole text, for error
  # positions) and returns {value, rest}.
  defp value(<<?{, rest::binary>>, text), do: object(skip_ws(rest), text, %{})
  defp value(<<?[, rest::binary>>, text), do: array(skip_ws(rest), text, [])
  defp value(<<?", rest::binary>>, text), do: string(rest, text, [])
  defp value(<<"true", rest::binary>>, _text), do: {true, rest}
  defp value(<<"false", rest::binary>>, _text), do: {false, rest}
  defp value(<<"null", rest::binary>>, _text), do: {nil, rest}
  defp value(<<c, _::binary>> = rest, text) when c == ?- or c in ?0..?9, do: number(rest, text)
  defp value(rest, text), do: fail(text, rest, "a value expected")

  defp object(<<?}, rest::binary>>, _text, acc) when acc == %{}, do: {acc, rest}

  defp object(<<?", rest::binary>> = at, text, acc) do
    {key, rest} = string(rest, text, [])
    if Map.has_key?(acc, key), do: fail(text, at, "duplicate key #{inspect(key)}")

    case skip_ws(rest) do
      <<?:, rest::binary>> ->
        {value, rest} = value(skip_ws(rest), text)
        acc = Map.put(acc, key, value)

        case skip_ws(rest) do
          <<?,, rest::binary>> -> object(skip_ws(rest), text, acc)
          <<?}, rest::binary>> -> {acc, rest}
          rest -> fail(text, rest, "`,` or `}` expected")
        end

      rest ->
        fail(text, rest, "`:` expected")
    end
  end

  defp object(rest, text, _acc), do: fail(text, rest, "a string key expected")

  defp array(<<?], rest::binary>>, _text, []), do: {[], rest}

  defp array(rest, text, acc) do
    {value, rest} = value(rest, text)

    case skip_ws(rest) do
      <<?,, rest::binary>> -> array(skip_ws(rest), text, [value | acc])
      <<?], rest::binary>> -> {Enum.reverse([value | acc]), rest}
      rest -> fail(text, rest, "`,` or `]` expected")
    end
  end

  defp string(<<?", rest::binary>>, _text, acc),
    do: {IO.iodata_to_binary(Enum.reverse(acc)), rest}

  defp string(<<?\\, rest::binary>> = at, text, acc), do: escape(rest, at, text, acc)

  defp string(<<c, _::binary>> = rest, text, _acc) when c < 0x20,
    do: fail(text, rest, "unescaped control character in a string")

  defp string(<<c::utf8, rest::binary>>, text, acc), do: string(rest, text, [<<c::utf8>> | acc])
  defp string(rest, text, _acc), do: fail(text, rest, "unterminated string or invalid UTF-8")

  @simple_escapes %{
    ?" => ?",
    ?\\ => ?\\,
    ?/ => ?/,
    ?b => ?\b,
    ?f => ?\f,
    ?n => ?\n,
    ?r => ?\r,
    ?t => ?\t
  }

  defp escape(<<c, rest::binary>>, _at, text, acc) when is_map_key(@simple_escapes, c),
    do: string(rest, text, [@simple_escapes[c] | acc])

  defp escape(<<?u, rest::binary>>, at, text, acc) do
    case hex4(rest) do
      {high, <<?\\, ?u, rest2::binary>>} when high in 0xD800..0xDBFF ->
        case hex4(rest2) do
          {low, rest3} when low in 0xDC00..0xDFFF ->
            code = 0x10000 + Bitwise.bsl(high - 0xD800, 10) + (low - 0xDC00)
            string(rest3, text, [<<code::utf8>> | acc])

          _ ->
            fail(text, at, "high surrogate without a low one")
        end

      {code, _rest} when code in 0xD800..0xDFFF ->
        fail(text, at, "lone surrogate")

      {code, rest} ->
        string(rest, text, [<<code::utf8>> | acc])

      :error ->
        fail(text, at, "four hex digits expected after \\u")
    end
  end

  defp escape(_rest, at, text, _acc), do: fail(text, at, "unknown escape")

  defp hex4(<<digits::binary-size(4), rest::binary>>) do
    if String.match?(digits, ~r/\A[0-9a-fA-F]{4}\z/),
      do: {String.to_integer(digits, 16), rest},
      else: :error
  end

  defp hex4(_rest), do: :error

  @number ~r/\A-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?/

  defp number(rest, text) do
    case Regex.run(@number, rest, capture: :first) do
      [literal] ->
        after_number = binary_part(rest, byte_size(literal), byte_size(rest) - byte_size(literal))
        {to_number(literal, rest, text), after_number}

      nil ->
        fail(text, rest, "malformed number")
    end
  end

  defp to_number(literal, rest, text) do
    if String.contains?(literal, [".", "e", "E"]) do
      # Erlang reads floats only with a fraction: "1e5" is read as "1.0e5".
      [mantissa | exponent] = String.split(literal, ["e", "E"])
      mantissa = if String.contains?(mantissa, "."), do: mantissa, else: mantissa <> ".0"
      String.to_float(Enum.join([mantissa | exponent], "e"))
    else
      String.to_integer(literal)
    end
  rescue
    ArgumentError -> fail(text, rest, "number out of range")
  end

  defp fail(text, rest, what) do
    position = byte_size(text) - byte_size(rest)
    raise ArgumentError, "invalid JSON at byte #{position}: #{what}"
  end
end

defmodule Mtrace.Frame do
  @moduledoc """
  How a stack frame (`t:Mtrace.frame_map/0`) is named in every output:
  report, folded export, JSON, flame graph, `Mtrace.Watch` and
  `Mtrace.VM.diagnose/1` use the same rule, so one function reads the same
  everywhere.

  A stack holds native frames (C code, named from ELF symbols and DWARF)
  and, for memory a NIF allocated, Erlang frames: the NIF itself and the
  Erlang functions that called it, named `Module.function/arity` as Elixir
  prints them (`:ets.insert/2` for an Erlang module).
  """

  @doc """
  The name a frame is shown under: for an Erlang frame its
  `Module.function/arity`; for a native frame its symbol (a C++ name without
  its argument list, a compiler's `[clone ...]` copy named as the function)
  if known, else the basename of its object file and the
  frame's offset in it, in lowercase hex. An address in no loaded object is,
  in beam.smp, code the VM's JIT generated or code unloaded since (a purged
  NIF library): `"?? (JIT or unloaded code)"`. An empty symbol or lib counts
  as unknown.

  ## Examples

      iex> Mtrace.Frame.name(%{symbol: "malloc_wrapper", lib: "/lib/libx.so", offset: 16})
      "malloc_wrapper"
      iex> Mtrace.Frame.name(%{symbol: "cache::put(std::string const&, int)", lib: "/lib/libc.so", offset: 0})
      "cache::put"
      iex> Mtrace.Frame.name(%{symbol: "ns::f(int) [clone .isra.0] [clone .cold]", lib: "/lib/libx.so", offset: 0})
      "ns::f"
      iex> Mtrace.Frame.name(%{symbol: nil, lib: "/usr/lib/libx.so.1", offset: 0x1A2B})
      "libx.so.1+0x1a2b"
      iex> Mtrace.Frame.name(%{module: Ledger, function: :append, arity: 2, symbol: nil, lib: nil, offset: 0})
      "Ledger.append/2"
      iex> Mtrace.Frame.name(%{module: nil, function: nil, arity: nil, symbol: nil, lib: nil, offset: 0})
      "?? (Erlang code)"
      iex> Mtrace.Frame.name(%{symbol: nil, lib: nil, offset: 0})
      "?? (JIT or unloaded code)"
  """
  @spec name(%{
          :symbol => binary() | nil,
          :lib => binary() | nil,
          :offset => integer(),
          optional(atom()) => term()
        }) :: String.t()
  # named/1 filled it in: formatted once, not at every use
  def name(%{module: module, symbol: symbol}) when is_binary(symbol) and module != nil,
    do: symbol

  def name(%{module: module, function: function, arity: arity})
      when is_atom(module) and module != nil and is_atom(function) and is_integer(arity),
      do: Exception.format_mfa(module, function, arity)

  def name(%{module: nil}), do: "?? (Erlang code)"

  def name(%{symbol: symbol} = frame) when is_binary(symbol) and symbol != "" do
    name = symbol |> printable() |> without_clone() |> short()

    # a symbol that is all argument list or blanks names nothing: where it is does
    if String.trim(name) == "", do: frame |> Map.delete(:symbol) |> name(), else: name
  end

  def name(%{lib: lib, offset: offset}) when is_binary(lib) and lib != "",
    do: printable(Path.basename(lib)) <> "+0x" <> String.downcase(Integer.to_string(offset, 16))

  def name(_frame), do: "?? (JIT or unloaded code)"

  @doc """
  A frame on one line, for the one-line stacks of `Mtrace.Watch` and
  `Mtrace.VM.diagnose/1`: its `name/1`, then where it is, the source file's
  basename and line when known, else the object it is in.

  ## Examples

      iex> Mtrace.Frame.label(%{symbol: "leak", lib: "/opt/leaky.so", file: "c_src/leaky.c", line: 12, offset: 0})
      "leak (leaky.c:12)"
      iex> Mtrace.Frame.label(%{symbol: "leak", lib: "/opt/leaky.so", file: nil, line: nil, offset: 0})
      "leak (leaky.so)"
      iex> Mtrace.Frame.label(%{symbol: nil, lib: "/opt/leaky.so", file: nil, line: nil, offset: 16})
      "leaky.so+0x10"
      iex> Mtrace.Frame.label(%{symbol: nil, lib: nil, file: nil, line: nil, addr: 0x7F11AA001000})
      "?? 0x7f11aa001000"
  """
  @spec label(map()) :: String.t()
  def label(frame) do
    name = name(frame)

    cond do
      is_binary(frame[:file]) and is_integer(frame[:line]) ->
        "#{name} (#{printable(Path.basename(frame.file))}:#{frame.line})"

      frame[:symbol] not in [nil, ""] and frame[:lib] not in [nil, ""] and
          not erlang?(frame) ->
        "#{name} (#{printable(Path.basename(frame.lib))})"

      # in no object: its address is what tells two such sites apart
      frame[:lib] in [nil, ""] and is_integer(frame[:addr]) and not erlang?(frame) ->
        "?? 0x#{Integer.to_string(frame.addr, 16) |> String.downcase()}"

      true ->
        name
    end
  end

  @doc """
  `text` (a symbol or a path, bytes as an object file or the disk hold
  them) made safe to print: bytes that are not UTF-8 become U+FFFD
  (`Mtrace.JSON.valid_utf8/1`) and control characters `?`, so that no name
  can break a line of a report or send an escape sequence to the terminal.
  Every name this module gives has been through it.

  ## Examples

      iex> Mtrace.Frame.printable("caf\\xE9\\e[2J")
      "caf\uFFFD?[2J"
      iex> Mtrace.Frame.printable("ns::f")
      "ns::f"
  """
  @spec printable(binary()) :: String.t()
  def printable(text) when is_binary(text) do
    if plain?(text),
      do: text,
      else:
        text |> Mtrace.JSON.valid_utf8() |> String.replace(~r/[\x{0}-\x{1f}\x{7f}-\x{9f}]/u, "?")
  end

  # Most names are printable ASCII, which a byte scan recognizes cheaply.
  defp plain?(<<c, rest::binary>>) when c in 0x20..0x7E, do: plain?(rest)
  defp plain?(<<>>), do: true
  defp plain?(_other), do: false

  @doc """
  Whether a frame is an Erlang frame (the NIF or an Erlang function above it).

      iex> Mtrace.Frame.erlang?(%{module: :ledger, function: :append, arity: 1})
      true
      iex> Mtrace.Frame.erlang?(%{symbol: "malloc_wrapper", lib: "/lib/libx.so"})
      false
  """
  @spec erlang?(map()) :: boolean()
  def erlang?(frame), do: Map.has_key?(frame, :module)

  @doc """
  Where in a stack (innermost first) the Erlang code that called the NIF
  is: its first Erlang frame is the NIF itself (the function the NIF
  implements), so the second one; the NIF's when it is the only one; `nil`
  for a stack without Erlang frames.

      iex> Mtrace.Frame.caller_at([
      ...>   %{symbol: "leak", lib: "/opt/leaky.so"},
      ...>   %{module: LeakyNif, function: :leak, arity: 1},
      ...>   %{module: Ledger, function: :append, arity: 1}
      ...> ])
      2
      iex> Mtrace.Frame.caller_at([%{symbol: "leak", lib: "/opt/leaky.so"}])
      nil
  """
  @spec caller_at([map()]) :: non_neg_integer() | nil
  def caller_at(frames) do
    case for({frame, at} <- Enum.with_index(frames), erlang?(frame), do: at) do
      [_nif, caller | _] -> caller
      [nif] -> nif
      [] -> nil
    end
  end

  @doc """
  Fills in `symbol` of the Erlang frames of a stack with their `name/1`, so
  that every reader of `symbol` sees `Module.function/arity`; native frames
  are left as they are.

      iex> [%{symbol: "Ledger.append/2"}] =
      ...>   Mtrace.Frame.named([%{module: Ledger, function: :append, arity: 2, symbol: nil}])
  """
  @spec named([map()]) :: [map()]
  def named(frames), do: [frames] |> named_all() |> hd()

  @doc """
  `named/1` for many stacks at once: an Erlang frame they share (the NIF's
  callers, in every stack of a NIF) is named once and stays one term, so a
  large answer is not copied frame by frame.

      iex> nif = %{module: Ledger, function: :append, arity: 2, symbol: nil}
      iex> [[a], [b]] = Mtrace.Frame.named_all([[nif], [nif]])
      iex> :erts_debug.same(a, b)
      true
  """
  @spec named_all([[map()]]) :: [[map()]]
  def named_all(stacks) do
    share_renamed(stacks, &match?(%{module: _}, &1), &%{&1 | symbol: name(&1)})
  end

  # Each frame of stacks that rename? picks, renamed once per distinct
  # frame and that one term used for all of them; the others as they are
  # (native frames: the NIF shares them already, and hashing them costs).
  defp share_renamed(stacks, rename?, rename) do
    stacks
    |> Enum.map_reduce(%{}, fn stack, memo ->
      Enum.map_reduce(stack, memo, fn frame, memo ->
        case rename?.(frame) && Map.fetch(memo, frame) do
          false -> {frame, memo}
          {:ok, named} -> {named, memo}
          :error -> rename.(frame) |> then(&{&1, Map.put(memo, frame, &1)})
        end
      end)
    end)
    |> elem(0)
  end

  @doc """
  A seed-form stack (`{lib, symbol}` pairs) with its Erlang frames, which
  the NIF gives as `{:erlang, {m, f, a}}`, as `{"erlang", "M.f/a"}`.

      iex> Mtrace.Frame.named_pairs([{"a.so", "f"}, {:erlang, {:ledger, :append, 1}}, {:erlang, nil}])
      [{"a.so", "f"}, {"erlang", ":ledger.append/1"}, {"erlang", nil}]
  """
  @spec named_pairs([{term(), term()}]) :: [{binary() | nil, binary() | nil}]
  def named_pairs(stack), do: [stack] |> named_pairs_all() |> hd()

  @doc """
  `named_pairs/1` for many stacks at once, each Erlang frame they share
  named once and kept one term (as `named_all/1`).

      iex> [[a], [b]] = Mtrace.Frame.named_pairs_all([[{:erlang, {:ets, :insert, 2}}], [{:erlang, {:ets, :insert, 2}}]])
      iex> {a, :erts_debug.same(a, b)}
      {{"erlang", ":ets.insert/2"}, true}
  """
  @spec named_pairs_all([[{term(), term()}]]) :: [[{binary() | nil, binary() | nil}]]
  def named_pairs_all(stacks) do
    share_renamed(stacks, &match?({:erlang, _}, &1), fn
      {:erlang, {m, f, a}} -> {"erlang", Exception.format_mfa(m, f, a)}
      {:erlang, nil} -> {"erlang", nil}
    end)
  end

  @doc """
  `name` made to fit `width` columns, for a line of a report: C++ template
  argument lists collapsed to `<...>`, the longest innermost one first,
  while it is too long; then, if still too long, its start cut (the end
  names the function).

      iex> Mtrace.Frame.fit("Asm::emit_body<unsigned long (process*, unsigned long)>", 30)
      "Asm::emit_body<...>"
      iex> Mtrace.Frame.fit("std::map<int, std::vector<char> >::insert", 40)
      "std::map<int, std::vector<...> >::insert"
      iex> Mtrace.Frame.fit("std::vector<int, std::allocator<int> >::_M_realloc_insert<int const&>", 40)
      "std::vector<...>::_M_realloc_insert<...>"
      iex> Mtrace.Frame.fit("operator<<", 5)
      "...<<"
  """
  @spec fit(String.t(), pos_integer()) :: String.t()
  def fit(name, width) do
    cond do
      String.length(name) <= width ->
        name

      (collapsed = collapse_one(name)) != name ->
        fit(collapsed, width)

      true ->
        "..." <> String.slice(name, -max(width - 3, 1)..-1)
    end
  end

  # The longest innermost template argument list (one whose arguments hold
  # no list but collapsed ones) replaced by "<...>"; an operator's own "<"
  # is not a bracket.
  defp collapse_one(name) do
    ~r/(?<!operator)(?<!operator<)<((?:[^<>]|<\.\.\.>)*)>/
    |> Regex.scan(name, return: :index)
    |> Enum.reject(fn [_all, {at, len}] -> binary_part(name, at, len) == "..." end)
    |> Enum.max_by(fn [{_at, len}, _args] -> len end, fn -> nil end)
    |> case do
      nil ->
        name

      [{at, len}, _args] ->
        binary_part(name, 0, at) <>
          "<...>" <> binary_part(name, at + len, byte_size(name) - at - len)
    end
  end

  # GCC's copies of a function ("f(int) [clone .isra.0]", "[clone .cold]")
  # are the function: named as it is.
  defp without_clone(symbol), do: String.replace(symbol, ~r/(?: \[clone [^\]]*\])+\z/, "")

  # "ns::f(int, char const*) const" -> "ns::f": the argument list of a
  # demangled C++ name, found from its end so that templates and operator()
  # keep their own parentheses; and a template function's return type
  # ("void ns::f<int>(int)" -> "ns::f<int>").
  defp short(symbol) do
    trimmed = String.trim_trailing(symbol, " const")

    with true <- String.ends_with?(trimmed, ")"),
         cut = cut_args(trimmed),
         # "A::operator()" without its arguments, as DWARF names it
         false <- String.ends_with?(cut, "operator") do
      drop_return_type(cut)
    else
      _ -> symbol
    end
  end

  # The name after the last space outside brackets, unless an operator's
  # name has the space ("operator new", "operator unsigned long").
  defp drop_return_type(name) do
    name = String.trim_trailing(name)

    with false <- String.contains?(name, "operator"),
         chars = String.to_charlist(name),
         [last | _] <- top_level_spaces(chars, 0, 0, []),
         # by code points, as top_level_spaces counts (not graphemes)
         rest = chars |> Enum.drop(last + 1) |> List.to_string(),
         # a name, not a suffix such as "(.cold)" or a pointer's "(*f)"
         true <- rest =~ ~r/^[A-Za-z_~]/ do
      rest
    else
      _ -> name
    end
  end

  defp top_level_spaces([], _depth, _i, acc), do: acc
  defp top_level_spaces([?\s | rest], 0, i, acc), do: top_level_spaces(rest, 0, i + 1, [i | acc])

  defp top_level_spaces([c | rest], depth, i, acc) when c in ~c"<({[",
    do: top_level_spaces(rest, depth + 1, i + 1, acc)

  defp top_level_spaces([c | rest], depth, i, acc) when c in ~c">)}]",
    do: top_level_spaces(rest, max(depth - 1, 0), i + 1, acc)

  defp top_level_spaces([_ | rest], depth, i, acc), do: top_level_spaces(rest, depth, i + 1, acc)

  defp cut_args(symbol) do
    chars = String.to_charlist(symbol)
    n = open_paren(Enum.reverse(chars), 0, length(chars))

    case n do
      nil -> symbol
      0 -> symbol
      n -> chars |> Enum.take(n) |> List.to_string()
    end
  end

  # The index of the "(" that matches the final ")".
  defp open_paren([?) | rest], depth, i), do: open_paren(rest, depth + 1, i - 1)
  defp open_paren([?( | _rest], 1, i), do: i - 1
  defp open_paren([?( | rest], depth, i), do: open_paren(rest, depth - 1, i - 1)
  defp open_paren([_ | rest], depth, i), do: open_paren(rest, depth, i - 1)
  defp open_paren([], _depth, _i), do: nil
end

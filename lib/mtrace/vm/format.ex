defmodule Mtrace.VM.Format do
  @moduledoc """
  Text for findings and reports: byte sizes, processes, and the IEx
  expressions an operator can paste to follow up.
  """

  @doc """
  A byte count in binary units.

  ## Examples

      iex> Mtrace.VM.Format.bytes(1536)
      "1.5 KiB"
      iex> Mtrace.VM.Format.bytes(1024 ** 4)
      "1.0 TiB"
      iex> Mtrace.VM.Format.bytes(nil)
      "n/a"
  """
  @spec bytes(number | nil) :: String.t()
  def bytes(nil), do: "n/a"
  # Each unit up to what still rounds below 1024 of it (1023.9 KiB): a
  # value that would read "1024.0 KiB" reads "1.0 MiB".
  def bytes(n) when n < 1023.5, do: "#{round(n)} B"
  def bytes(n) when n < 1023.95 * 1024, do: unit(n / 1024, "KiB")
  def bytes(n) when n < 1023.95 * 1024 * 1024, do: unit(n / (1024 * 1024), "MiB")
  def bytes(n) when n < 1023.95 * 1024 * 1024 * 1024, do: unit(n / (1024 * 1024 * 1024), "GiB")
  def bytes(n), do: unit(n / (1024 * 1024 * 1024 * 1024), "TiB")

  defp unit(value, name), do: "#{:erlang.float_to_binary(value * 1.0, decimals: 1)} #{name}"

  @doc """
  An expression that evaluates to `pid` in IEx on the node that owns it.

  ## Example

      iex> Mtrace.VM.Format.pid_expr(:erlang.list_to_pid(~c"<0.42.0>"))
      ~s|pid("0.42.0")|
  """
  @spec pid_expr(pid) :: String.t()
  def pid_expr(pid) do
    "#PID<" <> rest = inspect(pid)
    ~s|pid("#{String.trim_trailing(rest, ">")}")|
  end

  # A call a hint names: a function of an Elixir module (Process,
  # Mtrace.VM) or an Erlang one (:ets, :sys) followed by its arguments;
  # not a reference such as String.to_atom/1, nor a call inside a word.
  @call ~r/(?<![\w.:&])(:[a-z][a-z0-9_]*|[A-Z][A-Za-z0-9_]*(?:\.[A-Z][A-Za-z0-9_]*)*)\.([a-z_][a-zA-Z0-9_]*[?!]?)\(/
  # A pipe after a call: the next stage follows.
  @pipe ~r/\A\s*\|>\s*/
  # Calls that take `node:` themselves.
  @with_node [{"Mtrace", "report"}, {"Mtrace.VM", "diagnose"}]

  @doc """
  `hint` (the `next` of a finding, written on `node`) rewritten so that
  every call it names runs on `node` when typed on another node: calls
  that take a `node:` option get it, other calls go through
  `:erpc.call/4`, a pipeline of calls runs whole in `:erpc.call/2`, and
  each `pid("0.x.y")` (local to `node`) is passed to `pid_expr`, which
  gives the expression for that pid where the hint is printed. References
  to functions (`String.to_atom/1`) are left as they are.

  ## Examples

      iex> Mtrace.VM.Format.remote_hint(
      ...>   ~s|Process.info(pid("0.42.0"), :monitors); Mtrace.report(sort: :growth)|,
      ...>   :"a@host",
      ...>   fn "0.42.0" -> ~s|pid("7.42.0")| end
      ...> )
      ~s|:erpc.call(:a@host, Process, :info, [pid("7.42.0"), :monitors]); | <>
        "Mtrace.report(node: :a@host, sort: :growth)"
      iex> Mtrace.VM.Format.remote_hint("find who inserts into :t (its id is in :ets.all())", :a@host, & &1)
      "find who inserts into :t (its id is in :erpc.call(:a@host, :ets, :all, []))"
      iex> Mtrace.VM.Format.remote_hint("Port.list() |> Enum.frequencies() shows them", :a@host, & &1)
      ":erpc.call(:a@host, fn -> Port.list() |> Enum.frequencies() end) shows them"
  """
  @spec remote_hint(String.t(), node, (String.t() -> String.t())) :: String.t()
  def remote_hint(hint, node, pid_expr) do
    case Regex.run(@call, hint, return: :index, capture: :all) do
      [{start, len}, {ms, ml}, {fs, fl}] ->
        after_call = binary_part(hint, start + len, byte_size(hint) - start - len)
        {args, rest} = call_args(after_call)
        {stages, rest} = pipeline(rest)

        call =
          if stages == "" do
            remote_call(binary_part(hint, ms, ml), binary_part(hint, fs, fl), args, node)
          else
            expr = binary_part(hint, start, byte_size(hint) - start - byte_size(rest))
            ":erpc.call(#{inspect(node)}, fn -> #{expr} end)"
          end

        remote_pids(binary_part(hint, 0, start), pid_expr) <>
          remote_pids(call, pid_expr) <> remote_hint(rest, node, pid_expr)

      nil ->
        remote_pids(hint, pid_expr)
    end
  end

  # The stages piped after a call ("|> Enum.map(...) |> ..."), as written,
  # and the text after them.
  defp pipeline(text) do
    with [pipe] <- Regex.run(@pipe, text),
         after_pipe = binary_part(text, byte_size(pipe), byte_size(text) - byte_size(pipe)),
         [{0, len} | _] <- Regex.run(@call, after_pipe, return: :index) do
      {_args, rest} = call_args(binary_part(after_pipe, len, byte_size(after_pipe) - len))
      stage = binary_part(text, 0, byte_size(text) - byte_size(rest))
      {stages, rest} = pipeline(rest)
      {stage <> stages, rest}
    else
      _ -> {"", text}
    end
  end

  defp remote_call(m, f, args, node) do
    cond do
      {m, f} in @with_node and args == [] ->
        "#{m}.#{f}(node: #{inspect(node)})"

      {m, f} in @with_node ->
        "#{m}.#{f}(node: #{inspect(node)}, #{Enum.join(args, ", ")})"

      true ->
        # Keyword arguments at the end are one argument: a list.
        {plain, keywords} = Enum.split_while(args, &(not Regex.match?(~r/^[a-z_]+: /, &1)))
        args = if keywords == [], do: plain, else: plain ++ ["[#{Enum.join(keywords, ", ")}]"]
        ":erpc.call(#{inspect(node)}, #{m}, :#{f}, [#{Enum.join(args, ", ")}])"
    end
  end

  defp remote_pids(text, pid_expr),
    do: Regex.replace(~r/pid\("(0\.\d+\.\d+)"\)/, text, fn _, pid -> pid_expr.(pid) end)

  # The arguments of a call whose "(" was just read, split at the commas
  # between them, and the text after its ")".
  defp call_args(text), do: call_args(text, 0, "", [])

  defp call_args(<<")", rest::binary>>, 0, arg, args), do: {finish_args(arg, args), rest}
  defp call_args(<<",", rest::binary>>, 0, arg, args), do: call_args(rest, 0, "", [arg | args])

  defp call_args(<<"\"", rest::binary>>, depth, arg, args) do
    case String.split(rest, "\"", parts: 2) do
      [string, rest] -> call_args(rest, depth, arg <> "\"" <> string <> "\"", args)
      [string] -> {finish_args(arg <> "\"" <> string, args), ""}
    end
  end

  defp call_args(<<c, rest::binary>>, depth, arg, args) when c in ~c"([{",
    do: call_args(rest, depth + 1, arg <> <<c>>, args)

  defp call_args(<<c, rest::binary>>, depth, arg, args) when c in ~c")]}",
    do: call_args(rest, depth - 1, arg <> <<c>>, args)

  defp call_args(<<c, rest::binary>>, depth, arg, args),
    do: call_args(rest, depth, arg <> <<c>>, args)

  defp call_args("", _depth, arg, args), do: {finish_args(arg, args), ""}

  defp finish_args(arg, args) do
    [arg | args] |> Enum.reverse() |> Enum.map(&String.trim/1) |> Enum.reject(&(&1 == ""))
  end

  @doc """
  A process and what it is: its registered name, else where it waits and how
  it started. The pid is numbered as its own node numbers it (`pid/1`
  there takes it), also when another node prints it, as `Mtrace.top/1`
  watching a node does.

  ## Example

      iex> pid = :erlang.list_to_pid(~c"<0.42.0>")
      iex> Mtrace.VM.Format.process(pid, current_function: {:gen_server, :loop, 7}, initial_call: {MyApp.Cache, :init, 1})
      "#PID<0.42.0> (in :gen_server.loop/7, started as MyApp.Cache.init/1)"
  """
  @spec process(pid, keyword | nil) :: String.t()
  def process(pid, [registered_name: name] ++ _), do: "#{own(pid)} (#{inspect(name)})"

  def process(pid, [current_function: cf, initial_call: ic] ++ _),
    do: "#{own(pid)} (in #{mfa(cf)}, started as #{mfa(ic)})"

  def process(pid, _), do: "#{own(pid)} (exited since)"

  # "#PID<0.50.0>" for a pid another node's process shows as
  # "#PID<11038.50.0>": the first number is only the printing node's
  # name for that node.
  defp own(pid) when node(pid) == node(), do: inspect(pid)

  defp own(pid) do
    [_node, rest] = pid |> :erlang.pid_to_list() |> to_string() |> String.split(".", parts: 2)
    "#PID<0." <> rest
  end

  @doc """
  The line said before a wait of `ms` of a second or more, so that a shell
  that prints nothing for a minute does not look hung; `nil` for a shorter
  wait or none.

  ## Example

      iex> Mtrace.VM.Format.waiting(60_000, "Watching a@host", "diagnosis")
      "Watching a@host for 1m 00s; the diagnosis follows."
      iex> Mtrace.VM.Format.waiting(300, "Watching a@host", "diagnosis")
      nil
  """
  @spec waiting(non_neg_integer() | nil, String.t(), String.t()) :: String.t() | nil
  def waiting(ms, what, result) when is_integer(ms) and ms >= 1000,
    do: "#{what} for #{duration_ms(ms)}; the #{result} follows."

  def waiting(_ms, _what, _result), do: nil

  @doc """
  A `{module, function, arity}` as Elixir prints it.

  ## Example

      iex> Mtrace.VM.Format.mfa({Enum, :map, 2})
      "Enum.map/2"
  """
  @spec mfa(term) :: String.t()
  def mfa({m, f, a}) when is_atom(m) and is_atom(f) and is_integer(a),
    do: Exception.format_mfa(m, f, a)

  def mfa(other), do: inspect(other)

  @doc """
  An integer with thousands separators.

  ## Example

      iex> Mtrace.VM.Format.int(1234567)
      "1_234_567"
  """
  @spec int(integer) :: String.t()
  def int(n) when is_integer(n) and n < 0, do: "-" <> int(-n)

  def int(n) when is_integer(n) do
    n
    |> Integer.to_string()
    |> String.reverse()
    |> String.graphemes()
    |> Enum.chunk_every(3)
    |> Enum.map_join("_", &Enum.join/1)
    |> String.reverse()
  end

  def int(n), do: inspect(n)

  @doc """
  A count with its noun, singular or plural.

  ## Examples

      iex> Mtrace.VM.Format.count(1, "block")
      "1 block"
      iex> Mtrace.VM.Format.count(3072, "block")
      "3_072 blocks"
      iex> Mtrace.VM.Format.count(2, "binary")
      "2 binaries"
  """
  @spec count(integer, String.t()) :: String.t()
  def count(1, noun), do: "1 " <> noun
  def count(n, noun), do: int(n) <> " " <> plural(noun)

  defp plural(noun) do
    if String.ends_with?(noun, "y") and not String.ends_with?(noun, ["ay", "ey", "oy", "uy"]),
      do: String.slice(noun, 0..-2//1) <> "ies",
      else: noun <> "s"
  end

  @doc """
  A duration given in milliseconds: as is under a second, to a tenth of a
  second under a minute when not whole, else as `age/1` gives it.

  ## Examples

      iex> Mtrace.VM.Format.duration_ms(250)
      "250 ms"
      iex> Mtrace.VM.Format.duration_ms(1500)
      "1.5s"
      iex> Mtrace.VM.Format.duration_ms(90_000)
      "1m 30s"
  """
  @spec duration_ms(non_neg_integer()) :: String.t()
  def duration_ms(ms) when ms < 1000, do: "#{ms} ms"

  def duration_ms(ms) when ms < 60_000 and rem(ms, 1000) != 0,
    do: :erlang.float_to_binary(ms / 1000, decimals: 1) <> "s"

  def duration_ms(ms), do: age(ms / 1000)

  @doc """
  `part` as a share of `whole`, rounded: a share that rounds to 0 but is
  not reads "<1%", so that a figure is never said to be none of the whole.

  ## Examples

      iex> Mtrace.VM.Format.percent(1, 3)
      "33%"
      iex> Mtrace.VM.Format.percent(16, 4096)
      "<1%"
      iex> Mtrace.VM.Format.percent(0, 4096)
      "0%"
  """
  @spec percent(number, number) :: String.t()
  def percent(part, whole) when part > 0 and part * 200 < whole, do: "<1%"
  def percent(part, whole), do: "#{round(100 * part / whole)}%"

  @doc """
  An age (or any duration) in seconds, to the two largest units.

  ## Examples

      iex> Mtrace.VM.Format.age(5)
      "5s"
      iex> Mtrace.VM.Format.age(187)
      "3m 07s"
      iex> Mtrace.VM.Format.age(7380)
      "2h 03m"
      iex> Mtrace.VM.Format.age(190_800)
      "2d 05h"
      iex> Mtrace.VM.Format.age(40_000_000)
      "1y 97d"
      iex> Mtrace.VM.Format.age(1.0e300)
      "over 1000y"
  """
  @spec age(number) :: String.t()
  @year 365 * 86_400
  def age(seconds) when seconds >= 1000 * @year, do: "over 1000y"
  def age(seconds) when is_float(seconds), do: age(round(seconds))
  def age(seconds) when seconds < 60, do: "#{seconds}s"

  def age(seconds) when seconds < 3600,
    do: two_units(div(seconds, 60), "m", rem(seconds, 60), "s")

  def age(seconds) when seconds < 86_400,
    do: two_units(div(seconds, 3600), "h", div(rem(seconds, 3600), 60), "m")

  def age(seconds) when seconds < @year,
    do: two_units(div(seconds, 86_400), "d", div(rem(seconds, 86_400), 3600), "h")

  def age(seconds), do: "#{div(seconds, @year)}y #{div(rem(seconds, @year), 86_400)}d"

  defp two_units(major, major_unit, minor, minor_unit) do
    "#{major}#{major_unit} #{String.pad_leading(Integer.to_string(minor), 2, "0")}#{minor_unit}"
  end

  @doc """
  A growth rate in bytes per second, per second and per hour.

  ## Examples

      iex> Mtrace.VM.Format.rate(87_040)
      "+85.0 KiB/s (+298.8 MiB/h)"
      iex> Mtrace.VM.Format.rate(-2048)
      "-2.0 KiB/s (-7.0 MiB/h)"
  """
  @spec rate(number) :: String.t()
  def rate(per_s) do
    sign = if per_s < 0, do: "-", else: "+"
    "#{sign}#{bytes(abs(per_s))}/s (#{sign}#{bytes(abs(per_s) * 3600)}/h)"
  end

  @doc """
  A line broken at spaces to fit `width` columns (default 80). Each
  continuation is indented under the line's text: past its own indentation
  and its label (a first word followed by two spaces, as in
  `"memory  ..."`), or two spaces deeper where there is no label. Words
  longer than a line stay whole.

  ## Example

      iex> Mtrace.VM.Format.wrap("native  grew by +82.9 KiB/s, up in 5 of 5 steps", 30)
      ["native  grew by +82.9 KiB/s,", "        up in 5 of 5 steps"]
  """
  @spec wrap(String.t(), pos_integer) :: [String.t()]
  def wrap(line, width \\ 80) do
    {lead, label, rest} = split_lead(line)
    pad = String.duplicate(" ", String.length(lead) + max(String.length(label), 2))

    rest
    |> String.split(" ", trim: true)
    |> glue_units()
    |> Enum.reduce([lead <> label], fn word, [current | done] ->
      cond do
        String.trim(current) == "" or String.ends_with?(current, "  ") ->
          [current <> word | done]

        String.length(current) + 1 + String.length(word) <= width ->
          [current <> " " <> word | done]

        true ->
          [pad <> word, current | done]
      end
    end)
    |> Enum.reverse()
  end

  @doc """
  Lines as a document for `Inspect`. Pretty (as IEx inspects), each is
  broken at spaces where it would pass the width `Inspect` is given, from
  the column it starts at, so lines still fit when the value is nested in
  a map or a tuple (as `Mtrace.cluster/2` returns); otherwise each is
  wrapped at 80 columns (`wrap/2`). Continuations are indented as by
  `wrap/2`.

  ## Example

      iex> lines = ["calls: 5 mallocs, 3 frees", "table: 1.0 KiB"]
      iex> doc = Mtrace.VM.Format.doc(lines, %Inspect.Opts{pretty: true})
      iex> doc |> Inspect.Algebra.format(20) |> IO.iodata_to_binary()
      "calls: 5 mallocs,\\n  3 frees\\ntable: 1.0 KiB"
  """
  @spec doc([String.t()], Inspect.Opts.t()) :: Inspect.Algebra.t()
  def doc(lines, %Inspect.Opts{pretty: true}) do
    lines
    |> Enum.map(&line_doc/1)
    |> Enum.intersperse(Inspect.Algebra.line())
    |> Inspect.Algebra.concat()
    |> Inspect.Algebra.group()
  end

  def doc(lines, _opts) do
    lines
    |> Enum.flat_map(&wrap/1)
    |> Enum.map(&Inspect.Algebra.string/1)
    |> Enum.intersperse(Inspect.Algebra.line())
    |> Inspect.Algebra.concat()
  end

  defp line_doc(line) do
    {lead, label, rest} = split_lead(line)
    pad = String.length(lead) + max(String.length(label), 2)

    case rest |> String.split(" ", trim: true) |> glue_units() do
      [] ->
        Inspect.Algebra.string(lead <> label)

      [first | words] ->
        body =
          Enum.reduce(words, Inspect.Algebra.string(first), fn word, acc ->
            Inspect.Algebra.flex_glue(acc, Inspect.Algebra.string(word))
          end)

        Inspect.Algebra.concat(
          Inspect.Algebra.string(lead <> label),
          Inspect.Algebra.nest(body, pad)
        )
    end
  end

  # "12.7 MiB", "+82.9 KiB/s" and "26 posix_memalign" stay on one line: a
  # number and what it counts are not parted.
  defp glue_units(words) do
    words
    |> Enum.reduce([], fn word, acc ->
      case acc do
        [prev | done] when is_binary(prev) ->
          if Regex.match?(~r/^[KMG]?i?B(\/[sh])?\W*$/, word) or
               Regex.match?(~r/(^|\s)\(?[+-]?[\d_.]+$/, prev),
             do: [prev <> " " <> word | done],
             else: [word | acc]

        [] ->
          [word]
      end
    end)
    |> Enum.reverse()
  end

  defp split_lead(line) do
    trimmed = String.trim_leading(line)
    lead = String.duplicate(" ", String.length(line) - String.length(trimmed))

    case Regex.run(~r/^(\S+ {2,})(.*)$/s, trimmed) do
      [_, label, rest] -> {lead, label, rest}
      _ -> {lead, "", trimmed}
    end
  end
end

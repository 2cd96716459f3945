defmodule Mtrace.Error do
  @moduledoc """
  Raised when native tracing cannot answer: the tracer library is not
  preloaded into this VM, the NIF could not be loaded, or (with the `node:`
  option) the other node cannot be reached or has no mtrace. The message says
  what to do about it; `reason` says which case it is.

  Inspected (in a map, as `Mtrace.cluster/3` returns errors), it shows the
  reason and the message's first line; `Exception.message/1` gives it all.

      iex> e = Mtrace.Error.not_preloaded()
      iex> inspect(e)
      "#Mtrace.Error<:not_preloaded: the tracer library is not preloaded ...>"
      iex> Exception.message(e) =~ "LD_PRELOAD="
      true
  """
  defexception [:message, :reason]

  @type reason ::
          :not_preloaded
          | :not_traced
          | :tracking_off
          | :nif_not_loaded
          | :preload_mismatch
          | :not_distributed
          | :nodedown
          | :timeout
          | :not_loaded
          | :version
          | :remote
          | :no_tools
          | :off
  @type t :: %__MODULE__{message: String.t(), reason: reason()}

  @doc """
  The message as a person reads it in an 80-column shell: each long line
  broken at spaces (the first one shorter, after IEx's `** (Mtrace.Error) `);
  indented lines, the commands to copy, are kept whole. The `message` field
  keeps the unbroken text.

      iex> e = %Mtrace.Error{reason: :nodedown, message: String.duplicate("word ", 30)}
      iex> Exception.message(e) |> String.split("\\n") |> Enum.map(&String.length/1)
      [59, 79, 9]
  """
  @impl true
  @spec message(t()) :: String.t()
  def message(%__MODULE__{message: message}), do: wrap(message, 62)

  @doc """
  `text` broken as `message/1` breaks a message, its first line `first`
  columns wide: for a message printed after some other text (a log line's
  time and level, say); the lines after it `width` wide (80 by default).
  Indented lines (commands to copy) are left whole.

      iex> Mtrace.Error.wrap("one two three four", 9)
      "one two\\nthree four"
      iex> Mtrace.Error.wrap("one two three four", 9, 5)
      "one two\\nthree\\nfour"
  """
  @spec wrap(String.t(), pos_integer(), pos_integer()) :: String.t()
  def wrap(text, first, width \\ 80) do
    text
    |> to_string()
    |> String.split("\n")
    |> Enum.with_index()
    |> Enum.map_join("\n", fn {line, i} ->
      fill(line, if(i == 0, do: first, else: width), width)
    end)
  end

  defp fill(line, first, width) do
    if String.length(line) <= first or String.starts_with?(line, " "),
      do: line,
      else: line |> String.split(" ", trim: true) |> fill_words(first, width, [])
  end

  # Greedy: as many words as fit, then the rest at the full width.
  defp fill_words([], _first, _width, lines), do: lines |> Enum.reverse() |> Enum.join("\n")

  defp fill_words([word | rest], first, width, lines) do
    {line, rest} = take_words(rest, word, first)
    fill_words(rest, width, width, [line | lines])
  end

  defp take_words([word | rest], line, width) do
    if String.length(line) + 1 + String.length(word) <= width,
      do: take_words(rest, line <> " " <> word, width),
      else: {line, [word | rest]}
  end

  defp take_words([], line, _width), do: {line, []}

  @doc false
  # ld_preload: this VM's LD_PRELOAD, which says why when it is set.
  @spec not_preloaded(String.t() | nil) :: t()
  def not_preloaded(ld_preload \\ System.get_env("LD_PRELOAD")) do
    so = Path.join(to_string(:code.priv_dir(:mtrace)), "mtrace.so")
    {why, release_line} = why_not_preloaded(ld_preload)

    %__MODULE__{
      reason: :not_preloaded,
      message: """
      mtrace: the tracer library is not preloaded into #{this_vm()}, so no \
      native allocation has been recorded. #{why}Start the node with it preloaded:

          LD_PRELOAD=#{so}

      In a release, #{release_line}

      Mtrace.preloaded?/0 tells whether it is; Mtrace.VM works without it.\
      """
    }
  end

  # The VM the error is about, by name when distributed: the message is
  # made there and may be read on another node.
  defp this_vm, do: vm(node())

  defp vm(:nonode@nohost), do: "this VM"
  defp vm(node), do: "the VM of #{node}"

  @ls_line "add this line to rel/env.sh.eex:\n\n    " <>
             "export LD_PRELOAD=$(ls $RELEASE_ROOT/lib/mtrace-*/priv/mtrace.so)"

  # LD_PRELOAD set, yet no tracer: what went wrong, as far as it tells,
  # and the release's line that avoids it.
  defp why_not_preloaded(value) when value in [nil, ""], do: {"", @ls_line}

  defp why_not_preloaded(value) do
    case length(String.split(value, "mtrace.so")) - 1 do
      0 ->
        {"LD_PRELOAD is #{inspect(value)}, which names no mtrace.so. ", @ls_line}

      1 ->
        {"LD_PRELOAD is #{inspect(value)}, but the loader did not preload it (it said " <>
           "why on the node's standard error as the node started: a file that is not " <>
           "there, or a path with spaces, at which the loader splits it). ", @ls_line}

      _ ->
        {"LD_PRELOAD names more than one mtrace.so (#{inspect(value)}), and the loader " <>
           "preloads none of them: the release holds an older mtrace beside this one, " <>
           "which mix release leaves. ",
         "rebuild it into a clean directory (rm -rf _build/prod/rel/<app> first), or " <>
           "name this version in rel/env.sh.eex:\n\n    " <>
           "export LD_PRELOAD=\"$RELEASE_ROOT/lib/mtrace-<%= " <>
           "@release.applications[:mtrace][:vsn] %>/priv/mtrace.so\""}
    end
  end

  @doc false
  @spec nif_not_loaded(term()) :: t()
  def nif_not_loaded(reason) do
    %__MODULE__{
      reason: :nif_not_loaded,
      message:
        "mtrace: priv/mtrace_nif.so could not be loaded (#{inspect(reason)}); " <>
          "rebuild with `mix compile` and check that it exists in #{:code.priv_dir(:mtrace)}"
    }
  end

  @doc false
  @spec preload_mismatch() :: t()
  def preload_mismatch do
    %__MODULE__{
      reason: :preload_mismatch,
      message:
        "mtrace: the preloaded tracer library comes from another mtrace release; " <>
          "preload the mtrace.so of this one: " <>
          "LD_PRELOAD=#{Path.join(to_string(:code.priv_dir(:mtrace)), "mtrace.so")}"
    }
  end

  @doc false
  @spec not_traced() :: t()
  def not_traced do
    exe =
      case File.read_link("/proc/self/exe") do
        {:ok, path} -> Path.basename(path)
        {:error, _} -> "beam.smp"
      end

    programs =
      case System.get_env("MTRACE_PROGRAMS") do
        nil -> ""
        value -> " (MTRACE_PROGRAMS=#{value})"
      end

    %__MODULE__{
      reason: :not_traced,
      message: """
      mtrace: the tracer library is preloaded, but this program (#{exe}) is \
      not traced: it is not a program MTRACE_PROGRAMS names#{programs}, so no \
      native allocation has been recorded. Start the node with MTRACE_PROGRAMS \
      unset (it defaults to beam.smp) or naming it:

          MTRACE_PROGRAMS=#{exe}

      Mtrace.stats().active tells whether this program is traced.\
      """
    }
  end

  @doc false
  # A window asked for while tracking is switched off: nothing allocated in
  # it would be recorded, so it is not waited out.
  @spec tracking_off(String.t(), node()) :: t()
  def tracking_off(where, node) do
    enable =
      if node == node(),
        do: "Mtrace.enable()",
        else: ":erpc.call(#{inspect(node)}, Mtrace, :enable, [])"

    %__MODULE__{
      reason: :tracking_off,
      message: """
      Mtrace.#{where}: tracking is switched off in #{vm(node)} (Mtrace.disable/0 \
      or MTRACE_ENABLED=0), so nothing allocated during the window would be \
      recorded. Switch it on first:

          #{enable}\
      """
    }
  end

  defimpl Inspect do
    import Inspect.Algebra

    # One line where it fits: a map of errors stays readable; the message
    # has the rest.
    def inspect(%{reason: reason, message: message}, opts) do
      {first, more?} =
        case String.split(to_string(message), "\n", parts: 2) do
          [first] -> {first, false}
          [first, _rest] -> {first, true}
        end

      # the whole inspection within 72 columns: in iex's 80 it still fits
      # as a value of a map of nodes, indented and followed by "}," (as
      # Mtrace.cluster/2 returns); the struct's name already says "mtrace:"
      prefix = "#Mtrace.Error<#{Kernel.inspect(reason)}: "
      first = first |> String.trim() |> String.replace(~r/^(on node \S+: )?mtrace: /, "\\1")
      {first, cut?} = shorten(first, max(72 - String.length(prefix) - 5, 20))
      tail = if more? or cut?, do: " ...", else: ""

      # After a long key in a map of nodes even that may not fit: then the
      # words go below the reason (as Mtrace.VM.Diagnosis does), and after
      # a longer one the reason too, each break taken only where the line
      # would overflow (the layout does not count the "," after a map's
      # value: a line can end at column 81). Not pretty (a log line): one
      # line.
      if opts.pretty and is_integer(opts.width),
        do:
          group(
            nest(
              concat([
                "#Mtrace.Error<",
                flex_break(""),
                "#{Kernel.inspect(reason)}:",
                flex_break(" "),
                first <> tail <> ">"
              ]),
              2
            )
          ),
        else: prefix <> first <> tail <> ">"
    end

    # At most about `max` characters, cut at a space, and not between a
    # number and its unit ("within 2000 ..." would read as a count).
    defp shorten(text, max) do
      if String.length(text) <= max do
        {text, false}
      else
        cut =
          text
          |> String.slice(0, max + 1)
          |> String.replace(~r/\s+\S*$/, "")
          |> String.replace(~r/\s+[\d_.,]+$/, "")

        {String.trim_trailing(cut, ","), true}
      end
    end
  end
end

defmodule Mtrace.Stats do
  @moduledoc """
  What `Mtrace.stats/0` returns: the tracer's counters and figures, all
  integers, booleans or lists of names, in a struct so that IEx shows them
  grouped, sizes humanized, instead of 40 keys in no order. It is a map for
  programs: `stats.live_bytes`, `stats[:live_bytes]`, `%{live_count: n} =
  stats` and `Map.from_struct/1` all work. `Mtrace.stats/0` documents the
  fields; a field the preload in use does not report is `nil`.

  ## Example

      iex> stats = %Mtrace.Stats{live_count: 3, live_bytes: 12_288,
      ...>                       malloc_cnt: 10, free_cnt: 7}
      iex> stats[:live_bytes]
      12288
      iex> inspect(stats) |> String.split("\\n") |> hd()
      "#Mtrace.Stats<12.0 KiB live in 3 blocks, 0 dropped"
      iex> inspect(%{stats | enabled: false}) |> String.split("\\n") |> hd()
      "#Mtrace.Stats<tracking switched off (Mtrace.enable/0)"
      iex> inspect(%{stats | reset_ms: 1_000, now_ms: 188_000}) |> String.split("\\n") |> hd()
      "#Mtrace.Stats<12.0 KiB live in 3 blocks since a reset 3m 07s ago, 0 dropped"
      iex> inspect(%{stats | heap: false}) |> String.split("\\n") |> List.last()
      "  C library heap: not read (heap: false)>"
  """

  @behaviour Access

  @calls [
    :malloc_cnt,
    :calloc_cnt,
    :realloc_cnt,
    :reallocarray_cnt,
    :free_cnt,
    :posix_memalign_cnt,
    :aligned_alloc_cnt,
    :memalign_cnt,
    :valloc_cnt,
    :pvalloc_cnt,
    :strdup_cnt,
    :strndup_cnt
  ]

  defstruct @calls ++
              [
                :live_count,
                :live_bytes,
                :dropped,
                :replaced,
                :table_bytes,
                :stacks,
                :stack_bytes,
                :stacks_dropped,
                :depth,
                :shards,
                :enabled,
                :active,
                :sample_bytes,
                :sampled,
                :est_live_count,
                :est_live_bytes,
                :fast_unwind,
                :unwind_fallbacks,
                :unwind_cut,
                :libunwind,
                :config_errors,
                :erlang_frames,
                :erlang_frames_off,
                :erlang_stacks,
                :reset_ms,
                :now_ms,
                :allocated_bytes,
                :used_bytes,
                :free_bytes,
                :mmap_chunks,
                :mmap_bytes,
                :heap
              ]

  @type t :: %__MODULE__{}

  @doc """
  The struct for the map the NIF returns (keys it does not know are left out).

      iex> %Mtrace.Stats{live_count: 1} = Mtrace.Stats.new(%{live_count: 1, future_key: 2})
  """
  @spec new(map) :: t
  def new(map), do: struct(__MODULE__, map)

  # An answer from another node: one running an older mtrace answers with a
  # struct of fewer fields; each field added since is nil there, as one the
  # tracer does not report, and `heap` is what was asked.
  @doc false
  @spec from_node(map(), boolean()) :: t()
  def from_node(answer, heap) do
    stats = answer |> Map.from_struct() |> new()
    if is_nil(stats.heap), do: %{stats | heap: heap}, else: stats
  end

  @settings ~w(MTRACE_PROGRAMS MTRACE_ENABLED MTRACE_DEPTH MTRACE_SAMPLE_BYTES
                MTRACE_UNWIND MTRACE_ERLANG)

  @doc """
  The variables of `env` (`System.get_env/0`'s map) that read like a
  misspelled setting of mtrace's, each named with the setting it is close to,
  when that setting itself is not set: a typo leaves the setting at its
  default, which nothing else would say. `Mtrace.stats/0` adds them to
  `config_errors`. A name counts as close when it differs from a setting only
  in case, in one character (two for `MTRACE_SAMPLE_BYTES`), or by a missing
  end, so that other `MTRACE_` variables (of scripts, of mtrace's own tests)
  are not taken for one.

      iex> Mtrace.Stats.misspelled(%{"MTRACE_SAMPLE_BYTE" => "4096",
      ...>   "mtrace_depth" => "8", "MTRACE_STRESS" => "1", "MTRACE_PROGRESS" => "1"})
      ["MTRACE_SAMPLE_BYTE (did you mean MTRACE_SAMPLE_BYTES?)",
       "mtrace_depth (did you mean MTRACE_DEPTH?)"]
      iex> Mtrace.Stats.misspelled(%{"MTRACE_DEPT" => "4", "MTRACE_DEPTH" => "8"})
      []
  """
  @spec misspelled(%{optional(String.t()) => String.t()}) :: [String.t()]
  def misspelled(env) do
    for {name, _value} <- Enum.sort(env, :desc),
        name not in @settings,
        setting = Enum.find(@settings, &close?(name, &1)),
        not Map.has_key?(env, setting),
        reduce: [] do
      acc -> ["#{name} (did you mean #{setting}?)" | acc]
    end
  end

  defp close?(name, "MTRACE_" <> setting) do
    case String.upcase(name) do
      "MTRACE_" <> ^setting ->
        true

      "MTRACE_" <> rest when byte_size(rest) >= 4 ->
        String.starts_with?(setting, rest) or
          edits(rest, setting) <= if(byte_size(setting) >= 10, do: 2, else: 1)

      _ ->
        false
    end
  end

  # Levenshtein's distance, one row at a time (names are short).
  defp edits(a, b) do
    b = String.to_charlist(b)

    a
    |> String.to_charlist()
    |> Enum.reduce(Enum.to_list(0..length(b)), fn ca, [left | _] = row ->
      {new, _} =
        Enum.zip(b, Enum.zip(row, tl(row)))
        |> Enum.reduce({[left + 1], left}, fn {cb, {diag, up}}, {[prev | _] = acc, _} ->
          cost = if ca == cb, do: 0, else: 1
          {[Enum.min([prev + 1, up + 1, diag + cost]) | acc], up}
        end)

      Enum.reverse(new)
    end)
    |> List.last()
  end

  @impl Access
  def fetch(stats, key), do: Map.fetch(stats, key)

  @impl Access
  def get_and_update(stats, key, fun), do: Map.get_and_update(stats, key, fun)

  @impl Access
  def pop(stats, key), do: {Map.get(stats, key), Map.put(stats, key, nil)}

  @doc false
  def calls, do: @calls

  defimpl Inspect do
    alias Mtrace.VM.Format

    # mallinfo2's figures; nil where the C library does not report them, or
    # where the caller did not ask for them.
    defp heap(%{heap: false}), do: "  C library heap: not read (heap: false)"
    defp heap(%{allocated_bytes: nil}), do: "  C library heap: not reported by this C library"

    defp heap(s) do
      "  glibc heap: #{size(s.allocated_bytes)} allocated, #{size(s.used_bytes)} used, " <>
        "#{size(s.free_bytes)} free; #{size(s.mmap_bytes)} in #{count(s.mmap_chunks, "mmap chunk")}"
    end

    def inspect(s, opts) do
      [first | more] = live(s)

      rest = [
        "  calls: " <> calls(s),
        "  table: #{size(s.table_bytes)}; #{count(s.stacks, "stack")} in #{size(s.stack_bytes)}" <>
          "; depth #{s.depth}",
        "  tracking: " <> tracking(s),
        heap(s) <> ">"
      ]

      # line breaks of the algebra, not "\n": nested in a map or a tuple
      # (Mtrace.cluster/3), the lines are indented under their key, and
      # pretty, broken where they would pass the width from there
      Format.doc(["#Mtrace.Stats<" <> first | more] ++ rest, opts)
    end

    # What matters most first: a node that records nothing says so before
    # any figure that would read as "no leak".
    defp live(%{active: false}),
      do: ["not traced: MTRACE_PROGRAMS leaves this program out"]

    defp live(%{enabled: false} = s),
      do: ["tracking switched off (Mtrace.enable/0)", "  recorded before it: " <> figures(s)]

    defp live(s), do: [figures(s)]

    defp figures(%{sampled: true} = s) do
      "about #{size(s.est_live_bytes)} live in about #{count(s.est_live_count, "block")} " <>
        "(a sample of #{count(s.live_count, "block")}, #{size(s.live_bytes)})#{reset(s)}, " <>
        losses(s)
    end

    defp figures(s),
      do:
        "#{size(s.live_bytes)} live in #{count(s.live_count, "block")}#{reset(s)}, " <> losses(s)

    # After Mtrace.reset/0 the figures count only what came since: said,
    # so that a small figure does not read as a node that holds little.
    defp reset(%{reset_ms: reset, now_ms: now})
         when is_integer(reset) and reset > 0 and is_integer(now) and now >= reset,
         do: " since a reset #{Format.age(div(now - reset, 1000))} ago"

    defp reset(_s), do: ""

    defp losses(s) do
      [
        {s.dropped || 0, "dropped"},
        {s.replaced, "replaced"},
        {s.stacks_dropped, "without a stack"}
      ]
      |> Enum.filter(fn {n, what} -> what == "dropped" or (is_integer(n) and n > 0) end)
      |> Enum.map_join(", ", fn {n, what} -> "#{Format.int(n)} #{what}" end)
    end

    defp calls(s) do
      Mtrace.Stats.calls()
      |> Enum.map(&{&1, Map.get(s, &1)})
      |> Enum.filter(fn {_k, n} -> is_integer(n) and n > 0 end)
      |> Enum.map_join(", ", fn {k, n} ->
        "#{Format.int(n)} #{k |> Atom.to_string() |> String.trim_trailing("_cnt")}"
      end)
      |> case do
        "" -> "none"
        text -> text
      end
    end

    # Stacks the own walker gave to libunwind; with libunwind walking every
    # one, "(0 to libunwind)" would contradict the line.
    defp fallbacks(%{fast_unwind: false}), do: ""

    # without libunwind, what the own walker hands over ends where it stopped
    defp fallbacks(%{libunwind: false}),
      do: " (libunwind.so.8 not loaded: stacks it would finish end early; Debian: libunwind8)"

    defp fallbacks(%{unwind_fallbacks: n}) when is_integer(n),
      do: " (#{Format.int(n)} to libunwind)"

    defp fallbacks(_s), do: ""

    # An untraced program walks no stack: its walker and Erlang frames
    # would only be the defaults, not something it did.
    defp tracking(%{active: false}), do: "not traced (not a program MTRACE_PROGRAMS names)"

    defp tracking(s) do
      [
        cond do
          s.enabled == false -> "switched off"
          s.sampled -> "sampling every #{size(s.sample_bytes)}"
          true -> "lossless"
        end,
        if(s.fast_unwind == false, do: "libunwind", else: "own stack walker") <>
          fallbacks(s) <>
          if(is_integer(s.unwind_cut) and s.unwind_cut > 0,
            do: ", #{Format.count(s.unwind_cut, "stack")} cut short",
            else: ""
          ),
        case s.erlang_frames do
          true -> "Erlang frames on (#{count(s.erlang_stacks, "stack")})"
          _ -> "Erlang frames " <> (s.erlang_frames_off || "off")
        end,
        case s.config_errors do
          [_ | _] = bad -> "not understood, default used: " <> Enum.join(bad, ", ")
          _ -> nil
        end
      ]
      |> Enum.reject(&is_nil/1)
      |> Enum.join("; ")
    end

    defp size(n) when is_integer(n), do: Format.bytes(n)
    defp size(_), do: "n/a"

    defp count(n, noun) when is_integer(n), do: Format.count(n, noun)
    defp count(_, noun), do: "n/a #{noun}s"
  end
end

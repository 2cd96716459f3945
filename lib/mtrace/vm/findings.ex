defmodule Mtrace.VM.Findings do
  @moduledoc """
  Turns samples into scored findings and a verdict.

  ## Scores

  Every check measures something against its threshold and scores the ratio
  the same way: 50 at the threshold, proportionally less below it, and 50
  more each time the measure doubles above it (`50 + 50 * log2(ratio)`). A
  finding scoring 50 or more is a problem; the verdict is the kind of the
  highest-scoring one. Findings scoring under 20 are not reported. When a
  window was sampled, growth is scored alongside size and the larger score
  counts; growth of less than a minimum over the whole window (1_000
  messages, processes or monitors; 8 MiB of memory) is ignored as noise.

  ## Thresholds

  `Mtrace.VM.Thresholds` lists them all with their defaults; option
  `thresholds:` of `Mtrace.VM.diagnose/1` overrides any of them.

  | kind | size | growth over a window |
  | --- | --- | --- |
  | `:mailbox_buildup` | a process with `mailbox_len` messages waiting | one mailbox growing by `mailbox_growth` messages/s |
  | `:process_leak` | processes at `process_share` of the limit, or `idle_group`+ idle processes (waiting, mailbox empty) sharing initial call and current function and making up `idle_share` of all processes | the process count growing by `process_growth`/s |
  | `:monitor_leak` | a process holding `monitors` monitors | one process gaining `monitor_growth` monitors/s |
  | `:ets_growth` | a table holding `ets_bytes`, or `ets_share_min`+ that is `ets_share` of the VM's memory, counting the binaries it references (estimated from 64 objects) | a table growing by `ets_growth`/s |
  | `:binary_leak` | a forced GC freeing `binary_freed` of binaries, or `binary_freed_share` of the VM's memory if larger (without the GC, binaries holding half of the VM's memory score at most 45) | — |
  | `:native_leak` | `native_bytes` (or the VM's own memory if larger) of native memory, or `native_vm_min`+ that is `native_vm_ratio` times what the VM accounts for: the tracer's live malloc bytes, or RSS outside the ERTS allocators when it is not preloaded | native memory growing *steadily* by `native_growth`/s: sampled `window_steps` times across the window, it went up in at least `native_steady` of the steps |
  | `:native_heap` | with a window, the same sizes when native memory did not grow steadily: large, but not leaking while it was watched | — |
  | `:nif_alloc_leak` | one NIF module holding `nif_bytes` in the VM's allocators (enif_alloc, resources, binaries: `Mtrace.VM.nif_memory/1`), or `nif_share_min`+ that is `nif_share` of the VM's memory | that memory growing by `nif_growth`/s |
  | `:fragmentation` | an allocator type used below `frag_usage`, wasting `frag_wasted` | — |

  Growth below a minimum over the whole window (`*_growth_min`) is ignored
  as noise; native growth is judged by its steadiness instead, so that a
  node that churns, or takes a working set and gives it back, stays
  healthy while a slow steady leak does not.

  When scores tie, the more specific cause wins: a stuck mailbox or a
  process leak inflates memory everywhere else as a consequence.
  """

  alias Mtrace.VM.{MemoryChecks, NifChecks, ProcessChecks, Snapshot}

  @typedoc "One finding of `Mtrace.VM.diagnose/1`."
  @type finding :: %{
          kind: atom,
          score: float,
          summary: String.t(),
          evidence: term,
          next: String.t()
        }

  @problem 50.0
  @listed 20.0
  @priority [
    :mailbox_buildup,
    :process_leak,
    :monitor_leak,
    :binary_leak,
    :ets_growth,
    :nif_alloc_leak,
    :native_leak,
    :native_heap,
    :fragmentation
  ]

  @doc """
  All findings for sample `snap` (and `prev`, the sample a window earlier, or
  `nil`), highest score first. `extra` carries what is measured once, after
  sampling: `:bin_leak` (a `Mtrace.VM.bin_leak/1` result or `nil`),
  `:preloaded` and `:sites`, and optionally `:thresholds`,
  `:native_series` and `:limit` (see `Mtrace.VM.MemoryChecks.run/4`).

  ## Example

      snap = Mtrace.VM.Snapshot.take()
      Mtrace.VM.Findings.judge(nil, snap, %{bin_leak: nil, preloaded: false, sites: []})
      #=> []
  """
  @spec judge(Snapshot.t() | nil, Snapshot.t(), map) :: [finding]
  def judge(prev, snap, extra) do
    secs = if prev, do: max(snap.at_ms - prev.at_ms, 1) / 1000

    thresholds = Map.get(extra, :thresholds, Mtrace.VM.Thresholds.defaults())

    (ProcessChecks.run(prev, snap, secs, thresholds) ++
       MemoryChecks.run(prev, snap, secs, extra) ++
       [NifChecks.run(extra[:nif], secs, snap.memory, thresholds)])
    |> Enum.reject(&is_nil/1)
    |> Enum.filter(&(&1.score >= @listed))
    |> Enum.sort_by(&{-&1.score, Enum.find_index(@priority, fn k -> k == &1.kind end)})
  end

  @doc """
  The kind of the first (highest-scoring) finding at or above 50, else
  `:healthy`.

  ## Example

      iex> Mtrace.VM.Findings.verdict([%{kind: :ets_growth, score: 63.0}])
      :ets_growth
      iex> Mtrace.VM.Findings.verdict([%{kind: :ets_growth, score: 30.0}])
      :healthy
  """
  @spec verdict([finding]) :: atom
  def verdict(findings) do
    case findings do
      [%{kind: kind, score: score} | _] when score >= @problem -> kind
      _ -> :healthy
    end
  end

  @doc """
  The score for a measure at `ratio` times its threshold.

  ## Examples

      iex> Mtrace.VM.Findings.score(1)
      50.0
      iex> Mtrace.VM.Findings.score(4)
      150.0
      iex> Mtrace.VM.Findings.score(0.5)
      25.0
  """
  @spec score(number) :: float
  def score(ratio) when ratio <= 0, do: 0.0
  def score(ratio) when ratio <= 1, do: Float.round(50.0 * ratio, 1)
  def score(ratio), do: Float.round(50.0 + 50.0 * :math.log2(ratio), 1)

  @doc """
  Builds a finding scored from `ratio`.

  ## Example

      iex> Mtrace.VM.Findings.finding(:ets_growth, 2, "big", %{}, "Mtrace.VM.ets_top(5)").score
      100.0
  """
  @spec finding(atom, number, String.t(), term, String.t()) :: finding
  def finding(kind, ratio, summary, evidence, next) do
    %{kind: kind, score: score(ratio), summary: summary, evidence: evidence, next: next}
  end

  @doc """
  A rate per second over a window of `secs` seconds, or `nil` without one.

  ## Example

      iex> Mtrace.VM.Findings.rate(500, 2.0)
      250.0
  """
  @spec rate(number, number | nil) :: float | nil
  def rate(_delta, nil), do: nil
  def rate(delta, secs), do: delta / secs

  @doc """
  How far growth of `delta` over `secs` seconds goes past `per_s` per second,
  as a ratio; 0 without a window or when `delta` is under `min`, so that a
  short window's noise (a module loaded, a burst of messages) is not taken
  for a trend.

  ## Examples

      iex> Mtrace.VM.Findings.growth_ratio(2_000, 2.0, 500, 1_000)
      2.0
      iex> Mtrace.VM.Findings.growth_ratio(900, 0.5, 500, 1_000)
      0
  """
  @spec growth_ratio(number | nil, number | nil, number, number) :: number
  def growth_ratio(delta, secs, per_s, min)
      when is_number(delta) and is_number(secs) and delta >= min,
      do: ratio(delta / secs, per_s)

  def growth_ratio(_delta, _secs, _per_s, _min), do: 0

  @doc """
  `value / threshold`, or 0 when either is missing.

  ## Example

      iex> Mtrace.VM.Findings.ratio(nil, 10)
      0
  """
  @spec ratio(number | nil, number) :: number
  def ratio(value, threshold) when is_number(value) and threshold > 0, do: value / threshold
  def ratio(_, _), do: 0
end

defmodule Mtrace.VMSites do
  @moduledoc """
  The VM's own native allocations, which every node holds and which are not
  leaks by themselves: the data of loaded code, the carriers of the VM's own
  allocators, its threads' signal stacks. On a healthy node they are the
  largest sites, so `Mtrace.report/1` (under the site's line),
  `Mtrace.top/1`, `Mtrace.Watch` and `Mtrace.VM.diagnose/1` say what each
  one is, and an operator does not chase them. They are recognized by the
  functions in their stacks (frames of beam.smp as `Mtrace.Frame.name/1`
  gives them).
  """

  # {functions any of which the stack holds, what the site is, in short}
  @known [
    {~w(beamasm_metadata_update BeamModuleAssembler::register_metadata
        asmjit::_abi_1_9::JitAllocator::alloc BeamModuleAssembler::codegen
        beam_load_finalize_code erts_finish_loading),
     "the VM's own loaded code and its metadata, which grow as modules load",
     "the VM's own: loaded code"},
    {~w(erts_alcu_start erts_sys_aligned_alloc),
     "a carrier of the VM's own allocators, whose use Mtrace.VM shows",
     "the VM's own: allocator carrier"},
    {~w(sys_thread_init_signal_stack), "a signal stack of one of the VM's threads",
     "the VM's own: thread signal stack"}
  ]

  @doc """
  What a site is when its stack is one of the VM's own allocations, else
  nil. `frames` are the site's frames, innermost first; `:short` gives a
  few words, for the narrow columns of `Mtrace.top/1`.

  ## Examples

      iex> Mtrace.VMSites.note([%{symbol: "beamasm_metadata_update", lib: "/usr/lib/erlang/erts-13.1.5/bin/beam.smp", offset: 0}])
      "the VM's own loaded code and its metadata, which grow as modules load"
      iex> Mtrace.VMSites.note([%{symbol: "erts_alcu_start", lib: "beam.smp", offset: 0}], :short)
      "the VM's own: allocator carrier"
      iex> Mtrace.VMSites.note([%{symbol: "leak", lib: "/opt/leaky_nif.so", offset: 0}])
      nil
  """
  @spec note([map()], :long | :short) :: String.t() | nil
  def note(frames, form \\ :long) do
    names = for frame <- frames, not Mtrace.Frame.erlang?(frame), do: Mtrace.Frame.name(frame)

    Enum.find_value(@known, fn {functions, long, short} ->
      if Enum.any?(names, &(&1 in functions)), do: if(form == :short, do: short, else: long)
    end)
  end

  @doc """
  `sites` (as `Mtrace.sites/1` returns them, largest first) with the VM's
  own sites of one kind merged into one, for the one-line outputs, where
  they would otherwise read alike: counts, bytes and rates summed, the
  oldest `oldest` and newest `newest`, the first site's frames, and
  `:sites`, how many were merged (absent for a site that stands alone).
  The merged site takes the first one's place; other sites are left as
  they are, in their order. With `rank` (a site's figure, such as
  `& &1.growth_per_s`) the result is ordered by it again, largest first:
  merged sums may outgrow the sites above them.

  ## Example

      iex> own = [%{symbol: "erts_alcu_start", lib: "beam.smp", offset: 0}]
      iex> Mtrace.VMSites.merge([
      ...>   %{count: 2, bytes: 100, frames: own},
      ...>   %{count: 1, bytes: 50, frames: [%{symbol: "leak", lib: "x.so", offset: 0}]},
      ...>   %{count: 3, bytes: 10, frames: own}
      ...> ]) |> Enum.map(&{&1.count, &1.bytes, &1[:sites]})
      [{5, 110, 2}, {1, 50, nil}]
      iex> Mtrace.VMSites.merge([
      ...>   %{count: 1, bytes: 60, frames: own},
      ...>   %{count: 1, bytes: 50, frames: [%{symbol: "leak", lib: "x.so", offset: 0}]},
      ...>   %{count: 1, bytes: 40, frames: own}
      ...> ], & &1.bytes) |> Enum.map(& &1.bytes)
      [100, 50]
      iex> Mtrace.VMSites.merge([   # right after a mark sites have no rate
      ...>   %{count: 1, bytes: 60, growth_per_s: nil, frames: own},
      ...>   %{count: 1, bytes: 40, growth_per_s: nil, frames: own}
      ...> ]) |> Enum.map(&{&1.bytes, &1.growth_per_s})
      [{100, nil}]
  """
  @spec merge([map()], (map() -> number()) | nil) :: [map()]
  def merge(sites, rank \\ nil) do
    {merged, _} =
      Enum.reduce(sites, {[], %{}}, fn site, {out, at} ->
        case note(Map.get(site, :frames, [])) do
          nil ->
            {[site | out], at}

          what when is_map_key(at, what) ->
            i = length(out) - 1 - at[what]
            {List.update_at(out, i, &add(&1, site)), at}

          what ->
            {[site | out], Map.put(at, what, length(out))}
        end
      end)

    merged = Enum.reverse(merged)
    if rank, do: Enum.sort_by(merged, rank, :desc), else: merged
  end

  @doc """
  The bytes a site is ranked by: its estimate under sampling, else what
  the table recorded (a `rank` for `merge/2`).

      iex> Mtrace.VMSites.bytes(%{bytes: 10, est_bytes: 1_000})
      1000
      iex> Mtrace.VMSites.bytes(%{bytes: 10})
      10
  """
  @spec bytes(map()) :: number()
  def bytes(site), do: Map.get(site, :est_bytes, Map.get(site, :bytes, 0))

  @doc """
  How many sites a site from `merge/1` stands for, in words for its line:
  `" at N sites"`, or `""` for one that stands alone.

      iex> Mtrace.VMSites.at_sites(%{sites: 2})
      " at 2 sites"
      iex> Mtrace.VMSites.at_sites(%{count: 1})
      ""
  """
  @spec at_sites(map()) :: String.t()
  def at_sites(%{sites: n}), do: " at #{n} sites"
  def at_sites(_site), do: ""

  @summed [:count, :bytes, :est_count, :est_bytes, :growth_per_s]

  # a rate is nil right after its mark (Mtrace.Query): no sum then
  defp sum(a, b) when is_number(a) and is_number(b), do: a + b
  defp sum(_a, _b), do: nil

  defp add(into, site) do
    into
    |> Map.merge(Map.take(site, @summed), fn _key, a, b -> sum(a, b) end)
    |> Map.merge(Map.take(site, [:oldest]), fn _key, a, b -> max(a, b) end)
    |> Map.merge(Map.take(site, [:newest]), fn _key, a, b -> min(a, b) end)
    |> Map.update(:sites, 2, &(&1 + 1))
  end

  @doc """
  A site on one line, for `Mtrace.Watch` and `Mtrace.VM.diagnose/1`: what
  it is when it is one of the VM's own, else its innermost `n` frames
  (`Mtrace.Frame.label/1`), each called by the next; when the Erlang code
  that called the NIF (`Mtrace.Frame.caller_at/1`) is not among them, it
  follows them when it comes right after, else the last of them gives way
  to it, after a `…` for the frames between.

  ## Examples

      iex> Mtrace.VMSites.one_line([
      ...>   %{symbol: "leak", lib: "/opt/leaky.so", file: "leaky.c", line: 12, offset: 0},
      ...>   %{module: Ledger, function: :append, arity: 1, symbol: nil, lib: nil, offset: 0}
      ...> ])
      "leak (leaky.c:12) <- Ledger.append/1"
      iex> deep = for f <- ~w(f4 f3 f2 f1), do: %{symbol: f, lib: "/opt/deep.so", offset: 0}
      iex> nif = %{module: DeepNif, function: :leak, arity: 1, symbol: nil, lib: nil, offset: 0}
      iex> caller = %{module: Billing, function: :charge, arity: 1, symbol: nil, lib: nil, offset: 0}
      iex> Mtrace.VMSites.one_line(deep ++ [nif, caller], 3)
      "f4 (deep.so) <- f3 (deep.so) <- … <- Billing.charge/1"
      iex> Mtrace.VMSites.one_line(Enum.take(deep, 2) ++ [nif, caller], 3)
      "f4 (deep.so) <- f3 (deep.so) <- DeepNif.leak/1 <- Billing.charge/1"
  """
  @spec one_line([map()], pos_integer()) :: String.t()
  def one_line(frames, n \\ 4) do
    note(frames) || frames |> innermost(n) |> Enum.join(" <- ")
  end

  defp innermost(frames, n) do
    labels = &Enum.map(&1, fn frame -> Mtrace.Frame.label(frame) end)

    case Mtrace.Frame.caller_at(frames) do
      at when is_integer(at) and at > n and n >= 2 ->
        labels.(Enum.take(frames, n - 1)) ++ ["…", Mtrace.Frame.label(Enum.at(frames, at))]

      # right after them: in the place a "…" would take
      ^n ->
        labels.(Enum.take(frames, n + 1))

      _ ->
        labels.(Enum.take(frames, n))
    end
  end
end

defmodule Mtrace do
  @moduledoc """
  Finds native memory leaks on a live node: allocations made with malloc and
  friends (by NIFs, drivers and the C libraries they link) that are still held,
  oldest first, with the call stack that made them.

  The work is done by `priv/mtrace.so`, preloaded into `beam.smp` with
  `LD_PRELOAD`: it records every live allocation in a lossless table of its
  own. These functions read that table through a NIF. Without the preload they
  raise `Mtrace.Error`, whose message gives the `LD_PRELOAD` line to use;
  `preloaded?/0` tells beforehand. For memory the VM itself accounts for
  (processes, binaries, ETS), see `Mtrace.VM`.
  """

  alias Mtrace.Native

  @typedoc "One frame of a stack: the object file and the function name (nil if unknown)."
  @type frame :: {lib :: binary() | nil, symbol :: binary() | nil}

  @typedoc """
  One live allocation: its age in seconds, size in bytes, address, the
  nanoseconds spent naming its stack, and the stack (frame 0 called malloc).
  """
  @type old ::
          {age_s :: non_neg_integer(), size :: non_neg_integer(), addr :: non_neg_integer(),
           ns :: non_neg_integer(), stack :: [frame()]}

  @doc """
  Whether the tracer library is preloaded into this VM (and its NIF loaded).

      iex> is_boolean(Mtrace.preloaded?())
      true
  """
  @spec preloaded?() :: boolean()
  def preloaded? do
    Native.preloaded()
  rescue
    _ -> false
  end

  @doc """
  The `n` oldest live native allocations, oldest first.

  Each is `{age_seconds, size, addr, ns, stack}`; `stack` is a list of
  `{lib, symbol}` from the function that called malloc outwards. With
  `demangle` true, C++ names are demangled. The selection happens in C, so
  `olds(10)` is cheap even with millions of live allocations; the scan runs on
  a dirty scheduler.

      iex> for {age, size, _addr, _ns, stack} <- Mtrace.olds(3) do
      ...>   is_integer(age) and size >= 0 and is_list(stack)
      ...> end
      ...> |> Enum.all?()
      true
  """
  @spec olds(non_neg_integer(), boolean()) :: [old()]
  def olds(n \\ 10, demangle \\ false)

  def olds(n, demangle) when is_integer(n) and n >= 0 and is_boolean(demangle) do
    call(fn -> Native.olds(n, demangle, {0, 0, 0, 0}) end)
  end

  def olds(n, demangle) when is_boolean(demangle) do
    raise ArgumentError, "olds/2: n must be a non-negative integer, got: #{inspect(n)}"
  end

  def olds(_n, demangle) do
    raise ArgumentError, "olds/2: demangle must be a boolean, got: #{inspect(demangle)}"
  end

  @doc """
  Counters and table figures.

  Call counters (`malloc_cnt`, `calloc_cnt`, `realloc_cnt`, `free_cnt`,
  `posix_memalign_cnt`, `strdup_cnt`, `strndup_cnt`, and the same for
  `reallocarray`, `aligned_alloc`, `memalign`, `valloc`, `pvalloc`) count calls
  seen while tracking was on. `live_count`/`live_bytes` describe the table;
  `dropped` counts allocations that could not be recorded (no memory for the
  table), `replaced` entries overwritten because a free was missed,
  `stacks_dropped` allocations recorded without a stack. `enabled`, `active`
  (this executable is traced) and `depth` are the effective settings.
  `allocated_bytes`, `used_bytes`, `free_bytes`, `mmap_chunks` and
  `mmap_bytes` come from glibc's `mallinfo2()`.

  In sampling mode (`MTRACE_SAMPLE_BYTES`, `sampled: true`) the table holds a
  sample: `live_count`/`live_bytes` are what was recorded, and
  `est_live_count`/`est_live_bytes` are estimates of all live allocations,
  each sample weighted by the inverse of its chance to be sampled (without
  sampling they equal the exact figures). `fast_unwind` tells which stack
  walker runs and `unwind_fallbacks` how many stacks it handed to libunwind;
  `config_errors` names the `MTRACE_` variables whose value was not
  understood and fell back to the default.

      iex> %{live_count: n, enabled: true, active: true, config_errors: []} = Mtrace.stats()
      iex> is_integer(n)
      true
  """
  @spec stats() :: %{atom() => non_neg_integer() | boolean() | [String.t()]}
  def stats, do: call(&Native.stats/0)

  @doc """
  Forgets every recorded allocation and returns how many were forgotten.

  Later frees of forgotten blocks are harmless. Useful to drop what the node
  allocated while booting; `olds/2` then shows only what came after.

      iex> is_integer(Mtrace.reset())
      true
  """
  @spec reset() :: non_neg_integer()
  def reset, do: call(&Native.reset/0)

  @doc """
  Stops recording new allocations (frees are still honoured, so nothing
  recorded goes stale). Returns `:ok`.

      iex> Mtrace.disable()
      :ok
      iex> Mtrace.enable()
      :ok
  """
  @spec disable() :: :ok
  def disable, do: call(fn -> Native.set_enabled(false) end)

  @doc """
  Starts recording new allocations again (also undoes `MTRACE_ENABLED=0`).

      iex> Mtrace.enable()
      :ok
  """
  @spec enable() :: :ok
  def enable, do: call(fn -> Native.set_enabled(true) end)

  defp call(fun) do
    case fun.() do
      {:error, :not_preloaded} -> raise Mtrace.Error.not_preloaded()
      result -> result
    end
  rescue
    e in ErlangError ->
      case e do
        %ErlangError{original: :nif_not_loaded} ->
          raise Mtrace.Error.nif_not_loaded(Native.load_error())

        _ ->
          reraise e, __STACKTRACE__
      end
  end
end

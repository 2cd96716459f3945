defmodule Mtrace.Native do
  # NIF stubs. The NIF (priv/mtrace_nif.so) always loads, even when the tracer
  # library is not preloaded: then each call answers {:error, :not_preloaded}.
  # If the NIF itself cannot load, the module still loads (so that
  # Mtrace.preloaded?/0 can answer) and each stub raises :nif_not_loaded.
  @moduledoc false
  @on_load :load

  @doc false
  def load do
    path = :filename.join(:code.priv_dir(:mtrace), ~c"mtrace_nif")

    case :erlang.load_nif(path, 0) do
      :ok ->
        check_erlang_frames()
        :ok

      {:error, {:reload, _}} ->
        :ok

      {:error, reason} ->
        :persistent_term.put({__MODULE__, :load_error}, reason)
        :ok
    end
  end

  @doc false
  def load_error, do: :persistent_term.get({__MODULE__, :load_error}, nil)

  # Turns on Erlang frames once the NIF has found and checked where the VM
  # keeps a process's call chain: it looks for this function's own return
  # address at the line given, so both calls must stay non-tail calls with
  # __ENV__.line on their own line. The outcome is in stats().
  @doc false
  def check_erlang_frames do
    normal = erlang_layout(__ENV__.line)
    dirty = if normal == :ok, do: erlang_layout_dirty(__ENV__.line), else: normal
    _ = dirty
    :ok
  rescue
    # The NIF did not load: nothing to turn on.
    ErlangError -> :ok
  end

  @doc false
  def preloaded, do: false
  @doc false
  def olds(_n, _demangle, _filter, _lib, _form), do: :erlang.nif_error(:nif_not_loaded)
  @doc false
  def sites(_limit, _order, _demangle, _filter, _lib), do: :erlang.nif_error(:nif_not_loaded)
  @doc false
  def now_ms, do: :erlang.nif_error(:nif_not_loaded)
  @doc false
  def stats, do: :erlang.nif_error(:nif_not_loaded)
  @doc false
  def stats(_heap), do: :erlang.nif_error(:nif_not_loaded)
  @doc false
  def reset, do: :erlang.nif_error(:nif_not_loaded)
  @doc false
  def set_enabled(_on), do: :erlang.nif_error(:nif_not_loaded)
  @doc false
  def erlang_layout(_line), do: :erlang.nif_error(:nif_not_loaded)
  @doc false
  def erlang_layout_dirty(_line), do: :erlang.nif_error(:nif_not_loaded)
end

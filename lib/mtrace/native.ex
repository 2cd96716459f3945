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

  @doc false
  def preloaded, do: false
  @doc false
  def olds(_n, _demangle, _filter), do: :erlang.nif_error(:nif_not_loaded)
  @doc false
  def olds_where(_n, _demangle, _filter, _lib), do: :erlang.nif_error(:nif_not_loaded)
  @doc false
  def sites(_limit, _order, _demangle, _filter, _lib), do: :erlang.nif_error(:nif_not_loaded)
  @doc false
  def now_ms, do: :erlang.nif_error(:nif_not_loaded)
  @doc false
  def stats, do: :erlang.nif_error(:nif_not_loaded)
  @doc false
  def reset, do: :erlang.nif_error(:nif_not_loaded)
  @doc false
  def set_enabled(_on), do: :erlang.nif_error(:nif_not_loaded)
end

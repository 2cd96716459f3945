defmodule Mtrace.Test.LeakyNif do
  @moduledoc false
  # Test fixture: a NIF (test/fixtures/leaky_nif.c) that leaks on purpose.
  # Built by `make fixtures` into $MTRACE_BUILD (default _build/c).
  @on_load :load

  def load do
    dir = System.get_env("MTRACE_BUILD", "_build/c")
    :erlang.load_nif(String.to_charlist(Path.join(dir, "leaky_nif")), 0)
  end

  # Each test that reads the table starts from an empty one, tracking on,
  # and frees what it leaked when it ends.
  def fresh_table(on_exit) do
    free_kept()
    Mtrace.enable()
    Mtrace.reset()
    on_exit.(fn -> free_kept() end)
    :ok
  end

  def leak(_kind, _count, _size), do: :erlang.nif_error(:nif_not_loaded)
  def leak_dirty(_kind, _count, _size), do: :erlang.nif_error(:nif_not_loaded)
  def leak_dirty2(_kind, _count, _size), do: :erlang.nif_error(:nif_not_loaded)
  def spin(_ms), do: :erlang.nif_error(:nif_not_loaded)
  def churn(_count, _size), do: :erlang.nif_error(:nif_not_loaded)
  def free_kept, do: :erlang.nif_error(:nif_not_loaded)
  def leak_threads(_threads, _per_thread, _size), do: :erlang.nif_error(:nif_not_loaded)
  def leak_enif(_kind, _count, _size), do: :erlang.nif_error(:nif_not_loaded)
  def churn_enif(_count, _size), do: :erlang.nif_error(:nif_not_loaded)
end

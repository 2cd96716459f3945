defmodule LeakyApp.Native do
  @moduledoc false
  @on_load :load

  @doc false
  def load do
    :erlang.load_nif(:filename.join(:code.priv_dir(:leaky_app), ~c"leaky_nif"), 0)
  end

  @doc "Leaks `count` blocks of 4096 bytes; returns how many were leaked."
  def leak(_count), do: :erlang.nif_error(:nif_not_loaded)
end

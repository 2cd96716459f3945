defmodule LeakyApp do
  @moduledoc """
  A small application that leaks native memory on purpose, for trying mtrace
  on a release: `LeakyApp.Leaker` leaks 4096-byte blocks from the C function
  `leaky_app_cache_entry` (see `c_src/leaky.c`).
  """

  @doc "How many blocks `LeakyApp.Leaker` has leaked so far."
  @spec leaked() :: non_neg_integer()
  defdelegate leaked(), to: LeakyApp.Leaker
end

defmodule Mtrace.Frame do
  @moduledoc """
  How a stack frame (`t:Mtrace.frame_map/0`) is named in every output:
  report, folded export, JSON and flame graph use the same rule, so one
  function reads the same everywhere.
  """

  @doc """
  The name a frame is shown under: its symbol if known, else the basename of
  its object file and the frame's offset in it, in lowercase hex, else `"??"`.
  An empty symbol or lib counts as unknown.

  ## Examples

      iex> Mtrace.Frame.name(%{symbol: "malloc_wrapper", lib: "/lib/libx.so", offset: 16})
      "malloc_wrapper"
      iex> Mtrace.Frame.name(%{symbol: nil, lib: "/usr/lib/libx.so.1", offset: 0x1A2B})
      "libx.so.1+0x1a2b"
      iex> Mtrace.Frame.name(%{symbol: nil, lib: nil, offset: 0})
      "??"
  """
  @spec name(%{
          :symbol => binary() | nil,
          :lib => binary() | nil,
          :offset => integer(),
          optional(atom()) => term()
        }) :: String.t()
  def name(%{symbol: symbol}) when is_binary(symbol) and symbol != "", do: symbol

  def name(%{lib: lib, offset: offset}) when is_binary(lib) and lib != "",
    do: Path.basename(lib) <> "+0x" <> String.downcase(Integer.to_string(offset, 16))

  def name(_frame), do: "??"
end

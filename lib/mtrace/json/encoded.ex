defmodule Mtrace.JSON.Encoded do
  @moduledoc """
  JSON text already encoded, which `Mtrace.JSON.encode/1` writes as it is:
  a part written many times (a frame that thousands of stacks share) is
  encoded once, and a large array can be made of compact binaries instead
  of the fine-grained iodata an encoding builds.

      iex> frame = %Mtrace.JSON.Encoded{iodata: ~s|{"name":"malloc"}|}
      iex> Mtrace.JSON.encode(%{frames: [frame, frame]}) |> IO.iodata_to_binary()
      ~s|{"frames":[{"name":"malloc"},{"name":"malloc"}]}|
  """
  @enforce_keys [:iodata]
  defstruct [:iodata]
  @type t :: %__MODULE__{iodata: iodata()}
end

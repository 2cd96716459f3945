defmodule Mtrace.VM.Args do
  @moduledoc """
  Argument checks shared by the `Mtrace.VM` functions.

  Every check returns the value it was given, or raises `ArgumentError` with a
  message that names the argument or option, so a caller sees at once which
  one was wrong.
  """

  @doc """
  Returns `value` when it is an integer greater than zero, else raises.

  ## Example

      iex> Mtrace.VM.Args.pos_int!(5, "n")
      5
  """
  @spec pos_int!(term, String.t()) :: pos_integer
  def pos_int!(value, _name) when is_integer(value) and value > 0, do: value

  def pos_int!(value, name) do
    raise ArgumentError, "#{name} must be a positive integer, got: #{inspect(value)}"
  end

  @doc """
  Returns `value` when it is an integer of zero or more, else raises.

  ## Example

      iex> Mtrace.VM.Args.non_neg_int!(0, "ms")
      0
  """
  @spec non_neg_int!(term, String.t()) :: non_neg_integer
  def non_neg_int!(value, _name) when is_integer(value) and value >= 0, do: value

  def non_neg_int!(value, name) do
    raise ArgumentError, "#{name} must be a non-negative integer, got: #{inspect(value)}"
  end

  @doc """
  Returns `value` when it is a duration the VM's timers take (an integer of
  milliseconds from 0 to 2^32 - 1), else raises.

  ## Example

      iex> Mtrace.VM.Args.ms!(10_000, "window")
      10000
  """
  @spec ms!(term, String.t()) :: non_neg_integer
  def ms!(value, _name) when is_integer(value) and value >= 0 and value < 0x1_0000_0000,
    do: value

  def ms!(value, name) do
    raise ArgumentError,
          "#{name} must be an integer of milliseconds from 0 to 4294967295, got: #{inspect(value)}"
  end

  @doc """
  Returns `value` when it is one of `allowed`, else raises.

  ## Example

      iex> Mtrace.VM.Args.one_of!(:size, [:memory, :size], "by")
      :size
  """
  @spec one_of!(term, [term], String.t()) :: term
  def one_of!(value, allowed, name) do
    if value in allowed do
      value
    else
      raise ArgumentError,
            "#{name} must be one of #{Enum.map_join(allowed, ", ", &inspect/1)}, " <>
              "got: #{inspect(value)}"
    end
  end

  @doc """
  Checks that `opts` is a keyword list whose keys are all in `known`.

  Returns `opts` as a map with `defaults` filled in. `where` names the
  function in the error message.

  ## Example

      iex> Mtrace.VM.Args.opts!([print: false], [print: true, window: nil], "diagnose/1")
      %{print: false, window: nil}
  """
  @spec opts!(term, keyword, String.t()) :: map
  def opts!(opts, defaults, where) do
    unless Keyword.keyword?(opts) do
      raise ArgumentError, "options for #{where} must be a keyword list, got: #{inspect(opts)}"
    end

    known = Keyword.keys(defaults)

    case Enum.find(opts, fn {key, _} -> key not in known end) do
      nil ->
        Map.merge(Map.new(defaults), Map.new(opts))

      {key, _} ->
        raise ArgumentError,
              "unknown option #{inspect(key)} for #{where}; known options: " <>
                Enum.map_join(known, ", ", &inspect/1)
    end
  end
end

defmodule Mtrace.VM.Growth do
  @moduledoc """
  How a figure moved across a window, from samples taken at even steps:
  its rate, and how steadily it grew (the share of steps in which it went
  up). A leak grows in almost every step; churn and a working set taken
  and given back go up and down, and score low on steadiness whatever
  their net change.
  """

  alias Mtrace.VM.Format

  @typedoc "`from`/`to` are the first and last samples; `per_s` the rate between them."
  @type t :: %{
          from: number,
          to: number,
          per_s: float,
          ups: non_neg_integer,
          steps: pos_integer,
          steadiness: float
        }

  @doc """
  The growth of `samples` (oldest first, taken evenly over `secs` seconds),
  or `nil` without at least two samples and a window.

  ## Examples

      iex> g = Mtrace.VM.Growth.of([0, 100, 200, 300, 400, 500], 5.0)
      iex> {g.per_s, g.ups, g.steps, g.steadiness}
      {100.0, 5, 5, 1.0}
      iex> Mtrace.VM.Growth.of([0, 900, 0, 900, 0, 900], 5.0).steadiness
      0.6
      iex> Mtrace.VM.Growth.of([5], 5.0)
      nil
  """
  @spec of([number] | nil, number | nil) :: t | nil
  def of(samples, secs)
      when is_list(samples) and length(samples) >= 2 and is_number(secs) and secs > 0 do
    if Enum.all?(samples, &is_number/1) do
      steps = length(samples) - 1
      ups = samples |> Enum.chunk_every(2, 1, :discard) |> Enum.count(fn [a, b] -> b > a end)
      from = hd(samples)
      to = List.last(samples)

      %{
        from: from,
        to: to,
        per_s: (to - from) / secs,
        ups: ups,
        steps: steps,
        steadiness: ups / steps
      }
    end
  end

  def of(_samples, _secs), do: nil

  @doc """
  The growth in words.

  ## Example

      iex> Mtrace.VM.Growth.of([0, 100, 200, 300, 400, 500], 5.0) |> Mtrace.VM.Growth.describe()
      "grew by +100 B/s (+351.6 KiB/h), up in 5 of 5 steps"
  """
  @spec describe(t) :: String.t()
  def describe(%{per_s: per_s, ups: ups, steps: steps}) do
    verb = if per_s >= 0, do: "grew", else: "shrank"
    "#{verb} by #{Format.rate(per_s)}, up in #{ups} of #{steps} steps"
  end

  @doc """
  Seconds until the figure has grown by `room` more at this rate, `0` when
  there is no room left, `nil` when it is not growing.

  ## Example

      iex> Mtrace.VM.Growth.time_to(%{per_s: 100.0}, 3600 * 100)
      3600
  """
  @spec time_to(%{per_s: number}, number) :: non_neg_integer | nil
  def time_to(%{per_s: per_s}, _room) when per_s <= 0, do: nil
  def time_to(_growth, room) when room <= 0, do: 0
  def time_to(%{per_s: per_s}, room), do: round(room / per_s)
end

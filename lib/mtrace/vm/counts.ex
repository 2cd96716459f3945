defmodule Mtrace.VM.Counts do
  @moduledoc """
  How many processes, ports, atoms and ETS tables a node has, against the
  limits it was started with (`+P`, `+Q`, `+t`, `+e`).
  """

  @typedoc "Each entry is `{count, limit}`."
  @type t :: %{
          processes: {non_neg_integer, pos_integer},
          ports: {non_neg_integer, pos_integer},
          atoms: {non_neg_integer, pos_integer},
          ets: {non_neg_integer, pos_integer}
        }

  @doc """
  Current counts and limits. See `Mtrace.VM.counts/0`.

  ## Example

      %{processes: {count, limit}} = Mtrace.VM.Counts.read()
      true = count <= limit
  """
  @spec read() :: t
  def read do
    %{
      processes: pair(:process_count, :process_limit),
      ports: pair(:port_count, :port_limit),
      atoms: pair(:atom_count, :atom_limit),
      ets: pair(:ets_count, :ets_limit)
    }
  end

  defp pair(count, limit), do: {:erlang.system_info(count), :erlang.system_info(limit)}
end

defmodule Mtrace.Mark do
  @moduledoc """
  A point in time on one node's allocation table, from `Mtrace.mark/1`.

  Pass it as `since:` to `Mtrace.olds/2`, `Mtrace.sites/1` and the outputs
  built on them to see only allocations made after it that are still live:
  "what grew since I looked", without `Mtrace.reset/0` forgetting the past.

  `t_ms` is on the tracer's clock (`CLOCK_MONOTONIC_COARSE` of that node's
  machine), so a mark only means something on the node that took it; queries
  check `node`.
  """

  @enforce_keys [:node, :t_ms]
  defstruct [:node, :t_ms]

  @type t :: %__MODULE__{node: node(), t_ms: non_neg_integer()}
end

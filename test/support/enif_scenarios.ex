defmodule Mtrace.Test.EnifScenarios do
  @moduledoc false
  # Processes the NIF memory tests run on their peers.
  alias Mtrace.Test.LeakyNif

  # Keeps `bytes` of resources every 20 ms.
  def grow(bytes) do
    LeakyNif.leak_enif(:resource, 1, bytes)
    Process.sleep(20)
    grow(bytes)
  end

  # enif_alloc, resources and binaries made and given back, as fast as it can.
  def churn do
    LeakyNif.churn_enif(2_000, 4096)
    Process.sleep(1)
    churn()
  end
end

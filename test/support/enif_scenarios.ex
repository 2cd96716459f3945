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

  # enif_alloc, resources and binaries made and given back, 2,000 of each
  # every 10 ms, in short NIF calls on a normal scheduler.
  def churn do
    for _ <- 1..10, do: LeakyNif.churn_enif(200, 4096)
    Process.sleep(10)
    churn()
  end
end

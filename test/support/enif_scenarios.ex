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

  # One binary of `mib` MiB that `holders` processes keep, as a blob handed
  # to workers is; returns the holders.
  def shared_blob(mib, holders) do
    blob = :binary.copy(<<1>>, mib * 1_048_576)
    for _ <- 1..holders, do: spawn(fn -> receive(do: (:stop -> byte_size(blob))) end)
  end
end

defmodule Mtrace.Test.Remote do
  @moduledoc false
  # Distribution for the tests that start peers, and what runs on those peers.

  # Makes this node distributed (peers are reached over distribution).
  def distribute! do
    unless Node.alive?() do
      # net_kernel needs epmd and does not start it itself.
      System.cmd("epmd", ["-daemon"])
      name = :"mtrace_test_#{System.unique_integer([:positive])}"
      {:ok, _} = :net_kernel.start([name, :shortnames])
    end

    :ok
  end

  def preloaded_and_error do
    message =
      try do
        Mtrace.stats()
        nil
      rescue
        e in Mtrace.Error -> Exception.message(e)
      end

    {Mtrace.preloaded?(), message}
  end
end

defmodule Mtrace.Test.Remote do
  @moduledoc false
  # Runs on peer nodes started by the tests.

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

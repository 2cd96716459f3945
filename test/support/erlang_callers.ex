defmodule Mtrace.Test.ErlangCallers do
  @moduledoc false
  # Erlang callers of the leaking fixture NIF, for the Erlang frames tests.
  # Each call that must appear as a frame is a non-tail call (its result is
  # used: the compiler turns `f(), :ok` into a tail call when it knows f
  # returns :ok) and follows a `# call: name` marker, which the tests look
  # up to know its line.
  alias Mtrace.Test.LeakyNif

  def append(n) do
    # call: append
    LeakyNif.leak(:malloc, n, 1000)
    :ok
  end

  def audit(n) do
    # call: audit
    LeakyNif.leak(:malloc, n, 1000)
    :ok
  end

  def outer(nif, n) do
    # call: outer
    [middle(nif, n)]
  end

  defp middle(nif, n) do
    # call: middle
    [inner(nif, n)]
  end

  defp inner(:leak, n) do
    # call: inner
    LeakyNif.leak(:malloc, n, 1000)
    :ok
  end

  defp inner(:leak_dirty, n) do
    # call: inner_dirty
    LeakyNif.leak_dirty(:malloc, n, 1000)
    :ok
  end

  def tail_outer(n) do
    # call: tail_outer
    [tail(n)]
  end

  # The NIF call is this function's last: no frame of `tail` stays behind.
  defp tail(n), do: LeakyNif.leak(:malloc, n, 1000)

  # Leaks 4 blocks every 50 ms from append/1, until killed.
  def leak_forever do
    append(4)
    Process.sleep(50)
    leak_forever()
  end

  # n tasks at once, a quarter on each path (two of them through dirty
  # and normal calls of outer/2), each leaking `blocks` blocks.
  def concurrently(n, blocks) do
    for i <- 1..n do
      Task.async(fn ->
        case rem(i, 4) do
          0 -> append(blocks)
          1 -> audit(blocks)
          2 -> outer(:leak_dirty, blocks)
          3 -> outer(:leak, blocks)
        end
      end)
    end
    |> Task.await_many(60_000)

    :ok
  end
end

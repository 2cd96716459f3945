defmodule Mtrace.BinaryHeldOwnerTest do
  use ExUnit.Case, async: true

  alias Mtrace.VM.{BinaryChecks, Format, Thresholds}

  test "a table holding the binaries a GC left names its owner as findings name a process" do
    me = self()

    owner =
      spawn(fn ->
        Process.register(self(), :mtrace_held_owner)
        send(me, {:table, :ets.new(:mtrace_held_blobs, [:public])})
        Process.sleep(:infinity)
      end)

    table = receive do: ({:table, t} -> t)
    mib = 1_048_576
    bin_leak = %{held: [], binary_before: 151 * mib, binary_after: 150 * mib}
    ets = %{estimates: [{table, 150 * mib, 150 * mib}], unsampled: 0}
    f = BinaryChecks.held(%{memory: %{total: 181 * mib}}, bin_leak, ets, Thresholds.defaults())
    Process.exit(owner, :kill)

    assert f.next =~
             "find who inserts into :mtrace_held_blobs (unnamed), owned by " <>
               "#{inspect(owner)} (:mtrace_held_owner), without deleting"

    assert f.next =~ "Process.info(#{Format.pid_expr(owner)}, [:current_stacktrace, :dictionary])"
  end
end

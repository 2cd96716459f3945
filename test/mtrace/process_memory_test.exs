defmodule Mtrace.ProcessMemoryTest do
  # The process_memory check on this node's own processes: what it says of
  # a process whose memory is its mailbox, and what it asks to run.
  use ExUnit.Case, async: false

  alias Mtrace.VM.{Diagnose, Findings, Format}

  # `pid` ranked as the process holding the most, 300 MiB
  defp process_memory(pid) do
    snap = Diagnose.snapshot()
    procs = %{snap.procs | memory_top: [{pid, 300 * 1_048_576}]}
    checks = Findings.process_checks(nil, %{snap | procs: procs}, nil)
    Enum.find(checks, &(&1 && &1.kind == :process_memory))
  end

  test "memory that is mostly messages waiting is said to be, and no :sys call is asked" do
    # stuck in a call of its own: :sys.get_state/1 would time out behind
    # the queue
    stuck = spawn(fn -> receive do: (:first -> Process.sleep(:infinity)) end)
    send(stuck, :first)
    payload = Enum.to_list(1..60)
    for i <- 1..20_000, do: send(stuck, {:event, i, payload})

    f = process_memory(stuck)
    assert f.summary =~ "mostly its message queue: 20_000 messages waiting in about "
    assert %{len: 20_000, bytes: bytes} = f.evidence.message_queue
    assert bytes >= 20_000 * 60 * 16
    refute f.next =~ ":sys."
    assert f.next =~ "Process.info(#{Format.pid_expr(stuck)}, [:current_stacktrace, :status])"
    Process.exit(stuck, :kill)
  end

  test "a process keeping its state, its mailbox empty, is asked for its state" do
    keeper =
      spawn(fn ->
        kept = Enum.to_list(1..100_000)
        receive do: (:never -> kept)
      end)

    f = process_memory(keeper)
    refute f.summary =~ "message"
    assert f.evidence.message_queue == nil
    assert f.next =~ ":sys.get_state(#{Format.pid_expr(keeper)})"
    Process.exit(keeper, :kill)
  end
end

defmodule Mtrace.PortQueueTest do
  # diagnose/1 reads every port of the node
  use ExUnit.Case, async: false

  alias Mtrace.VM.{BinaryChecks, PortChecks, Ports, Thresholds}

  doctest Mtrace.VM.Ports
  doctest Mtrace.VM.PortChecks

  @mib 1_048_576

  # A connected pair whose client never reads: what the server sends
  # stays queued in the server's port once the kernel's buffers are full.
  defp stalled_pair do
    {:ok, listener} = :gen_tcp.listen(0, [:binary, active: false, sndbuf: 65_536])
    {:ok, number} = :inet.port(listener)
    opts = [:binary, active: false, recbuf: 65_536]
    {:ok, client} = :gen_tcp.connect({127, 0, 0, 1}, number, opts)
    {:ok, server} = :gen_tcp.accept(listener)
    :gen_tcp.close(listener)
    {:ok, {_, client_number}} = :inet.sockname(client)

    # a plain close would wait for the queue to drain (the socket's linger)
    on_exit(fn ->
      Process.exit(server, :kill)
      :gen_tcp.close(client)
    end)

    {server, client_number}
  end

  # Sends from another process (gen_tcp.send waits for the queue to drain)
  # and waits until the port holds at least `bytes` of it.
  defp queue(server, bytes) do
    spawn(fn -> :gen_tcp.send(server, :binary.copy("x", bytes)) end)
    wait_queued(server, bytes - 4 * @mib, 200)
  end

  defp wait_queued(port, at_least, tries) do
    {:queue_size, queued} = :erlang.port_info(port, :queue_size)

    cond do
      queued >= at_least -> queued
      tries == 0 -> flunk("#{inspect(port)} queued only #{queued} bytes")
      true -> Process.sleep(10) && wait_queued(port, at_least, tries - 1)
    end
  end

  test "port_top names the socket whose peer does not read, with its peer and owner" do
    {server, client_number} = stalled_pair()
    queued = queue(server, 24 * @mib)

    assert [{^server, value, info} | _] = Mtrace.VM.port_top(:queue_size, 3)
    assert value >= queued
    assert info[:name] == "tcp_inet"
    assert info[:kind] == :socket
    assert info[:peer] == "127.0.0.1:#{client_number}"
    assert info[:connected] == self()
    # read after the ranking: the queue may have moved meanwhile
    assert info[:queue_size] >= queued
    assert Enum.all?(Mtrace.VM.port_top(:memory, 50), fn {_, bytes, _} -> bytes > 0 end)
    # n alone, as findings write it
    assert [{^server, _, _} | _] = Mtrace.VM.port_top(3)
  end

  test "diagnose names the port holding the queue, and says what keeps it" do
    {server, client_number} = stalled_pair()
    queue(server, 24 * @mib)

    d = Mtrace.VM.diagnose(print: false, gc: false, thresholds: [port_queue: 16 * @mib])
    f = Enum.find(d.findings, &(&1.kind == :port_queue))

    assert f, "no :port_queue finding in #{inspect(Enum.map(d.findings, & &1.kind))}"
    assert f.score >= 50
    assert f.evidence.port == server
    # (a socket of another test may still be closing, its queue draining)
    assert f.summary =~ "#{inspect(server)} (tcp_inet to 127.0.0.1:#{client_number})"
    assert f.summary =~ ~r/ queued to write[;,]/
    assert f.summary =~ "owned by #{inspect(self())}"
    assert f.next =~ "with its linger option set to {true, 0} (:inet.setopts/2) a close drops"
    assert f.next =~ "send_timeout"

    # the call the finding suggests runs, and lists the port first
    [call] = Regex.run(~r/Mtrace\.VM\.port_top\(\d+\)/, f.next)
    assert {[{^server, _, _} | _], _} = Code.eval_string(call)
  end

  test "a program that does not read its input: named by its command" do
    port = Port.open({:spawn, "sleep 10"}, [:binary])
    # a plain close would keep its queue until the program exits
    on_exit(fn -> Process.exit(port, :kill) end)
    spawn(fn -> Port.command(port, :binary.copy("x", 20 * @mib)) end)
    wait_queued(port, 16 * @mib, 200)

    snap = %{ports: Ports.queued()}
    th = %{Thresholds.defaults() | port_queue: 8 * @mib}
    f = PortChecks.queue(nil, snap, nil, th)

    assert f.evidence.port == port
    assert f.evidence.info[:kind] == :program
    assert f.summary =~ "#{inspect(port)} (program: sleep 10) has "
    assert f.next =~ "the port keeps what the program has not read of its input"
    assert f.next =~ "killing the port (Process.exit/2 with :kill; its owner exits"
  end

  test "ports are named for what they are" do
    port = hd(Port.list())
    name = &Ports.name(port, &1)
    assert name.(kind: :stdio, name: "0/1") == "#{inspect(port)} (the VM's standard output)"
    assert name.(kind: :stdio, name: "2/2") == "#{inspect(port)} (the VM's standard error)"
    assert name.(kind: :distribution, name: "tcp_inet", peer: "b@h") =~ "(distribution to b@h)"
    assert name.(kind: :socket, name: "tcp_inet", peer: nil) =~ "(tcp_inet)"
    long = "/usr/lib/erlang/erts-13.1.5/bin/inet_gethost 4 with many more arguments"
    assert name.(kind: :program, name: long) =~ "(program: inet_gethost 4 with many more...)"
    assert name.(nil) =~ "(closed since)"

    # the fd driver's ports (the VM's own standard input and output)
    for port <- Port.list(), info = Ports.describe(port), info[:name] =~ ~r"^\d+/\d+$" do
      assert info[:kind] == :stdio
    end
  end

  test "many ports' queues together, their growth over a window, and one large write" do
    [a, b | _] = Port.list()
    th = Thresholds.defaults()
    prev = %{ports: %{a => 10 * @mib}}
    snap = %{ports: %{a => 110 * @mib, b => 150 * @mib}}
    f = PortChecks.queue(prev, snap, 10.0, th)

    # a's 100 MiB over 10 s: 10 MiB/s against 1 MiB/s; b, queued since the
    # window's start, is not growth (one large write is not a trend)
    assert f.score == Mtrace.VM.Findings.score(10)
    assert f.evidence.growth_per_s == 10.0 * @mib
    assert f.summary =~ "2 ports have 260.0 MiB queued to write, growing by 10.0 MiB/s; "
    assert f.summary =~ "the most, 150.0 MiB, in #{inspect(b)} ("

    # the same binary queued again and again: the memory did not grow
    prev = Map.put(prev, :memory, %{total: 300 * @mib})
    same = PortChecks.queue(prev, Map.put(snap, :memory, %{total: 302 * @mib}), 10.0, th)
    assert same.evidence.growth_per_s == nil

    one_write = PortChecks.queue(%{ports: %{}}, %{ports: %{b => 12 * @mib}}, 5.0, th)
    assert one_write.score < 50
    assert one_write.evidence.growth_per_s == nil

    assert PortChecks.queue(nil, %{ports: %{}}, nil, th) == nil
    # a snapshot taken before ports were sampled
    assert PortChecks.queue(nil, %{}, nil, th) == nil
  end

  test "bytes queued beyond the VM's memory (a binary queued twice) count as the memory" do
    port = hd(Port.list())
    snap = %{ports: %{port => 80 * @mib}, memory: %{total: 40 * @mib}}
    f = PortChecks.queue(nil, snap, nil, Thresholds.defaults())

    assert f.score == Mtrace.VM.Findings.score(40 / 64)
    assert f.summary =~ "has 80.0 MiB queued to write"

    assert f.summary =~
             "(binaries queued more than once count each time: the VM's memory is 40.0 MiB)"
  end

  test "the binaries a GC left are said to be queued in a port, whose listing comes next" do
    port = hd(Port.list())
    bin_leak = %{held: [], binary_before: 151 * @mib, binary_after: 150 * @mib}
    snap = %{memory: %{total: 181 * @mib}, ports: %{port => 140 * @mib}}
    ets = %{estimates: [], unsampled: 0}
    f = BinaryChecks.held(snap, bin_leak, ets, Thresholds.defaults())

    assert f.summary =~ "; port #{inspect(port)} ("
    assert f.summary =~ ") has 140.0 MiB queued to write"
    refute f.summary =~ "no process, port"
    assert f.next == "Mtrace.VM.port_top(5) lists the ports with the most queued to write"
    assert [{^port, 146_800_640, _info}] = f.evidence.ports
    refute f.summary =~ "more than once"

    # more queued than the GC left: the same binaries counted twice
    twice =
      BinaryChecks.held(
        %{snap | ports: %{port => 200 * @mib}},
        bin_leak,
        ets,
        Thresholds.defaults()
      )

    assert twice.summary =~
             "has 200.0 MiB queued to write (binaries queued more than once count each time)"
  end

  @tag :peer
  test "diagnose(node:) names the other node's port as this node shows it, and its owner" do
    Mtrace.Test.Remote.with_peer(fn node ->
      {owner, server} = :erpc.call(node, Mtrace.VMScenarios, :stalled_socket, [24 * @mib])

      opts = [node: node, print: false, gc: false, thresholds: [port_queue: 16 * @mib]]
      f = Enum.find(Mtrace.VM.diagnose(opts).findings, &(&1.kind == :port_queue))

      assert f.evidence.port == server
      # "#Port<n.x>": the number the other node's ports have here
      assert inspect(server) =~ ~r/^#Port<[1-9]\d*\.\d+>$/
      assert f.summary =~ "#{inspect(server)} (tcp_inet to 127.0.0.1:"
      assert f.summary =~ "owned by #{inspect(owner)}"
      assert f.next =~ ":erpc.call(#{inspect(node)}, Mtrace.VM, :port_top, [5])"
    end)
  end

  test "port_top checks its arguments" do
    assert_raise ArgumentError, ~r"^Mtrace.VM.port_top/2: by must be", fn ->
      Mtrace.VM.port_top(:queue)
    end

    assert_raise ArgumentError, ~r"^Mtrace.VM.port_top/2: n must be", fn ->
      Mtrace.VM.port_top(:memory, 0)
    end
  end
end

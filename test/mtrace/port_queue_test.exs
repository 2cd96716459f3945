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

    on_exit(fn ->
      :gen_tcp.close(client)
      :gen_tcp.close(server)
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
    assert info[:peer] == "127.0.0.1:#{client_number}"
    assert info[:connected] == self()
    assert info[:queue_size] == value
    assert Enum.all?(Mtrace.VM.port_top(:memory, 50), fn {_, bytes, _} -> bytes > 0 end)
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
    assert f.next =~ "Mtrace.VM.port_top(5)"
    assert f.next =~ "send_timeout"
  end

  test "a program that does not read its input: named by its command" do
    # closed with this test's process, which owns it
    port = Port.open({:spawn, "sleep 10"}, [:binary])
    spawn(fn -> Port.command(port, :binary.copy("x", 20 * @mib)) end)
    wait_queued(port, 16 * @mib, 200)

    snap = %{ports: Ports.queued()}
    th = %{Thresholds.defaults() | port_queue: 8 * @mib}
    f = PortChecks.queue(nil, snap, nil, th)

    assert f.evidence.port == port
    assert f.summary =~ "#{inspect(port)} (sleep 10) has "
    assert f.next =~ "a program started with Port.open/2 keeps what it has not read"
  end

  test "many ports' queues together, and their growth over a window" do
    [a, b | _] = Port.list()
    th = Thresholds.defaults()
    prev = %{ports: %{a => 10 * @mib}}
    snap = %{ports: %{a => 60 * @mib, b => 150 * @mib}}
    f = PortChecks.queue(prev, snap, 10.0, th)

    # 200 MiB over 10 s: 20 MiB/s against 1 MiB/s
    assert f.score == Mtrace.VM.Findings.score(20)
    assert f.evidence.growth_per_s == 20.0 * @mib
    assert f.summary =~ "2 ports have 210.0 MiB queued to write, growing by 20.0 MiB/s; "
    assert f.summary =~ "the most, 150.0 MiB, #{inspect(b)} ("

    assert PortChecks.queue(nil, %{ports: %{}}, nil, th) == nil
    # a snapshot taken before ports were sampled
    assert PortChecks.queue(nil, %{}, nil, th) == nil
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

defmodule Mtrace.VM.Ports do
  @moduledoc """
  Ports ranked by the bytes queued in them to be written, or by their own
  memory.

  A port's queue holds what was sent to it and not yet written: for a TCP
  socket, data its peer has not read yet; for a program started with
  `Port.open/2`, input it has not read; for the VM's standard output,
  what the pipe or terminal reading it has not taken. Large writes wait
  there as the binaries they were sent as, which count under `binary` in
  `erlang:memory/0` and under no process once the sender has let go of
  them (the same binary queued to several ports, or twice, is counted by
  each queue and held once). A `gen_tcp`
  socket stops taking data at its `high_watermark` (the sender waits), but
  one large send is queued whole, and every connection of a slow peer
  holds its own queue. A distribution connection's backlog to a slow node
  waits in the connection's own buffer, not in its port's queue, and is
  not seen here (`:binary_held` names the processes whose sends wait).
  """

  import Mtrace.VM.Procs, only: [ranking: 1, rank: 3, ranked: 1]

  @typedoc """
  How a port is described in results: `name` is its driver (`"tcp_inet"`)
  or the command it runs; `kind` what it is: `:socket`, `:distribution`
  (a connection to another node), `:program` (started with
  `Port.open/2`), `:stdio` (the VM's standard input and output, or
  other file descriptors) or `:other`; `connected` the process that owns
  it; `peer` the other end of a socket (`"10.0.0.7:443"`, a path for a
  local socket) or the node of a distribution connection, `nil` for
  other ports or one not connected.
  """
  @type info :: [
          name: String.t(),
          kind: :socket | :distribution | :program | :stdio | :other,
          connected: pid,
          peer: String.t() | nil,
          queue_size: non_neg_integer,
          memory: non_neg_integer
        ]

  # The drivers of sockets, whose peer :inet can name.
  @sockets [~c"tcp_inet", ~c"udp_inet", ~c"sctp_inet"]
  @command_max 32

  @doc """
  The `n` ports with the largest `:queue_size` (bytes waiting to be
  written) or `:memory` (bytes), largest first; ports where it is 0 and
  ports closed during the scan are left out.

  ## Example

      [] = Mtrace.VM.Ports.top(:queue_size, 3) |> Enum.filter(&(elem(&1, 1) == 0))
  """
  @spec top(:queue_size | :memory, pos_integer) :: [{port, pos_integer, info}]
  def top(by, n) do
    for {port, value} <- Port.list() |> Enum.reduce(ranking(n), &offer(&1, &2, by)) |> ranked(),
        info = describe(port),
        info != nil,
        do: {port, value, info}
  end

  defp offer(port, top, by) do
    case :erlang.port_info(port, by) do
      {^by, value} when value > 0 -> rank(top, port, value)
      _ -> top
    end
  end

  @doc """
  Every port with bytes queued, keyed by port: what `Mtrace.VM.diagnose/1`
  samples.

  ## Example

      queued = Mtrace.VM.Ports.queued()
      Enum.all?(queued, fn {_port, bytes} -> bytes > 0 end)
      #=> true
  """
  @spec queued() :: %{port => pos_integer}
  def queued do
    for port <- Port.list(),
        {:queue_size, bytes} <- [:erlang.port_info(port, :queue_size)],
        bytes > 0,
        into: %{},
        do: {port, bytes}
  end

  @doc """
  What `top/2` says of one port, or `nil` once it is closed.

  ## Example

      [name: _, kind: _, connected: _, peer: _, queue_size: _, memory: _] =
        Mtrace.VM.Ports.describe(hd(Port.list()))
  """
  @spec describe(port) :: info | nil
  def describe(port) do
    with {:name, name} <- :erlang.port_info(port, :name),
         {:connected, pid} <- :erlang.port_info(port, :connected),
         {:os_pid, os_pid} <- :erlang.port_info(port, :os_pid),
         {:queue_size, queued} <- :erlang.port_info(port, :queue_size),
         {:memory, memory} <- :erlang.port_info(port, :memory) do
      {kind, peer} = kind(port, name, os_pid)

      [
        name: text(name),
        kind: kind,
        connected: pid,
        peer: peer,
        queue_size: queued,
        memory: memory
      ]
    else
      _ -> nil
    end
  end

  defp kind(port, name, os_pid) do
    node = Enum.find_value(:erlang.system_info(:dist_ctrl), fn {n, ctrl} -> ctrl == port && n end)

    cond do
      node -> {:distribution, Atom.to_string(node)}
      name in @sockets -> {:socket, peer(port)}
      is_integer(os_pid) -> {:program, nil}
      Regex.match?(~r"^\d+/\d+$", text(name)) -> {:stdio, nil}
      true -> {:other, nil}
    end
  end

  # A command line as the OS was given it: bytes, most often UTF-8.
  defp text(chars) do
    bytes = :erlang.list_to_binary(chars)
    if String.valid?(bytes), do: bytes, else: List.to_string(chars)
  rescue
    ArgumentError -> List.to_string(chars)
  end

  defp peer(port) do
    case :inet.peername(port) do
      {:ok, {:local, path}} when path not in ["", ~c"", <<>>] -> to_string(path)
      {:ok, {ip, number}} when is_tuple(ip) -> "#{address(ip)}:#{number}"
      _ -> nil
    end
  catch
    _, _ -> nil
  end

  defp address({_, _, _, _, _, _, _, _} = ip), do: "[#{:inet.ntoa(ip)}]"
  defp address(ip), do: to_string(:inet.ntoa(ip))

  @doc ~S"""
  A port and what it is, for a sentence: `"#Port<0.8> (tcp_inet to
  10.0.0.7:443)"`, `"#Port<0.9> (program: cat -u)"`, `"#Port<0.4> (the
  VM's standard output)"`; `info` as `describe/1` gives it, `nil` for a
  port closed since.

  ## Example

      iex> port = hd(Port.list())
      iex> Mtrace.VM.Ports.name(port, name: "tcp_inet", kind: :socket, peer: "10.0.0.7:443") ==
      ...>   "#{inspect(port)} (tcp_inet to 10.0.0.7:443)"
      true
      iex> Mtrace.VM.Ports.name(port, nil) == "#{inspect(port)} (closed since)"
      true
  """
  @spec name(port, keyword | nil) :: String.t()
  def name(port, info), do: "#{inspect(port)} (#{what(info)})"

  defp what(nil), do: "closed since"
  defp what(info), do: what(info[:kind], info[:name], info[:peer])

  defp what(:distribution, _name, node), do: "distribution to #{node}"
  defp what(:socket, name, nil), do: name
  defp what(:socket, name, peer), do: "#{name} to #{peer}"
  defp what(:program, name, _), do: "program: #{command(name)}"
  defp what(:stdio, "0/1", _), do: "the VM's standard output"
  defp what(:stdio, "2/2", _), do: "the VM's standard error"
  defp what(:stdio, name, _), do: "file descriptors #{name}"
  defp what(_kind, name, _), do: name

  # A spawned program's name is its whole command line: its program's own
  # name and the start of its arguments are enough to tell it.
  defp command(line) do
    {program, args} =
      case String.split(line, " ", parts: 2) do
        [program, args] -> {program, " " <> args}
        [program] -> {program, ""}
      end

    short = Path.basename(program) <> args

    if String.length(short) > @command_max,
      do: String.slice(short, 0, @command_max - 3) <> "...",
      else: short
  end
end

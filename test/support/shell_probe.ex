defmodule Mtrace.Test.ShellProbe do
  @moduledoc false
  # Runs child programs the ways a node does (os:cmd/1, System.cmd/3, a
  # spawned port) and returns what they printed and how they exited, so that
  # a node with the tracer preloaded can be compared with one without it.
  # Called on this node and, over :erpc, on peers.

  # A port program that echoes `bytes` bytes back through cat, then exits 5.
  @port_cmd "sh -c 'head -c ~B | cat; exit 5'"

  @doc "What the child programs did, and whether this node is preloaded."
  def run do
    %{
      os_cmd: :os.cmd(~c"echo hi; ls /nonexistent 2>&1; exit 3"),
      os_cmd_status: :os.cmd(~c"sh -c 'exit 3'; echo status=$?"),
      system_cmd:
        System.cmd("sh", ["-c", "echo out; echo err >&2; exit 4"], stderr_to_stdout: true),
      port: port_echo(pattern(70_000)),
      preloaded: Mtrace.preloaded?(),
      ld_preload: System.get_env("LD_PRELOAD")
    }
  end

  @doc "A deterministic binary of `n` bytes covering every byte value."
  def pattern(n), do: for(i <- 0..(n - 1)//1, into: <<>>, do: <<rem(i * 7 + div(i, 256), 256)>>)

  @doc "Sends `data` through a port running cat; `{echoed, exit_status}`."
  def port_echo(data) do
    cmd = :io_lib.format(@port_cmd, [byte_size(data)]) |> IO.iodata_to_binary()
    port = Port.open({:spawn, cmd}, [:binary, :exit_status])
    true = Port.command(port, data)
    collect(port, [])
  end

  defp collect(port, acc) do
    receive do
      {^port, {:data, chunk}} -> collect(port, [acc | chunk])
      {^port, {:exit_status, status}} -> {IO.iodata_to_binary(acc), status}
    after
      30_000 -> {:no_exit_status, IO.iodata_to_binary(acc)}
    end
  end
end

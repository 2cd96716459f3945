defmodule Mtrace.Test.Remote do
  @moduledoc false
  # Distribution for the tests that start peers, and what runs on those peers.

  # Makes this node distributed (peers are reached over distribution).
  def distribute! do
    unless Node.alive?() do
      # net_kernel needs epmd and does not start it itself.
      System.cmd("epmd", ["-daemon"])
      name = :"mtrace_test_#{System.unique_integer([:positive])}"
      # several tests' tasks may get here at once: one of them starts it
      case :net_kernel.start([name, :shortnames]) do
        {:ok, _} -> :ok
        {:error, {:already_started, _}} -> :ok
      end
    end

    :ok
  end

  # A fresh peer (erl arguments `args`) with this node's code paths and the
  # mtrace application started: the node a test judges from the outside.
  def start_peer(args \\ []) do
    distribute!()
    args = Enum.map(args, &String.to_charlist/1)
    {:ok, peer, node} = :peer.start(%{name: :peer.random_name(), args: args})
    :ok = :erpc.call(node, :code, :add_paths, [:code.get_path()])
    {:ok, _} = :erpc.call(node, Application, :ensure_all_started, [:mtrace])
    {peer, node}
  end

  def stop_peer(peer) do
    :peer.stop(peer)
  catch
    # already gone, with the test process it was linked to
    :exit, _ -> :ok
  end

  # Runs fun.(node) on a fresh peer, stopped afterwards whatever happens.
  def with_peer(args \\ [], fun) do
    {peer, node} = start_peer(args)

    try do
      fun.(node)
    after
      stop_peer(peer)
    end
  end

  # What Mtrace.Watch.start_link/1 returns and logs, run on a peer.
  def watch_start_and_log do
    {:ok, _} = Application.ensure_all_started(:logger)
    {:ok, _} = Application.ensure_all_started(:ex_unit)
    me = self()

    log =
      ExUnit.CaptureLog.capture_log(fn ->
        send(me, {:started, Mtrace.Watch.start_link(name: nil)})
      end)

    receive do
      {:started, started} -> {started, log}
    end
  end

  # The plain output of Mtrace.top/1 on the node that runs it (not
  # distributed), distribution started there between its refreshes.
  def top_across_node_start do
    {:ok, _} = Application.ensure_all_started(:ex_unit)
    me = self()

    viewer =
      spawn(fn ->
        out =
          ExUnit.CaptureIO.capture_io(fn ->
            Mtrace.top(interval: 300, refreshes: 4, ansi: false)
          end)

        send(me, {:top, out})
      end)

    Process.sleep(450)
    name = :"top_started_#{System.unique_integer([:positive])}"
    {:ok, _} = :net_kernel.start(name, %{name_domain: :shortnames})

    receive do
      {:top, out} -> {node(), out}
    after
      20_000 -> {node(), Process.info(viewer, :current_stacktrace)}
    end
  end

  # Ends the process that runs it, as a max_heap_size limit would.
  def killed, do: Process.exit(self(), :kill)

  def exits, do: exit(:gone)

  # What cluster(:preloaded?) answers on the node that runs it.
  def cluster_nodes, do: Mtrace.cluster(:preloaded?) |> Map.keys() |> Enum.sort()

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

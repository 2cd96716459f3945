defmodule Mtrace.Remote do
  @moduledoc """
  Runs an mtrace function on another node over distributed Erlang
  (`:erpc`), for the `node:` option and `Mtrace.cluster/3`.

  Failures become `Mtrace.Error` with a reason and a message that say which
  node and what to do: `:not_distributed` (this node has no name),
  `:nodedown` (cannot connect), `:timeout`, `:not_loaded` (mtrace is not in
  that node's code path), `:version` (that node runs another mtrace
  version, without the function called), `:remote` (the process answering
  there was killed, exited or threw). An `Mtrace.Error` raised there (say,
  the tracer is not preloaded on that node) is raised here with the node
  named, and so is another exception's message.
  """

  @default_timeout 60_000

  @doc """
  `apply(mod, fun, args)` on `node`: locally when `node` is this node, else
  over `:erpc` within `timeout` ms.

      iex> Mtrace.Remote.call(node(), Kernel, :+, [1, 2])
      3
  """
  @spec call(node(), module(), atom(), list(), timeout()) :: term()
  def call(node, mod, fun, args, timeout \\ @default_timeout)

  def call(node, mod, fun, args, _timeout) when node == node(), do: apply(mod, fun, args)

  def call(node, mod, fun, args, timeout) do
    unless Node.alive?() do
      raise error(
              :not_distributed,
              "cannot reach #{inspect(node)}: this node is not distributed (start it with " <>
                "--sname or --name, or call Node.start/2)"
            )
    end

    :erpc.call(node, mod, fun, args, timeout)
  rescue
    e in ErlangError -> raise translate(e.original, node, mod, fun, args, timeout)
  catch
    # the process answering there was killed (a max_heap_size limit, say)
    # or exited: this node's caller, a cluster/3 task included, goes on
    :exit, {:signal, reason} ->
      raise error(
              :remote,
              "on node #{inspect(node)}: the process answering there was ended " <>
                "(#{inspect(reason)}) before it answered; a smaller answer (n, limit:) " <>
                "needs less of its memory"
            )

    :exit, {:exception, reason} ->
      raise error(:remote, "on node #{inspect(node)}: the call exited with #{inspect(reason)}")

    :throw, value ->
      raise error(:remote, "on node #{inspect(node)}: the call threw #{inspect(value)}")
  end

  @doc """
  Checks that `node` can be reached and has `mod` loadable (mtrace in its
  code path), before a view or a diagnosis starts working with it. Returns
  `:ok`, or raises `Mtrace.Error` as `call/5` does: `:not_distributed`,
  `:nodedown`, `:timeout`, or `:not_loaded`.

      iex> Mtrace.Remote.reachable!(node(), Mtrace.VM)
      :ok
  """
  @spec reachable!(node(), module(), timeout()) :: :ok
  def reachable!(node, mod, timeout \\ @default_timeout)

  def reachable!(node, _mod, _timeout) when node == node(), do: :ok

  def reachable!(node, mod, timeout) do
    case call(node, :code, :ensure_loaded, [mod], timeout) do
      {:module, ^mod} ->
        :ok

      _ ->
        raise not_loaded(node, mod)
    end
  end

  @doc """
  `apply(mod, fun, args)` on each node at once; one `{:ok, result}` or
  `{:error, %Mtrace.Error{}}` per node.

      iex> Mtrace.Remote.multicall([node()], Kernel, :+, [1, 2])
      %{node() => {:ok, 3}}
  """
  @spec multicall([node()], module(), atom(), list(), timeout()) ::
          %{node() => {:ok, term()} | {:error, Exception.t()}}
  def multicall(nodes, mod, fun, args, timeout \\ @default_timeout) do
    {here, others} = Enum.split_with(nodes, &(&1 == node()))
    tasks = Enum.map(others, &Task.async(fn -> outcome(&1, mod, fun, args, timeout) end))
    # This node's answer is made here, while the others run, not in a task:
    # a task's answer is copied to its caller, and a copy keeps no shared
    # term. olds(1_000_000) of a few thousand stacks, each shared by its
    # entries, copied as 3 GB, in one schedule of 26 s.
    here = Enum.map(here, &outcome(&1, mod, fun, args, timeout))
    Map.new(here ++ Task.await_many(tasks, :infinity))
  end

  defp outcome(node, mod, fun, args, timeout) do
    {node, {:ok, call(node, mod, fun, args, timeout)}}
  rescue
    e -> {node, {:error, e}}
  end

  defp translate({:erpc, :noconnection}, node, _mod, _fun, _args, _timeout),
    do: error(:nodedown, "cannot connect to node #{inspect(node)} (is it running? same cookie?)")

  defp translate({:erpc, :timeout}, node, _mod, _fun, _args, timeout),
    do: error(:timeout, "node #{inspect(node)} did not answer within #{timeout} ms")

  defp translate({:exception, :undef, [{mod, fun, _, _} | _]}, node, mod, fun, args, timeout) do
    called = "#{inspect(mod)}.#{fun}/#{length(args)}"

    if loaded_there?(node, mod, timeout) do
      error(
        :version,
        "node #{inspect(node)} runs another mtrace version (#{called} is not there): " <>
          "run the same mtrace version on both nodes"
      )
    else
      not_loaded(node, mod)
    end
  end

  defp translate({:exception, %Mtrace.Error{} = e, _stack}, node, _mod, _fun, _args, _) do
    %{e | message: "on node #{inspect(node)}: " <> e.message}
  end

  # Another exception raised there (an older mtrace refusing an option this
  # one has, say): the node is named, as in every error from there.
  defp translate({:exception, %_{__exception__: true, message: m} = e, _}, node, _, _, _, _)
       when is_binary(m),
       do: %{e | message: "on node #{inspect(node)}: " <> m}

  defp translate({:exception, %_{__exception__: true} = e, _stack}, _node, _mod, _fun, _, _),
    do: e

  defp translate(other, node, _mod, _fun, _args, _timeout),
    do: error(:remote, "on node #{inspect(node)}: #{inspect(other)}")

  # Whether mod is loaded on node, or can be: an undefined function of a
  # module that is there is another version's.
  defp loaded_there?(node, mod, timeout) do
    match?({:module, ^mod}, :erpc.call(node, :code, :ensure_loaded, [mod], timeout))
  catch
    _, _ -> false
  end

  defp error(reason, message), do: %Mtrace.Error{reason: reason, message: "mtrace: " <> message}

  # One wording wherever a node lacks mtrace's modules.
  defp not_loaded(node, mod) do
    error(
      :not_loaded,
      "not loaded on node #{inspect(node)} (#{inspect(mod)} is not in its code path): " <>
        "include mtrace in that node's release, or add its ebin directory there with " <>
        ":code.add_paths/1"
    )
  end
end

defmodule Mtrace.RemoteTest do
  # Queries other nodes (peers started here) with node: and cluster/3.
  use ExUnit.Case, async: false

  alias Mtrace.Test.LeakyNif

  @moduletag :peer

  setup_all do
    Mtrace.Test.Remote.distribute!()
  end

  # A peer; with `code: true` it gets this node's code paths (mtrace and the
  # test fixtures), with `preload: false` it runs without the tracer.
  defp start_peer(opts) do
    code = Keyword.get(opts, :code, true)
    preload = Keyword.get(opts, :preload, true)
    extra = Keyword.get(opts, :env, [])

    env = if preload, do: extra, else: [{~c"LD_PRELOAD", false} | extra]
    args = Keyword.get(opts, :args, [])
    {:ok, peer, node} = :peer.start_link(%{name: :peer.random_name(), env: env, args: args})

    on_exit(fn ->
      try do
        :peer.stop(peer)
      catch
        :exit, _ -> :ok
      end
    end)

    if code, do: :ok = :erpc.call(node, :code, :add_paths, [:code.get_path()])
    node
  end

  test "node: runs sites, olds, mark, stats and export on the other node" do
    peer = start_peer(code: true, preload: true)
    :ok = :erpc.call(peer, Mtrace, :enable, [])
    :erpc.call(peer, Mtrace, :reset, [])
    :ok = :erpc.call(peer, LeakyNif, :leak, [:malloc, 11, 2000])
    mark = Mtrace.mark(node: peer)
    assert mark.node == peer
    :ok = :erpc.call(peer, LeakyNif, :leak, [:strdup, 2, 49])

    assert [%{count: 11, bytes: 22_000}, %{count: 2, bytes: 100}] =
             Mtrace.sites(node: peer, lib: "leaky_nif")

    # nothing leaked here
    assert Mtrace.sites(lib: "leaky_nif") == []
    assert [%{count: 2}] = Mtrace.sites(node: peer, lib: "leaky_nif", since: mark)
    olds = Mtrace.olds(20, node: peer, lib: "leaky_nif")
    assert length(olds) == 13
    same = &Map.drop(&1, [:age, :ns])
    there = :erpc.call(peer, Mtrace, :olds, [20, [lib: "leaky_nif"]])
    assert Enum.map(olds, same) == Enum.map(there, same)
    # each stack crosses once: the 11 blocks of one site share its frames
    [a, b | _] = Enum.filter(olds, &(&1.size == 2000))
    assert :erts_debug.same(a.frames, b.frames)
    assert %{active: true, live_count: n} = Mtrace.stats(node: peer)
    assert n >= 13

    # a mark of the peer: the query runs where the mark was taken
    assert Mtrace.sites(since: mark, lib: "leaky_nif") ==
             Mtrace.sites(node: peer, since: mark, lib: "leaky_nif")

    # ... unless another node is named: there the mark means nothing
    assert_raise ArgumentError, ~r/mark was taken on/, fn ->
      Mtrace.sites(since: mark, node: node())
    end

    # ... whichever node took it: no query goes to one node to run on another
    here = Mtrace.mark()

    for query <- [
          fn -> Mtrace.sites(since: here, node: peer) end,
          fn -> Mtrace.olds(5, since: here, node: peer) end,
          fn -> Mtrace.report(since: here, node: peer) end
        ] do
      assert_raise ArgumentError, ~r/mark was taken on #{inspect(node())}/, query
    end

    path = Path.join(System.tmp_dir!(), "mtrace_remote_#{System.unique_integer([:positive])}")
    on_exit(fn -> File.rm(path) end)
    assert :ok = Mtrace.export(path, node: peer, lib: "leaky_nif", format: :folded)

    weights =
      for line <- String.split(File.read!(path), "\n", trim: true),
          do: line |> String.split(" ") |> List.last() |> String.to_integer()

    assert Enum.sum(weights) == 22_100
  end

  test "node: fails clearly where mtrace is not loaded or not preloaded" do
    bare = start_peer(code: false, preload: true)
    error = assert_raise Mtrace.Error, fn -> Mtrace.sites(node: bare) end
    assert error.reason == :not_loaded
    assert error.message =~ "mtrace: not loaded on node #{inspect(bare)}"

    unpreloaded = start_peer(code: true, preload: false)
    error = assert_raise Mtrace.Error, fn -> Mtrace.sites(node: unpreloaded) end
    assert error.reason == :not_preloaded
    assert error.message =~ "on node #{inspect(unpreloaded)}"
    # the VM it is about, by name: read here, "this VM" would be this one
    assert error.message =~ "not preloaded into the VM of #{unpreloaded},"
    assert error.message =~ "LD_PRELOAD"
    # a watcher in a supervision tree there starts as :ignore, not a crash loop
    # (its one warning is logged there)
    assert :ignore = :erpc.call(unpreloaded, Mtrace.Watch, :start_link, [[]])

    error = assert_raise Mtrace.Error, fn -> Mtrace.stats(node: :nobody@nowhere) end
    assert error.reason == :nodedown
  end

  test "a later release's preload is told from none" do
    newer = Path.expand("_build/c/newer_release.so")
    assert File.exists?(newer), "make fixtures builds #{newer}"
    peer = start_peer(code: true, env: [{~c"LD_PRELOAD", String.to_charlist(newer)}])
    error = assert_raise Mtrace.Error, fn -> Mtrace.stats(node: peer) end
    assert error.reason == :preload_mismatch
    assert error.message =~ "comes from another mtrace release"
  end

  test "another release's preload: the queries and the watcher say which library it is" do
    other = Path.expand("_build/c/other_release.so")
    assert File.exists?(other), "make fixtures builds #{other}"
    peer = start_peer(code: true, env: [{~c"LD_PRELOAD", String.to_charlist(other)}])
    error = assert_raise Mtrace.Error, fn -> Mtrace.stats(node: peer) end
    assert error.message =~ "comes from another mtrace release"
    # the watcher's one warning gives that reason, not "not preloaded"
    {started, log} = :erpc.call(peer, Mtrace.Test.Remote, :watch_start_and_log, [])
    assert started == :ignore
    text = String.replace(log, ~r/\s*\n\s*/, " ")
    assert text =~ "Mtrace.Watch not started: the preloaded tracer library comes from another"
    refute text =~ "not preloaded"
    # and top, whose sample says why the tracer cannot answer there
    out =
      ExUnit.CaptureIO.capture_io(fn ->
        Mtrace.top(node: peer, interval: 200, refreshes: 1, ansi: false)
      end)

    out = String.replace(out, ~r/\s*\n\s*/, " ")

    assert out =~
             "native: not traced: the preloaded tracer library comes from another mtrace release"

    refute out =~ "not preloaded"
  end

  test "with sampling, sites estimate every live allocation of the site" do
    peer = start_peer(code: true, preload: true, env: [{~c"MTRACE_SAMPLE_BYTES", ~c"16384"}])
    :ok = :erpc.call(peer, LeakyNif, :leak, [:malloc, 4000, 4096])
    assert %{sampled: true} = Mtrace.stats(node: peer)

    assert [%{count: sampled, est_count: est, est_bytes: est_bytes}] =
             Mtrace.sites(node: peer, lib: "leaky_nif")

    # p(4096 bytes recorded) = 1 - e^(-1/4): about 885 of 4000; the estimate
    # is within 20% (over 5 standard deviations) of the truth
    assert sampled < 4000
    assert_in_delta est, 4000, 800
    assert_in_delta est_bytes, 4000 * 4096, 800 * 4096

    # drawings weigh sites by the estimates
    path = Path.join(System.tmp_dir!(), "mtrace_sampled_#{System.unique_integer([:positive])}")
    on_exit(fn -> File.rm(path) end)
    :ok = Mtrace.export(path, node: peer, lib: "leaky_nif")
    assert [line] = String.split(File.read!(path), "\n", trim: true)
    assert line |> String.split(" ") |> List.last() |> String.to_integer() == est_bytes
  end

  test "sampling every 4 GiB is sampling (a 64-bit setting, not cut to 32 bits)" do
    peer = start_peer(code: true, env: [{~c"MTRACE_SAMPLE_BYTES", ~c"4294967296"}])
    assert %{sampled: true, sample_bytes: 4_294_967_296} = stats = Mtrace.stats(node: peer)
    assert inspect(stats) =~ "sampling every 4.0 GiB"
  end

  test "a misspelled setting is named in config_errors; other MTRACE_ variables are not" do
    env = [{~c"MTRACE_SAMPLE_BYTE", ~c"4096"}, {~c"MTRACE_STRESS", ~c"1"}]
    peer = start_peer(code: true, env: env)
    stats = Mtrace.stats(node: peer)

    assert %{sampled: false, config_errors: ["MTRACE_SAMPLE_BYTE " <> _ = typo]} = stats
    assert typo =~ "did you mean MTRACE_SAMPLE_BYTES?"
    assert inspect(stats) =~ "not understood, default used: MTRACE_SAMPLE_BYTE (did you mean"
  end

  test "a process killed or exited there, another version, another exception: Mtrace.Error or the node named" do
    peer = start_peer(code: true)

    for fun <- [:killed, :exits] do
      error =
        assert_raise Mtrace.Error, fn -> Mtrace.Remote.call(peer, Mtrace.Test.Remote, fun, []) end

      assert error.reason == :remote
      assert error.message =~ "on node #{inspect(peer)}: "
    end

    # cluster/3's tasks: the caller goes on, the node gets its error
    assert %{^peer => {:error, %Mtrace.Error{reason: :remote}}} =
             Mtrace.Remote.multicall([peer], Mtrace.Test.Remote, :killed, [])

    # a module there without the function: another mtrace version
    error = assert_raise Mtrace.Error, fn -> Mtrace.Remote.call(peer, Mtrace.Query, :gone, []) end
    assert error.reason == :version
    assert error.message =~ "runs another mtrace version (Mtrace.Query.gone/0 is not there)"

    # an older mtrace refusing an option: its message, the node named
    error =
      assert_raise ArgumentError, fn ->
        Mtrace.Remote.call(peer, Mtrace, :stats, [[heap: :maybe]])
      end

    assert error.message =~ ~r/^on node #{inspect(peer)}: option :heap/
  end

  test "stats from a node of an older mtrace, with fewer fields, inspect" do
    now = Mtrace.stats()
    old = now |> Map.drop([:unwind_cut, :now_ms, :reset_ms, :heap, :erlang_stacks])
    stats = Mtrace.Stats.from_node(old, true)
    assert %Mtrace.Stats{unwind_cut: nil, heap: true} = stats
    assert inspect(stats) =~ "#Mtrace.Stats<"
  end

  test "diagnose(node:) waits for the node no longer than its timeout" do
    peer = start_peer(code: true)
    os_pid = :erpc.call(peer, System, :pid, [])
    {_, 0} = System.cmd("kill", ["-STOP", os_pid])
    on_exit(fn -> System.cmd("kill", ["-CONT", os_pid]) end)

    error =
      assert_raise Mtrace.Error, fn ->
        Mtrace.VM.diagnose(node: peer, timeout: 1000, print: false)
      end

    assert error.reason == :timeout
    assert error.message =~ "within 1000 ms"
  end

  test "cluster/3 from a hidden node asks the nodes it is connected to" do
    hidden = start_peer(code: true, args: [~c"-hidden"])
    {:ok, _} = :erpc.call(hidden, Application, :ensure_all_started, [:mtrace])
    assert node() in :erpc.call(hidden, Mtrace.Test.Remote, :cluster_nodes, [])

    # made hidden by net_kernel:start/2, without the flag: driven over its
    # standard I/O, as it is not distributed when it starts
    {:ok, peer, _} = :peer.start_link(%{connection: :standard_io})
    on_exit(fn -> Mtrace.Test.Remote.stop_peer(peer) end)
    :ok = :peer.call(peer, :code, :add_paths, [:code.get_path()])
    {:ok, _} = :peer.call(peer, Application, :ensure_all_started, [:mtrace])
    name = :"hidden_#{System.unique_integer([:positive])}"
    opts = %{name_domain: :shortnames, hidden: true}
    {:ok, _} = :peer.call(peer, :net_kernel, :start, [name, opts])
    true = :peer.call(peer, :erlang, :set_cookie, [Node.get_cookie()])
    true = :peer.call(peer, Node, :connect, [node()])
    assert node() in :peer.call(peer, Mtrace.Test.Remote, :cluster_nodes, [])
  end

  test "cluster/3 answers per node, errors included" do
    good = start_peer(code: true, preload: true)
    bare = start_peer(code: false, preload: true)

    result = Mtrace.cluster(:stats)
    assert {:ok, %{active: true}} = result[node()]
    assert {:ok, %{active: true}} = result[good]
    assert {:error, %Mtrace.Error{reason: :not_loaded}} = result[bare]

    assert %{^good => {:ok, sites}} = Mtrace.cluster(:sites, [[limit: 2]])
    assert length(sites) <= 2

    # olds in the map form: each node sends each stack once, the entries
    # share it here as they do on that node
    :ok = :erpc.call(good, LeakyNif, :leak, [:malloc, 50, 4_321])
    olds = Mtrace.cluster(:olds, [1_000, [min_size: 4_321, max_size: 4_321]])
    assert {:ok, [%{size: 4_321, frames: [_ | _]} | _] = entries} = olds[good]
    assert length(entries) == 50
    assert :erts_debug.size(entries) < :erts_debug.flat_size(entries)
    assert {:error, %Mtrace.Error{reason: :not_loaded}} = olds[bare]
    assert {:ok, here} = olds[node()]
    assert is_list(here)

    assert_raise ArgumentError, ~r/unknown option :bogus/, fn ->
      Mtrace.cluster(:olds, [1, [bogus: 1]])
    end

    assert_raise ArgumentError, ~r/fun must be one of/, fn -> Mtrace.cluster(:halt) end

    # each node answers for itself: nothing may send its query elsewhere
    mark = Mtrace.mark()

    for args <- [[[since: mark]], [[node: good]], [1, [node: good]], [[timeout: 5]]] do
      fun = if length(args) == 2, do: :olds, else: :sites
      assert_raise ArgumentError, ~r/has no place/, fn -> Mtrace.cluster(fun, args) end
    end

    assert_raise ArgumentError, ~r/at most 2\^64 - 1/, fn ->
      Mtrace.cluster(:olds, [2 ** 64, []])
    end
  end
end

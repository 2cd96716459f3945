defmodule Mtrace.VM.Thresholds do
  @moduledoc """
  Every threshold `Mtrace.VM.diagnose/1` judges by, with its default. Each
  can be overridden with the `thresholds:` option, e.g.
  `Mtrace.VM.diagnose(window: 5_000, thresholds: [native_growth: 10 * 1024])`.

  Each key, its default, and what reaches it:

  * `mailbox_len` (10_000) — messages waiting in one process;
  * `mailbox_growth` (500) — messages/s one mailbox grows by (over at
    least `mailbox_growth_min`);
  * `mailbox_growth_min` (1_000) — messages of growth below which a
    window's mailbox growth is noise;
  * `process_share` (0.5) — processes as a share of the process limit;
  * `limit_share` (0.5) — atoms, ports or open file descriptors (against
    the OS's soft limit, where `/proc` tells it) as a share of their
    limit;
  * `limit_time` (86_400) — seconds in which atoms, ports or open file
    descriptors, growing as they did over a window, would reach their
    limit;
  * `limit_growth_min` (1_000) — atoms, ports or open file descriptors of
    growth over the window below which it is noise (or 5% of their limit,
    if that is less: 51 of the usual 1_024 descriptors);
  * `process_memory` (256 MiB) — what one process holds (heap, stack,
    mailbox), or the refc binaries it still references after a forced
    GC (`:binary_held`);
  * `process_memory_share` (0.5) — or this share of the VM's memory, when
    it is at least `process_memory_min`;
  * `process_memory_min` (64 MiB) — the least one process must hold for
    its share to count;
  * `process_memory_growth` (1 MiB) — bytes/s one process's memory grows
    by (over at least `process_memory_growth_min`);
  * `process_memory_growth_min` (8 MiB) — a process's growth over the
    window below which it is noise;
  * `idle_group` (10_000) — idle processes sharing what they were started
    as (for a GenServer, an Agent or a Task, the function proc_lib
    records, not `:proc_lib.init_p/5`) and current function, when they are
    also `idle_share` of all processes;
  * `idle_share` (0.5) — the share of all processes such a group makes;
  * `process_growth` (100) — processes/s the count grows by (over at
    least `process_growth_min`);
  * `process_growth_min` (1_000) — processes of growth below which it is
    noise;
  * `port_queue` (64 MiB) — bytes queued in one port to be written (a
    socket's peer that does not read, a program that does not read its
    input);
  * `port_queue_all` (256 MiB) — bytes queued in all ports together;
  * `port_queue_growth` (1 MiB) — bytes/s the ports' queues grow by
    together (over at least `port_queue_growth_min`);
  * `port_queue_growth_min` (8 MiB) — their growth over the window below
    which it is noise;
  * `monitors` (10_000) — monitors held by one process;
  * `monitor_growth` (100) — monitors/s one process gains (over at least
    `monitor_growth_min`);
  * `monitor_growth_min` (1_000) — monitors of growth below which it is
    noise;
  * `ets_bytes` (100 MiB) — one table, with the binaries it references;
  * `ets_share` (0.5) — one table's share of the VM's memory, when it
    holds `ets_share_min` or more;
  * `ets_share_min` (64 MiB) — the least a table must hold for
    `ets_share` to count;
  * `ets_growth` (1 MiB) — bytes/s one table grows by, with the binaries
    it references (over at least `ets_growth_min`);
  * `ets_growth_min` (8 MiB) — a table's growth over the window below
    which it is noise;
  * `persistent_term_bytes` (100 MiB) — terms kept in `persistent_term`;
  * `persistent_term_share` (0.5) — or this share of the VM's memory, when
    they hold `persistent_term_share_min` or more;
  * `persistent_term_share_min` (64 MiB) — the least they must hold for
    `persistent_term_share` to count;
  * `persistent_term_growth` (1 MiB) — bytes/s they grow by (over at
    least `persistent_term_growth_min`);
  * `persistent_term_growth_min` (8 MiB) — their growth over the window
    below which it is noise;
  * `binary_freed` (32 MiB) — refc binaries a forced GC frees (or
    `binary_freed_share` of the VM's memory if more);
  * `binary_freed_share` (0.25) — what a forced GC frees as a share of
    the VM's memory, when that is more than `binary_freed`;
  * `binary_gc_share` (0.25) — binaries' share of the VM's memory that
    makes `gc: :auto` run the forced GC, when they hold `binary_gc_min`;
    binaries the GC leaves at this share are named with their holders
    (`:binary_held`, a lead whoever holds them), and at this share the
    binaries of 256 more ETS tables than the 3 largest are estimated;
  * `binary_gc_min` (16 MiB) — the least binaries hold for that;
  * `native_bytes` (256 MiB) — native memory (or the VM's own memory if
    larger);
  * `native_vm_ratio` (2.0) — native memory this many times the VM's
    own, and at least `native_vm_min`: it dwarfs what the VM accounts for;
  * `native_vm_min` (64 MiB) — the least native memory for that ratio to
    count;
  * `native_growth` (50 KiB) — bytes/s native memory grows by, steadily,
    over a window;
  * `native_rss_growth_min` (1 MiB) — without the tracer (or with
    tracking switched off), native memory is RSS outside the ERTS
    allocators, which moves by itself as pages are first touched (a
    thread's stack, a new malloc arena, an idle node's first diagnosis):
    its growth over the window below this is noise, however steady;
  * `native_steady` (0.75) — share of a window's steps (`window_steps`)
    in which native memory, or a NIF module's memory in the VM's
    allocators, grew for the growth to count as steady (churn goes up
    and down);
  * `window_steps` (5) — samples of native memory taken across a window,
    at most one per 20 ms of it;
  * `nif_bytes` (64 MiB) — one NIF module's memory in the VM's
    allocators (enif_alloc, resources, binaries);
  * `nif_share` (0.25) — or this share of the VM's memory, when it is
    at least `nif_share_min`;
  * `nif_share_min` (16 MiB) — the least a module must hold for
    `nif_share` to count;
  * `nif_growth` (50 KiB) — bytes/s one module's memory there grows by,
    steadily (and by at least `nif_growth_min` over the window);
  * `nif_growth_min` (1 MiB) — a module's growth over the window below
    which it is noise;
  * `frag_usage` (0.5) — an allocator type used below this share, when
    it wastes at least `frag_wasted`;
  * `frag_wasted` (64 MiB) — the least such a type wastes.

  ## Example

      iex> Mtrace.VM.Thresholds.merge!([native_growth: 10_240]).native_growth
      10240
  """

  @mib 1_048_576

  @defaults %{
    mailbox_len: 10_000,
    mailbox_growth: 500,
    mailbox_growth_min: 1_000,
    process_share: 0.5,
    limit_share: 0.5,
    limit_time: 86_400,
    limit_growth_min: 1_000,
    process_memory: 256 * @mib,
    process_memory_share: 0.5,
    process_memory_min: 64 * @mib,
    process_memory_growth: 1 * @mib,
    process_memory_growth_min: 8 * @mib,
    idle_group: 10_000,
    idle_share: 0.5,
    process_growth: 100,
    process_growth_min: 1_000,
    port_queue: 64 * @mib,
    port_queue_all: 256 * @mib,
    port_queue_growth: 1 * @mib,
    port_queue_growth_min: 8 * @mib,
    monitors: 10_000,
    monitor_growth: 100,
    monitor_growth_min: 1_000,
    ets_bytes: 100 * @mib,
    ets_share: 0.5,
    ets_share_min: 64 * @mib,
    ets_growth: 1 * @mib,
    ets_growth_min: 8 * @mib,
    persistent_term_bytes: 100 * @mib,
    persistent_term_share: 0.5,
    persistent_term_share_min: 64 * @mib,
    persistent_term_growth: 1 * @mib,
    persistent_term_growth_min: 8 * @mib,
    binary_freed: 32 * @mib,
    binary_freed_share: 0.25,
    binary_gc_share: 0.25,
    binary_gc_min: 16 * @mib,
    native_bytes: 256 * @mib,
    native_vm_ratio: 2.0,
    native_vm_min: 64 * @mib,
    native_growth: 50 * 1024,
    native_rss_growth_min: 1 * @mib,
    native_steady: 0.75,
    window_steps: 5,
    nif_bytes: 64 * @mib,
    nif_share: 0.25,
    nif_share_min: 16 * @mib,
    nif_growth: 50 * 1024,
    nif_growth_min: 1 * @mib,
    frag_usage: 0.5,
    frag_wasted: 64 * @mib
  }

  # How close (String.jaro_distance/2) an unknown threshold's name must be
  # to a known one for that one to be suggested: :mailbox to :mailbox_len
  # is 0.88, :native_grwth to :native_growth 0.97, :window to
  # :window_steps 0.83; unrelated names (:foo, :memory) score under 0.7.
  @close 0.8

  # Shares of a whole: above 1 they could never be reached.
  @shares for {key, _} <- @defaults,
              key |> Atom.to_string() |> String.ends_with?("_share"),
              do: key
  @shares [:native_steady, :frag_usage | @shares]

  @typedoc "The thresholds in force, by key (see the table above)."
  @type t :: %{atom => number}

  @doc """
  The defaults.

      iex> Mtrace.VM.Thresholds.defaults().native_growth
      51200
  """
  @spec defaults() :: t
  def defaults, do: @defaults

  @doc """
  The defaults with `overrides` (a keyword list) applied; an unknown key
  (named with the threshold it is closest to, if one is close; else
  with all of them), a value that is not a positive number, or a share
  (`*_share`, `native_steady`, `frag_usage`) above 1 raises
  `ArgumentError`.

      iex> Mtrace.VM.Thresholds.merge!(mailbox: 5)
      ** (ArgumentError) Mtrace.VM.diagnose/1: option :thresholds: unknown threshold :mailbox (did you mean :mailbox_len?)

      iex> Mtrace.VM.Thresholds.merge!(native_growth: -1)
      ** (ArgumentError) Mtrace.VM.diagnose/1: option :thresholds: native_growth must be a positive number, got: -1

      iex> Mtrace.VM.Thresholds.merge!(native_steady: 5)
      ** (ArgumentError) Mtrace.VM.diagnose/1: option :thresholds: native_steady is a share, from 0 to 1 (e.g. 0.75), got: 5
  """
  @spec merge!(term) :: t
  def merge!(overrides) do
    unless is_list(overrides) and Keyword.keyword?(overrides) do
      raise ArgumentError,
            "Mtrace.VM.diagnose/1: option :thresholds must be a keyword list, got: #{inspect(overrides)}"
    end

    Enum.reduce(overrides, @defaults, fn {key, value}, acc ->
      cond do
        not Map.has_key?(@defaults, key) ->
          raise ArgumentError,
                "Mtrace.VM.diagnose/1: option :thresholds: unknown threshold " <> unknown(key)

        key == :window_steps and not (is_integer(value) and value > 0) ->
          raise ArgumentError,
                "Mtrace.VM.diagnose/1: option :thresholds: window_steps must be a positive " <>
                  "integer, got: #{inspect(value)}"

        not (is_number(value) and value > 0) ->
          raise ArgumentError,
                "Mtrace.VM.diagnose/1: option :thresholds: #{key} must be a positive number, got: #{inspect(value)}"

        key in @shares and value > 1 ->
          raise ArgumentError,
                "Mtrace.VM.diagnose/1: option :thresholds: #{key} is a share, from 0 to 1 (e.g. 0.75), got: " <>
                  inspect(value)

        true ->
          Map.put(acc, key, value)
      end
    end)
  end

  # An unknown key with the threshold whose name it is closest to (by
  # String.jaro_distance/2: a missing suffix, a typo), when one is close
  # enough; else with all of them.
  defp unknown(key) do
    name = to_string(key)

    {closest, distance} =
      @defaults
      |> Map.keys()
      |> Enum.map(&{&1, String.jaro_distance(name, Atom.to_string(&1))})
      |> Enum.max_by(&elem(&1, 1))

    if distance >= @close,
      do: "#{inspect(key)} (did you mean #{inspect(closest)}?)",
      else:
        "#{inspect(key)}; known: " <>
          (@defaults |> Map.keys() |> Enum.sort() |> Enum.map_join(", ", &inspect/1))
  end
end

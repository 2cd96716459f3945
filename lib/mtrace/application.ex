defmodule Mtrace.Application do
  @moduledoc """
  The mtrace application. Starting it only notes when it started, on the
  allocation table's clock: what the VM allocated before (while booting and
  loading code) is summarized apart in `Mtrace.report/1` instead of being
  ranked against what came later, and `boot: false` leaves it out of any
  query. It starts no process of its own that does any work.
  """

  use Application

  @impl true
  def start(_type, _args) do
    note_start()
    Supervisor.start_link([], strategy: :one_for_one, name: Mtrace.Supervisor)
  end

  @doc false
  def note_start do
    if Mtrace.preloaded?() and :persistent_term.get({Mtrace, :started_ms}, nil) == nil do
      :persistent_term.put({Mtrace, :started_ms}, Mtrace.Query.native!(&Mtrace.Native.now_ms/0))
    end

    :ok
  rescue
    # Never keep the application from starting: without the figure, nothing
    # is told apart as "boot".
    _ -> :ok
  end
end

defmodule LeakyApp.Application do
  @moduledoc false
  use Application

  @impl true
  def start(_type, _args) do
    children = [LeakyApp.Leaker]
    Supervisor.start_link(children, strategy: :one_for_one, name: LeakyApp.Supervisor)
  end
end

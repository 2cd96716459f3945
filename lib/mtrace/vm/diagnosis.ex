defmodule Mtrace.VM.Diagnosis do
  @moduledoc """
  What `Mtrace.VM.diagnose/1` returns: the verdict, the findings, and the
  state it judged. A struct so that IEx, after the printed report, echoes
  one line instead of every figure; the fields are plain data for programs.

    * `verdict` — the kind of the highest-scoring finding scoring 50 or
      more, else `:healthy`;
    * `findings` — `[Mtrace.VM.Findings.finding()]`, highest score first;
    * `node`, `window` (ms or nil), `memory`, `counts`, `native`
      (`%{preloaded, stats, sites}`) — what was measured;
    * `growth` — with a window, bytes per second for each category of
      `:erlang.memory/0` (`:total`, `:processes`, `:binary`, `:ets`,
      `:code`, `:atom`) and `:native`, a `Mtrace.VM.Growth` of native
      memory sampled across the window; `nil` without one;
    * `nif` — `{:ok, rows}` of `Mtrace.VM.NifMemory.read/0` (memory NIFs
      hold in the VM's allocators), or `{:error, reason}`.

  ## Example

      iex> d = %Mtrace.VM.Diagnosis{verdict: :healthy, findings: [], node: :"app@host"}
      iex> inspect(d)
      "#Mtrace.VM.Diagnosis<app@host: healthy, no findings>"
  """

  defstruct verdict: :healthy,
            findings: [],
            node: nil,
            window: nil,
            memory: %{},
            counts: %{},
            growth: nil,
            native: %{},
            nif: nil

  @type t :: %__MODULE__{
          verdict: atom,
          findings: [Mtrace.VM.Findings.finding()],
          node: node | nil,
          window: pos_integer | nil,
          memory: map,
          counts: map,
          growth: map | nil,
          native: map,
          nif: {:ok, [map]} | {:error, atom} | nil
        }

  defimpl Inspect do
    def inspect(%{verdict: verdict, findings: findings, node: node}, _opts) do
      top =
        case findings do
          [%{score: score} | _] when verdict != :healthy -> " (score #{score})"
          _ -> ""
        end

      listed =
        case findings do
          [] -> "no findings"
          [_] -> "1 finding"
          many -> "#{length(many)} findings"
        end

      "#Mtrace.VM.Diagnosis<#{node}: #{verdict}#{top}, #{listed}>"
    end
  end
end

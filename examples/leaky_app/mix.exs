defmodule Mix.Tasks.Compile.LeakyNif do
  @moduledoc """
  Builds `c_src/leaky.c` into `priv/leaky_nif.so` of the app's build directory
  with `cc` (or `$CC`). Defined here so that it exists before the project is
  compiled.
  """
  use Mix.Task.Compiler

  @src "c_src/leaky.c"
  # Keep leaky_app_cache_entry a real call frame (see c_src/leaky.c).
  @cflags ~w(-std=gnu11 -O1 -g -fPIC -fno-optimize-sibling-calls -fno-inline -Wall -Wextra)

  @impl true
  def run(_args) do
    root = Path.dirname(Mix.Project.project_file())
    src = Path.join(root, @src)
    priv = Path.join(Mix.Project.app_path(), "priv")
    out = Path.join(priv, "leaky_nif.so")

    if Mix.Utils.stale?([src, Mix.Project.project_file()], [out]) do
      File.mkdir_p!(priv)
      cc = System.get_env("CC", "cc")
      args = @cflags ++ ["-I", erts_include()] ++ ldflags() ++ ["-o", out, src]

      case System.cmd(cc, args, stderr_to_stdout: true) do
        {_, 0} ->
          Mix.shell().info("==> leaky_app: built #{out}")

        {output, status} ->
          Mix.shell().error(output)
          Mix.raise("leaky_app: `#{cc} #{Enum.join(args, " ")}` failed (exit status #{status})")
      end
    end

    {:ok, []}
  end

  @impl true
  def clean do
    File.rm(Path.join([Mix.Project.app_path(), "priv", "leaky_nif.so"]))
  end

  defp erts_include do
    Path.join([:code.root_dir(), "erts-#{:erlang.system_info(:version)}", "include"])
  end

  defp ldflags do
    case :os.type() do
      {:unix, :darwin} -> ["-bundle", "-undefined", "dynamic_lookup"]
      _ -> ["-shared"]
    end
  end
end

defmodule LeakyApp.MixProject do
  use Mix.Project

  def project do
    [
      app: :leaky_app,
      version: "0.1.0",
      elixir: "~> 1.14",
      compilers: [:leaky_nif] ++ Mix.compilers(),
      start_permanent: Mix.env() == :prod,
      # In prod, copy each app's priv/ into _build instead of symlinking it:
      # otherwise mtrace's compiler, writing to _build/prod/lib/mtrace/priv,
      # would write through the symlink into the mtrace checkout's priv/ when
      # that exists. (The release gets real files either way: `mix release`
      # copies priv/ dereferencing symlinks. See README.md.)
      build_embedded: Mix.env() == :prod,
      deps: deps(),
      # docs kept, so that `h Mtrace.olds` works in the remote console
      releases: [leaky_app: [include_executables_for: [:unix], strip_beams: [keep: ["Docs"]]]]
    ]
  end

  def application do
    [mod: {LeakyApp.Application, []}, extra_applications: [:logger]]
  end

  defp deps do
    [{:mtrace, path: "../.."}]
  end
end

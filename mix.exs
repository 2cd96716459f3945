defmodule Mix.Tasks.Compile.Mtrace do
  @moduledoc """
  Builds mtrace's C code (the preload `priv/mtrace.so` and `priv/mtrace_nif.so`)
  with make: GNU make with `Makefile`, or BSD make with `Makefile.bsd` where GNU
  make is absent. `MAKE` overrides the choice (a name containing "bmake", or a
  non-GNU make, gets `Makefile.bsd`).

  Defined here rather than in `lib/` so that it exists before the project is
  compiled, also when mtrace is a dependency of another project.
  """
  use Mix.Task.Compiler

  @impl true
  def run(_args) do
    {make, makefile} = make_command()
    root = Path.dirname(Mix.Project.project_file())
    priv = Path.join(Mix.Project.app_path(), "priv")
    build = Path.join(Mix.Project.build_path(), "mtrace_c")
    # make builds into a directory of its own, which Mix never touches: the
    # app's priv/ may be a copy of the checkout's (build_embedded), whose
    # new modification times would make stale libraries look up to date.
    built = Path.join(build, "priv")
    # make splits paths at spaces: the build directory is given relative to
    # the checkout where that avoids them (a project under "my apps/").
    make_build = spaceless!(build, root, "the build directory")
    # EXTRA_CFLAGS (-Werror in mtrace's own test builds) is not taken from
    # the environment: a newer compiler's new warning must not fail a release.
    args = ["-f", makefile, "PRIV=#{make_build}/priv", "BUILD=#{make_build}", "EXTRA_CFLAGS="]
    args = args ++ ["all"]
    include = spaceless!(erts_include(), root, "Erlang's include directory")
    env = [{"ERTS_INCLUDE_DIR", include}]
    makevars = Path.join(build, "makevars.mk")
    forget_other_erts(makevars, include)
    # `mix deps.clean mtrace` removes the app's directory, not this one: an
    # app not compiled yet (this compiler runs first) probes again, so that
    # it sees what was installed since (libdw-dev, say), as a first build
    # does. (Its priv/ tells nothing: a path dependency's is the checkout's.)
    app = Path.join([Mix.Project.app_path(), "ebin", "mtrace.app"])
    unless File.exists?(app), do: File.rm(makevars)

    case System.cmd(make, args, cd: root, env: env, stderr_to_stdout: true) do
      {out, 0} ->
        # installed whenever they differ (build_embedded copies the
        # checkout's priv/ over them), said only when make built them
        Enum.each(["mtrace.so", "mtrace_nif.so"], &install(built, priv, &1))

        if String.contains?(out, "-o ") do
          Mix.shell().info("==> mtrace: built #{priv}/mtrace.so and mtrace_nif.so")
        end

        # what the platform's probe said (built without libdw: no source
        # file:line, and how to have it), which make's own lines would hide
        for "mtrace: " <> _ = note <- String.split(out, "\n"), do: Mix.shell().info(note)

        {:ok, []}

      {out, status} ->
        Mix.shell().error(out)
        Mix.raise("mtrace: `#{make} #{Enum.join(args, " ")}` failed (exit status #{status})")
    end
  end

  @impl true
  def clean do
    priv = Path.join(Mix.Project.app_path(), "priv")
    Enum.each(["mtrace.so", "mtrace_nif.so"], &File.rm(Path.join(priv, &1)))
    # The objects and the probed settings (makevars.mk) go too, so that a
    # clean build sees what was installed since.
    File.rm_rf(Path.join(Mix.Project.build_path(), "mtrace_c"))
  end

  # path as make can take it: as it is, else relative to the checkout
  # (the spaces are most often in the directories both are under).
  defp spaceless!(path, root, what) do
    relative = relative(Path.split(path), Path.split(root))

    cond do
      not String.match?(path, ~r/\s/) ->
        path

      not String.match?(relative, ~r/\s/) ->
        relative

      true ->
        Mix.raise("mtrace: make cannot build with #{what} at #{inspect(path)}: it has spaces")
    end
  end

  defp relative([same | path], [same | root]), do: relative(path, root)
  defp relative(path, root), do: Path.join(Enum.map(root, fn _ -> ".." end) ++ path)

  # Copies a library make built into the app's priv/ when it differs from
  # the one there.
  defp install(built, priv, file) do
    from = Path.join(built, file)
    to = Path.join(priv, file)

    if File.read(from) != File.read(to) do
      File.mkdir_p!(priv)
      # a new file, not a write into one a running VM may have mapped
      File.rm(to)
      File.cp!(from, to)
    end
  end

  # The settings make keeps are probed once; built against another OTP's
  # headers (Erlang upgraded since), they are probed again.
  defp forget_other_erts(makevars, include) do
    with {:ok, text} <- File.read(makevars),
         false <- String.contains?(text, "\nERTS_INCLUDE = #{include}\n") do
      File.rm(makevars)
    end
  end

  defp erts_include do
    Path.join([:code.root_dir(), "erts-#{:erlang.system_info(:version)}", "include"])
  end

  defp make_command do
    case System.get_env("MAKE") do
      nil ->
        cond do
          gnu_make?("make") -> {"make", "Makefile"}
          System.find_executable("gmake") -> {"gmake", "Makefile"}
          System.find_executable("bmake") -> {"bmake", "Makefile.bsd"}
          System.find_executable("make") -> {"make", "Makefile.bsd"}
          true -> Mix.raise("mtrace: no make found: install make (GNU) or bmake")
        end

      make ->
        unless System.find_executable(make),
          do: Mix.raise("mtrace: MAKE=#{make} names no program found in PATH")

        if gnu_make?(make), do: {make, "Makefile"}, else: {make, "Makefile.bsd"}
    end
  end

  defp gnu_make?(make) do
    System.find_executable(make) != nil and
      match?({"GNU Make" <> _, 0}, System.cmd(make, ["--version"], stderr_to_stdout: true))
  rescue
    _ -> false
  end
end

defmodule Mtrace.MixProject do
  use Mix.Project

  def project do
    [
      app: :mtrace,
      version: "0.2.0",
      elixir: "~> 1.14",
      compilers: [:mtrace] ++ Mix.compilers(),
      elixirc_paths: elixirc_paths(Mix.env()),
      start_permanent: Mix.env() == :prod,
      deps: [],
      description: "Finds memory leaks on live Erlang/Elixir nodes: native (malloc) and VM-side."
    ]
  end

  def application do
    # tools: instrument, which reads the VM's allocation tags (Mtrace.VM.nif_memory/1).
    [mod: {Mtrace.Application, []}, extra_applications: [:logger, :tools]]
  end

  defp elixirc_paths(:test), do: ["lib", "test/support"]
  defp elixirc_paths(_), do: ["lib"]
end

defmodule Mtrace.FlamegraphInteractiveTest do
  # The flame graph's own script, driven in headless Chromium through
  # playwright-core (npm): click to zoom, reset, search with the matched
  # share, checked on the page and on screenshots. Skipped, saying why,
  # where chromium, node or npm (and so playwright-core) is missing.
  use ExUnit.Case, async: true

  alias Mtrace.Flamegraph
  alias Mtrace.Test.PNG

  @moduletag :chromium
  @moduletag timeout: 180_000
  @width 1200
  @pad 10

  defp frame(symbol) do
    %{
      symbol: symbol,
      lib: "/usr/lib/libapp.so",
      file: nil,
      line: nil,
      addr: 0,
      inlined: false,
      offset: 0
    }
  end

  defp site(symbols, bytes) do
    %{
      count: 1,
      bytes: bytes,
      oldest: 1,
      newest: 1,
      frames: symbols |> Enum.reverse() |> Enum.map(&frame/1)
    }
  end

  # playwright-core under _build/npm, installed on first use.
  defp playwright do
    dir = Path.expand("_build/npm")
    module = Path.join(dir, "node_modules/playwright-core")

    cond do
      File.dir?(module) ->
        {:ok, module}

      System.find_executable("npm") == nil ->
        {:skip, "npm is not installed (Debian: apt-get install npm)"}

      true ->
        File.mkdir_p!(dir)

        case System.cmd("npm", ~w(install --silent --no-audit --no-fund playwright-core@1),
               cd: dir,
               stderr_to_stdout: true
             ) do
          {_, 0} -> {:ok, module}
          {out, _} -> {:skip, "npm could not install playwright-core: " <> out}
        end
    end
  end

  test "click zooms into a box, reset restores, search highlights and gives the matched share" do
    chromium = System.find_executable("chromium")
    node = System.find_executable("node")

    with {:tools, true} <- {:tools, chromium != nil and node != nil},
         {:ok, pw} <- playwright() do
      run(pw, chromium)
    else
      {:tools, false} -> IO.puts(:stderr, "skipped: chromium or node is not installed")
      {:skip, why} -> IO.puts(:stderr, "skipped: " <> why)
    end
  end

  defp run(pw, chromium) do
    sites = [
      site(["main", "worker", "fixture_leak_malloc"], 600),
      site(["main", "worker", "fixture_leak_calloc"], 300),
      site(["main", "fixture_leak_strdup"], 100)
    ]

    svg = sites |> Flamegraph.svg(width: @width) |> IO.iodata_to_binary()
    height = Regex.run(~r/height="(\d+)"/, svg) |> List.last() |> String.to_integer()
    {dir, path} = written(svg)
    driver = Path.expand("test/support/flamegraph_driver.js")

    args = [
      driver,
      pw,
      chromium,
      path,
      "#{@width}",
      "#{height}",
      "fixture_leak_calloc",
      "fixture_leak_(malloc|strdup)",
      dir
    ]

    {out, status} = System.cmd("node", args, stderr_to_stdout: true)
    assert status == 0, out

    seen =
      out |> String.split("\n", trim: true) |> List.last() |> Mtrace.Test.JSONParser.decode!()

    full = @width - 2 * @pad
    # calloc's box held 30% of the width; zoomed, all of it
    assert_in_delta seen["before"], 0.3 * full, 1
    assert_in_delta seen["zoomed"], full, 1
    assert seen["resetShown"]
    # malloc's and strdup's boxes (and what hangs below them) left the view
    assert seen["hidden"] >= 2
    assert_in_delta seen["afterReset"], seen["before"], 0.01
    # malloc (60%) and strdup (10%) match: 70% of the width
    assert seen["matched"] == "Matched: 70.0%"

    # the screenshots show it: after the search, malloc's box is magenta;
    # zoomed, calloc's box spans the row
    searched = PNG.decode!(File.read!(Path.join(dir, "searched.png")))
    row_y = fn depth -> 60 + depth * 17 + 8 end
    {r, g, b} = pixel3(searched, round(@pad + 0.3 * full), row_y.(3))
    assert abs(r - 230) <= 8 and g <= 8 and abs(b - 230) <= 8, inspect({r, g, b})

    zoomed = PNG.decode!(File.read!(Path.join(dir, "zoomed.png")))
    # (away from the label at its left end)
    middle = pixel3(zoomed, round(@pad + 0.6 * full), row_y.(3))
    right = pixel3(zoomed, @width - @pad - 5, row_y.(3))
    assert middle == right and middle != {248, 248, 248}, inspect({middle, right})
  end

  test "a zoom keeps the boxes above the one clicked and below it, however their edges rounded" do
    chromium = System.find_executable("chromium")
    node = System.find_executable("node")

    with {:tools, true} <- {:tools, chromium != nil and node != nil},
         {:ok, pw} <- playwright() do
      sites = [site(["main", "outer", "inner"], 1000), site(["main", "other"], 1000)]
      svg = sites |> Flamegraph.svg(width: @width) |> IO.iodata_to_binary()
      # inner's box as rounding can leave it: its right edge 0.02 beyond
      # outer's (both drawn at x = 600, width 590)
      svg =
        String.replace(
          svg,
          ~r/(data-name="inner">.*?<rect x=")600.0(")/s,
          "\\g{1}600.02\\g{2}"
        )

      assert svg =~ ~s(<rect x="600.02")
      {_dir, path} = written(svg)
      driver = Path.expand("test/support/flamegraph_zoom_driver.js")
      {out, status} = System.cmd("node", [driver, pw, chromium, path, "outer"])
      assert status == 0, out

      seen =
        out |> String.split("\n", trim: true) |> List.last() |> Mtrace.Test.JSONParser.decode!()

      assert seen["found"]
      assert Enum.sort(seen["shown"]) == ["all", "inner", "main", "outer"]
    else
      {:tools, false} -> IO.puts(:stderr, "skipped: chromium or node is not installed")
      {:skip, why} -> IO.puts(:stderr, "skipped: " <> why)
    end
  end

  # The SVG in a directory of its own (removed after the test), for the
  # browser and its screenshots.
  defp written(svg) do
    dir = Path.join(System.tmp_dir!(), "mtrace_fg_#{System.unique_integer([:positive])}")
    File.mkdir_p!(dir)
    on_exit(fn -> File.rm_rf!(dir) end)
    path = Path.join(dir, "graph.svg")
    File.write!(path, svg)
    {dir, path}
  end

  defp pixel3(png, x, y) do
    p = PNG.pixel(png, x, y)
    {elem(p, 0), elem(p, 1), elem(p, 2)}
  end
end

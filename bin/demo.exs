# Run by bin/demo inside a VM that has priv/mtrace.so preloaded.
alias Mtrace.Test.LeakyNif

# Two Elixir callers of one leaking NIF function: mtrace tells them apart.
defmodule Demo.Cache do
  # A cache that never evicts: each put keeps a 4 KiB block in native memory.
  def put(_key) do
    LeakyNif.leak(:malloc, 1, 4096)
    :ok
  end
end

defmodule Demo.Sessions do
  def open(_id) do
    LeakyNif.leak(:malloc, 1, 4096)
    :ok
  end
end

unless Mtrace.preloaded?() do
  IO.puts(:stderr, "bin/demo: the tracer is not preloaded into this VM (LD_PRELOAD)")
  System.halt(1)
end

# As in a release, where mtrace is one of the applications: its start marks
# the end of the VM's boot for report/1.
{:ok, _} = Application.ensure_all_started(:mtrace)
forgotten = Mtrace.reset()
alias Mtrace.VM.Format

IO.puts(
  "Forgot #{Format.count(forgotten, "block")} allocated while the VM booted (Mtrace.reset/0)."
)

IO.puts("""
Running a NIF for 3 seconds: it churns 60_000 short-lived malloc/free pairs
and, hidden among them, leaks 4 KiB blocks from one static C function, called
from two places in Elixir: Demo.Cache.put/1 every 100 ms (a cache that never
evicts) and Demo.Sessions.open/1 every 300 ms.
""")

for i <- 1..30 do
  LeakyNif.churn(2_000, 512)
  Demo.Cache.put(i)
  if rem(i, 3) == 0, do: Demo.Sessions.open(i)
  Process.sleep(100)
end

IO.puts("""
The call sites holding native memory the NIF library allocated
(Mtrace.report(lib: "leaky_nif", limit: 2, frames: 4)): the C function that
called malloc, then the Erlang code that called the NIF.
""")

Mtrace.report(lib: "leaky_nif", limit: 2, frames: 4)

# The verdict in words: the C function that leaks and who called it.
sites = Mtrace.sites(lib: "leaky_nif", limit: 2)
[%{frames: [leaker | _]} | _] = sites
held = Enum.sum(Enum.map(sites, & &1.bytes))
blocks = Enum.sum(Enum.map(sites, & &1.count))

callers =
  Enum.map_join(sites, " and ", fn site ->
    caller = Enum.at(site.frames, Mtrace.Frame.caller_at(site.frames) || 0)
    "#{Format.bytes(site.bytes)} from #{Mtrace.Frame.label(caller)}"
  end)

stats = Mtrace.stats()

IO.puts("")

"""
In short: #{Mtrace.Frame.label(leaker)} holds #{Format.bytes(held)} in \
#{Format.count(blocks, "block")} never freed: #{callers}; among \
#{Format.int(stats.malloc_cnt)} mallocs and #{Format.int(stats.free_cnt)} frees \
seen, #{Format.int(stats.dropped)} dropped.
"""
|> String.trim_trailing()
|> Format.wrap()
|> Enum.each(&IO.puts/1)

[old] = Mtrace.olds(1, lib: "leaky_nif")

IO.puts(
  "\nIts oldest block, with its address and age (Mtrace.olds(1, lib: \"leaky_nif\")):\n" <>
    "  #{Format.bytes(old.size)} at 0x#{Integer.to_string(old.addr, 16)}, " <>
    "#{Format.age(old.age)} old"
)

for frame <- Enum.take(old.frames, 4), do: IO.puts("      " <> Mtrace.Frame.label(frame))

mark = Mtrace.mark()
LeakyNif.leak(:strdup, 5, 99)

IO.puts("""

After mark = Mtrace.mark(), the NIF leaked 5 more strings. What grew since the
mark (Mtrace.sites(since: mark)):
""")

for site <- Mtrace.sites(since: mark) do
  frame = hd(site.frames)

  IO.puts(
    "  #{Format.count(site.count, "block")}, #{Format.bytes(site.bytes)} from #{frame.symbol} " <>
      "(#{Path.basename(frame.file || "?")}:#{frame.line})"
  )
end

svg = Path.expand("_build/demo/native.svg")
File.mkdir_p!(Path.dirname(svg))
:ok = Mtrace.flamegraph(svg)
:ok = Mtrace.export(Path.rootname(svg) <> ".folded")

IO.puts("""

Flame graph of all live native memory:
  #{svg}
Collapsed stacks (for flamegraph.pl, inferno or speedscope):
  #{Path.rootname(svg)}.folded

On your own node (README, "Using it in your project"):
  Mtrace.VM.diagnose(window: 10_000)  which side grows, and what holds it
  Mtrace.report()                     the native sites, as above
""")

# Run by bin/demo inside a VM that has priv/mtrace.so preloaded.
alias Mtrace.Test.LeakyNif

true = Mtrace.preloaded?()
forgotten = Mtrace.reset()
IO.puts("Forgot #{forgotten} allocations made while the VM booted (Mtrace.reset/0).")

IO.puts("""
Running a NIF for 3 seconds: it churns 60,000 short-lived malloc/free pairs
and, hidden among them, leaks one 4 KiB block every 100 ms from a static C
function, the way a cache that never evicts does.
""")

for _ <- 1..30 do
  LeakyNif.churn(2_000, 512)
  LeakyNif.leak(:malloc, 1, 4096)
  Process.sleep(100)
end

stats = Mtrace.stats()

IO.puts("""
Mtrace.stats(): #{stats.malloc_cnt} mallocs and #{stats.free_cnt} frees seen, \
#{stats.live_count} allocations (#{stats.live_bytes} bytes) still live, \
#{stats.dropped} dropped.

The 3 oldest live allocations (Mtrace.olds(3, true)):
""")

for {age, size, addr, ns, stack} <- Mtrace.olds(3, true) do
  IO.puts("  #{size} bytes at 0x#{Integer.to_string(addr, 16)}, #{age} s old (named in #{ns} ns)")

  for {lib, symbol} <- Enum.take(stack, 4) do
    IO.puts("      #{symbol || "??"}  #{Path.basename(lib || "??")}")
  end
end

IO.puts("\nThe sites holding the most native memory (Mtrace.report(limit: 3, frames: 3)):\n")
Mtrace.report(limit: 3, frames: 3)

mark = Mtrace.mark()
LeakyNif.leak(:strdup, 5, 99)

IO.puts("""

After mark = Mtrace.mark(), the NIF leaked 5 more strings. What grew since the
mark (Mtrace.sites(since: mark)):
""")

for site <- Mtrace.sites(since: mark) do
  frame = hd(site.frames)

  IO.puts(
    "  #{site.count} blocks, #{site.bytes} bytes from #{frame.symbol} (#{Path.basename(frame.file || "?")}:#{frame.line})"
  )
end

svg = Path.expand("_build/demo/native.svg")
File.mkdir_p!(Path.dirname(svg))
:ok = Mtrace.flamegraph(svg)
:ok = Mtrace.export(Path.rootname(svg) <> ".folded")

IO.puts("""

Flame graph of all live native memory: #{svg}
Collapsed stacks (flamegraph.pl, inferno, speedscope): #{Path.rootname(svg)}.folded
""")

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

# Group what is still held by the function that called malloc.
{symbol, blocks} =
  Mtrace.olds(1_000_000)
  |> Enum.group_by(fn {_, _, _, _, stack} -> stack |> List.first({nil, nil}) |> elem(1) end)
  |> Enum.max_by(fn {_, olds} -> olds |> Enum.map(&elem(&1, 1)) |> Enum.sum() end)

bytes = blocks |> Enum.map(&elem(&1, 1)) |> Enum.sum()
{_, _, _, _, [{lib, _} | _]} = hd(blocks)

IO.puts("""

Leaking function: #{symbol} in #{Path.basename(lib)}
  #{length(blocks)} blocks, #{bytes} bytes allocated and never freed; the churn left nothing.
""")

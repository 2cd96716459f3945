# mtrace's tests read the allocation table of this very VM, so the VM must
# have been started with the tracer preloaded. bin/test does that.
unless Mtrace.preloaded?() do
  IO.puts(:stderr, """
  The mtrace tests need the tracer preloaded into the test VM. Run them with
      bin/test
  or, after `make all fixtures`:
      LD_PRELOAD=$PWD/priv/mtrace.so mix test
  """)

  System.halt(1)
end

ExUnit.start()

defmodule Mtrace.VM.ThresholdsTest do
  use ExUnit.Case, async: true

  alias Mtrace.VM.Thresholds

  test "an unknown threshold close to a known one is told that one, not all of them" do
    e = assert_raise ArgumentError, fn -> Thresholds.merge!(mailbox: 5) end
    assert e.message =~ "unknown threshold :mailbox (did you mean :mailbox_len?)"
    refute e.message =~ ":frag_usage"

    e = assert_raise ArgumentError, fn -> Thresholds.merge!(native_grwth: 5) end
    assert e.message =~ "(did you mean :native_growth?)"
  end

  test "an unknown threshold close to none is told all of them" do
    e = assert_raise ArgumentError, fn -> Thresholds.merge!(foo: 5) end
    refute e.message =~ "did you mean"
    assert e.message =~ "unknown threshold :foo; known: :binary_freed, "
  end
end

defmodule Mtrace.VM.JitCode do
  @moduledoc """
  The resident bytes of the JIT's code. The JIT maps its code twice,
  writable and executable, from one shared memory file (`/memfd:vmem`), so
  RSS counts those pages twice, as shared memory (`RssShmem` in
  `/proc/self/status`), and no ERTS allocator holds them. Other shared
  memory (a NIF's mapping) is not the JIT's: the pages of the JIT's
  mappings are counted one by one in `/proc/self/pagemap` (its present bit,
  readable without privileges; not `smaps`, which walks every mapping's
  pages), else bounded by those mappings' size.
  """

  import Bitwise

  @doc """
  The JIT's resident code in bytes, at most `shared` (`RssShmem` in bytes).

  ## Example

      iex> Mtrace.VM.JitCode.resident(0)
      0
  """
  @spec resident(non_neg_integer) :: non_neg_integer
  def resident(shared) do
    ranges = mappings()

    min(
      shared,
      pages_present(ranges) || Enum.reduce(ranges, 0, fn {lo, hi}, n -> n + hi - lo end)
    )
  end

  # [lo, hi) of each mapping of the JIT's code file, from /proc/self/maps.
  defp mappings do
    case File.read("/proc/self/maps") do
      {:ok, maps} ->
        for line <- :binary.split(maps, "\n", [:global]),
            :binary.match(line, "/memfd:vmem") != :nomatch,
            [lo, hi | _] = :binary.split(line, ["-", " "], [:global]),
            do: {String.to_integer(lo, 16), String.to_integer(hi, 16)}

      {:error, _} ->
        []
    end
  end

  # Bytes of those mappings present in this process's page tables; nil
  # where pagemap or the page size cannot be read.
  defp pages_present([]), do: 0

  defp pages_present(ranges) do
    with page when is_integer(page) <- page_size(),
         {:ok, fd} <- :file.open("/proc/self/pagemap", [:read, :raw, :binary]) do
      try do
        Enum.reduce_while(ranges, 0, fn {lo, hi}, bytes ->
          case :file.pread(fd, div(lo, page) * 8, div(hi - lo, page) * 8) do
            {:ok, entries} -> {:cont, bytes + present(entries) * page}
            _ -> {:halt, nil}
          end
        end)
      after
        :file.close(fd)
      end
    else
      _ -> nil
    end
  end

  defp present(entries) do
    for <<entry::native-64 <- entries>>, entry >>> 63 == 1, reduce: 0, do: (n -> n + 1)
  end

  # AT_PAGESZ (6) of the process's auxiliary vector.
  defp page_size do
    with {:ok, auxv} <- File.read("/proc/self/auxv") do
      Enum.find_value(for(<<type::native-64, value::native-64 <- auxv>>, do: {type, value}), fn
        {6, size} -> size
        _ -> nil
      end)
    else
      _ -> nil
    end
  end
end

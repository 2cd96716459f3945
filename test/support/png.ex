defmodule Mtrace.Test.PNG do
  @moduledoc """
  A small PNG decoder, enough to read the pixels of a browser screenshot:
  8-bit RGB or RGBA, not interlaced, any of the five scanline filters.
  Anything else raises, so a test never reads pixels it misunderstood.
  """

  import Bitwise

  defstruct [:width, :height, :channels, :pixels]

  @type t :: %__MODULE__{
          width: pos_integer(),
          height: pos_integer(),
          channels: 3 | 4,
          pixels: binary()
        }

  @signature <<137, 80, 78, 71, 13, 10, 26, 10>>

  @doc "Decodes a PNG file's contents; raises on formats this module does not handle."
  @spec decode!(binary()) :: t()
  def decode!(<<@signature, chunks::binary>>) do
    {header, idat} = read_chunks(chunks, nil, [])
    %{width: width, height: height, channels: channels} = header
    stride = width * channels
    raw = :zlib.uncompress(IO.iodata_to_binary(idat))

    unless byte_size(raw) == height * (stride + 1) do
      raise ArgumentError,
            "PNG: #{byte_size(raw)} bytes of image data, expected #{height * (stride + 1)}"
    end

    pixels = unfilter_rows(raw, stride, channels, :binary.copy(<<0>>, stride), [])
    %__MODULE__{width: width, height: height, channels: channels, pixels: pixels}
  end

  def decode!(_other), do: raise(ArgumentError, "PNG: not a PNG file (bad signature)")

  @doc "The pixel at column `x`, row `y` (0-based, from the top left): `{r, g, b}` or `{r, g, b, a}`."
  @spec pixel(t(), non_neg_integer(), non_neg_integer()) :: tuple()
  def pixel(%__MODULE__{width: width, height: height} = png, x, y)
      when is_integer(x) and x >= 0 and x < width and is_integer(y) and y >= 0 and y < height do
    offset = (y * png.width + x) * png.channels

    png.pixels
    |> binary_part(offset, png.channels)
    |> :binary.bin_to_list()
    |> List.to_tuple()
  end

  ## Chunks

  defp read_chunks(<<length::32, type::binary-4, rest::binary>>, header, idat) do
    <<data::binary-size(length), crc::32, rest::binary>> = rest

    unless :erlang.crc32(type <> data) == crc do
      raise ArgumentError, "PNG: bad CRC in chunk #{type}"
    end

    case type do
      "IHDR" -> read_chunks(rest, parse_header(data), idat)
      "IDAT" -> read_chunks(rest, header, [idat, data])
      "IEND" -> {header || raise(ArgumentError, "PNG: no IHDR chunk"), idat}
      # A suggested palette for a true-color image changes no pixel.
      "PLTE" -> read_chunks(rest, header, idat)
      <<first, _::binary>> when first in ?a..?z -> read_chunks(rest, header, idat)
      _critical -> raise ArgumentError, "PNG: unsupported critical chunk #{type}"
    end
  end

  defp read_chunks(_truncated, _header, _idat), do: raise(ArgumentError, "PNG: truncated file")

  defp parse_header(<<width::32, height::32, depth, color_type, compression, filter, interlace>>) do
    channels =
      case color_type do
        2 -> 3
        6 -> 4
        other -> raise ArgumentError, "PNG: color type #{other} unsupported (only RGB and RGBA)"
      end

    unless depth == 8, do: raise(ArgumentError, "PNG: bit depth #{depth} unsupported (only 8)")
    unless interlace == 0, do: raise(ArgumentError, "PNG: interlaced images unsupported")

    unless compression == 0 and filter == 0,
      do: raise(ArgumentError, "PNG: unknown compression or filter method")

    %{width: width, height: height, channels: channels}
  end

  ## Scanline filters (PNG specification, section 9)

  defp unfilter_rows(<<>>, _stride, _bpp, _prior, rows),
    do: rows |> Enum.reverse() |> IO.iodata_to_binary()

  defp unfilter_rows(<<filter, rest::binary>>, stride, bpp, prior, rows) do
    <<line::binary-size(stride), rest::binary>> = rest
    row = unfilter(filter, line, prior, bpp, 0, <<>>)
    unfilter_rows(rest, stride, bpp, row, [row | rows])
  end

  # `a` is the byte one pixel to the left in this row, `b` the byte above,
  # `c` the byte above `a`; all read as 0 beyond the image's edge.
  defp unfilter(_filter, <<>>, _prior, _bpp, _i, row), do: row

  defp unfilter(filter, <<x, rest::binary>>, prior, bpp, i, row) do
    a = if i >= bpp, do: :binary.at(row, i - bpp), else: 0
    b = :binary.at(prior, i)
    c = if i >= bpp, do: :binary.at(prior, i - bpp), else: 0
    byte = x + predict(filter, a, b, c) &&& 0xFF
    unfilter(filter, rest, prior, bpp, i + 1, <<row::binary, byte>>)
  end

  defp predict(0, _a, _b, _c), do: 0
  defp predict(1, a, _b, _c), do: a
  defp predict(2, _a, b, _c), do: b
  defp predict(3, a, b, _c), do: div(a + b, 2)
  defp predict(4, a, b, c), do: paeth(a, b, c)
  defp predict(filter, _a, _b, _c), do: raise(ArgumentError, "PNG: unknown filter type #{filter}")

  defp paeth(a, b, c) do
    p = a + b - c
    pa = abs(p - a)
    pb = abs(p - b)
    pc = abs(p - c)

    cond do
      pa <= pb and pa <= pc -> a
      pb <= pc -> b
      true -> c
    end
  end
end

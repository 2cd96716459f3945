# A Debian 12 image with everything mtrace needs to build and test.
#   ./docker.sh            a shell in /app (the repository, mounted)
#   ./docker.sh bin/test   run a command instead
FROM debian:12-slim

ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 LC_ALL=C.UTF-8
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      make bmake gcc libc6-dev ca-certificates procps \
      erlang-nox erlang-dev elixir \
      libunwind-dev libdw-dev libelf-dev clang-format valgrind musl-tools dwz \
      tmux chromium nodejs npm \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
CMD ["bash"]

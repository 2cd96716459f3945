#!/bin/sh
# Builds the mtrace image and runs a shell (or the given command) in it, with
# this repository mounted at /app.
#   ./docker.sh            interactive shell
#   ./docker.sh bin/test   run the tests
set -eu
cd "$(dirname "$0")"
docker build -t mtrace .
tty=""
[ -t 0 ] && tty="-it"
[ $# -eq 0 ] && set -- bash
# shellcheck disable=SC2086
exec docker run --rm $tty --hostname mtrace -v "$PWD:/app" -w /app mtrace "$@"

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
# As the caller, so that _build/ and priv/ in the mounted checkout stay
# theirs (the image has every package bin/test and bin/demo ask for, so
# nothing needs root); HOME for mix's and npm's caches.
user=""
[ "$(id -u)" -ne 0 ] && user="--user $(id -u):$(id -g) -e HOME=/tmp"
[ $# -eq 0 ] && set -- bash
# shellcheck disable=SC2086
exec docker run --rm $tty $user --hostname mtrace -v "$PWD:/app" -w /app mtrace "$@"

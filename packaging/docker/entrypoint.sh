#!/bin/sh
# The container's entry point: the first argument names a process of the Procfile (web,
# worker, beat, release; web when there is none) and runs that line as it is written
# there, with any further arguments after it, so the image and a Procfile platform run
# the same commands. Other arguments run as a command (`b2bhub run`, `b2bhub user create
# NAME`). exec: the process itself gets the container's signals, SIGTERM stopping it as
# a service manager's does.
set -eu
procfile="$(dirname "$0")/../../Procfile"
name="${1:-web}"
line=""
case "$name" in
    *[!a-z]*) ;;  # not a process name: a command
    *) line=$(sed -n "s/^${name}: //p" "$procfile") ;;
esac
if [ -z "$line" ]; then
    exec "$@"
fi
if [ "$#" -gt 0 ]; then shift; fi
set -f  # the Procfile line is split into words, never globbed
# shellcheck disable=SC2086
exec $line "$@"

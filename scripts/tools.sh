#!/bin/sh
# Installs the Debian packages a make target needs, only when missing, so CI and a fresh machine
# get them and a machine that has them pays nothing. Usage: scripts/tools.sh COMMAND PACKAGE ...
# pairs, e.g. `scripts/tools.sh promtool prometheus`.
set -eu

missing=""
while [ $# -ge 2 ]; do
  command -v "$1" >/dev/null 2>&1 || missing="$missing $2"
  shift 2
done
[ -z "$missing" ] && exit 0

if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
echo "installing:$missing"
$sudo apt-get update -qq
# shellcheck disable=SC2086 # one word per package
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing

#!/usr/bin/env bash
# The broker matrix: one test command run against each broker named, all at the same time (each
# has a broker of its own, and the tests own their queue names, so they share only the machine).
# Each broker's output goes to a file, printed whole once that broker's run has ended, in the
# order given; then one line per broker with its version, result and time. Exits 1 if any failed.
#
# Usage: scripts/test-matrix.sh "BROKER..." COMMAND...   (scripts/brokers.sh must have started them)
set -euo pipefail
cd "$(dirname "$0")/.."

[ $# -ge 2 ] || { echo "usage: $0 \"BROKER...\" COMMAND..." >&2; exit 2; }
read -r -a brokers <<<"$1"
shift
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

declare -A pid started
for broker in "${brokers[@]}"; do
  env=$(scripts/brokers.sh env "$broker")
  started[$broker]=$SECONDS
  (eval "$env" && exec "$@") >"$logs/$broker.log" 2>&1 &
  pid[$broker]=$!
done

status=0
summary=""
for broker in "${brokers[@]}"; do
  if wait "${pid[$broker]}"; then result=passed; else result=FAILED; status=1; fi
  took=$((SECONDS - started[$broker]))
  version=$(scripts/brokers.sh version "$broker")
  echo "=== $broker: RabbitMQ $version"
  cat "$logs/$broker.log"
  summary+="$broker: RabbitMQ $version $result in $((took / 60)) m $((took % 60)) s"$'\n'
done
printf '\n=== broker matrix\n%s' "$summary"
exit $status

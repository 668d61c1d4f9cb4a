#!/usr/bin/env bash
# Runs the tests (make test) against the broker they are pointed at, or, when none answers there
# and Docker with Compose v2 is at hand, against the compose stack's RabbitMQ, started for the
# run with a user of its own and removed after it (project ricochet-test, its own volume).
#
# Usage: scripts/test-broker.sh PYTEST_COMMAND [ARG...]
# The broker: RICOCHET_TEST_AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/, the local
# RabbitMQ); its management API: RICOCHET_TEST_MANAGEMENT_URL (default http://127.0.0.1:15672/).
# A compose broker is published on those ports; its Prometheus port is RABBITMQ_METRICS_PORT
# (default 15692). Against it everything runs except the fault tests that start RabbitMQ nodes
# of their own from a local rabbitmq-server: that is said before the run, never skipped quietly.
set -euo pipefail
cd "$(dirname "$0")/.."

[ $# -ge 1 ] || { echo "usage: $0 PYTEST_COMMAND [ARG...]" >&2; exit 2; }
url=${RICOCHET_TEST_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/}
management=${RICOCHET_TEST_MANAGEMENT_URL:-http://127.0.0.1:15672/}
# Only host and port matter here: user and password are the tests' business.
port_of() { local rest=${1#*://}; rest=${rest#*@}; rest=${rest%%/*}; echo "${rest##*:}"; }
host_of() { local rest=${1#*://}; rest=${rest#*@}; rest=${rest%%/*}; echo "${rest%:*}"; }
host=$(host_of "$url")
amqp_port=$(port_of "$url")

if timeout 5 bash -c "exec 3<>/dev/tcp/$host/$amqp_port" 2>/dev/null; then
  exec "$@"
fi

# Needs the machine's own rabbitmq-server: the broker restarts and the 3-node cluster.
LEFT_OUT=(tests/faults/test_broker_faults.py tests/faults/test_cluster.py)

if ! docker compose version >/dev/null 2>&1; then
  echo "test-broker: no RabbitMQ answers on $host:$amqp_port, and there is no Docker with" \
    "Compose v2 to start one: install RabbitMQ (docs/getting-started.md, On a machine with a local RabbitMQ)" >&2
  exit 1
fi
case $host in 127.0.0.1 | localhost) ;; *)
  echo "test-broker: no RabbitMQ answers on $host:$amqp_port (not this machine: nothing to start)" >&2
  exit 1
  ;;
esac

export COMPOSE_PROJECT_NAME=ricochet-test
export RABBITMQ_USER=ricochet-test
RABBITMQ_PASSWORD=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
export RABBITMQ_PASSWORD
export RABBITMQ_AMQP_PORT=$amqp_port
RABBITMQ_MANAGEMENT_PORT=$(port_of "$management")
export RABBITMQ_MANAGEMENT_PORT
export RABBITMQ_METRICS_PORT=${RABBITMQ_METRICS_PORT:-15692}

echo "test-broker: no RabbitMQ answers on $host:$amqp_port: starting the compose stack's" \
  "RabbitMQ there (user $RABBITMQ_USER, management on $RABBITMQ_MANAGEMENT_PORT)"
trap 'docker compose down --volumes --timeout 10 >/dev/null 2>&1 || true' EXIT
docker compose up --detach --wait rabbitmq
container=$(docker compose ps --quiet rabbitmq)

export RICOCHET_TEST_BROKER=compose
export RICOCHET_TEST_AMQP_URL=amqp://$RABBITMQ_USER:$RABBITMQ_PASSWORD@127.0.0.1:$amqp_port/
export RICOCHET_TEST_MANAGEMENT_URL=http://127.0.0.1:$RABBITMQ_MANAGEMENT_PORT/
export RICOCHET_TEST_RABBITMQCTL="docker exec $container rabbitmqctl"
version=$(docker exec "$container" rabbitmqctl -q version)
echo "test-broker: testing on the compose stack's RabbitMQ $version. Left out, because they" \
  "start RabbitMQ nodes of their own from a local rabbitmq-server: ${LEFT_OUT[*]}"
status=0
"$@" "${LEFT_OUT[@]/#/--ignore=}" || status=$?
echo "test-broker: tested on the compose stack's RabbitMQ $version; left out (no local" \
  "rabbitmq-server): ${LEFT_OUT[*]}"
exit $status

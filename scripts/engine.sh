#!/usr/bin/env bash
# A Docker engine of ricochet's own, for the compose test (make test-compose) on a machine that
# has no image registry: Debian's docker.io, Compose v2, and the base images the stack needs,
# built from Debian's archive instead of pulled.
#
# Usage: scripts/engine.sh start|stop|env|run COMMAND [ARG...]
#   start  install what is missing, start the engine, build the base images that are missing
#   stop   stop the engine this script started (by its pid); its data and images are kept
#   env    print the variables that point docker and compose at it (eval "$(scripts/engine.sh env)")
#   run    start, run COMMAND with those variables, stop; exits with COMMAND's status
#
# The engine keeps everything under $RICOCHET_ENGINE_DIR (default /var/tmp/ricochet-engine):
# its data root (and so the base images, built once, and the build cache), socket, pid and log.
# It never touches another engine: no iptables rules, no IP forwarding, no default bridge, so no
# container reaches beyond this machine; only builds use the host's network (pip). Needs root.
set -euo pipefail

DIR=${RICOCHET_ENGINE_DIR:-/var/tmp/ricochet-engine}
HERE=$(cd "$(dirname "$0")" && pwd)
SOCKET=$DIR/docker.sock
PIDFILE=$DIR/dockerd.pid
export DOCKER_HOST=unix://$SOCKET

# The base images: what docker-compose.yml and the Dockerfile pull by default, made locally.
# PYTHON_IMAGE: Debian's Python 3.11 where the Dockerfile's default is python:3.11-slim-bookworm.
# RABBITMQ_IMAGE: Debian trixie's RabbitMQ 4.0 with the plugins, where compose runs 4.1.
# PROMETHEUS_IMAGE: Debian's prometheus. Grafana has no Debian package (see docs/deploying.md).
PYTHON_IMAGE=ricochet-base/python:bookworm
RABBITMQ_IMAGE=ricochet-base/rabbitmq:trixie
PROMETHEUS_IMAGE=ricochet-base/prometheus:bookworm
BASE_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

die() { echo "engine: $*" >&2; exit 1; }

answers() { docker version >/dev/null 2>&1; }

# Debian's docker.io and debootstrap, and Compose v2: bookworm's docker-compose is v1, which
# rejects docker-compose.yml's top-level `name:`; trixie's package carries the v2 CLI plugin.
install_tools() {
  # The package would start the machine's own docker service: a policy-rc.d that says no, for the
  # install only, unless the machine has one already.
  local policy=/usr/sbin/policy-rc.d made_policy=""
  if ! command -v dockerd >/dev/null && [ ! -e $policy ]; then
    printf '#!/bin/sh\nexit 101\n' >$policy && chmod +x $policy && made_policy=1
  fi
  "$HERE/tools.sh" dockerd docker.io debootstrap debootstrap
  [ -z "$made_policy" ] || rm -f $policy
  docker compose version >/dev/null 2>&1 || install_compose
}

install_compose() {
  local tmp
  tmp=$(mktemp -d)
  echo "installing Compose v2 (Debian trixie's docker-compose) in ~/.docker/cli-plugins"
  echo "deb $("$HERE/debian-mirror.sh") trixie main" >"$tmp/sources.list"
  # trixie's index and the package stay in the temporary directory: the machine's own apt
  # (sources, lists, cache, locks) never sees trixie.
  local apt=(apt-get -qq -o APT::Sandbox::User=root -o Debug::NoLocking=1
    -o Dir::Etc::SourceList="$tmp/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o Dir::State::Lists="$tmp/lists" -o Dir::Cache="$tmp/cache")
  mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial"
  "${apt[@]}" update
  (cd "$tmp" && "${apt[@]}" download docker-compose)
  dpkg-deb -x "$tmp"/docker-compose_*.deb "$tmp/root"
  mkdir -p ~/.docker/cli-plugins
  install -m 0755 "$tmp/root/usr/libexec/docker/cli-plugins/docker-compose" ~/.docker/cli-plugins/
  rm -rf "$tmp"
  docker compose version
}

start_engine() {
  answers && return 0
  mkdir -p "$DIR"
  # --bridge=none: compose makes the stack's own network; the machine's docker0 stays untouched.
  dockerd --data-root "$DIR/data" --exec-root "$DIR/exec" --pidfile "$PIDFILE" -H "$DOCKER_HOST" \
    --iptables=false --ip6tables=false --ip-forward=false --bridge=none \
    --storage-driver=overlay2 >>"$DIR/dockerd.log" 2>&1 &
  for _ in $(seq 1 60); do answers && return 0; sleep 0.5; done
  die "dockerd did not answer on $SOCKET (log: $DIR/dockerd.log)"
}

stop_engine() {
  [ -f "$PIDFILE" ] || return 0
  local pid
  pid=$(cat "$PIDFILE")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
  die "dockerd (pid $pid) did not stop"
}

has_image() { docker image inspect "$1" >/dev/null 2>&1; }

# debootstrap SUITE with PACKAGES into a fresh tree. The packages are configured offline, in a
# network namespace of their own and with a policy-rc.d that forbids starting services, so that
# no post-install script starts a broker or a Prometheus beside the machine's own.
debootstrap_tree() {
  local suite=$1 packages=$2 root=$3
  rm -rf "$root"
  mkdir -p "$root"
  # shellcheck disable=SC2046 # an empty mirror means debootstrap's default
  debootstrap --variant=minbase --foreign --include="$packages" "$suite" "$root" \
    $("$HERE/debian-mirror.sh")
  printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
  chmod +x "$root/usr/sbin/policy-rc.d"
  unshare --net --mount chroot "$root" /debootstrap/debootstrap --second-stage
}

# Import a tree as an image; the tree is not kept (the image is).
import_tree() {
  local root=$1 image=$2
  shift 2
  local changes=(--change "ENV PATH=$BASE_PATH" --change "ENV LANG=C.UTF-8")
  for change in "$@"; do changes+=(--change "$change"); done
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" --numeric-owner -c . | docker import "${changes[@]}" - "$image" >/dev/null
  rm -rf "$root"
}

python_image() {
  local root=$DIR/trees/python
  debootstrap_tree bookworm python3,python3-venv,python-is-python3,ca-certificates "$root"
  # pip in the image build must trust what the machine trusts (an egress proxy's CA, a company
  # CA): the machine's extra certificates, added to the image's bundle.
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/" 2>/dev/null || true
  unshare --net --mount chroot "$root" update-ca-certificates >/dev/null
  import_tree "$root" "$PYTHON_IMAGE" 'CMD ["python3"]'
}

rabbitmq_image() {
  local root=$DIR/trees/rabbitmq
  debootstrap_tree trixie rabbitmq-server "$root"
  # What the official image configures before docker-compose.yml's conf.d file and plugins.
  mkdir -p "$root/etc/rabbitmq/conf.d"
  printf 'listeners.tcp.default = 5672\nloopback_users.guest = false\n' \
    >"$root/etc/rabbitmq/conf.d/10-defaults.conf"
  # Each data volume makes its own Erlang cookie at its first start.
  rm -f "$root/var/lib/rabbitmq/.erlang.cookie"
  import_tree "$root" "$RABBITMQ_IMAGE" \
    "ENV PATH=/usr/lib/rabbitmq/bin:$BASE_PATH" "ENV RABBITMQ_LOGS=-" "ENV HOME=/var/lib/rabbitmq" \
    "USER rabbitmq" "WORKDIR /var/lib/rabbitmq" "EXPOSE 5672 15672 15692" 'CMD ["rabbitmq-server"]'
}

prometheus_image() {
  local root=$DIR/trees/prometheus
  debootstrap_tree bookworm prometheus "$root"
  # As the official image: data in /prometheus, owned by nobody, which runs the server.
  mkdir -p "$root/prometheus"
  chown 65534:65534 "$root/prometheus"
  import_tree "$root" "$PROMETHEUS_IMAGE" "USER nobody" "WORKDIR /prometheus" "EXPOSE 9090" \
    'ENTRYPOINT ["/usr/bin/prometheus"]' \
    'CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]'
}

# The missing base images, built side by side (about a minute); each build's log is kept.
bases() {
  local pids=() names=() name image status=0
  for name in python rabbitmq prometheus; do
    image=$(variable "${name^^}_IMAGE")
    has_image "$image" && continue
    echo "building $image (debootstrap; log: $DIR/$name.build.log)"
    "${name}_image" >"$DIR/$name.build.log" 2>&1 &
    pids+=($!)
    names+=("$name")
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || { echo "engine: could not build ${names[$i]}: see $DIR/${names[$i]}.build.log" >&2; status=1; }
  done
  return $status
}

variable() { echo "${!1}"; }

env_of() {
  echo "export DOCKER_HOST=$DOCKER_HOST"
  echo "export PYTHON_IMAGE=$PYTHON_IMAGE"
  echo "export RABBITMQ_IMAGE=$RABBITMQ_IMAGE"
  echo "export PROMETHEUS_IMAGE=$PROMETHEUS_IMAGE"
}

start() {
  install_tools
  start_engine
  bases
}

run() {
  [ $# -ge 1 ] || die "usage: $0 run COMMAND [ARG...]"
  trap stop_engine EXIT
  start
  eval "$(env_of)"
  local status=0
  "$@" || status=$?
  # Images a rebuild replaced would pile up in the data root run after run.
  docker image prune --force >/dev/null
  exit $status
}

[ $# -ge 1 ] || die "usage: $0 start|stop|env|run COMMAND [ARG...]"
command=$1
shift
case $command in
  start) start ;;
  stop) stop_engine ;;
  env) env_of ;;
  run) run "$@" ;;
  *) die "unknown command '$command'" ;;
esac

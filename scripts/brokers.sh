#!/usr/bin/env bash
# The RabbitMQ brokers ricochet is tested on, side by side on one machine:
#   local   the machine's own RabbitMQ (Debian's package on the host: 3.10 here), ports 5672/15672
#   trixie  Debian trixie's RabbitMQ (4.0.x) in a chroot, AMQP 5673, management 15673
#   sid     Debian sid's RabbitMQ (the newest 4.x) and rabbitmqadmin v2 in a chroot, 5674/15674
#
# Usage: scripts/brokers.sh build|start|check|stop|env|version [BROKER...]   (default: all)
#   build    make the chroots that are missing (debootstrap from Debian's archive, ~1 min each)
#   start    build if needed, then start each broker with ricochet's plugins; idempotent. A chroot
#            broker gets ricochet's config (config/advanced.config among it) when it starts; the
#            local one keeps its own (docs/broker-problems.md: What a broker restart costs waiting jobs)
#   check    print each broker's version and ports; exit 1 if one does not answer
#   stop     stop the chroot brokers and unmount what start mounted (the local one keeps running)
#   env      print the test harness's variables for one broker (eval "$(scripts/brokers.sh env sid)")
#   version  print one broker's RabbitMQ version
#   names    print the brokers' names
#   root     print a chroot broker's root folder
#   python   make sure a chroot has its Debian's python3 with venv (make test-newest runs the
#            suites on trixie's, the newest Python Debian ships), and print its version
# The chroots live in $RICOCHET_BROKERS_DIR (default /var/tmp/ricochet-brokers) and are reused.
# Needs root (chroot, mount) and Debian's package archive for a build; a broker that cannot be
# built or started is an error, never a silent skip.
set -euo pipefail

DIR=${RICOCHET_BROKERS_DIR:-/var/tmp/ricochet-brokers}
ALL=(local trixie sid)
# A broker keeps the open-file limit it was started with, and a quorum queue costs it about three
# files: the machine's default of 1,024 stops it at about 300 queues, fewer than the suites running
# beside each other (each pytest process has a vhost of its own) declare. Brokers start here with
# the hard limit, and a running local broker with fewer than FILES is started again (once).
FILES=8192
PLUGINS="rabbitmq_management rabbitmq_shovel rabbitmq_shovel_management rabbitmq_prometheus rabbitmq_random_exchange rabbitmq_consistent_hash_exchange"

die() { echo "brokers: $*" >&2; exit 1; }

# Ports of a broker: AMQP, management, Prometheus, Erlang distribution.
ports() {
  case $1 in
    local) echo "5672 15672 15692 25672" ;;
    trixie) echo "5673 15673 15693 25673" ;;
    sid) echo "5674 15674 15694 25674" ;;
    *) die "unknown broker '$1' (known: ${ALL[*]})" ;;
  esac
}
amqp_port() { set -- $(ports "$1"); echo "$1"; }
mgmt_port() { set -- $(ports "$1"); echo "$2"; }
root_of() { echo "$DIR/$1"; }
node_of() { echo "ricochet-$1@localhost"; }

# The rabbitmqctl (or another CLI tool) command line for a broker.
cli() {
  local name=$1 tool=$2
  if [ "$name" = local ]; then echo "$tool"; else echo "chroot $(root_of "$name") $tool -n $(node_of "$name")"; fi
}

build() {
  local name=$1 root packages=rabbitmq-server
  [ "$name" = local ] && return 0
  root=$(root_of "$name")
  [ -f "$root/.ricochet-built" ] && return 0
  "$(dirname "$0")/tools.sh" debootstrap debootstrap || die "debootstrap is missing and could not be installed"
  # rabbitmqadmin v2 will not build its HTTP client without a CA bundle, even for plain HTTP.
  [ "$name" = sid ] && packages+=",rabbitmqadmin-ng,ca-certificates"
  [ "$name" = trixie ] && packages+=",python3-venv,ca-certificates"
  echo "building $name (debootstrap $name with $packages)"
  rm -rf "$root.partial"
  mkdir -p "$DIR"
  # shellcheck disable=SC2046 # an empty mirror means debootstrap's default
  debootstrap --variant=minbase --include="$packages" "$name" "$root.partial" $("$(dirname "$0")/debian-mirror.sh") \
    >"$DIR/$name.build.log" 2>&1 || die "could not build $name: see $DIR/$name.build.log"
  mv "$root.partial" "$root"
  touch "$root/.ricochet-built"
}

mounted() { mountpoint -q "$1"; }

configure() {
  local name=$1 root
  root=$(root_of "$name")
  set -- $(ports "$name")
  cp /etc/hosts "$root/etc/hosts"
  mounted "$root/proc" || mount -t proc proc "$root/proc"
  mounted "$root/dev" || mount --bind /dev "$root/dev"
  cat >"$root/etc/rabbitmq/rabbitmq-env.conf" <<EOF
NODENAME=$(node_of "$name")
NODE_PORT=$1
DIST_PORT=$4
EOF
  cat >"$root/etc/rabbitmq/rabbitmq.conf" <<EOF
listeners.tcp.default = 127.0.0.1:$1
management.tcp.ip = 127.0.0.1
management.tcp.port = $2
prometheus.tcp.ip = 127.0.0.1
prometheus.tcp.port = $3
loopback_users.guest = true
vm_memory_high_watermark.relative = 0.4
disk_free_limit.absolute = 50MB
EOF
  # What rabbitmq.conf cannot set: the broker retries a held dead-letter after 5 s, not 3 minutes,
  # so jobs waiting in the delay levels and tiers are not held that long after a restart.
  cp "$(dirname "$0")/../config/advanced.config" "$root/etc/rabbitmq/advanced.config"
  echo "[${PLUGINS// /,}]." >"$root/etc/rabbitmq/enabled_plugins"
}

up() { $(cli "$1" rabbitmq-diagnostics) -q check_port_connectivity >/dev/null 2>&1; }

# Debian's rabbitmq-server switches to its user through su, whose PAM session sets the open-file
# limit back to 1,024: switched to by setpriv instead, the broker keeps this shell's.
start_local() {
  if id rabbitmq >/dev/null 2>&1 && command -v setpriv >/dev/null; then
    (cd /var/lib/rabbitmq && HOME=/var/lib/rabbitmq \
      setpriv --reuid rabbitmq --regid rabbitmq --init-groups rabbitmq-server -detached) >/dev/null 2>&1 || true
  else
    rabbitmq-server -detached >/dev/null 2>&1 || true
  fi
}

files() {
  $(cli "$1" rabbitmqctl) -q status --formatter json |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["file_descriptors"]["total_limit"])'
}

start() {
  local name=$1 had
  build "$name"
  ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
  if [ "$name" = local ] && [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -ge "$FILES" ] &&
    up local && had=$(files local) && [ "$had" -lt "$FILES" ]; then
    echo "local: started with $had open files; starting it again with $(ulimit -n)"
    rabbitmqctl -q stop >/dev/null
    for _ in $(seq 1 30); do up local || break; sleep 1; done
  fi
  if [ "$name" = local ]; then
    up local || start_local
  elif ! up "$name"; then
    configure "$name"
    chroot "$(root_of "$name")" rabbitmq-server -detached >/dev/null 2>&1 || true
  fi
  for _ in $(seq 1 90); do up "$name" && break; sleep 1; done
  up "$name" || die "$name did not start (logs: $(root_of "$name")/var/log/rabbitmq)"
  # Every start: a broker built or started by an earlier version may lack a plugin added since.
  $(cli "$name" rabbitmq-plugins) enable $PLUGINS >/dev/null
  # Leftovers of an earlier run (an alarm a killed test did not clear) must not stall this one.
  $(cli "$name" rabbitmqctl) -q set_vm_memory_high_watermark 0.4 >/dev/null
  $(cli "$name" rabbitmqctl) -q set_disk_free_limit 50MB >/dev/null
  for _ in $(seq 1 30); do
    curl -fsS -o /dev/null -u guest:guest "http://127.0.0.1:$(mgmt_port "$name")/api/overview" && break
    sleep 1
  done
  check "$name"
}

version() { $(cli "$1" rabbitmqctl) -q version; }

# A chroot built before it came with python3-venv gets it from its Debian's archive.
python() {
  local name=$1 root
  [ "$name" = local ] && die "python: the local broker has no chroot"
  build "$name"
  root=$(root_of "$name")
  if ! chroot "$root" python3 -c 'import ensurepip' 2>/dev/null; then
    cp /etc/resolv.conf "$root/etc/resolv.conf"
    { chroot "$root" apt-get update -q &&
      chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        python3-venv ca-certificates; } >"$DIR/$name.python.log" 2>&1 ||
      die "could not install python3-venv in $name: see $DIR/$name.python.log"
  fi
  chroot "$root" python3 --version
}

check() {
  local name=$1
  up "$name" || die "$name is not running (start it: scripts/brokers.sh start $name)"
  set -- $(ports "$name")
  echo "$name: RabbitMQ $(version "$name") on AMQP $1, management $2"
}

stop() {
  local name=$1 root
  [ "$name" = local ] && return 0
  root=$(root_of "$name")
  [ -d "$root" ] || return 0
  if up "$name"; then $(cli "$name" rabbitmqctl) -q stop >/dev/null 2>&1 || true; fi
  # epmd and stray Erlang processes of the chroot would keep /dev busy.
  for _ in $(seq 1 30); do mounted "$root/dev" && umount "$root/dev" 2>/dev/null && break; sleep 1; done
  mounted "$root/proc" && umount "$root/proc"
  ! mounted "$root/dev" || die "could not unmount $root/dev"
}

env_of() {
  local name=$1
  echo "export RICOCHET_TEST_BROKER=$name"
  echo "export RICOCHET_TEST_AMQP_URL=amqp://guest:guest@127.0.0.1:$(amqp_port "$name")/"
  echo "export RICOCHET_TEST_MANAGEMENT_URL=http://127.0.0.1:$(mgmt_port "$name")/"
  echo "export RICOCHET_TEST_RABBITMQCTL='$(cli "$name" rabbitmqctl)'"
  # rabbitmqadmin v2 comes with the sid chroot; it talks to any broker's management API.
  if [ -x "$(root_of sid)/usr/bin/rabbitmqadmin" ]; then
    echo "export RICOCHET_TEST_RABBITMQADMIN_V2='chroot $(root_of sid) rabbitmqadmin'"
  fi
}

[ $# -ge 1 ] || die "usage: $0 build|start|check|stop|env|version|names [BROKER...]"
command=$1
shift
[ $# -ge 1 ] || set -- "${ALL[@]}"
for name in "$@"; do ports "$name" >/dev/null; done
case $command in
  build | start | check | stop) for name in "$@"; do "$command" "$name"; done ;;
  env) env_of "$1" ;;
  version) version "$1" ;;
  root) root_of "$1" ;;
  python) python "$1" ;;
  names) echo "${ALL[*]}" ;;
  *) die "unknown command '$command'" ;;
esac

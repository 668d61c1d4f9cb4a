#!/usr/bin/env bash
# The unit suite, then a smoke of the integration suite (SMOKE below), with
# the newest releases of the libraries ricochet is built on installed over the lock, on the newest
# Python Debian ships (trixie's python3, 3.13): what a user who pip installs ricochet on a new
# machine gets. A release that breaks ricochet fails here before a user installs it. The suites run
# inside the trixie broker's chroot (scripts/brokers.sh python trixie), in a virtualenv of their
# own ($NEWEST_VENV, default .venv-newest), against that broker in a vhost of their own. The
# versions installed are printed first, and a failure names the packages newer than the lock.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${NEWEST_INSIDE:-}" != 1 ]; then
  scripts/brokers.sh start trixie >/dev/null
  scripts/brokers.sh python trixie
  root=$(scripts/brokers.sh root trixie)
  # The checkout, seen inside the chroot (its virtualenv is made there, in the checkout).
  inside=/mnt/ricochet
  mkdir -p "$root$inside"
  mountpoint -q "$root$inside" || mount --bind "$PWD" "$root$inside"
  trap 'umount "$root$inside"' EXIT
  eval "$(scripts/brokers.sh env trixie)"
  # pip inside trusts what the machine trusts (an index behind a proxy of the site's own CA).
  bundle=/etc/ssl/certs/ca-certificates.crt
  [ ! -f "$bundle" ] || cp "$bundle" "$root/etc/ssl/certs/machine-ca-certificates.crt"
  status=0
  chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 CI="${CI:-}" \
    NEWEST_INSIDE=1 NEWEST_VENV="${NEWEST_VENV:-}" PIP_CERT=/etc/ssl/certs/machine-ca-certificates.crt \
    http_proxy="${http_proxy:-}" https_proxy="${https_proxy:-}" no_proxy="${no_proxy:-}" \
    RICOCHET_TEST_BROKER="$RICOCHET_TEST_BROKER" RICOCHET_TEST_AMQP_URL="$RICOCHET_TEST_AMQP_URL" \
    RICOCHET_TEST_MANAGEMENT_URL="$RICOCHET_TEST_MANAGEMENT_URL" \
    RICOCHET_TEST_RABBITMQCTL="rabbitmqctl -n ricochet-trixie@localhost" \
    bash -c 'cd "$0" && exec scripts/test-newest.sh "$@"' "$inside" "$@" || status=$?
  exit "$status"
fi

python3 --version
packages=(aio-pika aiormq pamqp structlog pydantic pydantic-settings tenacity)
venv=${NEWEST_VENV:-.venv-newest}
pip() { "$venv/bin/pip" --quiet --disable-pip-version-check "$@"; }

# A virtualenv of another Python (made outside the chroot) is made again.
"$venv/bin/python" -c "" 2>/dev/null || python3 -m venv --clear "$venv"
pip install --upgrade pip
# The lock first, then the project and its test tools (nothing to resolve past the lock), then
# the newest release of each package, whatever pyproject.toml's bounds say: a new major shows up
# here first. pip says which of ricochet's bounds it then breaks; the suites say whether ricochet
# itself breaks.
pip install --require-hashes --no-deps -r requirements.lock
pip install -e '.[dev,docs]'
pip install --upgrade "${packages[@]}"

# "name locked installed" for each package; "-" for one the lock does not pin.
versions=$("$venv/bin/python" - "${packages[@]}" <<'PY'
import re
import sys
from importlib.metadata import version
from pathlib import Path

locked = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", Path("requirements.lock").read_text(), re.M))
for name in sys.argv[1:]:
    print(name, locked.get(name, "-"), version(name))
PY
)
echo "newest releases over the lock (package, locked, installed):"
awk '{ printf "  %-18s %-10s %s\n", $1, $2, $3 }' <<<"$versions"
newer=$(awk '$2 != $3 { printf "%s%s %s (the lock has %s)", sep, $1, $3, $2; sep = ", " }' <<<"$versions")

# A suite, and on failure the packages that may have broken it. The suites run beside make test
# on two cores, where a test of lateness can miss its bound by a load spike: the failed tests run
# once more, and a failure that does not come again is reported as such, not blamed on a release
# or on Python (one that breaks ricochet fails both times).
run() {
    local cache=(-o cache_dir=.pytest_cache-newest)
    "$venv/bin/python" -m pytest "${cache[@]}" "$@" && return 0
    echo "test-newest: $1: the failed tests once more" >&2
    if "$venv/bin/python" -m pytest "${cache[@]}" --last-failed "$@"; then
        echo "test-newest: $1 passed on the second run: the failure above did not come again" >&2
        return 0
    fi
    echo "test-newest: $1 fails on $(python3 --version) with the newest releases: ${newer:-none newer than the lock}" >&2
    exit 1
}
# The unit suite but its check of the alert rules (Debian's promtool, the same on every Python).
run tests/unit --ignore=tests/unit/test_observability_files.py -q "${@}"
# The smoke: a job's life through the library calls each release could break (aio-pika's
# channels, confirms and nacks, pydantic's models and settings, structlog's lines, tenacity's
# connects, threads): enqueue, retry, fail, replay, both clients, the logs, a worker's start, stop
# and reconnect. Timing rows stay out: make test runs them on an idler machine. Over two
# processes (a file each at a time): the matrix has ended by then, and the smoke waits on the
# broker far more than it computes.
SMOKE=(tests/integration/test_lifecycle.py tests/integration/test_client.py
  tests/integration/test_sync_client.py tests/integration/test_replay.py
  tests/integration/test_logs.py)
run "${SMOKE[@]}" -n 2 --dist loadfile -q "${@}"

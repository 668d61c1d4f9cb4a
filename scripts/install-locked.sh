#!/bin/sh
# Make a virtualenv at $1 (with $PYTHON, default python3) holding ricochet and exactly the
# dependencies pinned, with hashes, in requirements.lock. The Dockerfile runs this, and so does a
# test, so the image and the test cannot install different things. `make lock` regenerates the lock.
set -eu
venv=${1:?usage: install-locked.sh VENV_DIR}
cd "$(dirname "$0")/.."
"${PYTHON:-python3}" -m venv "$venv"
# The lock pins the build backend too, so building ricochet itself needs nothing unpinned.
"$venv/bin/pip" install --require-hashes --no-deps --only-binary=:all: -r requirements.lock
"$venv/bin/pip" install --no-deps --no-build-isolation --no-index .
"$venv/bin/ricochet" --version

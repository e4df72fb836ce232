#!/bin/sh
# Install corral from this checkout on Debian/Ubuntu: the system packages it
# needs (bubblewrap; a C compiler for its small exec helper), then a virtualenv
# in ./.venv with corral in it. Safe to re-run.
set -eu
cd "$(dirname "$0")/.."
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq bubblewrap gcc libc6-dev python3 python3-venv >/dev/null
# Debian's interpreter (the python3-venv just installed), not whatever python3 comes
# first on PATH (a pyenv shim); --clear: a re-run, or a venv another interpreter made,
# starts over instead of failing in ensurepip
/usr/bin/python3 -m venv --clear .venv
.venv/bin/pip install -q --upgrade pip >/dev/null
.venv/bin/pip install -q .
echo "corral installed: $(pwd)/.venv/bin/corral"

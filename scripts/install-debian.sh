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
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip >/dev/null
.venv/bin/pip install -q .
echo "corral installed: $(pwd)/.venv/bin/corral"

#!/usr/bin/env bash
# Installs redis-server from Debian's packages when it is missing (tests and the demo start their own).
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
    exit 0
fi
echo "install-redis: redis-server not found; installing it with apt-get"
SUDO=""
if [[ "$(id -u)" != "0" ]]; then SUDO="sudo"; fi
${SUDO} apt-get update -qq
DEBIAN_FRONTEND=noninteractive ${SUDO} apt-get install -y -qq redis-server >/dev/null
# The package may start a system service on 6379; the tests never use it.
redis-server --version

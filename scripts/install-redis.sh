#!/usr/bin/env bash
# Installs what the tests need from Debian's packages when it is missing: redis-server (tests and the demo
# start their own), redis-cli (the cluster tests create their cluster with it; Debian ships it in
# redis-tools), openssl (the TLS tests make a throwaway certificate authority with it) and script (the CLI's
# `watch` test runs it on a pseudo-terminal; Debian ships it in bsdutils).
set -euo pipefail
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v script >/dev/null 2>&1 || missing+=(bsdutils)
if [[ ${#missing[@]} -eq 0 ]]; then
    exit 0
fi
echo "install-redis: ${missing[*]} not found; installing with apt-get"
SUDO=""
if [[ "$(id -u)" != "0" ]]; then SUDO="sudo"; fi
${SUDO} apt-get update -qq
DEBIAN_FRONTEND=noninteractive ${SUDO} apt-get install -y -qq "${missing[@]}" >/dev/null
# The package may start a system service on 6379; the tests never use it.
redis-server --version
redis-cli --version
openssl version

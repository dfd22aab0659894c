#!/usr/bin/env bash
# Installs everything larder builds, tests and demos with: Debian packages and
# the npm test tools.  Idempotent and quiet when nothing is missing, so that
# `make test` and `make demo` can run it every time on a fresh Debian 12 host.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential pkg-config git curl ca-certificates procps util-linux
  clang clang-tidy cppcheck libclang-rt-14-dev
  libuv1-dev librocksdb-dev libcurl4-openssl-dev
  protobuf-c-compiler libprotobuf-c-dev
  libsnappy-dev libzstd-dev liblz4-dev zlib1g-dev libbrotli-dev
  libinih-dev libsystemd-dev systemd libjansson-dev libexpat1-dev
  nginx-light iproute2 tmux python3
  debootstrap systemd-container
  prometheus
  python3-dev python3-numpy python3-torch python3-pytest python3-setuptools python3-pip python3-venv
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# Node.js may come from Debian or from elsewhere (NodeSource bundles npm);
# only install Debian's when there is none at all.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)

if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "deps: missing packages: ${missing[*]} (run as root to install them)" >&2
    exit 1
  fi
  echo "deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# nginx is started by the tests on loopback ports of their own; the package's
# service must not hold port 80 or be needed.
if command -v systemctl >/dev/null 2>&1 && systemctl is-enabled nginx >/dev/null 2>&1; then
  systemctl disable --now nginx >/dev/null 2>&1 || true
fi
# prometheus is there for promtool (the metrics test checks a scrape with
# it); the package's server must not run on the host.
if command -v systemctl >/dev/null 2>&1 && systemctl is-enabled prometheus >/dev/null 2>&1; then
  systemctl disable --now prometheus >/dev/null 2>&1 || true
fi

# npm test tools, pinned by tests/package-lock.json.  The stamp records the
# lock file's hash so that an unchanged tree skips the install.
stamp=tests/node_modules/.larder-lock-hash
want=$(sha256sum tests/package-lock.json | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "deps: installing npm test tools"
  (cd tests && npm ci --no-audit --no-fund --loglevel=error)
  echo "$want" >"$stamp"
fi

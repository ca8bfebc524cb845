#!/usr/bin/env bash
# Installs redis-server from Debian's packages when it is missing. Tests start their own
# servers; this only makes the binary available (apt does not start a service here).
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
  exit 0
fi
echo "redis-server not found: installing it with apt-get" >&2
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq redis-server >/dev/null
command -v redis-server >/dev/null

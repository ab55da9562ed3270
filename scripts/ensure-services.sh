#!/usr/bin/env bash
# Makes sure the real servers the test suite talks to are installed (Debian packages): redis-server,
# prometheus, nginx (the compose load balancer's config is run for real), wrk, and Chromium with its
# chromedriver (the admin console's browser test, tests/gateway/control/test_console.py). Installs them with
# apt-get when running as root; otherwise fails with a clear message. Tests never skip for a missing
# server: they fail.
set -euo pipefail
need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v prometheus  >/dev/null 2>&1 || need+=(prometheus)
command -v wrk         >/dev/null 2>&1 || need+=(wrk)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx)
[ -x /usr/bin/chromium ]     || need+=(chromium)
[ -x /usr/bin/chromedriver ] || need+=(chromium-driver)
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" -ne 0 ]; then
  echo "missing: ${need[*]} — install them (Debian: apt-get install ${need[*]}) and re-run" >&2
  exit 1
fi
echo "installing ${need[*]} from Debian packages" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null

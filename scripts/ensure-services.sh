#!/usr/bin/env bash
# Makes sure the real servers the test suite talks to are installed (Debian packages): redis-server,
# prometheus, nginx (the compose load balancer's config is run for real), wrk, Chromium with its
# chromedriver (the admin console's browser test, tests/gateway/control/test_console.py), and `ss`
# (iproute2: tests/real_engines/test_disconnect.py reads the engine's sockets with it). Installs them with
# apt-get when running as root; otherwise fails with a clear message. Tests never skip for a missing
# server: they fail. After installing, every server is checked again: a package that installed nothing
# usable is an error here, not a confusing test failure later.
set -euo pipefail

missing() {
  local out=()
  command -v redis-server >/dev/null 2>&1 || out+=(redis-server)
  command -v prometheus  >/dev/null 2>&1 || out+=(prometheus)
  command -v wrk         >/dev/null 2>&1 || out+=(wrk)
  command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || out+=(nginx)
  [ -x /usr/bin/chromium ]     || out+=(chromium)
  [ -x /usr/bin/chromedriver ] || out+=(chromium-driver)
  command -v ss >/dev/null 2>&1 || out+=(iproute2)
  echo "${out[@]}"
}

read -r -a need <<< "$(missing)"
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" -ne 0 ]; then
  echo "missing: ${need[*]} — install them (Debian: apt-get install ${need[*]}) and re-run" >&2
  exit 1
fi
echo "installing ${need[*]} from Debian packages" >&2
export DEBIAN_FRONTEND=noninteractive
if ! apt-get update -qq; then
  echo "apt-get update failed: cannot install ${need[*]}" >&2
  exit 1
fi
if ! apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; then
  echo "apt-get install ${need[*]} failed (see apt's message above)" >&2
  exit 1
fi
read -r -a still <<< "$(missing)"
if [ ${#still[@]} -ne 0 ]; then
  echo "still missing after apt-get install: ${still[*]}" >&2
  exit 1
fi

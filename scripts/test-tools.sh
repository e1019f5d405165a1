#!/usr/bin/env bash
# Install the system tools the fault tests use when they are missing (Debian/Ubuntu):
#   faketime  libfaketime, to run a worker whose wall clock is off (tests/faults/test_clock_skew.py)
#   strace    fault injection, to slow every fsync of a PostgreSQL server (tests/faults/test_slow_fsync.py)
#   chromium  Debian's browser, driven headless by Playwright for the web UI's tests (tests/ui)
#   iptables  packet filter, to cut a worker's network namespace off its servers (tests/hosts);
#             nft alone does as well
# Fails naming what could not be installed; the tests that need a missing tool skip, saying why.
set -u

missing=()
command -v faketime >/dev/null 2>&1 || missing+=(faketime)
command -v strace >/dev/null 2>&1 || missing+=(strace)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v iptables >/dev/null 2>&1 || command -v nft >/dev/null 2>&1 || missing+=(iptables)
if [ ${#missing[@]} -eq 0 ]; then
  echo "services: faketime, strace, chromium and iptables are installed"
  exit 0
fi

echo "services: installing ${missing[*]} (the fault tests need them)"
if ! command -v apt-get >/dev/null 2>&1; then
  echo "services: cannot install ${missing[*]}: no apt-get here; install them with your package manager" >&2
  exit 1
fi
sudo=()
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo=(sudo -n)
  else
    echo "services: cannot install ${missing[*]}: not root and no password-less sudo; run: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi
if ! "${sudo[@]}" apt-get update -qq >/dev/null; then
  echo "services: 'apt-get update' failed; could not install ${missing[*]}" >&2
  exit 1
fi
if ! DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null; then
  echo "services: 'apt-get install -y ${missing[*]}' failed" >&2
  exit 1
fi
for tool in "${missing[@]}"; do
  command -v "$tool" >/dev/null 2>&1 || { echo "services: $tool is still missing after apt-get install" >&2; exit 1; }
done
echo "services: installed ${missing[*]}"

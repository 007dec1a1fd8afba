#!/bin/sh
# Debian's chromium for the web view's browser tests (playwright drives it by path; it never downloads
# a browser). Idempotent: does nothing when /usr/bin/chromium exists or when we are not root.
set -e
if [ -x /usr/bin/chromium ]; then
    exit 0
fi
if [ "$(id -u)" != "0" ]; then
    echo "install-chromium: not root, skipping (the browser tests will skip): apt-get install chromium" >&2
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-chromium: no apt-get here, skipping (the browser tests will skip)" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq chromium >/dev/null

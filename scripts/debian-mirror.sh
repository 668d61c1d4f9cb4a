#!/bin/sh
# Prints the Debian mirror the host's apt uses (deb822 sources first, then sources.list), or
# nothing when there is none, so that debootstrap builds get their packages where the machine
# gets its own (debootstrap's default mirror otherwise).
uri=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
[ -n "$uri" ] || uri=$(awk '$1 == "deb" && $0 ~ /debian/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
echo "$uri"

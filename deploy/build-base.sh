#!/usr/bin/env bash
# Build a Debian bookworm base image with Python 3.11 from the Debian mirror alone, for machines
# that reach package registries but no image registry: debootstrap --variant=minbase, then
# docker import. The result stands in for python:3.11-slim (pass it as --build-arg BASE=...).
#   deploy/build-base.sh [TAG]            default tag: dekube/base:bookworm
# Needs root, debootstrap and a running dockerd. Env: DEBIAN_MIRROR (default http://deb.debian.org/debian).
set -euo pipefail
TAG="${1:-dekube/base:bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PACKAGES=python3,python3-venv,python3-pip,ca-certificates,iproute2,nftables
if [ "$(id -u)" != 0 ]; then echo "error: debootstrap needs root" >&2; exit 1; fi
command -v debootstrap >/dev/null || { echo "error: debootstrap is missing (apt-get install debootstrap)" >&2; exit 1; }
docker info >/dev/null 2>&1 || { echo "error: no docker daemon answers (start dockerd)" >&2; exit 1; }
ROOTFS="$(mktemp -d /tmp/dekube-base.XXXXXX)"
trap 'rm -rf "$ROOTFS"' EXIT
debootstrap --variant=minbase --include="$PACKAGES" bookworm "$ROOTFS" "$MIRROR" >"$ROOTFS.log" 2>&1 \
  || { tail -20 "$ROOTFS.log" >&2; echo "error: debootstrap failed (log $ROOTFS.log)" >&2; exit 1; }
rm -f "$ROOTFS.log"
ln -sf python3 "$ROOTFS/usr/bin/python"
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*
tar -C "$ROOTFS" --numeric-owner -c . | docker import \
  -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8' \
  -c 'CMD ["python3"]' - "$TAG" >/dev/null
echo "built $TAG ($(docker image inspect -f '{{.Size}}' "$TAG" | awk '{printf "%.0f MB", $1/1e6}'))"

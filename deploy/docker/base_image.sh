#!/usr/bin/env bash
# Builds the base image asyncps/debian:12 once (skipped when it exists): a
# minimal Debian 12 root file system made with debootstrap from the package
# source this machine's apt uses (no image registry is needed or reached),
# imported into Docker. The source is read from apt's configuration each
# time, never written into a file here.
#   deploy/docker/base_image.sh [--force]
set -euo pipefail
# dockerd and debootstrap live in sbin, which a test's PATH leaves out.
export PATH="$PATH:/usr/sbin:/sbin"
image=asyncps/debian:12
if [[ "${1:-}" != --force ]] && docker image inspect "$image" >/dev/null 2>&1; then
  echo "$image exists"
  exit 0
fi
codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
mirror=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE) $(COMPONENT) $(IDENTIFIER)' |
  awk -v c="$codename" '$2 == c && $3 == "main" && $4 == "Packages" {print $1; exit}')
if [[ -z "$mirror" ]]; then
  echo "base_image.sh: apt has no '$codename main' source to bootstrap from" >&2
  exit 1
fi
root=$(mktemp -d /tmp/asyncps-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "== debootstrap $codename from $mirror"
debootstrap --variant=minbase "$codename" "$root" "$mirror" >"$root.log" 2>&1 || {
  tail -20 "$root.log" >&2
  exit 1
}
rm -f "$root.log"
# No caches, package lists or logs in the image (debootstrap already wrote
# the same source into its apt configuration).
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*
tar -C "$root" -c . | docker import - "$image" >/dev/null
echo "== $image: $(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1 / 1e6}')"

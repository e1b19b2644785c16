#!/usr/bin/env bash
# Builds Debian's own Abseil with ThreadSanitizer, for the --config=tsan
# tests, and prints the directory of its libraries on the last line.
#
#   tests/tsan/abseil.sh [DIR]     # default ~/.cache/asyncps/absl-tsan-<version>
#
# Why: Debian's libabsl is not built with TSAN, so absl::Mutex never tells
# TSAN about a lock and TSAN reports correctly locked code as racy. The
# source is that of the installed libabsl-dev (apt-get source, with Debian's
# patches, through a private source list: the system's apt configuration is
# not touched), built as shared libraries with the installed ones' SONAMEs;
# tests run with LD_LIBRARY_PATH=DIR, so our code and gRPC both lock through
# the instrumented absl::Mutex. Only the synchronization library and what it
# needs are built (about a minute on 2 cores). A finished DIR is reused.
set -euo pipefail

version=$(dpkg-query -W -f='${Version}' libabsl-dev)
dir=${1:-$HOME/.cache/asyncps/absl-tsan-$version}
if [[ -f $dir/.done ]]; then
  echo "$dir"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$dir"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
# The deb-src twin of each Debian source apt is configured with.
apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 'Identifier: Packages' |
  sort -u |
  while read -r uri release; do
    case $uri in *debian*) ;; *) continue ;; esac
    echo "deb-src [signed-by=$keyring] $uri $release main"
  done >"$work/sources.list"
if [[ ! -s $work/sources.list ]]; then
  echo "tests/tsan/abseil.sh: no Debian source in apt's configuration" >&2
  exit 1
fi
apt=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o "Dir::State::Lists=$work/lists" -o APT::Sandbox::User=root -qq)
apt-get "${apt[@]}" update >&2
(cd "$work" && apt-get "${apt[@]}" source --download-only "abseil=$version" >&2)
dpkg-source -x "$work"/abseil_*.dsc "$work/src" >&2
cmake -S "$work/src" -B "$work/build" -DCMAKE_CXX_STANDARD=17 \
  -DBUILD_SHARED_LIBS=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS="-fsanitize=thread -O1 -g" \
  -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread >&2
cmake --build "$work/build" -j"$(nproc)" --target synchronization >&2
find "$work/build" -name 'libabsl_*.so.*' -exec cp -P {} "$dir/" \;
touch "$dir/.done"
echo "$dir"

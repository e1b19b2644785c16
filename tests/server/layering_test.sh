#!/bin/bash
# Inside server/, arrows point down only: no core target (a //server target
# other than the composition, shard_server and ps_server) depends on
# server/edge/ or server/replica/. Bazel visibility cannot say so by itself
# (the core and the composition share the //server package), so the
# genquery beside this test lists any such dependency and the test fails
# naming it (docs/DESIGN.md, "Inside server/").
set -eu
found="$1"
if [[ -s "${found}" ]]; then
  echo "core targets of //server depend on server/edge or server/replica:"
  cat "${found}"
  exit 1
fi
echo "no core target depends on server/edge or server/replica"

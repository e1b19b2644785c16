#!/usr/bin/env bash
# Bazel's --workspace_status_command (.bazelrc): the commit the binaries are
# built from, for --version and asyncps_build_info. "unknown" outside a git
# checkout (a source tarball, a container build without .git); "-dirty"
# when the tree has changes not committed.
commit=$(git rev-parse --short=12 HEAD 2>/dev/null) || commit=unknown
if [[ $commit != unknown ]] && ! git diff --quiet HEAD 2>/dev/null; then
  commit+=-dirty
fi
echo "STABLE_ASYNCPS_COMMIT $commit"

#!/usr/bin/env bash
# Every Kubernetes overlay (deploy/k8s/overlays/*) and the monitoring
# kustomization (deploy/k8s/monitoring: the Prometheus operator's
# PodMonitor and PrometheusRule), as `kubectl kustomize` renders them,
# against the Kubernetes API's own schemas (kubernetes-models
# from npm, tools/ops/k8s_validate; deploy/install_deps.sh installs it); and
# the validator itself refuses a deliberately broken manifest
# (tests/deploy/k8s_broken.yaml), naming each fault, fields the API's types
# lack included.
set -euo pipefail
root="$TEST_SRCDIR/$TEST_WORKSPACE"
work="$TEST_TMPDIR/k8s"
npm_dir=${ASYNCPS_NPM_DIR:-/opt/asyncps/k8s_validate}
export NODE_PATH="$npm_dir/node_modules"
fail() { echo "FAIL: $*" >&2; exit 1; }
[[ -d "$NODE_PATH/kubernetes-models" ]] ||
  fail "no kubernetes-models in $NODE_PATH: run deploy/install_deps.sh"
validate="$root/tools/ops/k8s_validate/validate.js"
to_json() {  # YAML documents on stdin -> a JSON array in $1
  /usr/bin/python3 -c 'import json, sys, yaml
json.dump([d for d in yaml.safe_load_all(sys.stdin) if d], open(sys.argv[1], "w"))' "$1"
}
# kustomize does not read a kustomization.yaml that is a symbolic link
# (Bazel's runfiles are): render a copy.
rm -rf "$work" && mkdir -p "$work" && cp -rL "$root/deploy/k8s" "$work/k8s"
rendered=()
for dir in "$work"/k8s/overlays/*/ "$work"/k8s/monitoring/; do
  overlay=$(basename "$dir")
  kubectl kustomize "$dir" 2>"$work/$overlay.err" | to_json "$work/$overlay.json" ||
    fail "kubectl kustomize overlays/$overlay: $(cat "$work/$overlay.err")"
  rendered+=("$work/$overlay.json")
done
# One run over every render (the lines name each file's objects).
node "$validate" "${rendered[@]}" || fail "a render is not valid (INVALID above)"

# The broken manifest must be refused, each fault named.
to_json "$work/broken.json" <"$root/tests/deploy/k8s_broken.yaml"
if node "$validate" "$work/broken.json" >"$work/broken.out"; then
  cat "$work/broken.out"
  fail "the validator accepted tests/deploy/k8s_broken.yaml"
fi
cat "$work/broken.out"
for fault in "spec/replicas must be integer" "containerPort must be integer" \
  "capabilities/drop must be array" "spec/containers must be array" \
  "broken-no-selector: data/spec must have required property selector" \
  "no schema for apps/v1 StatefulSett" \
  "broken-podmonitor: data/spec/podMetricsEndpoints must be array" \
  "'restartPolcy' does not exist in type" \
  "'imagePullPolicey' does not exist in type"; do
  grep -qF "$fault" "$work/broken.out" || fail "the validator did not name: $fault"
done
echo PASS

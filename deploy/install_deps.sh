#!/usr/bin/env bash
# Installs every Debian 12 package asyncps needs to build, test and run.
# Idempotent: packages already present are left alone, and apt is only
# consulted when something is missing. Every other script calls this first.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap           # Bazel 4.2.3 (/usr/bin/bazel)
  g++
  clang                     # --config=clang: -Wthread-safety checks ABSL_GUARDED_BY
  libgrpc++-dev             # gRPC 1.51 C++
  protobuf-compiler-grpc    # grpc_cpp_plugin
  protobuf-compiler         # protoc 3.21
  libprotobuf-dev
  libssl-dev                # OpenSSL 3.0: TLS on the data plane
  libabsl-dev               # Abseil 20220623: flags, status, strings, sync, time
  libgoogle-glog-dev        # logging (this Abseil has no logging library)
  libgtest-dev
  libgmock-dev
  libbenchmark-dev
  libopenblas-dev           # CPU backend (cblas_sgemm)
  libgloo-dev               # CPU ring all-reduce
  zlib1g-dev                # gzip'd IDX files
  prometheus-cpp-dev        # /metrics: metric types and text format (prometheus-cpp 1.0)
  libcpp-httplib-dev        # /metrics: the HTTP server (see common/metrics_endpoint.h)
  dataset-fashion-mnist     # /usr/share/datasets/fashion-mnist/
  gnuplot-nox               # experiment plots, psctl timeline --plot
  prometheus                # tests/integration/prometheus_test.sh; promtool
  docker.io                 # the compose cluster (deploy/docker-compose.yml)
  docker-compose            # 1.29
  debootstrap               # the base image (deploy/docker/base_image.sh)
  curl                      # tools/bench/metrics_bench.sh
  iperf3                    # tests/deploy/netem_test.sh: the emulated links' rate
  openssh-client            # asyncps.run -H: the launcher's ssh
  openssh-server            # tests/deploy/launcher_hosts_test.sh: each emulated host's sshd
  cmake                     # tests/tsan/abseil.sh builds Debian's Abseil for TSAN
  dpkg-dev                  # dpkg-source, for the same
  python3-yaml              # tests/deploy/drift_test.py
  procps                    # pkill/pgrep in scripts
  python3                   # tools/experiments/ (standard library only)
  python3-dev               # the Python module (//python): Python.h
  pybind11-dev              # the Python module's bindings (pybind11 2.10)
  python3-numpy             # the Python module's arrays
  python3-torch             # asyncps.torch, the CNN example (PyTorch 1.13)
  python3-pytest            # tests/python
  python3-venv              # pip install ./python (tests/pip_install.sh)
  python3-pip
  python3-setuptools        # python/setup.py
  python3-wheel
  etcd-server               # replicated shards' coordination (ps_server --replicas)
  universal-ctags           # tests/lint/code_size.py: C++ functions' extents
  shfmt                     # the same, for shell (shfmt --to-json)
  node-acorn                # the same, for JavaScript (acorn --locations)
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# kubectl renders the Kubernetes overlays (kubectl kustomize); Node.js runs
# their schema validation. Debian's kubernetes-client (1.20) and nodejs
# (18) only where none is installed: a newer one from elsewhere would
# conflict with them over /usr/bin/kubectl, and both serve.
command -v kubectl >/dev/null || missing+=(kubernetes-client)
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)

if ((${#missing[@]} > 0)); then
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  echo "install_deps: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The Kubernetes schema validator (tools/ops/k8s_validate: kubernetes-models
# from npm, pinned by its package-lock.json) in ASYNCPS_NPM_DIR, reinstalled
# only when the lock file changes.
npm_dir=${ASYNCPS_NPM_DIR:-/opt/asyncps/k8s_validate}
src="$(dirname "$0")/../tools/ops/k8s_validate"
if ! cmp -s "$src/package-lock.json" "$npm_dir/package-lock.json" ||
  [[ ! -d "$npm_dir/node_modules/kubernetes-models" ]]; then
  echo "install_deps: npm ci of $src into $npm_dir" >&2
  mkdir -p "$npm_dir"
  cp "$src/package.json" "$src/package-lock.json" "$npm_dir/"
  # Not fatal here: only the schema test needs it, and it says so.
  (cd "$npm_dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null) ||
    echo "install_deps: npm ci failed: tests/deploy:k8s_schema_test cannot run" >&2
fi

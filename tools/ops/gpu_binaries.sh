# Sourced by the GPU tools (gpu_bench.sh, gpu_train.sh), from the
# repository's root: `gpu_binaries NAME TARGET...` leaves BIN as it is if
# set (a folder of binaries, e.g. from tools/ops/pack_gpu.sh), else builds the
# targets (--config=cuda where nvcc is installed) and copies them into a
# fresh folder /tmp/NAME.XXXXXX that BIN then names.
gpu_binaries() {
  local name=$1
  shift
  if [[ -n "${BIN:-}" ]]; then return; fi
  deploy/install_deps.sh
  local config=()
  if [[ -x /usr/local/cuda/bin/nvcc ]]; then config=(--config=cuda); fi
  bazel build "${config[@]}" "$@"
  BIN=$(mktemp -d "/tmp/$name.XXXXXX")
  local target
  for target in "$@"; do
    target=${target#//}
    cp "bazel-bin/${target%%:*}/${target##*:}" "$BIN/"
  done
  bazel shutdown
}

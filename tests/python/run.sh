#!/usr/bin/env bash
# The Python tests (pytest) of the asyncps module, against real ps_server
# processes, with Debian's /usr/bin/python3 (python3-torch, python3-numpy,
# python3-pytest). Run by bazel test //tests/python:python_test.
set -euo pipefail
root=$PWD
export PYTHONPATH=$root/python
export ASYNCPS_PS_SERVER=$root/server/ps_server
export ASYNCPS_PSCTL=$root/tools/psctl
export ASYNCPS_PS_WORKER=$root/worker/ps_worker
export ASYNCPS_GEN_CERTS=$root/deploy/gen_certs.sh
export ASYNCPS_CTR_EXPERIMENT=$root/tools/experiments/ctr_experiment.py
export ASYNCPS_EXAMPLE=$root/python/examples/fashion_cnn.py
export ASYNCPS_MINIMAL=$root/python/examples/minimal.py
export ASYNCPS_README=$root/README.md
# One intra-op thread per process: the tests start several at once.
export OMP_NUM_THREADS=1
cd "$TEST_TMPDIR"
exec /usr/bin/python3 -m pytest -q -p no:cacheprovider --durations=25 \
  "$root/tests/python/client_test.py" "$root/tests/python/torch_test.py" \
  "$root/tests/python/optim_test.py" "$root/tests/python/optim_state_test.py" \
  "$root/tests/python/optim_bsp_test.py" "$root/tests/python/launcher_test.py" \
  "$root/tests/python/embedding_test.py" \
  "$root/tests/python/embedding_bsp_test.py" "$root/tests/python/ctr_test.py" \
  "$root/tests/python/outer_test.py" "$root/tests/python/doctor_test.py" \
  "$root/tests/python/elastic_test.py"

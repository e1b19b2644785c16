#!/usr/bin/env bash
# python3 -m asyncps.run -H across emulated hosts (launcher_hosts_test.py
# says what it checks): three network namespaces from
# deploy/netem_cluster.sh, each with its own sshd. Skipped, saying why,
# where the kernel, the permissions or the packages lack what it needs.
set -uo pipefail
export PATH="$PATH:/usr/sbin:/sbin"  # ip, sshd
root=$PWD
script=$(find "$root" -path '*deploy/netem_cluster.sh' -print -quit)
[[ -x "$script" ]] || { echo "FAIL: deploy/netem_cluster.sh not found"; exit 1; }
name="lh$$"

for tool in ssh ssh-keygen sshd; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIPPED: no $tool (deploy/install_deps.sh installs openssh)"; exit 0
  fi
done
if ! ip netns add "${name}probe" 2>/dev/null; then
  echo "SKIPPED: cannot create network namespaces here (root and CONFIG_NET_NS needed)"; exit 0
fi
ip netns del "${name}probe"

export PYTHONPATH=$root/python
export ASYNCPS_PS_SERVER=$root/server/ps_server
export OMP_NUM_THREADS=1
"$script" --hosts 3 --link 1gbit --name "$name" -- \
  /usr/bin/python3 "$root/tests/deploy/launcher_hosts_test.py"
status=$?
"$script" --down "$name"
exit "$status"

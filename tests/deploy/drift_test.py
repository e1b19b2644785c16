#!/usr/bin/python3
"""Drift between the deployment files and the binaries, checked offline.

Every flag that deploy/docker-compose.yml (its GPU and TLS overrides, and the
replicated docker-compose.replicated.yml), every
Kubernetes overlay (deploy/k8s/overlays/*, as `kubectl kustomize` renders
it) and deploy/local_cluster.sh pass to ps_server, ps_worker,
psctl or the shards' launcher (python/package/cluster.py) exists in that
program's --helpfull (the launcher's --help); the
Kubernetes manifests parse, and their names and ports agree (the workers'
--servers name the shard Job's pods through its headless Service, on the
port the shards listen on, which the Service and the containers expose;
the counts agree with the ConfigMap's; every workload is a Job that ends
when the workers do);
the compose services the workers name exist and listen there; and
`docker-compose config -q` accepts the compose files.
"""
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys

import yaml

ROOT = os.path.join(os.environ["TEST_SRCDIR"], os.environ["TEST_WORKSPACE"])
BINARIES = {
    "ps_server": "server/ps_server",
    "ps_worker": "worker/ps_worker",
    "psctl": "tools/psctl",
}
failures = []


def fail(message):
    failures.append(message)
    print("FAIL:", message, file=sys.stderr)


def known_flags(binary):
    out = subprocess.run([os.path.join(ROOT, BINARIES[binary]), "--helpfull"],
                         capture_output=True, text=True).stdout
    flags = set(re.findall(r"^\s+--([A-Za-z0-9_]+) ", out, re.M))
    assert len(flags) > 10, f"{binary} --helpfull listed {len(flags)} flags"
    return flags


FLAGS = {b: known_flags(b) for b in BINARIES}
FLAGS["cluster.py"] = set(re.findall(r"--([a-z0-9_]+)", subprocess.run(
    [sys.executable, os.path.join(ROOT, "python/package/cluster.py"), "--help"],
    capture_output=True, text=True, check=True).stdout))


def flag_names(args):
    """The --name of each --name=value or --name argument."""
    return [m.group(1) for a in args
            for m in [re.match(r"--([A-Za-z0-9_]+)", a)] if m]


def check(where, binary, args):
    for name in flag_names(args):
        if name not in FLAGS[binary]:
            fail(f"{where}: {binary} has no flag --{name}")


def commands(argv):
    """(binary, its arguments) for each of our binaries in a command line,
    including inside `sh -c '...'`."""
    out = []
    if len(argv) >= 3 and argv[0] == "sh" and argv[1] == "-c":
        for line in argv[2:]:
            out += commands(shlex.split(line))
        return out
    def binary(word):
        name = os.path.basename(word.strip('"'))
        return name if name in BINARIES else None

    # Each binary's arguments run to the next binary ("a ... && exec b ...").
    starts = [i for i, word in enumerate(argv) if binary(word)]
    for i, end in zip(starts, starts[1:] + [len(argv)]):
        out.append((binary(argv[i]), argv[i + 1:end]))
    return out


def value(args, flag):
    for a in args:
        if a.startswith(f"--{flag}="):
            return a.split("=", 1)[1]
    return None


# --- docker-compose -------------------------------------------------------
compose_files = [os.path.join(ROOT, "deploy", f)
                 for f in ("docker-compose.yml", "docker-compose.gpu.yml",
                           "docker-compose.tls.yml",
                           "docker-compose.replicated.yml")]
env = dict(os.environ, ASYNCPS_OUT="/tmp")
for files in ([compose_files[0]], compose_files[:2],
              [compose_files[0], compose_files[2]], [compose_files[3]]):
    cmd = ["docker-compose"] + [x for f in files for x in ("-f", f)]
    r = subprocess.run(cmd + ["config", "-q"], capture_output=True, text=True,
                       env=env)
    if r.returncode != 0:
        fail(f"docker-compose config -q on {files}: {r.stderr.strip()}")
config = yaml.safe_load(subprocess.run(
    ["docker-compose", "-f", compose_files[0], "-f", compose_files[1],
     "config"], capture_output=True, text=True, env=env, check=True).stdout)
tls = yaml.safe_load(subprocess.run(
    ["docker-compose", "-f", compose_files[0], "-f", compose_files[2],
     "config"], capture_output=True, text=True, env=env, check=True).stdout)
plain = yaml.safe_load(subprocess.run(
    ["docker-compose", "-f", compose_files[0], "config"], capture_output=True,
    text=True, env=env, check=True).stdout)
replicated = yaml.safe_load(subprocess.run(
    ["docker-compose", "-f", compose_files[3], "config"], capture_output=True,
    text=True, env=env, check=True).stdout)
shard_ports = {}
servers_named = []
for conf, label in ((plain, "docker-compose.yml"),
                    (config, "docker-compose.gpu.yml"),
                    (tls, "docker-compose.tls.yml"),
                    (replicated, "docker-compose.replicated.yml")):
    for name, service in conf["services"].items():
        argv = list(service.get("entrypoint") or []) + list(
            service.get("command") or [])
        for binary, args in commands(argv):
            check(f"{label} service {name}", binary, args)
            if binary == "ps_server":
                shard_ports[name] = value(args, "port")
            if binary == "ps_worker":
                servers_named.append((label, name, value(args, "servers")))
        test = (service.get("healthcheck") or {}).get("test") or []
        for binary, args in commands([t for t in test if t != "CMD"]):
            check(f"{label} service {name} healthcheck", binary, args)
for label, name, servers in servers_named:
    # A replicated shard's members are joined by '|'.
    for server in re.split(r"[,|]", servers or ""):
        host, _, port = server.partition(":")
        if shard_ports.get(host) != port:
            fail(f"{label} service {name}: --servers names {server}, but "
                 f"service {host} listens on {shard_ports.get(host)}")

def pod_spec(obj):
    """The pod template's spec of a workload, or None."""
    return obj.get("spec", {}).get("template", {}).get("spec")


def each_container(objects):
    """(object, container, its command line) for every workload's
    containers."""
    for d in objects:
        for c in (pod_spec(d) or {}).get("containers", []):
            yield d, c, list(c.get("command") or []) + list(c.get("args") or [])


# --- the "restricted" Pod Security level, probes, disruption, network ------
# Our own reading of the level's rules (tests/deploy/k8s_schema_test.sh
# checks the manifests against the API's schemas): each pod runs as
# non-root with the RuntimeDefault seccomp profile; each container
# escalates nothing, drops every capability and has a read-only root file
# system.
def check_restricted(label, objects, shards):
    for d in objects:
        pod = pod_spec(d)
        if pod is None:
            continue
        where = f"{label} {d['kind']} {d['metadata']['name']}"
        psc = pod.get("securityContext", {})
        if psc.get("runAsNonRoot") is not True or \
                psc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
            fail(f"{where}: the pod is not runAsNonRoot with seccomp "
                 "RuntimeDefault")
        for c in pod.get("containers", []):
            csc = c.get("securityContext", {})
            if csc.get("allowPrivilegeEscalation") is not False or \
                    csc.get("capabilities", {}).get("drop") != ["ALL"] or \
                    csc.get("readOnlyRootFilesystem") is not True:
                fail(f"{where}: container {c['name']} may escalate, keeps "
                     "capabilities or writes its root file system")
    shard_pod = shards["spec"]["template"]["spec"]
    if not all("startupProbe" in c for c in shard_pod["containers"]):
        fail(f"{label}: the shards have no startupProbe: a long restore is "
             "killed by liveness")
    shard_labels = shards["spec"]["template"]["metadata"]["labels"]
    for kind in ("PodDisruptionBudget", "NetworkPolicy"):
        # The job's own (etcd's, replicated, are apart).
        found = [d for d in objects if d["kind"] == kind and
                 d["metadata"].get("labels", {}).get("app") == "asyncps"]
        if not found:
            fail(f"{label}: no {kind} for the shards")
        for d in found:
            selector = (d["spec"].get("selector") or d["spec"]["podSelector"])
            if selector["matchLabels"].items() - shard_labels.items():
                fail(f"{label}: {kind} {d['metadata']['name']} does not "
                     "select the shards")


# --- Kubernetes ------------------------------------------------------------
def is_etcd(container):
    """The replicated overlay's etcd, which is not one of the job's."""
    return (container.get("command") or [None])[0] == "etcd"



def job_config(label, objects):
    """The asyncps-job ConfigMap's data, or None (a failure said so)."""
    for d in objects:
        for key in ("apiVersion", "kind", "metadata"):
            if key not in d:
                fail(f"{label}: a {d.get('kind')} has no {key}")
    config = next((d.get("data", {}) for d in objects
                   if d["kind"] == "ConfigMap"
                   and d["metadata"]["name"] == "asyncps-job"), None)
    if config is None:
        fail(f"{label}: no asyncps-job ConfigMap")
    return config


def resolve(config, v):
    """A flag's value with the ConfigMap's $VARS filled in."""
    for name, val in config.items():
        v = (v or "").replace(f"${name}", str(val))
    return v


def check_jobs_end(label, objects):
    """The job ends: every workload is a Job (nothing that restarts
    forever), but the replicated overlay's etcd, which its kustomization
    says to delete with the job."""
    for d in objects:
        pod = pod_spec(d)
        if pod is None:
            continue
        if any(is_etcd(c) for c in pod.get("containers", [])):
            continue
        if d["kind"] != "Job" or pod.get("restartPolicy") not in (
                "OnFailure", "Never"):
            fail(f"{label} {d['kind']} {d['metadata']['name']}: not a Job "
                 "that ends (the job must end when the workers finish)")


def check_shard_job(label, objects, config, service, shards):
    """The shards: an Indexed Job of NUM_SHARDS x REPLICAS pods in the
    headless Service's subdomain, with a PodDisruptionBudget of one."""
    if pod_spec(shards).get("subdomain") != service["metadata"]["name"] or \
            shards["spec"].get("completionMode") != "Indexed":
        fail(f"{label}: the shards are not an Indexed Job in the headless "
             "Service's subdomain")
    if service["spec"]["selector"].items() - \
            shards["spec"]["template"]["metadata"]["labels"].items():
        fail(f"{label}: the headless Service does not select the shards")
    # Pods: NUM_SHARDS x REPLICAS (the members of each shard's group).
    replicas = shards["spec"]["completions"]
    pods = int(config.get("NUM_SHARDS", 0)) * int(config.get("REPLICAS", 1))
    if replicas != pods or shards["spec"]["parallelism"] != replicas:
        fail(f"{label}: the shard Job's completions {replicas} and "
             f"parallelism are not NUM_SHARDS x REPLICAS {pods}")
    for d in objects:
        if d["kind"] == "PodDisruptionBudget" and \
                d["spec"].get("minAvailable") != int(replicas) - 1:
            fail(f"{label}: the shards' PodDisruptionBudget is not "
                 "minAvailable NUM_SHARDS - 1")


def check_shard_flags(where, args, config, exposed, service_ports):
    """A ps_server command line: its ports exposed by the container and the
    Service, --num_shards from the ConfigMap, and --exit_when_done."""
    for flag in ("port", "data_port", "metrics_port"):
        p = int(value(args, flag))
        if p not in exposed or p not in service_ports:
            fail(f"{where}: --{flag}={p} is not exposed by "
                 "the container and the Service")
    if resolve(config, value(args, "num_shards")) != config.get("NUM_SHARDS"):
        fail(f"{where}: --num_shards is not NUM_SHARDS")
    if "exit_when_done" not in " ".join(args):
        fail(f"{where}: the shards do not --exit_when_done")


def check_containers(label, objects, config, service):
    """Every container's command lines: flags the binaries take, $VARS from
    the ConfigMap, metrics ports exposed and annotated, the shards' flags.
    Returns the shards' --port."""
    service_ports = {p["port"] for p in service["spec"]["ports"]}
    shard_port = None
    for d, c, argv in each_container(objects):
        exposed = {p["containerPort"] for p in c.get("ports", [])}
        if argv[:2] == ["sh", "-c"] and not any(
                e.get("configMapRef", {}).get("name") == "asyncps-job"
                for e in c.get("envFrom", [])):
            fail(f"{label} {d['metadata']['name']}: reads $VARS but has "
                 "no envFrom asyncps-job")
        for binary, args in commands(argv):
            where = f"{label} {d['kind']} {d['metadata']['name']}"
            check(where, binary, args)
            metrics = value(args, "metrics_port")
            if metrics and int(metrics) not in exposed:
                fail(f"{where}: --metrics_port={metrics} is not a "
                     "containerPort")
            annotations = d["spec"]["template"]["metadata"].get(
                "annotations", {})
            if metrics and annotations.get("prometheus.io/port") != metrics:
                fail(f"{where}: prometheus.io/port is not --metrics_port")
            if binary == "ps_server":
                shard_port = value(args, "port")
                check_shard_flags(where, args, config, exposed, service_ports)
    return shard_port


def check_workers(label, objects, config, servers):
    """The workers and the evaluator build --servers as `servers` for each
    of NUM_SHARDS; the evaluator ends with the job; each worker Job runs
    --num_workers pods."""
    for d, c, argv in each_container(objects):
        for binary, args in commands(argv):
            if binary != "ps_worker":
                continue
            script = " ".join(argv)
            if servers not in script or '"$NUM_SHARDS"' not in script:
                fail(f"{label} {d['metadata']['name']}: --servers is not "
                     f"built as {servers} for each of NUM_SHARDS")
            if value(args, "role") == "evaluator":
                if "--until_done" not in args:
                    fail(f"{label} {d['metadata']['name']}: the evaluator "
                         "does not end with the job (--until_done)")
            else:
                n = resolve(config, value(args, "num_workers"))
                if str(d["spec"]["completions"]) != n or \
                        str(d["spec"]["parallelism"]) != n:
                    fail(f"{label} {d['metadata']['name']}: completions, "
                         f"parallelism and --num_workers={n} differ")


# Each overlay as `kubectl kustomize` renders it (the manifests a user
# applies), checked alike.
def check_kubernetes(label, objects):
    config = job_config(label, objects)
    if config is None:
        return
    for key, binary in (("SERVER_FLAGS", "ps_server"),
                        ("CLIENT_FLAGS", "ps_worker"),
                        ("WORKER_FLAGS", "ps_worker")):
        check(f"{label} ConfigMap {key}", binary,
              shlex.split(config.get(key, "")))
    # The job's headless Service (etcd's own, replicated, is apart).
    service = next(d for d in objects if d["kind"] == "Service"
                   and d["spec"].get("clusterIP") == "None"
                   and d["metadata"].get("labels", {}).get("app") != "asyncps-etcd")
    check_jobs_end(label, objects)
    shards = next(d for d, c, argv in each_container(objects)
                  if any(b == "ps_server" for b, _ in commands(argv)))
    check_shard_job(label, objects, config, service, shards)
    shard_port = check_containers(label, objects, config, service)
    # The workers and the evaluator build --servers from NUM_SHARDS: the
    # shard Job's pods through the headless Service on the shards' port.
    servers = (f"{shards['metadata']['name']}-$((i*REPLICAS+m))."
               f"{service['metadata']['name']}:{shard_port}")
    check_workers(label, objects, config, servers)
    check_restricted(label, objects, shards)


# kustomize does not read a kustomization.yaml that is a symbolic link
# (Bazel's runfiles are): render a copy.
K8S = os.path.join(os.environ.get("TEST_TMPDIR", "/tmp"), "k8s")
shutil.rmtree(K8S, ignore_errors=True)
shutil.copytree(os.path.join(ROOT, "deploy/k8s"), K8S)
OVERLAYS = sorted(os.listdir(os.path.join(K8S, "overlays")))
k8s_objects = 0
workloads = []  # Every overlay's objects.
for overlay in OVERLAYS:
    r = subprocess.run(["kubectl", "kustomize",
                        os.path.join(K8S, "overlays", overlay)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"kubectl kustomize overlays/{overlay}: {r.stderr.strip()}")
        continue
    try:
        rendered = [d for d in yaml.safe_load_all(r.stdout) if d]
    except yaml.YAMLError as e:
        fail(f"overlays/{overlay} does not parse: {e}")
        continue
    k8s_objects += len(rendered)
    workloads += rendered
    check_kubernetes(f"overlays/{overlay}", rendered)

# --- monitoring (deploy/k8s/monitoring) -------------------------------------
# The PodMonitor finds every pod of the job on a port each container names
# "metrics"; the PrometheusRule carries deploy/alerts.yml's rules unchanged.
r = subprocess.run(["kubectl", "kustomize", os.path.join(K8S, "monitoring")],
                   capture_output=True, text=True)
if r.returncode != 0:
    fail(f"kubectl kustomize monitoring: {r.stderr.strip()}")
else:
    monitoring = {d["kind"]: d for d in yaml.safe_load_all(r.stdout) if d}
    pod_monitor = monitoring["PodMonitor"]
    wanted = pod_monitor["spec"]["selector"]["matchLabels"]
    ports = {e["port"] for e in pod_monitor["spec"]["podMetricsEndpoints"]}
    for d, c, argv in each_container(workloads):
        if is_etcd(c):
            continue  # Not the job's: the replicated overlay's etcd.
        labels = d["spec"]["template"]["metadata"]["labels"]
        named = {p.get("name") for p in c.get("ports", [])}
        if wanted.items() - labels.items() or not ports <= named:
            fail(f"monitoring: the PodMonitor does not scrape "
                 f"{d['metadata']['name']} (labels {wanted}, ports {ports})")
    alerts = yaml.safe_load(open(os.path.join(ROOT, "deploy/alerts.yml")))
    if monitoring["PrometheusRule"]["spec"]["groups"] != alerts["groups"]:
        fail("monitoring/prometheus-rule.yaml's rules are not "
             "deploy/alerts.yml's")

# --- local_cluster.sh -------------------------------------------------------
ETCD_FLAGS = set(re.findall(r"^\s+--([a-z0-9-]+)", subprocess.run(
    ["etcd", "--help"], capture_output=True, text=True).stderr +
    subprocess.run(["etcd", "--help"], capture_output=True,
                   text=True).stdout, re.M))
for script in ("deploy/local_cluster.sh",):
    text = open(os.path.join(ROOT, script)).read().replace("\\\n", " ")
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        if re.match(r"\s*etcd\s", line):
            # The private etcd of --replicas: its flags are etcd's.
            for name in re.findall(r"--([a-z0-9-]+)=", line):
                if name not in ETCD_FLAGS:
                    fail(f"{script}: --{name} is not a flag of etcd: "
                         f"{line.strip()[:100]}")
            continue
        names = re.findall(r"--([a-z0-9_]+)=", line)
        if not names:
            continue
        # A line naming no binary (an array of flags handed on, a helper
        # that echoes one) is checked against both.
        binaries = (["cluster.py"] if "cluster.py" in line else
                    [b for b in ("ps_server", "ps_worker", "psctl")
                     if b in line] or ["ps_server", "ps_worker"])
        for name in names:
            if not any(name in FLAGS[b] for b in binaries):
                fail(f"{script}: --{name} is a flag of none of {binaries}: "
                     f"{line.strip()[:100]}")

if failures:
    sys.exit(f"{len(failures)} drift(s)")
print(f"PASS: {k8s_objects} Kubernetes objects in {len(OVERLAYS)} overlays, "
      f"{len(plain['services'])} compose services, flags of "
      f"{', '.join(f'{b} ({len(f)})' for b, f in FLAGS.items())} checked")

"""pip install ./python: builds asyncps with Bazel and installs it.

    python3 -m venv --system-site-packages venv   # sees Debian's torch, numpy
    venv/bin/pip install ./python

Installs the `asyncps` package (the compiled client `_core` with type stubs,
`asyncps.torch`, the launcher `asyncps.run`) and puts `ps_server`, `psctl`
and `asyncps-run` on PATH. Supported: Debian 12 (amd64) with its Python
3.11, after deploy/install_deps.sh (Bazel, gRPC, protobuf, Abseil come from
Debian's packages; nothing is downloaded).

    pip wheel --no-deps --no-index -w dist ./python

builds the same as a wheel, asyncps-VERSION-cp311-cp311-linux_x86_64.whl,
that installs with no compiler and no Bazel (tests/wheel_test.sh: in a
container that has neither). It is not a manylinux wheel: the module and
the binaries link Debian 12's shared gRPC 1.51, protobuf 3.21, Abseil
20220623 and glog, which manylinux does not allow and no Debian 12 package
can vendor (auditwheel is not packaged); so it runs on Debian 12 amd64 with
Python 3.11 and these runtime packages: libgrpc++1.51 libprotobuf32
libabsl20220623 libgoogle-glog0v6 libprometheus-cpp-core1.0
libcpp-httplib0.11, and python3-numpy (python3-torch for asyncps.torch).
"""

import os
import re
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
with open(os.path.join(HERE, "package", "__init__.py")) as f:
    VERSION = re.search(r'__version__ = "([^"]+)"', f.read()).group(1)


class BazelBuild(build_py):
    """Builds the module and the binaries with Bazel, then lays the package
    out as //python:asyncps does, with the binaries under asyncps/bin."""

    def run(self):
        targets = ["//python:asyncps", "//server:ps_server", "//tools:psctl"]
        subprocess.check_call(["bazel", "build", "--noshow_progress",
                               *targets], cwd=ROOT)
        bin_dir = subprocess.check_output(
            ["bazel", "info", "bazel-bin"], cwd=ROOT, text=True).strip()
        package = os.path.join(self.build_lib, "asyncps")
        os.makedirs(os.path.join(package, "bin"), exist_ok=True)
        for name in ("__init__.py", "_torch_embedding.py", "_torch_kinds.py",
                     "_torch_load.py",
                     "_torch_outer.py", "_torch_overlap.py",
                     "_torch_progress.py",
                     "_torch_staging.py", "cluster.py", "ctr.py", "hosts.py",
                     "run.py",
                     "torch.py", "_core.so"):
            shutil.copy(os.path.join(bin_dir, "python", "asyncps", name),
                        os.path.join(package, name))
        for name in ("_core.pyi", "py.typed", "cli.py"):
            shutil.copy(os.path.join(HERE, "package", name),
                        os.path.join(package, name))
        for binary in ("server/ps_server", "tools/psctl"):
            target = os.path.join(package, "bin", os.path.basename(binary))
            shutil.copy(os.path.join(bin_dir, binary), target)
            os.chmod(target, 0o755)


class BinaryDistribution(Distribution):
    """Holds compiled code (built by Bazel, not by setuptools): the wheel is
    tagged for this Python and platform, not py3-none-any."""

    def has_ext_modules(self):
        return True


setup(
    name="asyncps",
    version=VERSION,
    description="Client, PyTorch optimizer and launcher for the asyncps "
                "parameter server",
    packages=["asyncps"],
    package_dir={"asyncps": "package"},
    cmdclass={"build_py": BazelBuild},
    distclass=BinaryDistribution,
    python_requires=">=3.11",
    entry_points={"console_scripts": [
        "ps_server = asyncps.cli:ps_server",
        "psctl = asyncps.cli:psctl",
        "asyncps-run = asyncps.run:main",
    ]},
    zip_safe=False,
)

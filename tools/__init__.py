"""The Python tools' one import path.

A tool run as a file puts the checkout first on sys.path and imports from
this package; nothing else loads a file by its path:

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(
        __file__)), "..", ".."))
    from tools import ROOT  # noqa: E402  (and `import asyncps` works)
    from asyncps import cluster  # noqa: E402
    from tools.reliability import chaos  # noqa: E402

Importing this package makes `import asyncps` work: the built package when
one is on the path (bazel-bin/python on $PYTHONPATH, as the tests and the
launchers set it, or one installed by pip), else python/package itself,
whose pure-Python modules (asyncps.cluster, asyncps.ctr) need no build. In
that second case the compiled client is absent: `asyncps.Client` and
`asyncps.torch` need the built package.
"""

import importlib.machinery
import importlib.util
import os
import sys

# The checkout (or the runfiles tree of a Bazel test), whatever the cwd.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _asyncps():
    if "asyncps" in sys.modules or importlib.util.find_spec("asyncps"):
        return
    spec = importlib.machinery.ModuleSpec("asyncps", None, is_package=True)
    spec.submodule_search_locations = [os.path.join(ROOT, "python", "package")]
    sys.modules["asyncps"] = importlib.util.module_from_spec(spec)


_asyncps()

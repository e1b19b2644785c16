"""The binaries pip installed with asyncps (asyncps/bin), on PATH."""

import os
import sys


def _exec(name):
    binary = os.path.join(os.path.dirname(__file__), "bin", name)
    os.execv(binary, [binary, *sys.argv[1:]])


def ps_server():
    _exec("ps_server")


def psctl():
    _exec("psctl")

#!/usr/bin/python3
"""Moved to tools/experiments/experiment.py; this path stays for the
commands written before the move (dated records, commit messages)."""
import os
import sys

new = os.path.join(os.path.dirname(os.path.abspath(__file__)), "experiments",
                   "experiment.py")
os.execv(sys.executable, [sys.executable, new] + sys.argv[1:])

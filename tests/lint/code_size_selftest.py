#!/usr/bin/env python3
"""code_size.py against a tree made here: in each language a function of 81
lines is reported and one of 80 is not, a file of 451 lines is reported and
one of 450 is not, third_party/ is left out, and a shell array assignment
(`x=()`, which ctags 5.9 takes for a function) is no function. So the
checker can fail, and fails where it should."""

import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKER = os.path.join(HERE, "code_size.py")


def body(n, line):
    """n lines of `line`, for the inside of a function."""
    return "".join(line + "\n" for _ in range(n))


# Each file's text; a function's length counts its first and last lines.
FILES = {
    "WORKSPACE": "",
    "big.cc": body(451, "// x"),
    "fits.cc": body(450, "// x"),
    "long.cc": ("int Long() {\n" + body(79, "  // x") + "}\n"
                "int Fits() {\n" + body(78, "  // x") + "}\n"
                "struct S {\n  void Method() {\n" + body(79, "    // x") +
                "  }\n};\n"),
    "long.cu": "__global__ void Kernel() {\n" + body(79, "  // x") + "}\n",
    "long.py": ("def long():\n" + body(80, "    pass") +
                "\n\nclass C:\n    def fits(self):\n" +
                body(79, "        pass")),
    "long.sh": ("#!/bin/bash\nx=()\nlong() {\n" + body(79, "  :") + "}\n"
                "fits() {\n" + body(78, "  :") + "}\n"),
    "long.js": ("function long() {\n" + body(79, "  0;") + "}\n"
                "const fits = () => {\n" + body(78, "  0;") + "};\n"),
    "run": "#!/usr/bin/env bash\nscript() {\n" + body(79, "  :") + "}\n",
    "third_party/big.cc": body(600, "// x"),
}

EXPECTED = {
    "big.cc:1: file is 451 lines (limit 450)",
    "long.cc:1: function Long is 81 lines (limit 80)",
    "long.cc:163: function S::Method is 81 lines (limit 80)",
    "long.cu:1: function Kernel is 81 lines (limit 80)",
    "long.py:1: function long is 81 lines (limit 80)",
    "long.sh:3: function long is 81 lines (limit 80)",
    "long.js:1: function long is 81 lines (limit 80)",
    "run:2: function script is 81 lines (limit 80)",
}


def main():
    with tempfile.TemporaryDirectory(
            dir=os.environ.get("TEST_TMPDIR")) as root:
        for path, text in FILES.items():
            os.makedirs(os.path.dirname(os.path.join(root, path)),
                        exist_ok=True)
            with open(os.path.join(root, path), "w") as f:
                f.write(text)
        # Untracked files of a git checkout are read, as new files are.
        subprocess.run(["git", "init", "-q", root], check=True)
        run = subprocess.run([sys.executable, CHECKER, "--root", root],
                             capture_output=True, text=True)
    print(run.stdout, run.stderr, sep="")
    reported = {line for line in run.stdout.splitlines()
                if not line.startswith("code_size:")}
    ok = True
    if run.returncode != 1:
        print(f"FAIL: exit status {run.returncode}, want 1")
        ok = False
    for line in sorted(EXPECTED - reported):
        print(f"FAIL: not reported: {line}")
        ok = False
    for line in sorted(reported - EXPECTED):
        print(f"FAIL: reported, should not be: {line}")
        ok = False
    print("PASS" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

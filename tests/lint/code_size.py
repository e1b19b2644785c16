#!/usr/bin/env python3
"""Lists every source file over 450 lines and every function over 80 lines.

Issue #39: "No source file over 450 lines. No function over 80 lines, in any
language." This checks the whole work tree (what git tracks, plus new files
it does not ignore) but third-party code, in C++ (.cc/.h/.cu), Python, shell
and JavaScript, and exits 1 naming file:line, function and length for each
violation. Functions are found by real parsers, not by pattern:

  C++ / CUDA   universal-ctags (its "end" field)   Debian: universal-ctags
  Python       the standard library's ast (end_lineno)
  shell        shfmt --to-json (FuncDecl positions) Debian: shfmt
  JavaScript   acorn --locations                    Debian: node-acorn

(universal-ctags 5.9, Debian 12's, gives no end line for shell or
JavaScript functions, hence the two others.) A function's length counts its
lines from its first (the `def`, the signature, `name() {`) to its last,
comments and blank lines inside included; a lambda is counted on its own
and inside the function that holds it.

  tests/lint/code_size.py            # the tree this script is in
  tests/lint/code_size.py --root DIR

Under `bazel test` (//tests/lint:code_size_test) the tree is found by
following this script's runfiles link back to its source.
"""

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys

MAX_FILE_LINES = 450
MAX_FUNCTION_LINES = 80

# Third-party code, not ours to size. Generated files are not tracked (Bazel
# writes them under bazel-*, which .gitignore names), so git leaves them out.
EXCLUDED_PREFIXES = ("third_party/",)

CPP_SUFFIXES = (".cc", ".h", ".cu", ".cuh")
PYTHON_SUFFIXES = (".py", ".pyi")
SHELL_SUFFIXES = (".sh", ".bash")
JS_SUFFIXES = (".js", ".mjs", ".cjs")

# The Debian package that provides each parser, for the error message.
TOOLS = {"ctags": "universal-ctags", "shfmt": "shfmt", "acorn": "node-acorn"}


class Violation:
    """One file or function over its limit."""

    def __init__(self, path, line, what, lines, limit):
        self.path, self.line, self.what = path, line, what
        self.lines, self.limit = lines, limit

    def __str__(self):
        return (f"{self.path}:{self.line}: {self.what} is {self.lines} lines "
                f"(limit {self.limit})")


def source_files(root):
    """The tree's files, relative to root: tracked or untracked-not-ignored."""
    try:
        out = subprocess.run(
            ["git", "-C", root, "ls-files", "-z", "--cached", "--others",
             "--exclude-standard"],
            check=True, capture_output=True).stdout.decode()
        paths = [p for p in out.split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        # Not a git checkout (an unpacked archive): walk it, leaving out
        # Bazel's output links and hidden folders.
        paths = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [
                d for d in dirnames
                if not d.startswith((".", "bazel-")) or d == ".ci"
            ]
            rel = os.path.relpath(dirpath, root)
            paths += [os.path.normpath(os.path.join(rel, f)) for f in filenames]
    return sorted(p for p in paths
                  if not p.startswith(EXCLUDED_PREFIXES)
                  and os.path.isfile(os.path.join(root, p)))


def language(root, path):
    """'cpp', 'python', 'shell', 'js' or None, by suffix or else shebang."""
    if path.endswith(CPP_SUFFIXES):
        return "cpp"
    if path.endswith(PYTHON_SUFFIXES):
        return "python"
    if path.endswith(SHELL_SUFFIXES):
        return "shell"
    if path.endswith(JS_SUFFIXES):
        return "js"
    if "." in os.path.basename(path):
        return None
    with open(os.path.join(root, path), "rb") as f:
        first = f.readline(200)
    if not first.startswith(b"#!"):
        return None
    if re.search(rb"python", first):
        return "python"
    if re.search(rb"\b(ba|da|k|z)?sh\b", first):
        return "shell"
    if re.search(rb"\bnode\b", first):
        return "js"
    return None


def read_lines(root, path):
    with open(os.path.join(root, path), encoding="utf-8",
              errors="replace") as f:
        return f.read().splitlines()


def require(tool):
    if shutil.which(tool) is None:
        sys.exit(f"code_size: '{tool}' is not installed "
                 f"(Debian package {TOOLS[tool]}; deploy/install_deps.sh)")


def cpp_name(tag, lines):
    """A readable name: Class::Method, TEST_F(Suite, Name), or a lambda."""
    name, scope = tag["name"], tag.get("scope", "")
    if name.startswith("__anon"):
        return "lambda"
    if re.fullmatch(r"[A-Z][A-Z0-9_]*", name):
        # A function made by a macro (TEST, TEST_F, PYBIND11_MODULE): the
        # macro's arguments name it.
        m = re.search(re.escape(name) + r"\s*\(([^)]*)\)",
                      lines[tag["line"] - 1])
        return f"{name}({m.group(1)})" if m else name
    if tag.get("scopeKind") in ("class", "struct", "union"):
        return scope.split("::")[-1] + "::" + name
    return name


def cpp_functions(root, paths):
    """(path, line, name, length) of each C++/CUDA function, by ctags."""
    if not paths:
        return []
    require("ctags")
    out = subprocess.run(
        ["ctags", "--sort=no", "--fields=+neKlZ", "--output-format=json",
         "--languages=C++,CUDA", "--langmap=CUDA:.cu.cuh", "-L", "-", "-o",
         "-"],
        cwd=root, input="\n".join(paths).encode(), check=True,
        capture_output=True).stdout.decode()
    found, texts = [], {}
    for row in out.splitlines():
        tag = json.loads(row)
        if tag.get("_type") != "tag" or tag.get("kind") != "function":
            continue
        path = tag["path"]
        if "end" not in tag:
            sys.exit(f"code_size: ctags gave no end line for {path}:"
                     f"{tag['line']} {tag['name']}")
        if path not in texts:
            texts[path] = read_lines(root, path)
        found.append((path, tag["line"], cpp_name(tag, texts[path]),
                      tag["end"] - tag["line"] + 1))
    return found


def python_functions(root, path):
    tree = ast.parse("\n".join(read_lines(root, path)) + "\n", filename=path)
    found = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                found.append((path, child.lineno, name,
                              child.end_lineno - child.lineno + 1))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def shell_functions(root, path):
    require("shfmt")
    with open(os.path.join(root, path), "rb") as f:
        out = subprocess.run(["shfmt", "--to-json"], stdin=f, check=True,
                             capture_output=True).stdout
    found = []

    def visit(node):
        if isinstance(node, dict):
            if node.get("Type") == "FuncDecl":
                start, end = node["Pos"]["Line"], node["End"]["Line"]
                found.append((path, start, node["Name"]["Value"],
                              end - start + 1))
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit(json.loads(out))
    return found


JS_FUNCTIONS = ("FunctionDeclaration", "FunctionExpression",
                "ArrowFunctionExpression")


def js_functions(root, path):
    require("acorn")
    out = subprocess.run(
        ["acorn", "--ecma2022", "--locations", "--allow-hash-bang",
         os.path.join(root, path)],
        check=True, capture_output=True).stdout
    found = []

    def visit(node):
        if isinstance(node, dict):
            if node.get("type") in JS_FUNCTIONS:
                start = node["loc"]["start"]["line"]
                end = node["loc"]["end"]["line"]
                name = (node.get("id") or {}).get("name") or "function"
                found.append((path, start, name, end - start + 1))
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit(json.loads(out))
    return found


def check(root):
    """The violations in the tree at root, and how many files were read."""
    by_language = {}
    for path in source_files(root):
        lang = language(root, path)
        if lang:
            by_language.setdefault(lang, []).append(path)
    violations = []
    for paths in by_language.values():
        for path in paths:
            n = len(read_lines(root, path))
            if n > MAX_FILE_LINES:
                violations.append(
                    Violation(path, 1, "file", n, MAX_FILE_LINES))
    functions = cpp_functions(root, by_language.get("cpp", []))
    for lang, parse in (("python", python_functions),
                        ("shell", shell_functions), ("js", js_functions)):
        for path in by_language.get(lang, []):
            functions += parse(root, path)
    for path, line, name, length in functions:
        if length > MAX_FUNCTION_LINES:
            violations.append(Violation(path, line, f"function {name}",
                                        length, MAX_FUNCTION_LINES))
    violations.sort(key=lambda v: (v.path, v.line))
    return violations, sum(len(p) for p in by_language.values())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.realpath(__file__))
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(here)),
                        help="the tree to check (default: this script's)")
    root = parser.parse_args().root
    if not os.path.isfile(os.path.join(root, "WORKSPACE")):
        sys.exit(f"code_size: {root} is not the asyncps tree (no WORKSPACE)")
    violations, files = check(root)
    for v in violations:
        print(v)
    over_files = sum(v.what == "file" for v in violations)
    print(f"code_size: {files} source files read; {over_files} over "
          f"{MAX_FILE_LINES} lines, {len(violations) - over_files} functions "
          f"over {MAX_FUNCTION_LINES} lines")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())

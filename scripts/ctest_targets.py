#!/usr/bin/env python3
"""Prints the CMake targets that the ctest tests with a given label need.

Usage: ctest_targets.py BUILD_DIR LABEL

The build dir must have been configured with the CMake file API query
BUILD_DIR/.cmake/api/v1/query/codemodel-v2 in place (scripts/test.sh creates it). Each
argument of each test's command (read from the CTestTestfile.cmake files, as ctest leaves the
command out of its listing while the program is not built) that is an artifact of a target (an
executable, a Python extension) names that target; the targets are printed one per line. Exits 1 when no test has
the label or a test's program is not an artifact of this project's targets nor an existing file.
"""
import glob
import json
import os
import re
import subprocess
import sys


def artifacts(build_dir):
    """Maps each artifact's absolute path to its target name."""
    reply = os.path.join(build_dir, ".cmake", "api", "v1", "reply")
    index = sorted(glob.glob(os.path.join(reply, "index-*.json")))[-1]
    with open(index) as f:
        codemodel = json.load(f)["reply"]["codemodel-v2"]["jsonFile"]
    with open(os.path.join(reply, codemodel)) as f:
        model = json.load(f)
    out = {}
    for config in model["configurations"]:
        for target in config["targets"]:
            with open(os.path.join(reply, target["jsonFile"])) as f:
                t = json.load(f)
            for a in t.get("artifacts", []):
                path = a["path"]
                if not os.path.isabs(path):
                    path = os.path.join(build_dir, path)
                out[os.path.normpath(path)] = t["name"]
    return out


def test_commands(build_dir):
    """Maps each test's name to its command, from the CTestTestfile.cmake files."""
    out = {}
    # CMake 3.x writes add_test([=[NAME]=] "ARG" ...), CMake 4 add_test("NAME" "ARG" ...).
    pattern = re.compile(r'^add_test\((?:\[=\[(.+?)\]=\]|"((?:[^"\\]|\\.)*)") (.*)\)$')
    for root, _, files in os.walk(build_dir):
        if "CTestTestfile.cmake" not in files:
            continue
        with open(os.path.join(root, "CTestTestfile.cmake")) as f:
            for line in f:
                m = pattern.match(line.strip())
                if m:
                    out[m.group(1) or m.group(2)] = [a.replace('\\"', '"')
                                                     for a in re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(3))]
    return out


def main():
    build_dir, label = os.path.abspath(sys.argv[1]), sys.argv[2]
    shown = subprocess.run(["ctest", "--test-dir", build_dir, "-N", "-L", label,
                            "--show-only=json-v1"], check=True, capture_output=True, text=True)
    tests = json.loads(shown.stdout)["tests"]
    if not tests:
        sys.exit(f"no test is labelled {label}")
    by_path = artifacts(build_dir)
    commands = test_commands(build_dir)
    needed = []
    for test in tests:
        command = test.get("command") or commands.get(test["name"])
        if not command:
            sys.exit(f"{test['name']}: no command found")
        for arg in command:
            name = by_path.get(os.path.normpath(arg))
            if name and name not in needed:
                needed.append(name)
        if os.path.normpath(command[0]) not in by_path and not os.path.exists(command[0]):
            sys.exit(f"{test['name']}: {command[0]} is neither a target's artifact nor a file")
    print("\n".join(needed))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Clang's thread-safety analysis over every annotated source (ctest
thread_safety): each .cc under common/, coordinator/ and worker/ that uses
ABSL_GUARDED_BY, itself or in the header of its name, is compiled again with
clang++ -fsyntax-only -Wthread-safety -Werror=thread-safety, with the flags
the build compiled it with (BUILD/compile_commands.json). The build itself
may use gcc, which ignores the annotations; this is where they are checked.

  thread_safety_test.py SOURCE_DIR BUILD_DIR

Exit 0 when every file passes, 1 naming each failure with clang's message,
77 (ctest's skip) when clang++ is missing."""

import json
import os
import shlex
import shutil
import subprocess
import sys

ANNOTATION = "ABSL_GUARDED_BY"
FOLDERS = ("common", "coordinator", "worker")


def annotated_sources(root):
    out = []
    for top in FOLDERS:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if not f.endswith(".cc"):
                    continue
                cc = os.path.join(dirpath, f)
                h = cc[:-3] + ".h"
                for path in (cc, h):
                    if os.path.exists(path) and ANNOTATION in open(path, errors="replace").read():
                        out.append(os.path.realpath(cc))
                        break
    return sorted(out)


def clang_command(entry, clang):
    args = shlex.split(entry["command"]) if "command" in entry else list(entry["arguments"])
    out, skip = [clang], False
    for a in args[1:]:
        if skip:
            skip = False
            continue
        if a == "-o":
            skip = True
            continue
        if a == "-c" or a.startswith("-fsanitize"):
            continue
        out.append(a)
    return out + ["-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety",
                  "-Wno-unknown-warning-option", "-Wno-ignored-optimization-argument"]


def main():
    root, build = sys.argv[1], sys.argv[2]
    clang = shutil.which("clang++")
    if clang is None:
        print("thread_safety: clang++ not found (scripts/setup.sh installs clang); skipped")
        return 77
    database = os.path.join(build, "compile_commands.json")
    if not os.path.isfile(database):
        print("thread_safety: no %s: configure the build with CMake (the "
              "project sets CMAKE_EXPORT_COMPILE_COMMANDS)" % database)
        return 1
    with open(database) as f:
        commands = {os.path.realpath(os.path.join(e["directory"], e["file"])): e
                    for e in json.load(f)}
    sources = annotated_sources(root)
    if not sources:
        print("thread_safety: no annotated source found under %s" % root)
        return 1
    failed, checked = [], 0
    for src in sources:
        entry = commands.get(src)
        if entry is None:
            # Not built in this configuration (a worker file without
            # libtorch, say).
            print("thread_safety: %s not built here; not checked" % os.path.relpath(src, root))
            continue
        r = subprocess.run(clang_command(entry, clang), cwd=entry["directory"],
                           capture_output=True, text=True)
        checked += 1
        if r.returncode != 0:
            failed.append((src, r.stderr))
    for src, err in failed:
        print("thread_safety: %s:\n%s" % (os.path.relpath(src, root), err[-4000:]))
    print("thread_safety: %d of %d annotated sources pass clang -Wthread-safety"
          % (checked - len(failed), checked))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

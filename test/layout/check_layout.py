#!/usr/bin/env python3
"""The tree as extension/doc/architecture.md describes it, checked.

1. The code map cannot go stale: every .c/.h under extension/ and gateway/
   is named in architecture.md by its path in backticks (`extension/core/common.c`),
   and every such path named there exists.
2. Lower layers never call up: a file under extension/<folder>/ includes
   headers of its own folder and of lower folders only (the order is
   LAYERS below, the same as the doc's "Layers"); the one exception is the
   entry point PostgreSQL calls, _PG_init, registering the workers.
3. Source file names are unique across extension/'s folders (PGXS keeps
   every object's dependency file in one .deps/ directory by file name).

Exit 1 with one line per finding.
"""
import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DOC = "extension/doc/architecture.md"
TREES = ("extension", "gateway")

# extension/<folder>/ -> layer; a file may include its own folder and lower layers
LAYERS = {"core": 0, "include": 0, "conversation": 1, "push": 1,
          "user": 2, "shard": 3, "ops": 4, "fanout": 5}
# (file, header) pairs allowed to include upward, with why
UPWARD = {("extension/core/im_sync.c", "fanout/fanout.h"):
          "_PG_init registers the background workers (called by PostgreSQL only)"}


def tracked_sources():
    try:
        out = subprocess.run(["git", "-C", ROOT, "ls-files", "--", *TREES],
                             check=True, capture_output=True, text=True).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        out = []
        for tree in TREES:
            for d, _, files in os.walk(os.path.join(ROOT, tree)):
                if "node_modules" in d:
                    continue
                out += [os.path.relpath(os.path.join(d, f), ROOT) for f in files]
    return sorted(p for p in out if re.search(r"\.[ch]$", p))


def main():
    problems = []
    files = tracked_sources()
    doc = open(os.path.join(ROOT, DOC), encoding="utf-8").read()
    named = set(re.findall(r"`((?:extension|gateway)/[^`\s]+\.[ch])`", doc))
    for p in files:
        if p not in named:
            problems.append(f"{DOC}: {p} is not in the code map")
    for p in sorted(named - set(files)):
        problems.append(f"{DOC}: names {p}, which does not exist")

    seen = {}
    for p in files:
        parts = p.split("/")
        if parts[0] != "extension" or len(parts) < 3 or parts[1] not in LAYERS:
            continue
        if p.endswith(".c"):
            base = parts[-1]
            if base in seen:
                problems.append(f"{p}: same file name as {seen[base]} (.deps/{base[:-2]}.Po)")
            seen[base] = p
        mine = LAYERS[parts[1]]
        for line in open(os.path.join(ROOT, p), encoding="utf-8"):
            m = re.match(r'#include "([a-z_]+)/([a-z_]+\.h)"', line)
            if not m or m.group(1) not in LAYERS:
                continue
            folder, header = m.group(1), f"{m.group(1)}/{m.group(2)}"
            if folder == parts[1] or LAYERS[folder] < mine or (p, header) in UPWARD:
                continue
            problems.append(f"{p}: includes {header}, a layer above or beside {parts[1]}/")
    for p in problems:
        print(p)
    print(f"layout: {len(files)} sources, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

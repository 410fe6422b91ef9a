#!/usr/bin/env python3
"""Checks that every folder includes only the folders at or below its layer (DESIGN.md's layout):
engine/ bottom to top, then kernels/ (the CUDA backend: the backend's layer and below; its
kernels/policy/, the policies' op extensions, also engine/policy), viz/
(figures: reads the trace) and app/, python/ on top. Prints each include that points up and exits
1, or prints the layer table and exits 0. Usage: tools/check_layers.py [REPO_ROOT]"""
import pathlib
import re
import sys

# folder -> the folders it may include (its own included). Order is the layers, bottom to top.
ENGINE = ["common", "model", "backend", "arch", "policy", "trace", "session", "eval"]
ALLOWED = {}
for i, layer in enumerate(ENGINE):
    ALLOWED[f"engine/{layer}"] = {f"engine/{below}" for below in ENGINE[: i + 1]}
# model and backend are siblings: the backend needs no model file, the model no backend.
ALLOWED["engine/backend"].discard("engine/model")
ALLOWED["include/kvlens"] = set()
ALLOWED["engine/policy"].add("include/kvlens")
ALLOWED["kernels"] = {"engine/common", "engine/backend", "kernels"}
# The policies' op extensions on the GPU implement interfaces declared beside the policies: the
# CUDA backend's layer plus engine/policy, nothing else above the backend.
ALLOWED["kernels/policy"] = ALLOWED["kernels"] | {"engine/policy", "kernels/policy"}
ALLOWED["viz"] = {"engine/common", "engine/model", "engine/backend", "engine/policy",
                  "engine/trace", "viz"}
EVERYTHING = set(ALLOWED) | {f"engine/{layer}" for layer in ENGINE} | {"viz", "kernels",
                                                                        "kernels/policy",
                                                                        "include/kvlens"}
ALLOWED["app/session"] = EVERYTHING | {"app/session"}
ALLOWED["app/cli"] = EVERYTHING | {"app/session", "app/cli"}
ALLOWED["app/gui"] = EVERYTHING | {"app/session", "app/gui"}
ALLOWED["python"] = EVERYTHING | {"app/session", "python"}
# python/embed: the interpreter of --policy-file, below app/ (the front ends link it); it
# includes the policy adapter (python/src/py_policy.h), not the module's app/session parts.
ALLOWED["python/embed"] = {f"engine/{layer}" for layer in ENGINE} | {"include/kvlens", "python",
                                                                      "python/embed"}
for front_end in ("app/session", "app/cli", "app/gui"):
    ALLOWED[front_end].add("python/embed")

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def folder_of(path: str) -> str | None:
    """The layer folder a repository path belongs to (the longest key of ALLOWED it starts with)."""
    best = None
    for key in ALLOWED:
        if (path == key or path.startswith(key + "/")) and (best is None or len(key) > len(best)):
            best = key
    return best


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent)
    bad = []
    checked = 0
    for source in sorted(root.rglob("*")):
        if source.suffix not in {".h", ".cpp", ".cu", ".cuh", ".c"}:
            continue
        rel = source.relative_to(root).as_posix()
        if rel.startswith(("build", ".")):
            continue
        owner = folder_of(rel)
        if owner is None:
            continue
        checked += 1
        for target in INCLUDE.findall(source.read_text(errors="replace")):
            target_folder = folder_of(target)
            if target_folder is None:
                continue  # a header of the same folder by a relative name, or a system one
            if target_folder not in ALLOWED[owner]:
                bad.append(f"{rel}: includes {target} ({target_folder} is above {owner})")
    for line in bad:
        print(line)
    if bad:
        print(f"check_layers: {len(bad)} include(s) point up a layer")
        return 1
    print(f"check_layers: {checked} files, every include points down or sideways within a layer")
    print("engine layers, bottom to top: " + " -> ".join(ENGINE))
    return 0


if __name__ == "__main__":
    sys.exit(main())

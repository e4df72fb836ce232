"""Describe a directory tree exactly (types, modes, contents, symlink targets).

The same code runs on the host and, as ``python3 -c LISTING_SCRIPT DIR``,
inside a sandbox, so a test can compare the tree a sandboxed command saw with
the real workspace byte for byte.
"""

from __future__ import annotations

import json
import subprocess

LISTING_SCRIPT = r"""
import hashlib, json, os, stat, sys
def listing(root):
    out = {}
    def walk(d, rel):
        for name in sorted(os.listdir(d)):
            p = os.path.join(d, name); r = rel + "/" + name if rel else name
            st = os.lstat(p); mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISDIR(st.st_mode):
                out[r] = ["dir", mode]; walk(p, r)
            elif stat.S_ISLNK(st.st_mode):
                out[r] = ["symlink", os.readlink(p)]
            elif stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    out[r] = ["file", mode, hashlib.sha256(f.read()).hexdigest()]
            else:
                out[r] = ["other", mode]
    walk(root, "")
    return out
if __name__ == "__main__":
    print(json.dumps(listing(sys.argv[1]), sort_keys=True))
"""

_namespace: dict[str, object] = {}
exec(compile(LISTING_SCRIPT, "<tree-listing>", "exec"), _namespace)


def tree(root: str) -> dict[str, list[object]]:
    """``{relative path: description}`` of everything below *root*."""
    result = _namespace["listing"](root)  # type: ignore[operator]
    return json.loads(json.dumps(result))


def tree_in_subprocess(root: str) -> dict[str, list[object]]:
    """The same, computed by a separate ``python3`` (as a sandboxed command would)."""
    out = subprocess.run(
        ["python3", "-c", LISTING_SCRIPT, root], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)

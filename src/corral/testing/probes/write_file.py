"""write_file.py PATH: create PATH (and its missing parent directories) with a marker."""

import os
import sys

path = sys.argv[1]
try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("written by the probe\n")
except OSError as exc:
    print(f"BLOCKED {exc.errno} {exc.strerror}")
    sys.exit(1)
print("WROTE")

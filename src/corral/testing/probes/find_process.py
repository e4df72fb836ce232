"""find_process.py REVERSED: look for a process whose command line contains the marker.

The marker arrives reversed, so that our own command line (and the
sandbox's launcher above us) does not contain it. "self" looks for us.
"""

import os
import sys

marker = sys.argv[1][::-1]
if sys.argv[1] == "self":
    print("FOUND" if os.path.isdir(f"/proc/{os.getpid()}") else "MISSING")
    sys.exit(0)
for name in os.listdir("/proc"):
    if not name.isdigit():
        continue
    try:
        with open(f"/proc/{name}/cmdline", "rb") as f:
            if marker.encode() in f.read():
                print(f"FOUND {name}")
                sys.exit(0)
    except OSError:
        continue
print("MISSING")
sys.exit(1)

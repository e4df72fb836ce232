"""allocate.py MIB: allocate and touch MIB mebibytes."""

import sys

chunks = []
for _ in range(int(sys.argv[1])):
    chunk = bytearray(1 << 20)
    for i in range(0, len(chunk), 4096):
        chunk[i] = 1
    chunks.append(chunk)
print("ALLOCATED")

"""read_file.py PATH: print the contents of PATH."""

import sys

try:
    with open(sys.argv[1]) as f:
        print(f.read())
except OSError as exc:
    print(f"BLOCKED {exc.errno} {exc.strerror}")
    sys.exit(1)

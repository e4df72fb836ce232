"""sleep.py SECONDS: sleep, then say so."""

import sys
import time

time.sleep(float(sys.argv[1]))
print("WOKE")

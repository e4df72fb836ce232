"""print_env.py: print the environment, one NAME=VALUE per line."""

import os

for name, value in sorted(os.environ.items()):
    print(f"{name}={value}")

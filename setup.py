"""Build glue: compile the small C exec helper that ships inside the package.

Everything else about the package lives in pyproject.toml. The helper
(src/corral/native/corral-exec.c) applies seccomp, Landlock and rlimits right
before exec inside the sandbox; see docs/design.md ("The exec helper") for why
it is native code. It is linked statically when the C library allows it, so it
also runs inside container and VM root filesystems.

Set CORRAL_SKIP_NATIVE=1 to build without it (corral then reports the
sandboxing backends that need it as unavailable, with the reason).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

SOURCE = Path("src/corral/native/corral-exec.c")
CFLAGS = ["-O2", "-Wall", "-Wextra", "-Werror", "-D_FORTIFY_SOURCE=2", "-fstack-protector-strong"]


def compile_helper(out: Path) -> None:
    """Compile the helper to *out*, statically if possible."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SystemExit(
            "corral: failed to build the exec helper: no C compiler found. "
            "Install one (Debian/Ubuntu: apt-get install gcc libc6-dev) or set CORRAL_SKIP_NATIVE=1."
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    base = [cc, *CFLAGS, "-o", str(out), str(SOURCE)]
    for extra in (["-static"], []):
        result = subprocess.run([*base, *extra], capture_output=True, text=True, check=False)
        if result.returncode == 0:
            out.chmod(0o755)
            return
        last = result.stderr
    raise SystemExit(f"corral: failed to build the exec helper:\n{last}")


class BuildPyWithHelper(build_py):
    """build_py that also compiles corral-exec into corral/_bin/."""

    def run(self) -> None:
        super().run()
        if os.environ.get("CORRAL_SKIP_NATIVE") == "1":
            print("corral: CORRAL_SKIP_NATIVE=1, not building the exec helper", file=sys.stderr)
            return
        compile_helper(Path(self.build_lib) / "corral" / "_bin" / "corral-exec")


class BinaryDistribution(Distribution):
    """The wheel carries a native executable, so it is platform specific."""

    def has_ext_modules(self) -> bool:
        return True


setup(cmdclass={"build_py": BuildPyWithHelper}, distclass=BinaryDistribution)

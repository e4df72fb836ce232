"""Build glue: compile the small C programs that ship inside the package.

Everything else about the package lives in pyproject.toml. Both are linked
statically when the C library allows it:

* the exec helper (src/corral/native/corral-exec.c and exec/) applies seccomp,
  Landlock and rlimits right before exec inside the sandbox; see docs/design.md
  ("The exec helper") for why it is native code. Statically linked, it also
  runs inside container and VM root filesystems.
* the fast client (src/corral/native/corral-client.c and client/) serves
  `corral run` and the Claude Code hook through the corral server without an
  interpreter's start-up; see docs/design.md ("The fast client").
* the guest agent (src/corral/native/corral-vm-agent.c) is pid 1 of the
  ``microvm`` backend's guests; see docs/backends/microvm.md.
* the micro-VM relay (src/corral/native/corral-vm-relay.c) is the host side of
  one command in such a guest, under corral's engine; on every command's path,
  so without an interpreter's start-up.

Set CORRAL_SKIP_NATIVE=1 to build without them (corral then reports the
sandboxing backends that need the helper as unavailable, with the reason, and
uses its Python command line where it would use the fast client).
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

NATIVE = Path("src/corral/native")
#: each program -> the directory of native/ that holds the rest of its sources (None: one file)
PROGRAMS = {
    "corral-exec": "exec",
    "corral-client": "client",
    "corral-vm-agent": None,
    "corral-vm-relay": None,
}
CFLAGS = ["-O2", "-Wall", "-Wextra", "-Werror", "-D_FORTIFY_SOURCE=2", "-fstack-protector-strong"]


def program_sources(name: str) -> list[str]:
    """The C files of program *name*: native/<name>.c (its main), then every .c of its directory.

    The Makefile's ``native`` rule compiles the same files.
    """
    directory = PROGRAMS[name]
    rest = sorted((NATIVE / directory).glob("*.c")) if directory else []
    return [str(NATIVE / f"{name}.c"), *(str(path) for path in rest)]


def compile_program(name: str, out: Path) -> None:
    """Compile program *name* (see program_sources) to *out*, statically if possible."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SystemExit(
            f"corral: failed to build {name}: no C compiler found. "
            "Install one (Debian/Ubuntu: apt-get install gcc libc6-dev) or set CORRAL_SKIP_NATIVE=1."
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    base = [cc, *CFLAGS, "-o", str(out), *program_sources(name)]
    for extra in (["-static"], []):
        result = subprocess.run([*base, *extra], capture_output=True, text=True, check=False)
        if result.returncode == 0:
            out.chmod(0o755)
            return
        last = result.stderr
    raise SystemExit(f"corral: failed to build {name}:\n{last}")


class BuildPyWithHelper(build_py):
    """build_py that also compiles corral-exec and corral-client into corral/_bin/."""

    def run(self) -> None:
        super().run()
        # A working tree's _bin/ also holds the fast client's sidecar, which names
        # that tree's interpreter (corral/_fastclient.py): it must never ship.
        for sidecar in (Path(self.build_lib) / "corral" / "_bin").glob("*.cli*"):
            sidecar.unlink()
        if os.environ.get("CORRAL_SKIP_NATIVE") == "1":
            print("corral: CORRAL_SKIP_NATIVE=1, not building the native programs", file=sys.stderr)
            return
        for name in PROGRAMS:
            compile_program(name, Path(self.build_lib) / "corral" / "_bin" / name)


class BinaryDistribution(Distribution):
    """The wheel carries a native executable, so it is platform specific."""

    def has_ext_modules(self) -> bool:
        return True


setup(cmdclass={"build_py": BuildPyWithHelper}, distclass=BinaryDistribution)

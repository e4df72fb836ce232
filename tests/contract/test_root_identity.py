"""A root caller's command never acts with the host's root identity, on every backend.

The kernel trusts the *global* uid 0 for some interfaces whatever the
capabilities (every sysctl, ``/proc/sysrq-trigger``) and plain ownership
guards root-only files (``/etc/shadow``). bubblewrap maps a root caller's
command to uid 65533 (tests/integration/test_process_escapes.py); this module
makes the same real attempts on the other backends that run here as root:
gVisor (the command runs as 65533 over the host's read-only ``/``), podman
and docker (the container's uid 0 over the image's files, with the engines'
read-only ``/proc/sys``, ``/proc/sysrq-trigger`` and ``/sys``). The host's
knobs are read before and after; a changed one is put back before failing.
"""

from __future__ import annotations

import os

import pytest

from .conftest import available

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a root caller's test (runs as root)")

#: Host-wide knobs a command holding the host's root identity could write.
_KNOBS = ("/proc/sys/kernel/core_pattern", "/proc/sys/vm/overcommit_ratio")

#: Tries every knob, sysrq and a /sys file, then reads /etc/shadow; one line per attempt.
_ATTEMPT = (
    "import sys\n"
    "for path, value in [(p, '|/tmp/helper') for p in sys.argv[1:]] + [\n"
    "        ('/proc/sysrq-trigger', 'h'), ('/sys/kernel/mm/ksm/run', '1')]:\n"
    "    try:\n"
    "        with open(path, 'w') as f:\n"
    "            f.write(value)\n"
    "        print('WROTE', path)\n"
    "    except OSError as e:\n"
    "        print('refused', path, e.errno)\n"
    "try:\n"
    "    print('SHADOW', open('/etc/shadow').read().replace('\\n', '|'))\n"
    "except OSError as e:\n"
    "    print('shadow refused', e.errno)\n"
)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


@pytest.mark.parametrize("backend", ["gvisor", "podman", "docker"])
def test_a_root_callers_command_holds_no_host_root_identity(backend: str, tmp_path: object) -> None:
    problem = available().get(backend, "not registered")
    if problem is not None:
        pytest.skip(f"{backend} is not available here: {problem}")
    from corral.pipeline._request import ExecRequest
    from corral.pipeline._runner import execute
    from corral.policy import load_settings

    ws = str(tmp_path)
    flags: dict[str, object] = {"backend": backend}
    if backend in ("podman", "docker"):
        flags["image"] = "corral:python"
    if backend in ("gvisor", "docker"):
        flags["allowDegraded"] = ["filesystem.protect"]  # no write broker there
    policy = load_settings(cwd=ws, workspace=ws, flags=flags).policy
    before = {path: _read(path) for path in _KNOBS}
    try:
        outcome = execute(
            ExecRequest.from_argv(["python3", "-c", _ATTEMPT, *_KNOBS], cwd=ws),
            policy,
            environ=dict(os.environ),
        )
    finally:
        after = {path: _read(path) for path in _KNOBS}
        for path, value in before.items():
            if after[path] != value:  # put the host back before failing
                with open(path, "w") as f:
                    f.write(value)
    assert after == before
    out = outcome.text("stdout")
    assert outcome.returncode == 0, (out, outcome.text("stderr"))
    assert "WROTE" not in out, out
    assert out.count("refused /") == len(_KNOBS) + 2, out
    if backend == "gvisor":  # over the host's own /: its root-only files stay unreadable
        assert "shadow refused 13" in out, out
    # podman and docker show the image's /etc, not the host's: nothing of the host to read

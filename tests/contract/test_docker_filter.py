"""docker: every process the command can see runs under corral's filter.

The Docker engine cannot pass file descriptors into a container, so corral's
exec helper is bound in with its deny filter as a read-only file and is the
container's entrypoint: pid 1 in ``--init`` mode for a run (not dumpable, it
forks the command once the filter is installed), ``--hold`` for a session
whose ``docker exec`` commands start under the helper too. Each test makes
the real attempt inside (writing pid 1's memory, an AF_UNIX socket) and
checks what it saw. Root only: the engine's socket is root's here.
"""

from __future__ import annotations

import os

import pytest

from .conftest import available

#: Lists every process it can see and attacks pid 1; prints one line per pid.
_LOOK = (
    "import os, socket\n"
    "for p in sorted((n for n in os.listdir('/proc') if n.isdigit()), key=int):\n"
    "    f = dict(l.split(':', 1) for l in open(f'/proc/{p}/status'))\n"
    "    try:\n"
    "        fd = os.open(f'/proc/{p}/mem', os.O_RDWR); os.close(fd); mem = 'open'\n"
    "    except OSError as e:\n"
    "        mem = str(e.errno)\n"
    "    print(p, f['Name'].strip(), f['Seccomp'].strip(), f['Seccomp_filters'].strip(), mem)\n"
    "try:\n"
    "    socket.socket(socket.AF_UNIX); print('unix open')\n"
    "except OSError as e:\n"
    "    print('unix', e.errno)\n"
)


@pytest.fixture
def docker(tmp_path: object):  # type: ignore[no-untyped-def]
    problem = available().get("docker", "not registered")
    if problem is not None:
        pytest.skip(f"docker is not available here: {problem}")
    from corral.backends import get_backend, inspect_host
    from corral.pipeline._request import ExecRequest
    from corral.policy import load_settings

    ws = str(tmp_path)
    flags = {"backend": "docker", "image": "corral:python"}
    flags["allowDegraded"] = ["filesystem.protect"]  # docker has no write broker
    policy = load_settings(cwd=ws, workspace=ws, flags=flags).policy
    backend = get_backend("docker")
    facts, _ = inspect_host(
        backend, ExecRequest.from_argv(["true"], cwd=ws), policy, dict(os.environ)
    )
    return backend, policy, facts, ws


def _rows(text: str) -> tuple[list[list[str]], str]:
    lines = text.splitlines()
    return [line.split() for line in lines[:-1]], lines[-1]


def test_a_docker_run_has_corrals_init_and_filter_in_every_process(docker) -> None:  # type: ignore[no-untyped-def]
    from corral.pipeline._request import ExecRequest
    from corral.pipeline._runner import execute

    _backend, policy, _facts, ws = docker
    outcome = execute(
        ExecRequest.from_argv(["python3", "-c", _LOOK + "raise SystemExit(7)"], cwd=ws),
        policy,
        environ=dict(os.environ),
    )
    assert outcome.returncode == 7, outcome.text("stderr")  # the init hands on the status
    rows, unix = _rows(outcome.text("stdout"))
    assert rows and rows[0][:2] == ["1", ".corral-exec"], rows
    assert rows[0][4] != "open", rows  # pid 1 cannot be written
    # Seccomp: 2 everywhere, with corral's filter on top of Docker's
    assert all(r[2] == "2" and int(r[3]) >= 2 for r in rows), rows
    assert unix == "unix 1", unix  # corral's filter: no AF_UNIX socket (EPERM)
    assert "network.allowUnixSockets" not in outcome.degraded


def test_a_docker_session_has_corrals_hold_init_and_filter_in_every_command(docker) -> None:  # type: ignore[no-untyped-def]
    from corral.pipeline._request import ExecRequest, new_sandbox_id

    backend, policy, facts, ws = docker
    session = backend.open_session(policy, facts, new_sandbox_id())
    try:
        seen = session.exec(ExecRequest.from_argv(["python3", "-c", _LOOK], cwd=ws))
        assert seen.returncode == 0, seen.text("stderr")
        rows, unix = _rows(seen.text("stdout"))
        assert rows and rows[0][:2] == ["1", ".corral-exec"], rows
        assert rows[0][4] != "open", rows  # the --hold init only reaps: out of reach
        assert all(r[2] == "2" for r in rows), rows
        assert all(int(r[3]) >= 2 for r in rows[1:]), rows  # each command: corral's filter
        assert unix == "unix 1", unix
        slow = session.exec(ExecRequest.from_argv(["sleep", "60"], cwd=ws, timeout=1.0))
        assert slow.timed_out
        again = session.exec(ExecRequest.from_argv(["true"], cwd=ws))
        assert again.returncode == 0  # the session survives a timed-out command
    finally:
        session.close()

"""Real images, real engines: corral image build, files owned by the user, sessions, routing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

CORRAL = [sys.executable, "-m", "corral"]

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="mmdebstrap --mode=root, rootful podman and runsc need root"
)
needs_build = pytest.mark.skipif(
    shutil.which("mmdebstrap") is None, reason="mmdebstrap is not installed"
)
needs_podman = pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed")
needs_runsc = pytest.mark.skipif(
    shutil.which("runsc") is None, reason="runsc (gVisor) is not installed"
)


def _run(
    *args: str, cwd: str, settings: dict[str, object] | None = None
) -> subprocess.CompletedProcess[str]:
    extra: list[str] = []
    if settings is not None:
        path = os.path.join(cwd, ".test-settings.json")
        with open(path, "w") as f:
            json.dump(settings, f)
        extra = ["--settings", path]
    return subprocess.run(
        [*CORRAL, "run", "--workspace", cwd, *extra, "--", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


@pytest.fixture(scope="module")
def built_python() -> str:
    """`corral image build python` through the CLI (offline from apt only; reused from the cache)."""
    if os.geteuid() != 0 or shutil.which("mmdebstrap") is None:
        pytest.skip("needs root and mmdebstrap")
    result = subprocess.run(
        [*CORRAL, "image", "build", "python"],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    if result.returncode != 0 and "mmdebstrap exited" in result.stderr:
        pytest.skip(f"the Debian mirror is unreachable: {result.stderr.strip()[-300:]}")
    assert result.returncode == 0, result.stderr
    assert "image:   corral:python" in result.stdout
    rootfs = result.stdout.split("rootfs:")[1].split()[0]
    assert os.path.isfile(os.path.join(rootfs, "usr", "bin", "python3"))
    layout = result.stdout.split("oci:")[1].split()[0]
    with open(os.path.join(layout, "index.json")) as f:
        assert json.load(f)["manifests"][0]["mediaType"].endswith("manifest.v1+json")
    return rootfs


@needs_root
@needs_build
@needs_podman
def test_built_image_runs_python_under_podman(built_python: str, tmp_path: object) -> None:
    result = _run(
        "python3",
        "-c",
        "print(1)",
        cwd=str(tmp_path),
        settings={"backend": "podman", "image": "corral:python"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1"


@needs_root
@needs_build
@needs_podman
def test_podman_without_an_image_runs_the_default_image(
    built_python: str, tmp_path: object
) -> None:
    # no "image" setting: the default image (corral:python), not the host's files
    if not os.path.exists("/usr/bin/bwrap"):
        pytest.skip("the host has no /usr/bin/bwrap to tell its files from the image's")
    result = _run(
        "sh",
        "-c",
        "test -e /usr/bin/bwrap && echo host || echo image; python3 -c 'print(1)'",
        cwd=str(tmp_path),
        settings={"backend": "podman"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["image", "1"]


@needs_root
@needs_build
@needs_podman
@pytest.mark.parametrize("server", ["on", "off"])
def test_an_oom_kill_leaves_nothing_in_the_callers_directory_or_in_root(
    built_python: str, tmp_path: object, server: str
) -> None:
    """conmon writes an ``oom`` file into its working directory: never the user's (or /)."""
    workspace = os.path.join(str(tmp_path), "ws")
    os.mkdir(workspace)
    root_had_oom = os.path.lexists("/oom")
    # a state directory of the test's own: its server (cwd /) is stopped at the end
    env = {
        **os.environ,
        "CORRAL_SERVER": server,
        "XDG_STATE_HOME": os.path.join(str(tmp_path), "st"),
    }
    if server == "on":  # running before the run (a first run would start it in the background)
        started = subprocess.run([*CORRAL, "server", "--detach"], env=env, capture_output=True)
        assert started.returncode == 0, started.stderr
    try:
        result = subprocess.run(
            [*CORRAL, "run", "--backend", "podman", "--memory", "64M", "--", "python3", "-c",
             "x = bytearray(400 << 20)"],
            cwd=workspace, env=env, capture_output=True, text=True, check=False, timeout=300,
        )  # fmt: skip
    finally:
        subprocess.run([*CORRAL, "server", "--stop"], env=env, capture_output=True, check=False)
    assert result.returncode == 137, result.stderr
    assert os.listdir(workspace) == []
    assert os.path.lexists("/oom") == root_had_oom


@needs_podman
def test_podman_without_a_built_image_names_the_one_command(tmp_path: object) -> None:
    cache = os.path.join(str(tmp_path), "cache")  # nothing built here
    result = subprocess.run(
        [*CORRAL, "run", "--workspace", str(tmp_path), "--backend", "podman", "--", "true"],
        cwd=str(tmp_path),
        env={**os.environ, "XDG_CACHE_HOME": cache, "CORRAL_SERVER": "off"},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 125
    assert "the default image corral:python is not built yet" in result.stderr
    assert "run 'corral image build python' once" in result.stderr
    assert not os.path.exists(cache), "nothing was built or cached implicitly"


@needs_root
@needs_build
@needs_runsc
def test_built_image_runs_python_under_gvisor(built_python: str, tmp_path: object) -> None:
    settings = {
        "backend": "gvisor",
        "isolation": "kernel",
        "image": "corral:python",
        "allowDegraded": ["filesystem.protect"],
    }
    result = _run(
        "python3", "-c", "import sys; print(1, sys.prefix)", cwd=str(tmp_path), settings=settings
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == "1"
    assert "/usr" in result.stdout  # the image's interpreter, not the host's pyenv


@needs_root
@needs_build
@needs_podman
@pytest.mark.parametrize("broker", [True, False], ids=["through-the-broker", "direct"])
def test_files_written_by_a_container_belong_to_the_invoking_user(
    built_python: str, tmp_path: object, broker: bool
) -> None:
    settings: dict[str, object] = {"backend": "podman", "image": "corral:python"}
    if not broker:
        settings["filesystem"] = {"protect": ["!" + p for p in _default_protect()]}
    result = _run(
        "/bin/sh",
        "-c",
        "mkdir -p out && echo hi > out/made.txt && id -u",
        cwd=str(tmp_path),
        settings=settings,
    )
    assert result.returncode == 0, result.stderr
    made = os.path.join(str(tmp_path), "out", "made.txt")
    assert os.stat(made).st_uid == os.getuid()
    assert os.stat(made).st_gid == os.getgid()
    assert os.stat(os.path.dirname(made)).st_uid == os.getuid()
    assert result.stdout.strip() == str(os.getuid())


def _default_protect() -> list[str]:
    from corral.policy._defaults import PROTECTED_PATTERNS

    return [p for p, _ in PROTECTED_PATTERNS]


@needs_root
@needs_build
@needs_podman
def test_podman_session_starts_once_and_execs_many(built_python: str, tmp_path: object) -> None:
    from corral.backends import get_backend, inspect_host
    from corral.pipeline._request import ExecRequest, new_sandbox_id
    from corral.policy import load_settings

    ws = str(tmp_path)
    policy = load_settings(
        cwd=ws, workspace=ws, flags={"backend": "podman", "image": "corral:python"}
    ).policy
    backend = get_backend("podman")
    request = ExecRequest.from_argv(["true"], cwd=ws)
    facts, _ = inspect_host(backend, request, policy, dict(os.environ))
    session = backend.open_session(policy, facts, new_sandbox_id())  # type: ignore[attr-defined]
    engine = str(facts.detail("engine"))
    env = backend.engine_env(facts)  # type: ignore[attr-defined]
    try:
        first = session.exec(
            ExecRequest.from_argv(["/bin/sh", "-c", "echo one > state.txt; echo $$"], cwd=ws)
        )
        second = session.exec(ExecRequest.from_argv(["cat", "state.txt"], cwd=ws))
        blocked = session.exec(ExecRequest.from_argv(["/bin/sh", "-c", "echo x > .bashrc"], cwd=ws))
        assert first.returncode == 0
        assert second.text("stdout").strip() == "one"
        assert blocked.returncode != 0
        assert blocked.violations
        slow = session.exec(ExecRequest.from_argv(["sleep", "60"], cwd=ws, timeout=1.0))
        assert slow.timed_out
        assert slow.returncode == 124
        # every process the command sees is under corral's filter or out of its reach:
        # the session's pid 1 is corral's helper (--hold), not dumpable
        seen = session.exec(
            ExecRequest.from_argv(
                [
                    "python3",
                    "-c",
                    "import os\n"
                    "for p in sorted(n for n in os.listdir('/proc') if n.isdigit()):\n"
                    "    f = dict(l.split(':', 1) for l in open(f'/proc/{p}/status'))\n"
                    "    try:\n"
                    "        os.close(os.open(f'/proc/{p}/mem', os.O_RDWR)); mem = 'open'\n"
                    "    except OSError as e:\n"
                    "        mem = e.errno\n"
                    "    print(p, f['Name'].strip(), f['Seccomp_filters'].strip(), mem)\n",
                ],
                cwd=ws,
            )
        )
        rows = [line.split() for line in seen.text("stdout").splitlines()]
        assert rows and rows[0][:2] == ["1", ".corral-exec"], rows
        assert rows[0][3] != "open", rows  # the init cannot be written
        me = [r for r in rows if r[1].startswith("python")]
        assert me and all(int(r[2]) >= 2 for r in me), rows  # podman's + corral's filters
        alive = subprocess.run(
            [engine, "inspect", "-f", "{{.State.Running}}", session.name],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert alive.stdout.strip() == "true"  # the session survives a timed-out command
    finally:
        session.close()
    gone = subprocess.run([engine, "container", "exists", session.name], env=env, check=False)
    assert gone.returncode != 0  # removed on close


@needs_root
@needs_runsc
def test_rules_route_matching_commands_to_another_backend(tmp_path: object) -> None:
    settings = {
        "rules": [
            {
                "match": "pytest*",
                "backend": "gvisor",
                "isolation": "kernel",
                "allowDegraded": ["filesystem.protect"],
            }
        ]
    }
    ws = str(tmp_path)
    out = os.path.join(ws, "outcome.json")
    with open(os.path.join(ws, "pytest"), "w") as f:
        f.write("#!/bin/sh\necho routed\n")
    os.chmod(os.path.join(ws, "pytest"), 0o755)
    path = os.path.join(ws, ".routing.json")
    with open(path, "w") as f:
        json.dump(settings, f)
    routed = subprocess.run(
        [
            *CORRAL,
            "run",
            "--workspace",
            ws,
            "--settings",
            path,
            "--json-out",
            out,
            "--",
            "./pytest",
            "-q",
        ],
        cwd=ws,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert routed.returncode == 0, routed.stderr
    with open(out) as f:
        first = json.load(f)["backend"]
    settings["rules"][0]["match"] = "./pytest*"  # type: ignore[index]
    with open(path, "w") as f:
        json.dump(settings, f)
    subprocess.run(
        [
            *CORRAL,
            "run",
            "--workspace",
            ws,
            "--settings",
            path,
            "--json-out",
            out,
            "--",
            "./pytest",
            "-q",
        ],
        cwd=ws,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    with open(out) as f:
        second = json.load(f)["backend"]
    assert (first, second) == ("bubblewrap", "gvisor")


def test_auto_picks_the_cheapest_backend_meeting_the_isolation_minimum(tmp_path: object) -> None:
    from corral.backends import BACKENDS, get_backend
    from corral.pipeline._request import ExecRequest
    from corral.pipeline._runner import prepare
    from corral.policy import Policy

    ws = str(tmp_path)
    base = Policy.for_workspace(ws, home=str(tmp_path))
    picked = {}
    for level in ("process", "namespace", "kernel"):
        try:
            prepared = prepare(
                ExecRequest.from_argv(["true"], cwd=ws),
                base.replace(isolation=level, allow_degraded=frozenset({"filesystem.protect"})),
                environ=dict(os.environ),
            )
        except Exception as exc:
            picked[level] = type(exc).__name__
            continue
        picked[level] = prepared.backend.name
        levels = ("none", "process", "namespace", "kernel", "vm")
        chosen = prepared.backend
        assert levels.index(chosen.isolation) >= levels.index(level)
        cheaper = [
            get_backend(n)
            for n in BACKENDS
            if get_backend(n).cost_ms < chosen.cost_ms
            and not get_backend(n).explicit_only
            and levels.index(get_backend(n).isolation) >= levels.index(level)
        ]
        for other in cheaper:  # every cheaper candidate must be unusable here
            from corral.backends import inspect_host

            facts, _ = inspect_host(
                other, ExecRequest.from_argv(["true"], cwd=ws), base, dict(os.environ)
            )
            # unusable, or (landlock for a root caller) refusing the policy
            refuses_root = other.name == "landlock" and os.geteuid() == 0
            assert other.problem(facts) is not None or refuses_root, (level, other.name)
    assert picked["namespace"] in ("bubblewrap", "podman", "docker")


@needs_root
@needs_podman
def test_image_rm_and_prune_clear_the_cache_and_the_engine(tmp_path: object) -> None:
    import io
    import tarfile

    from corral.backends.podman import podman_config

    cache = os.path.join(str(tmp_path), "cache")
    root = os.path.join(cache, "corral", "images")
    env = {**os.environ, "XDG_CACHE_HOME": cache}
    podman_env = {**os.environ, "CONTAINERS_CONF": podman_config(env)}
    old, new, other = "a" * 16, "b" * 16, "c" * 16
    tag = f"t{os.getpid()}"  # a name no other test or user image has
    layer = os.path.join(str(tmp_path), "layer.tar")
    with tarfile.open(layer, "w") as tar:
        info = tarfile.TarInfo("hello")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"hi\n"))

    def build(name: str, key: str, *, imported: bool) -> str:
        directory = os.path.join(root, f"{name}-{key}")
        os.makedirs(os.path.join(directory, "rootfs"))
        ref = f"localhost/corral-{name}:{key}"
        engines = [["podman", ref]] if imported else []
        with open(os.path.join(directory, "image.json"), "w") as f:
            json.dump({"name": name, "key": key, "dir": directory, "engines": engines}, f)
        if imported:
            subprocess.run(
                ["podman", "import", layer, ref], env=podman_env, check=True, capture_output=True
            )
        return directory

    def point(name: str, directory: str) -> None:
        with open(os.path.join(root, f"{name}.json"), "w") as f:
            json.dump({"dir": directory, "key": directory[-16:]}, f)

    def in_podman(ref: str) -> bool:
        found = subprocess.run(
            ["podman", "image", "inspect", ref], env=podman_env, capture_output=True, check=False
        )
        return found.returncode == 0

    superseded = build(tag, old, imported=True)
    current = build(tag, new, imported=True)
    subprocess.run(
        ["podman", "tag", f"localhost/corral-{tag}:{new}", f"localhost/corral-{tag}:latest"],
        env=podman_env,
        check=True,
    )
    point(tag, current)
    kept = build(f"{tag}x", other, imported=False)
    point(f"{tag}x", kept)
    scratch = os.path.join(root, f"{tag}-{'d' * 16}.tmp-999999999")  # its builder is gone
    os.makedirs(scratch)
    try:

        def corral(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*CORRAL, "image", *args],
                env=env,
                capture_output=True,
                text=True,
                check=False,
                timeout=120,
            )

        pruned = corral("prune")
        assert pruned.returncode == 0, pruned.stderr
        assert not os.path.exists(superseded) and not os.path.exists(scratch)
        assert not in_podman(f"localhost/corral-{tag}:{old}")
        assert os.path.isdir(current) and os.path.isdir(kept)
        assert in_podman(f"localhost/corral-{tag}:{new}")
        assert f"removed {superseded}" in pruned.stdout.splitlines()

        removed = corral("rm", tag)
        assert removed.returncode == 0, removed.stderr
        assert not os.path.exists(current) and not os.path.exists(os.path.join(root, f"{tag}.json"))
        assert not in_podman(f"localhost/corral-{tag}:{new}")
        assert not in_podman(f"localhost/corral-{tag}:latest")
        assert os.path.isdir(kept), "another image's build was touched"
        assert os.path.isfile(os.path.join(root, f"{tag}x.json"))

        missing = corral("rm", tag)
        assert missing.returncode == 125 and "not in the cache" in missing.stderr
    finally:
        for key in (old, new, "latest"):
            subprocess.run(
                ["podman", "rmi", "-f", f"localhost/corral-{tag}:{key}"],
                env=podman_env,
                capture_output=True,
                check=False,
            )

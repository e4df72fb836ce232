"""Whole-plan checks of the new backends (pure: facts are built by hand)."""

from __future__ import annotations

import pytest

from corral._exceptions import BackendUnavailable, EnforcementUnavailable, UsageError
from corral.backends import HostFacts, get_backend
from corral.backends._image_ref import ImageRef
from corral.pipeline._request import ExecRequest
from corral.policy import Policy

WS = "/work/proj"


def _facts(**details: object) -> HostFacts:
    return HostFacts(
        uid=1000,
        gid=1000,
        home="/home/me",
        arch="x86_64",
        helper="/opt/corral-exec",
        landlock_abi=7,
        path_kinds=((WS, "dir"),),
        environ=(("PATH", "/usr/bin:/bin"), ("SECRET", "x")),
        details=tuple(sorted(details.items())),
    )


def _policy(**changes: object) -> Policy:
    return Policy.for_workspace(WS, home="/home/me").replace(**changes)


def _request() -> ExecRequest:
    return ExecRequest.from_argv(["make", "test"], cwd=WS, sandbox_id="sbx-1")


def test_landlock_plan_applies_everything_in_the_helper() -> None:
    facts = _facts(
        listings=(
            ("/", (("etc", "dir"), ("home", "dir"), ("tmp", "dir"), ("work", "dir"))),
            ("/home", (("me", "dir"),)),
            ("/home/me", ((".ssh", "dir"), ("src", "dir"))),
        )
    )
    plan = get_backend("landlock").plan(_request(), _policy(isolation="process"), facts)
    argv = list(plan.argv)
    assert argv[0] == "/opt/corral-exec"
    assert argv[-3:] == ["--", "make", "test"]
    for flag in ("--drop-caps", "--setsid", "--landlock-fd", "--seccomp-fd", "--notify-fd"):
        assert flag in argv
    assert dict(plan.env)["TMPDIR"] == "/tmp/corral-sbx-1"
    assert "SECRET" not in dict(plan.env)
    assert plan.broker is not None
    assert plan.broker.confine_metadata
    assert plan.broker.open_roots == ("/tmp/corral-sbx-1",)
    spec = plan.fd("data")
    assert spec is not None
    assert b"/home/me/src\0" in spec.data
    assert b"/home/me/.ssh\0" not in spec.data


def test_landlock_keeps_the_helper_as_reaper_and_refuses_it_unscoped_without_a_cgroup() -> None:
    """The helper ends the whole tree (--reaper); with Landlock ABI < 6 the command could
    kill it, so a run that has no cgroup either is refused (or degraded, recorded)."""
    from corral.backends.landlock import REAP_SIGNAL

    backend = get_backend("landlock")
    policy = _policy(isolation="process")
    plan = backend.plan(_request(), policy, _facts(listings=()))
    argv = list(plan.argv)
    assert argv[argv.index("--reaper") + 1] == str(REAP_SIGNAL) and plan.reaper == REAP_SIGNAL
    old = _facts(listings=()).replace(landlock_abi=5)
    assert plan.cgroup is not None and backend.plan(_request(), policy, old).degraded == ()
    no_cgroup = policy.replace(
        resources=policy.resources.replace(memory=None, pids=None, cpus=None)
    )
    assert backend.plan(_request(), no_cgroup, _facts(listings=())).degraded == ()
    with pytest.raises(EnforcementUnavailable, match="could kill it") as info:
        backend.plan(_request(), no_cgroup, old)
    assert info.value.rule == "isolation"
    allowed = no_cgroup.replace(allow_degraded=frozenset({"isolation"}))
    assert backend.plan(_request(), allowed, old).degraded == ("isolation",)


def test_landlock_plan_grants_no_pty_of_the_host_but_lets_the_broker_open_new_ones() -> None:
    facts = _facts(
        listings=(
            ("/", (("dev", "dir"), ("tmp", "dir"), ("work", "dir"))),
            ("/dev", (("null", "other"), ("ptmx", "other"), ("pts", "dir"), ("shm", "dir"))),
        )
    )
    plan = get_backend("landlock").plan(_request(), _policy(isolation="process"), facts)
    spec = plan.fd("data")
    assert spec is not None
    for granted in (b"/dev/null\0", b"/dev/ptmx\0", b"/dev/shm\0", b"/dev/tty\0"):
        assert granted in spec.data
    assert b"/dev/pts\0" not in spec.data and b"/dev/pts/" not in spec.data
    # the other end of a pty the command creates: TIOCGPTPEER goes to the broker
    assert plan.broker is not None
    assert "ioctl" in dict(plan.broker.syscall_names).values()


def test_landlock_refuses_a_host_allowlist() -> None:
    policy = _policy(isolation="process")
    policy = policy.replace(network=policy.network.replace(mode="allowlist", allow=("pypi.org",)))
    with pytest.raises(EnforcementUnavailable, match="by port, not by host") as info:
        get_backend("landlock").plan(_request(), policy, _facts(listings=()))
    assert info.value.rule == "network.mode"


def test_gvisor_refuses_protected_paths_unless_degraded() -> None:
    facts = _facts(
        runsc="/usr/bin/runsc", runsc_version=20221219, image=ImageRef(kind="host"), state="/s"
    )
    facts = facts.replace(uid=0, gid=0)
    with pytest.raises(EnforcementUnavailable) as info:
        get_backend("gvisor").plan(_request(), _policy(isolation="kernel"), facts)
    assert info.value.rule == "filesystem.protect"
    plan = get_backend("gvisor").plan(
        _request(),
        _policy(isolation="kernel", allow_degraded=frozenset({"filesystem.protect"})),
        facts,
    )
    assert plan.degraded == ("filesystem.protect",)
    assert "--network=none" in plan.argv
    assert "--platform=ptrace" in plan.argv
    assert plan.files
    assert plan.files[0][0] == "/s/bundles/sbx-1/config.json"


def test_podman_plan_keeps_secrets_off_the_command_line() -> None:
    facts = _facts(
        engine="/usr/bin/podman",
        engine_problem=None,
        containers_conf="/c.conf",
        image=ImageRef(
            kind="corral",
            value="corral:python",
            rootfs="/r",
            engine_ref="localhost/corral-python:k",
        ),
    )
    policy = _policy(env=_policy().env.replace(set=(("API_TOKEN", "s3cret"),)))
    plan = get_backend("podman").plan(_request(), policy, facts)
    assert not any("s3cret" in word for word in plan.argv)
    env_file = next(f for f in plan.fds if f.number == 9)
    assert b"API_TOKEN=s3cret\n" in env_file.data
    for flag in (
        "--network=none",
        "--cap-drop=ALL",
        "--security-opt=no-new-privileges",
        "--read-only",
        "--user",
        "--preserve-fds",
    ):
        assert flag in plan.argv
    assert f"{WS}:{WS}:ro" in plan.argv  # the broker writes; the container sees it read-only
    assert dict(plan.env)["CONTAINERS_CONF"] == "/c.conf"


def test_container_backends_without_an_image_name_the_default_images_build() -> None:
    unbuilt = ImageRef(kind="corral", value="corral:python", problem="not built yet")
    facts = _facts(
        engine="/usr/bin/podman", engine_problem=None, image=unbuilt, image_is_default=True
    )
    with pytest.raises(BackendUnavailable, match="'image' setting is empty") as info:
        get_backend("podman").plan(_request(), _policy(), facts)
    assert info.value.hint is not None and "'corral image build python'" in info.value.hint
    # an image the user named is misuse, not a backend that cannot run here
    facts = _facts(
        engine="/usr/bin/podman", engine_problem=None, image=unbuilt, image_is_default=False
    )
    with pytest.raises(UsageError, match="not built yet"):
        get_backend("podman").plan(_request(), _policy(), facts)


def test_docker_refuses_what_it_cannot_pass_into_the_container() -> None:
    facts = _facts(
        engine="/usr/bin/docker",
        engine_problem=None,
        image=ImageRef(kind="ref", value="debian", engine_ref="debian"),
        filters="/state/filters",
    )
    with pytest.raises(EnforcementUnavailable) as info:
        get_backend("docker").plan(_request(), _policy(), facts)
    assert info.value.rule == "filesystem.protect"
    policy = _policy(allow_degraded=frozenset({"filesystem.protect"}))
    plan = get_backend("docker").plan(_request(), policy, facts)
    assert set(plan.degraded) == {"filesystem.protect"}  # AF_UNIX: corral's filter, bound in
    assert f"{WS}:{WS}:rw" in plan.argv


def test_docker_runs_corrals_helper_as_init_with_the_filter_bound_in() -> None:
    from corral.backends._seccomp import compile_filter
    from corral.backends._seccomp_rules import DENY_RULES, unix_socket_rule

    facts = _facts(
        engine="/usr/bin/docker",
        engine_problem=None,
        image=ImageRef(kind="ref", value="debian", engine_ref="debian"),
        filters="/state/filters",
    )
    policy = _policy(allow_degraded=frozenset({"filesystem.protect"}))
    plan = get_backend("docker").plan(_request(), policy, facts)
    argv = list(plan.argv)
    ((path, program),) = plan.files
    assert path.startswith("/state/filters/") and path.endswith(".bpf")
    assert program == compile_filter(
        (*DENY_RULES, unix_socket_rule()), arch="x86_64", deny_unknown=True
    )
    assert f"{path}:/dev/.corral-seccomp:ro" in argv
    assert "/opt/corral-exec:/dev/.corral-exec:ro" in argv
    assert argv[argv.index("--entrypoint") + 1] == "/dev/.corral-exec"
    assert "--init" not in argv[: argv.index("debian")]  # not docker's own init
    after = argv[argv.index("debian") + 1 :]
    assert after == ["--init", "--seccomp-file", "/dev/.corral-seccomp", "--", "make", "test"]


def test_seatbelt_is_unavailable_off_macos_with_the_reason() -> None:
    facts = _facts(platform="linux", sandbox_exec=False)
    assert "macOS only" in str(get_backend("seatbelt").problem(facts))
    plan = get_backend("seatbelt").plan_profile(
        _request(),
        _policy(
            resources=_policy().resources.replace(  # type: ignore[attr-defined]
                memory=None, pids=None
            )
        ),
        facts,
    )
    assert plan.argv[0] == "/usr/bin/sandbox-exec"
    assert plan.argv[-2:] == ("make", "test")


def _podman_facts(uid: int) -> HostFacts:
    facts = _facts(
        engine="/usr/bin/podman",
        engine_problem=None,
        containers_conf="/c.conf",
        image=ImageRef(kind="ref", value="debian", engine_ref="debian"),
    )
    return facts.replace(uid=uid, gid=uid, egress_token="t0ken-for-this-run")


def _allowlist(policy: Policy) -> Policy:
    return policy.replace(network=policy.network.replace(mode="allowlist", allow=("pypi.org",)))


def test_podman_as_root_joins_a_fresh_namespace_with_the_proxy_in_it() -> None:
    from corral.backends._plan import NETNS_PATH

    plan = get_backend("podman").plan(_request(), _allowlist(_policy()), _podman_facts(0))
    assert plan.egress is not None
    assert plan.egress.netns == "fresh"  # the engine makes it and names it in the argv
    assert plan.egress.allow == ("pypi.org",)
    assert f"--network=ns:{NETNS_PATH}" in plan.argv
    assert "--network=none" not in plan.argv and "--network=host" not in plan.argv
    env_file = next(f for f in plan.fds if f.number == 9).data.decode()
    proxy = f"http://corral:{plan.egress.token}@127.0.0.1:{plan.egress.port}"
    assert f"HTTPS_PROXY={proxy}\n" in env_file
    assert plan.egress.token not in " ".join(plan.argv)  # the credential stays off argv


@pytest.mark.parametrize(
    ("backend", "uid", "why"),
    [
        ("podman", 1000, "rootless podman cannot join"),
        ("docker", 0, "docker cannot join a network namespace"),
    ],
)
def test_container_backends_refuse_an_allowlist_they_cannot_enforce(
    backend: str, uid: int, why: str
) -> None:
    facts = _podman_facts(uid).replace(
        details=tuple(
            (k, f"/usr/bin/{backend}" if k == "engine" else v)
            for k, v in _podman_facts(uid).details
        )
    )
    policy = _allowlist(_policy(allow_degraded=frozenset({"filesystem.protect"})))
    with pytest.raises(EnforcementUnavailable, match=why) as info:
        get_backend(backend).plan(_request(), policy, facts)
    assert info.value.rule == "network.mode"


def test_podman_sessions_refuse_an_allowlist() -> None:
    backend = get_backend("podman")
    with pytest.raises(EnforcementUnavailable, match="sessions keep no egress proxy"):
        backend.plan_session(_allowlist(_policy()), _podman_facts(0), "sbx-1")  # type: ignore[attr-defined]


def test_container_plans_carry_an_argv_for_a_terminal_only_when_it_may_apply() -> None:
    """``corral run`` at a terminal: the plan's ``terminal_argv`` differs from its argv by the
    engine's ``-t`` (and, for docker, the command as pid 1); SDK, piped or --no-tty runs have none."""
    docker_facts = _facts(
        engine="/usr/bin/docker",
        engine_problem=None,
        image=ImageRef(kind="ref", value="debian", engine_ref="debian"),
        filters="/state/filters",
    )
    policy = _policy(allow_degraded=frozenset({"filesystem.protect"}))
    streamed = _request().replace(capture=False, stdin_mode="inherit")
    for name, facts in (("podman", _podman_facts(0)), ("docker", docker_facts)):
        backend = get_backend(name)
        plan = backend.plan(streamed.replace(output_tty=True), policy, facts)
        argv, terminal = list(plan.argv), list(plan.terminal_argv)
        assert argv[argv.index("run") + 1 :].count("-i") == 1 and "-t" not in argv
        assert terminal[terminal.index("-i") + 1] == "-t"
        if name == "podman":
            # the helper makes the container's pty the command's controlling terminal
            assert "--ctty" in terminal and "--ctty" not in argv
            assert [w for w in terminal if w not in ("-t", "--ctty")] == argv
        else:  # the command keeps docker's pty as its controlling terminal: pid 1 itself
            assert [w for w in terminal if w != "-t"] == [w for w in argv if w != "--init"]
        for request in (
            streamed,  # --no-tty
            streamed.replace(output_tty=True, capture=True),  # the SDK
            streamed.replace(output_tty=True, stdin_mode="null"),
            streamed.replace(output_tty=True, tty=True),  # corral shell: -t already
        ):
            assert backend.plan(request, policy, facts).terminal_argv == ()


def _disk_policy(size: int, **changes: object) -> Policy:
    policy = _policy(**changes)
    return policy.replace(
        filesystem=policy.filesystem.replace(read_only=True),
        resources=policy.resources.replace(disk=size),
        allow_degraded=frozenset({"filesystem.protect", *policy.allow_degraded}),
    )


@pytest.mark.parametrize("name", ["podman", "docker"])
def test_containers_refuse_a_disk_quota_their_dev_would_exceed_for_a_root_command(
    name: str,
) -> None:
    """The engines' own 64 MiB /dev is writable by the container's uid 0 (a root caller)."""
    backend = get_backend(name)

    def facts(uid: int) -> HostFacts:
        engine = (("engine", f"/usr/bin/{name}"), ("filters", "/state/filters"))
        base = _podman_facts(uid)
        return base.replace(details=tuple(sorted({**dict(base.details), **dict(engine)}.items())))

    with pytest.raises(EnforcementUnavailable, match="64 MiB") as info:
        backend.plan(_request(), _disk_policy(8 << 20), facts(0))
    assert info.value.rule == "resources.disk"
    # a size the /dev tmpfs cannot exceed, or a command that cannot write /dev, holds
    assert backend.plan(_request(), _disk_policy(64 << 20), facts(0)).argv
    assert backend.plan(_request(), _disk_policy(8 << 20), facts(1000)).argv


def test_gvisor_refuses_a_disk_quota_when_the_command_is_uid_0_inside() -> None:
    """runsc cannot size /dev: the quota holds only for a command that cannot write it."""
    facts = _facts(
        runsc="/usr/bin/runsc", runsc_version=20221219, image=ImageRef(kind="host"), state="/s"
    )
    gvisor = get_backend("gvisor")
    root = facts.replace(uid=0, gid=0)
    assert gvisor.plan(_request(), _disk_policy(8 << 20, isolation="kernel"), root).argv  # 65533
    kept = _disk_policy(8 << 20, isolation="kernel", allow_degraded=frozenset({"isolation"}))
    image = root.replace(
        details=tuple(
            sorted(
                {
                    **dict(root.details),
                    "image": ImageRef(kind="rootfs", value="/img", rootfs="/img"),
                }.items()
            )
        )
    )
    for policy, host in ((kept, root), (_disk_policy(8 << 20, isolation="kernel"), image)):
        with pytest.raises(EnforcementUnavailable, match="does not size") as info:
            gvisor.plan(_request(), policy, host)
        assert info.value.rule == "resources.disk"


def test_the_gvisor_plan_carries_a_console_socket_argv_only_when_it_may_apply() -> None:
    """At a terminal runsc runs a second bundle whose process has ``terminal: true`` and sends
    the pty master to the engine's console socket; SDK, piped or --no-tty runs keep pipes."""
    import json

    from corral.backends._plan import CONSOLE_SOCKET

    facts = _facts(
        runsc="/usr/bin/runsc", runsc_version=20221219, image=ImageRef(kind="host"), state="/s"
    ).replace(uid=0, gid=0)
    policy = _policy(isolation="kernel", allow_degraded=frozenset({"filesystem.protect"}))
    streamed = _request().replace(capture=False, stdin_mode="inherit")
    backend = get_backend("gvisor")
    plan = backend.plan(streamed.replace(output_tty=True), policy, facts)
    argv, terminal = list(plan.argv), list(plan.terminal_argv)
    bundle = argv[argv.index("--bundle") + 1]
    assert terminal[terminal.index("run") + 1 : terminal.index("run") + 3] == [
        "--console-socket",
        CONSOLE_SOCKET,
    ]
    assert terminal[terminal.index("--bundle") + 1] == f"{bundle}-tty"
    assert [w for w in terminal if w not in ("--console-socket", CONSOLE_SOCKET)] == [
        f"{bundle}-tty" if w == bundle else w for w in argv
    ]
    configs = {path: json.loads(data) for path, data in plan.files}
    piped, on_terminal = configs[f"{bundle}/config.json"], configs[f"{bundle}-tty/config.json"]
    assert piped["process"]["terminal"] is False and on_terminal["process"]["terminal"] is True
    assert {**on_terminal, "process": {**on_terminal["process"], "terminal": False}} == piped
    for request in (
        streamed,  # --no-tty
        streamed.replace(output_tty=True, capture=True),  # the SDK
        streamed.replace(output_tty=True, stdin_mode="null"),
        streamed.replace(output_tty=True, tty=True),  # corral shell: its own pty as stdio
    ):
        plan = backend.plan(request, policy, facts)
        assert plan.terminal_argv == () and len(plan.files) == 1

"""Whole-plan tests of the bubblewrap backend: plan() is pure, so compare entire plans."""

from __future__ import annotations

import pytest

from corral._exceptions import BackendUnavailable, EnforcementUnavailable, UsageError
from corral.backends._plan import BrokerSpec, CgroupSpec, FdSpec, HostFacts, LaunchPlan
from corral.backends._seccomp import compile_filter
from corral.backends._seccomp_rules import (
    BROKER_RULES,
    CONNECT_BROKER_RULES,
    DENY_RULES,
    SYSCALLS,
    unix_datagram_rule,
    unix_socket_rule,
)
from corral.backends.bubblewrap import GITCONFIG_SOURCE, SANDBOX_GITCONFIG, BubblewrapBackend
from corral.pipeline._request import ExecRequest
from corral.policy import Policy, ResourceLimits

WS = "/src/app"
HOME = "/home/me"


def facts(**overrides: object) -> HostFacts:
    base = {
        "uid": 1000,
        "gid": 1000,
        "home": HOME,
        "arch": "x86_64",
        "bwrap": "/usr/bin/bwrap",
        "bwrap_version": (0, 8, 0),
        "helper": "/opt/corral/_bin/corral-exec",
        "broker_problem": None,
        "cgroup_problem": None,
        "path_kinds": (
            (WS, "dir"),
            (f"{HOME}/.ssh", "dir"),
            (f"{HOME}/.netrc", "file"),
            (f"{WS}/.git/hooks", "dir"),
        ),
        "environ": (
            ("PATH", "/usr/bin:/bin"),
            ("HOME", HOME),
            ("LANG", "C.UTF-8"),
            ("LC_ALL", "C"),
            ("AWS_SECRET_ACCESS_KEY", "xxx"),
            ("TERM", "xterm"),
        ),
    }
    base.update(overrides)
    return HostFacts(**base)  # type: ignore[arg-type]


def policy(**resources: object) -> Policy:
    p = Policy.for_workspace(WS, home=HOME)
    p = p.replace(
        filesystem=p.filesystem.replace(
            deny_read=(f"{HOME}/.ssh", f"{HOME}/.netrc", f"{HOME}/.aws"),
            protect=("**/.git/hooks/**", "**/.bashrc"),
        )
    )
    return p.replace(resources=ResourceLimits(**resources))  # type: ignore[arg-type]


def request(**kw: object) -> ExecRequest:
    return ExecRequest.from_argv(["pytest", "-q"], cwd=WS, sandbox_id="sbx-000000000001", **kw)  # type: ignore[arg-type]


def broker_names() -> tuple[tuple[int, str], ...]:
    return tuple(
        sorted(
            (SYSCALLS[name][0], name)
            for rule in BROKER_RULES
            for name in rule[0]
            if SYSCALLS[name][0] is not None
        )
    )  # type: ignore[misc]


COMMON = [
    "/usr/bin/bwrap",
    "--unshare-user",
    "--unshare-ipc",
    "--unshare-pid",
    "--unshare-uts",
    "--unshare-cgroup-try",
    "--unshare-net",
    "--disable-userns",
    "--as-pid-1",
    "--die-with-parent",
    "--new-session",
    "--cap-drop",
    "ALL",
    "--hostname",
    "corral",
    "--ro-bind",
    "/",
    "/",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
    "--ro-bind",
    "/opt/corral/_bin/corral-exec",
    "/dev/.corral-exec",
    "--tmpfs",
    "/tmp",
    "--tmpfs",
    "/var/tmp",
]


def test_default_plan_in_full() -> None:
    plan = BubblewrapBackend().plan(
        request(), policy(memory=1 << 30, pids=64, timeout=30.0, output=1000), facts()
    )
    expected = LaunchPlan(
        backend="bubblewrap",
        sandbox_id="sbx-000000000001",
        argv=(
            *COMMON,
            "--ro-bind",
            WS,
            WS,  # read-only: the write broker performs allowed writes
            "--ro-bind",
            "/dev/null",
            f"{HOME}/.netrc",  # secrets, sorted; missing ones skipped
            "--tmpfs",
            f"{HOME}/.ssh",
            "--remount-ro",
            f"{HOME}/.ssh",
            "--chdir",
            WS,
            "--info-fd",
            "7",
            "--block-fd",
            "8",
            "--",
            "/dev/.corral-exec",
            "--init",
            "--status-fd",
            "3",
            "--seccomp-fd",
            "4",
            "--notify-fd",
            "5",
            "--notify-sock",
            "6",
            "--",
            "pytest",
            "-q",
        ),
        env=(
            ("PATH", "/usr/bin:/bin"),
            ("HOME", HOME),
            ("LANG", "C.UTF-8"),
            ("LC_ALL", "C"),
            ("TERM", "xterm"),
            ("TMPDIR", "/tmp"),
            ("CORRAL_SANDBOX_ID", "sbx-000000000001"),
        ),
        cwd="/",
        fds=(
            FdSpec(number=3, kind="status"),
            FdSpec(
                number=4,
                kind="data",
                data=compile_filter(
                    (*DENY_RULES, unix_socket_rule()), arch="x86_64", deny_unknown=True
                ),
            ),
            FdSpec(
                number=5,
                kind="data",
                data=compile_filter(BROKER_RULES, arch="x86_64", deny_unknown=False),
            ),
            FdSpec(number=6, kind="notify-sock"),
            FdSpec(number=7, kind="info"),
            FdSpec(number=8, kind="block"),
        ),
        broker=BrokerSpec(
            roots=((WS, WS),),
            patterns=(
                ("**/.git/hooks/**", "filesystem.protect: **/.git/hooks/**"),
                # a row dir/** also covers the name dir (a symlink to a payload dir)
                ("**/.git/hooks", "filesystem.protect: **/.git/hooks/**"),
                ("**/.bashrc", "filesystem.protect: **/.bashrc"),
            ),
            syscall_names=broker_names(),
            git_configs=(f"{HOME}/.gitconfig", f"{HOME}/.config/git/config"),
        ),
        cgroup=CgroupSpec(memory=1 << 30, pids=64),
        timeout=30.0,
        kill_grace=2.0,
        output_limit=1000,
        display_argv=("pytest", "-q"),
    )
    assert plan == expected


def test_host_kernel_interfaces_in_proc_are_read_only_or_hidden() -> None:
    kinds = (
        *facts().path_kinds,
        ("/proc/sys", "dir"),
        ("/proc/sysrq-trigger", "file"),
        ("/proc/kcore", "file"),
        ("/proc/acpi", "dir"),
    )
    argv = BubblewrapBackend().plan(request(), policy(), facts(path_kinds=kinds)).argv
    text = " ".join(argv)
    assert "--ro-bind /proc/sys /proc/sys" in text
    assert "--ro-bind /proc/sysrq-trigger /proc/sysrq-trigger" in text
    assert "--ro-bind /dev/null /proc/kcore" in text
    assert "--tmpfs /proc/acpi --remount-ro /proc/acpi" in text
    # after the fresh /proc is mounted, and nothing for what this kernel lacks
    assert argv.index("/proc/sys") > argv.index("--proc")
    assert "/proc/irq" not in argv


def test_plan_is_pure_and_repeatable() -> None:
    assert BubblewrapBackend().plan(request(), policy(), facts()) == BubblewrapBackend().plan(
        request(), policy(), facts()
    )


def test_read_only_workspace_needs_no_broker() -> None:
    p = policy()
    p = p.replace(filesystem=p.filesystem.replace(read_only=True))
    plan = BubblewrapBackend().plan(request(), p, facts())
    assert plan.broker is None
    assert plan.argv[COMMON.__len__() : COMMON.__len__() + 3] == ("--ro-bind", WS, WS)
    assert "--notify-fd" not in plan.argv


def test_open_network_shares_the_host_network() -> None:
    p = policy()
    p = p.replace(network=p.network.replace(mode="open", allow_unix_sockets=True))
    plan = BubblewrapBackend().plan(request(), p, facts())
    assert "--unshare-net" not in plan.argv
    assert plan.fds[1].data == compile_filter(DENY_RULES, arch="x86_64", deny_unknown=True)


def test_allowed_write_paths_are_supervised_too() -> None:
    p = policy()
    p = p.replace(filesystem=p.filesystem.replace(allow_write=("/data",)))
    plan = BubblewrapBackend().plan(request(), p, facts(path_kinds=((WS, "dir"), ("/data", "dir"))))
    assert plan.broker is not None and plan.broker.roots == ((WS, WS), ("/data", "/data"))
    i = plan.argv.index("/data")
    assert plan.argv[i - 1] == "--ro-bind"


def test_secrets_under_private_tmp_are_not_masked_twice() -> None:
    p = policy()
    p = p.replace(filesystem=p.filesystem.replace(deny_read=("/tmp/secret",)))
    plan = BubblewrapBackend().plan(
        request(), p, facts(path_kinds=((WS, "dir"), ("/tmp/secret", "dir")))
    )
    assert "/tmp/secret" not in plan.argv


def test_environment_is_an_allowlist() -> None:
    plan = BubblewrapBackend().plan(request(env={"EXTRA": "1"}), policy(), facts())
    names = [name for name, _ in plan.env]
    assert "AWS_SECRET_ACCESS_KEY" not in names
    assert names[-3:] == ["EXTRA", "TMPDIR", "CORRAL_SANDBOX_ID"]


def test_cpu_time_and_request_timeout() -> None:
    plan = BubblewrapBackend().plan(
        request(timeout=5.0), policy(cpu_time=10.0, timeout=60.0), facts()
    )
    assert plan.timeout == 5.0
    i = plan.argv.index("--rlimit")
    assert plan.argv[i + 1] == "cpu=10:11"


def test_missing_bwrap_or_helper_is_unavailable() -> None:
    with pytest.raises(BackendUnavailable, match="apt-get install bubblewrap"):
        BubblewrapBackend().plan(request(), policy(), facts(bwrap=None))
    with pytest.raises(BackendUnavailable, match="exec helper"):
        BubblewrapBackend().plan(request(), policy(), facts(helper=None))
    with pytest.raises(BackendUnavailable, match="CORRAL_BWRAP"):
        BubblewrapBackend().plan(
            request(), policy(), facts(bwrap=None, environ=(("CORRAL_BWRAP", "/x"),))
        )


def test_limits_without_cgroups_are_refused_or_recorded() -> None:
    f = facts(cgroup_problem="no writable cgroup")
    with pytest.raises(EnforcementUnavailable) as info:
        BubblewrapBackend().plan(request(), policy(memory=1 << 20), f)
    assert info.value.rule == "resources.memory"
    assert "--allow-degraded resources.memory" in (info.value.hint or "")
    p = policy(memory=1 << 20).replace(allow_degraded=frozenset({"resources.memory"}))
    plan = BubblewrapBackend().plan(request(), p, f)
    assert plan.cgroup is None and plan.degraded == ("resources.memory",)


def test_protection_without_the_broker_is_refused_or_degraded_to_existing_paths() -> None:
    f = facts(broker_problem="Linux 5.4 lacks seccomp ADDFD_FLAG_SEND")
    with pytest.raises(EnforcementUnavailable, match=r"filesystem\.protect"):
        BubblewrapBackend().plan(request(), policy(), f)
    p = policy().replace(allow_degraded=frozenset({"filesystem.protect"}))
    plan = BubblewrapBackend().plan(request(), p, f)
    assert plan.broker is None and plan.degraded == ("filesystem.protect",)
    # the persistence points that exist at the root are still read-only
    hooks = f"{WS}/.git/hooks"
    i = plan.argv.index(hooks)
    assert plan.argv[i - 1] == "--ro-bind" and plan.argv[i + 1] == hooks


def test_workspace_must_exist_and_not_be_secret() -> None:
    with pytest.raises(UsageError, match=r"not an existing directory"):
        BubblewrapBackend().plan(request(), policy(), facts(path_kinds=()))
    p = policy()
    p = p.replace(filesystem=p.filesystem.replace(deny_read=("/src",)))
    with pytest.raises(UsageError, match="inside the secret path"):
        BubblewrapBackend().plan(request(), p, facts())


def test_terminal_requests_a_controlling_tty() -> None:
    plan = BubblewrapBackend().plan(request().replace(tty=True), policy(), facts())
    assert plan.argv[-4:] == ("--ctty", "--", "pytest", "-q")


def test_old_bwrap_without_disable_userns() -> None:
    plan = BubblewrapBackend().plan(request(), policy(), facts(bwrap_version=(0, 6, 1)))
    assert "--disable-userns" not in plan.argv


def test_allow_read_re_exposes_a_path_under_the_private_tmp() -> None:
    p = policy()
    p = p.replace(filesystem=p.filesystem.replace(allow_read=("/tmp/venv",)))
    plan = BubblewrapBackend().plan(
        request(), p, facts(path_kinds=((WS, "dir"), ("/tmp/venv", "dir")))
    )
    i = plan.argv.index("/tmp/venv")
    assert plan.argv[i - 1 : i + 2] == ("--ro-bind", "/tmp/venv", "/tmp/venv")
    assert plan.argv.index("--tmpfs") < i  # bound after the private /tmp is mounted


def test_a_root_caller_runs_as_the_unprivileged_sandbox_id() -> None:
    from corral.backends.bubblewrap import ROOT_SANDBOX_ID, STAGE_DIR

    kinds = (*facts().path_kinds, (HOME, "dir"), ("/root", "dir"))
    plan = BubblewrapBackend().plan(request(), policy(), facts(uid=0, gid=0, path_kinds=kinds))
    argv = list(plan.argv)
    bwrap = argv.index("/usr/bin/bwrap")
    prefix = argv[:bwrap]
    assert prefix[:5] == [
        "/opt/corral/_bin/corral-exec",
        "--as-user",
        str(ROOT_SANDBOX_ID),
        "--status-fd",
        "3",
    ]
    # what the sandbox must own is idmapped; nested paths ride on their parent's clone
    idmapped = [prefix[i + 1] for i, a in enumerate(prefix) if a == "--idmap"]
    assert sorted(idmapped) == ["/home/me", "/root", "/src/app"]
    # every bind source is staged; bwrap (unprivileged) binds the staged clones
    staged = [prefix[i + 1] for i, a in enumerate(prefix) if a == "--stage"]
    assert WS in staged and "/opt/corral/_bin/corral-exec" in staged
    sandbox = argv[bwrap:]
    assert sandbox[1:5] == ["--uid", "0", "--gid", "0"]
    k = staged.index(WS)
    assert f"--ro-bind {STAGE_DIR}/{k} {WS}" in " ".join(sandbox)
    assert plan.broker is not None and plan.broker.idmapped_id == ROOT_SANDBOX_ID
    # git reads the repositories the command does not own (root's, read-only)
    assert ("GIT_CONFIG_SYSTEM", SANDBOX_GITCONFIG) in plan.env
    assert GITCONFIG_SOURCE in staged
    assert f"{STAGE_DIR}/{staged.index(GITCONFIG_SOURCE)} {SANDBOX_GITCONFIG}" in " ".join(sandbox)


def test_a_root_callers_own_git_system_config_is_kept() -> None:
    p = policy().replace(env=policy().env.replace(set=(("GIT_CONFIG_SYSTEM", "/etc/mine"),)))
    plan = BubblewrapBackend().plan(request(), p, facts(uid=0, gid=0))
    assert dict(plan.env)["GIT_CONFIG_SYSTEM"] == "/etc/mine"
    assert SANDBOX_GITCONFIG not in plan.argv


def test_a_non_root_caller_keeps_its_own_uid() -> None:
    plan = BubblewrapBackend().plan(request(), policy(), facts())
    assert "--as-user" not in plan.argv and "--uid" not in plan.argv
    assert "GIT_CONFIG_SYSTEM" not in dict(plan.env)
    assert plan.broker is not None and plan.broker.idmapped_id is None


def test_a_root_caller_may_keep_root_only_by_degrading_isolation() -> None:
    p = policy().replace(allow_degraded=frozenset({"isolation"}))
    plan = BubblewrapBackend().plan(request(), p, facts(uid=0, gid=0))
    assert "--as-user" not in plan.argv
    assert plan.degraded == ("isolation",)


def test_the_broker_reads_the_global_git_configs_the_callers_git_reads() -> None:
    from corral.backends.bubblewrap import user_git_configs

    assert user_git_configs(facts(environ=())) == (
        f"{HOME}/.gitconfig",
        f"{HOME}/.config/git/config",
    )
    xdg = facts(environ=(("XDG_CONFIG_HOME", "/cfg"),))
    assert user_git_configs(xdg) == (f"{HOME}/.gitconfig", "/cfg/git/config")
    chosen = facts(environ=(("GIT_CONFIG_GLOBAL", "/etc/my.gitconfig"),))
    assert user_git_configs(chosen) == ("/etc/my.gitconfig",)


# ---------------------------------------------------------------- allowUnixSockets as a list
PG = "/var/run/postgresql/.s.PGSQL.5432"


def socket_facts(**details: object) -> HostFacts:
    base = facts()
    listed = {
        "socket_dirs": ("/run",),
        "unix_named": ((PG, "/run/postgresql/.s.PGSQL.5432"),),
        "unix_listeners": (
            ("/run/postgresql/.s.PGSQL.5432", ()),
            ("/run/docker.sock", ()),
            (f"{HOME}/.docker/run/docker.sock", ()),
            (f"{WS}/.git/fsmonitor--daemon.ipc", ()),
            ("/srv/closed/x.sock", ("/srv/closed",)),
            (f"{HOME}/.ssh/agent.sock", ()),
        ),
    }
    listed.update(details)
    return base.replace(
        path_kinds=(*base.path_kinds, (PG, "socket")), details=tuple(sorted(listed.items()))
    )


def socket_policy(named: tuple[str, ...] = (PG,), mode: str = "none") -> Policy:
    p = policy()
    return p.replace(network=p.network.replace(allow_unix_sockets=named, mode=mode))


def test_a_unix_socket_list_hides_run_and_covers_every_other_listener() -> None:
    plan = BubblewrapBackend().plan(request(), socket_policy(), socket_facts())
    args = " ".join(plan.argv)
    assert "--tmpfs /run " in args
    # the named socket, at its canonical path, before /run turns read-only
    assert args.index(f"--ro-bind {PG} /run/postgresql/.s.PGSQL.5432") < args.index(
        "--remount-ro /run"
    )
    assert f"--ro-bind /dev/null {HOME}/.docker/run/docker.sock" in args
    assert f"--ro-bind /dev/null {WS}/.git/fsmonitor--daemon.ipc" in args
    assert "/dev/null /run/" not in args  # under the empty /run already
    assert "/srv/closed/x.sock" not in args  # the sandbox's uid cannot reach it
    assert f"{HOME}/.ssh/agent.sock" not in args  # under denyRead
    # a workspace under /run is bound back over the empty /run: its sockets are covered
    ws = "/run/user/1000/ws"
    p = socket_policy()
    p = p.replace(filesystem=p.filesystem.replace(workspace=ws))
    f = socket_facts(unix_listeners=((f"{ws}/app.sock", ()),))
    f = f.replace(path_kinds=(*f.path_kinds, (ws, "dir")))
    req = ExecRequest.from_argv(["true"], cwd=ws, sandbox_id="sbx-000000000001")
    args = " ".join(BubblewrapBackend().plan(req, p, f).argv)
    assert args.index("--tmpfs /run ") < args.index(f"--ro-bind /dev/null {ws}/app.sock")
    # socket(AF_UNIX) is allowed but for datagram sockets; the broker performs every
    # connect() and judges the socket's inode (the mounts are the second layer)
    (seccomp,) = [fd for fd in plan.fds if fd.number == 4]
    assert seccomp.data == compile_filter(
        (*DENY_RULES, unix_datagram_rule()), arch="x86_64", deny_unknown=True
    )
    assert plan.broker is not None
    assert plan.broker.unix_sockets == ("/run/postgresql/.s.PGSQL.5432",)  # canonical
    assert "connect" in dict(plan.broker.syscall_names).values()
    notify = compile_filter(
        (*BROKER_RULES, *CONNECT_BROKER_RULES), arch="x86_64", deny_unknown=False
    )
    assert any(fd.data == notify for fd in plan.fds)


def test_named_sockets_alone_start_a_broker_that_traps_only_connect() -> None:
    p = socket_policy()
    p = p.replace(filesystem=p.filesystem.replace(read_only=True))
    plan = BubblewrapBackend().plan(request(), p, socket_facts())
    assert plan.broker is not None
    assert plan.broker.roots == () and plan.broker.patterns == ()
    assert set(dict(plan.broker.syscall_names).values()) == {"connect"}
    only_connect = compile_filter(CONNECT_BROKER_RULES, arch="x86_64", deny_unknown=False)
    assert any(fd.data == only_connect for fd in plan.fds)
    # where the broker cannot run, the list is refused (never the mounts alone)
    with pytest.raises(EnforcementUnavailable) as info:
        BubblewrapBackend().plan(request(), p, socket_facts().replace(broker_problem="old kernel"))
    assert info.value.rule == "network.allowUnixSockets"


def test_corrals_own_sockets_cannot_be_named() -> None:
    state = f"{HOME}/.local/state/corral"
    sock = f"{state}/server/server.sock"
    p = socket_policy()
    p = p.replace(network=p.network.replace(allow_unix_sockets=(sock,)))
    f = socket_facts(unix_named=((sock, sock),), corral_state=state)
    f = f.replace(path_kinds=(*f.path_kinds, (sock, "socket")))
    with pytest.raises(EnforcementUnavailable, match="it is corral's own") as info:
        BubblewrapBackend().plan(request(), p, f)
    assert info.value.rule == "network.allowUnixSockets"


@pytest.mark.parametrize(
    ("named", "mode", "kinds", "words"),
    [
        ((PG,), "open", {}, "open"),
        ((f"{WS}/db.sock",), "none", {f"{WS}/db.sock": "socket"}, "may write"),
        (("/run/gone.sock",), "none", {}, "does not exist"),
        (("/etc/passwd",), "none", {"/etc/passwd": "file"}, "not a socket"),
        ((f"{HOME}/.ssh/agent.sock",), "none", {f"{HOME}/.ssh/agent.sock": "socket"}, "denyRead"),
    ],
)
def test_a_unix_socket_list_is_refused_where_it_cannot_hold(
    named: tuple[str, ...], mode: str, kinds: dict[str, str], words: str
) -> None:
    base = socket_facts()
    f = base.replace(path_kinds=(*base.path_kinds, *kinds.items()))
    with pytest.raises(EnforcementUnavailable, match=words) as info:
        BubblewrapBackend().plan(request(), socket_policy(named, mode), f)
    assert info.value.rule == "network.allowUnixSockets"


def test_a_unix_socket_list_without_the_host_listing_is_refused() -> None:
    with pytest.raises(EnforcementUnavailable, match="not listed"):
        BubblewrapBackend().plan(request(), socket_policy(), facts())

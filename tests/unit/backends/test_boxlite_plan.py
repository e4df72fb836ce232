"""The boxlite backend's plans and refusals (pure: nothing boots).

These plans are what runs on a host whose KVM boots guests; here the tests
check what the policy becomes (volumes, limits, the guest user, the
environment) and what is refused, with the rule named.
"""

from __future__ import annotations

import json

import pytest

from corral._exceptions import BackendUnavailable, EnforcementUnavailable, UsageError
from corral.backends import HostFacts, PreviewSpec, get_backend
from corral.backends.boxlite import FD_CONFIG, GUEST_OVERHEAD_MB, HOST_TASKS
from corral.pipeline._request import ExecRequest
from corral.policy import Policy

WS = "/work/proj"
SECRET_FILE = "/work/proj/.env"


def _facts(uid: int = 1000, **details: object) -> HostFacts:
    base: dict[str, object] = {
        "boxlite": "0.10.8",
        "image_name": "python",
        "image_problem": None,
        "oci_layout": "/cache/images/python-1/oci",
        "kvm_problem": None,
        "python": "/venv/bin/python3",
        "home": "/state/boxlite",
    }
    base.update(details)
    return HostFacts(
        uid=uid,
        gid=uid,
        home="/home/u",
        arch="x86_64",
        helper="/opt/corral-exec",
        path_kinds=((WS, "dir"), (SECRET_FILE, "file")),
        environ=(("PATH", "/usr/bin:/bin"), ("SECRET_TOKEN", "x"), ("LANG", "C.UTF-8")),
        details=tuple(sorted(base.items())),
    )


def _policy(**fs: object) -> Policy:
    policy = Policy.for_workspace(WS, home="/home/u").replace(backend="boxlite", isolation="vm")
    return policy.replace(filesystem=policy.filesystem.replace(**fs))


def _request(*argv: str) -> ExecRequest:
    return ExecRequest.from_argv(list(argv or ("python3", "-V")), cwd=WS, sandbox_id="sbx-1")


def _config(plan: object) -> dict[str, object]:
    spec = next(f for f in plan.fds if f.number == FD_CONFIG)  # type: ignore[attr-defined]
    return json.loads(spec.data)  # type: ignore[no-any-return]


COPY = PreviewSpec(id="pv-1", mechanism="copy", workspace=WS, tree="/state/previews/pv-1/tree")


def test_a_read_only_run_shares_the_workspace_read_only_and_nothing_else() -> None:
    plan = get_backend("boxlite").plan(_request(), _policy(read_only=True), _facts())
    assert plan.argv[0] == "/opt/corral-exec"
    assert plan.argv[-4:-2] == ("/venv/bin/python3", "-I")
    assert plan.argv[-2].endswith("/corral/backends/_boxlite_run.py")
    assert plan.argv[-1] == str(FD_CONFIG)
    # the run's cgroup: its kill at the end stops whatever BoxLite started
    assert plan.cgroup is not None and plan.cgroup.pids == HOST_TASKS
    config = _config(plan)
    box = config["box"]
    assert box["volumes"] == [[WS, WS, True]]  # type: ignore[index]
    assert box["rootfs_path"] == "/cache/images/python-1/oci"  # type: ignore[index]
    assert box["working_dir"] == WS  # type: ignore[index]
    ex = config["exec"]
    env = dict(ex["env"])  # type: ignore[index]
    assert "SECRET_TOKEN" not in env and env["HOME"] == env["TMPDIR"] == "/tmp"
    assert ex["user"] == "1000:1000" and ex["cwd"] == WS  # type: ignore[index]


def test_a_writable_run_shares_only_the_previews_copy() -> None:
    backend = get_backend("boxlite")
    assert backend.writes_through_preview and backend.preview_mechanism() == "copy"
    plan = backend.plan(_request(), _policy(), _facts(), preview=COPY)
    assert _config(plan)["box"]["volumes"] == [["/state/previews/pv-1/tree", WS, False]]  # type: ignore[index]
    with pytest.raises(EnforcementUnavailable) as info:
        backend.plan(_request(), _policy(), _facts())
    assert info.value.rule == "filesystem.workspace"
    overlay = PreviewSpec(id="pv-2", mechanism="overlay", workspace=WS, upper="/u", work="/w")
    with pytest.raises(UsageError, match="this preview's mechanism is overlay") as refused:
        backend.plan(_request(), _policy(), _facts(), preview=overlay)
    assert refused.value.hint == "create the preview with --mechanism copy"


def test_limits_become_the_vms_size_and_guest_rlimits() -> None:
    policy = _policy(read_only=True)
    policy = policy.replace(
        resources=policy.resources.replace(memory=1 << 30, cpus=2.0, pids=100, cpu_time=30.0)
    )
    config = _config(get_backend("boxlite").plan(_request("make"), policy, _facts()))
    assert config["box"]["memory_mib"] == 1024 + GUEST_OVERHEAD_MB  # type: ignore[index]
    assert config["box"]["cpus"] == 2  # type: ignore[index]
    argv = config["exec"]["argv"]  # type: ignore[index]
    assert argv[:2] == ["/bin/sh", "-c"] and argv[3:] == ["corral-limits", "make"]
    assert argv[2] == 'ulimit -u 100 && ulimit -t 30 || exit 126\nexec "$@"'
    fractional = policy.replace(resources=policy.resources.replace(cpus=1.5))
    with pytest.raises(EnforcementUnavailable) as info:
        get_backend("boxlite").plan(_request(), fractional, _facts())
    assert info.value.rule == "resources.cpus"


def test_a_root_callers_pids_limit_is_refused_not_dropped() -> None:
    """RLIMIT_NPROC does not bind uid 0, and the command is the caller's uid in the guest."""
    policy = _policy(read_only=True)
    policy = policy.replace(resources=policy.resources.replace(pids=100))
    with pytest.raises(EnforcementUnavailable) as info:
        get_backend("boxlite").plan(_request(), policy, _facts(uid=0))
    assert info.value.rule == "resources.pids"
    allowed = policy.replace(allow_degraded=frozenset({"resources.pids"}))
    plan = get_backend("boxlite").plan(_request(), allowed, _facts(uid=0))
    assert plan.degraded == ("resources.pids",)
    assert _config(plan)["exec"]["argv"] == ["python3", "-V"]  # type: ignore[index]


@pytest.mark.parametrize(
    ("change", "rule"),
    [
        ({"network": ("mode", "allowlist")}, "network.mode"),
        ({"network": ("mode", "open")}, "network.mode"),
        ({"filesystem": ("deny_read", (SECRET_FILE,))}, "filesystem.denyRead"),
        ({"filesystem": ("allow_write", ("/tmp/out",))}, "filesystem.allowWrite"),
        ({"filesystem": ("allow_read", ("/opt/data",))}, "filesystem.allowRead"),
        ({"resources": ("disk", 1 << 30)}, "resources.disk"),
    ],
)
def test_what_the_vm_cannot_express_is_refused_with_its_rule(
    change: dict[str, tuple[str, object]], rule: str
) -> None:
    policy = _policy(read_only=True)
    for section, (key, value) in change.items():
        policy = policy.replace(**{section: getattr(policy, section).replace(**{key: value})})
    with pytest.raises(EnforcementUnavailable) as info:
        get_backend("boxlite").plan(_request(), policy, _facts())
    assert info.value.rule == rule


def test_credentials_and_caches_are_refused() -> None:
    policy = _policy(read_only=True).replace(caches=(("pip", "/home/u/.cache/pip"),))
    with pytest.raises(EnforcementUnavailable) as info:
        get_backend("boxlite").plan(_request(), policy, _facts())
    assert info.value.rule == "caches"


@pytest.mark.parametrize(
    ("details", "message"),
    [
        ({"boxlite": None}, "pip install 'corral[boxlite]'"),
        ({"kvm_problem": "a trial KVM boot hung for 8 s"}, "KVM that boots guests: a trial KVM"),
        ({"oci_layout": None}, "run 'corral image build python'"),
        ({"image_problem": "not corral:NAME"}, "not corral:NAME"),
    ],
)
def test_what_this_host_lacks_is_named(details: dict[str, object], message: str) -> None:
    with pytest.raises(BackendUnavailable, match=message.replace("[", r"\[").replace("]", r"\]")):
        get_backend("boxlite").plan(_request(), _policy(read_only=True), _facts(**details))


def test_without_cgroups_the_backend_is_unavailable() -> None:
    facts = _facts().replace(cgroup_problem="no cgroup v1 memory controller")
    assert "cgroup" in str(get_backend("boxlite").problem(facts))

"""bubblewrap plans for a run in a preview, compared whole against the plain plan."""

from __future__ import annotations

import pytest

from corral._exceptions import UsageError
from corral.backends import HostFacts, PreviewSpec
from corral.backends.bubblewrap import BubblewrapBackend
from corral.pipeline._request import ExecRequest
from corral.policy import Policy

WS = "/src/app"


def facts(**extra):
    kinds = ((WS, "dir"), (f"{WS}/build", "dir"))
    return HostFacts(
        uid=1000,
        gid=1000,
        home="/home/me",
        arch="x86_64",
        bwrap="/usr/bin/bwrap",
        bwrap_version=(0, 8, 0),
        helper="/opt/corral/corral-exec",
        path_kinds=kinds,
        **extra,
    )


def plans(spec, policy=None):
    backend = BubblewrapBackend()
    policy = policy or Policy.for_workspace(WS, home="/home/me")
    request = ExecRequest.from_argv(["make"], cwd=WS).replace(sandbox_id="sbx-000000000000")
    return backend.plan(request, policy, facts()), backend.plan(
        request, policy, facts(), preview=spec
    )


def test_overlay_preview_prefixes_the_mount_helper_and_reaches_roots_in_its_namespace():
    spec = PreviewSpec(
        id="pv-1", mechanism="overlay", workspace=WS, upper="/st/pv-1/upper", work="/st/pv-1/work"
    )
    plain, preview = plans(spec)
    prefix = (
        "/opt/corral/corral-exec",
        "--mount-overlay",
        "overlay",
        WS,
        "/st/pv-1/upper",
        "/st/pv-1/work",
        "--status-fd",
        "3",
        "--",
    )
    assert plain.broker is not None
    assert preview == plain.replace(
        argv=(*prefix, *plain.argv), broker=plain.broker.replace(launcher_ns=True)
    )


def test_fuse_preview_names_the_daemon():
    spec = PreviewSpec(
        id="pv-1",
        mechanism="fuse-overlayfs",
        workspace=WS,
        upper="/st/u",
        work="/st/w",
        fuse_binary="/usr/bin/fuse-overlayfs",
    )
    plain, preview = plans(spec)
    prefix = (
        "/opt/corral/corral-exec",
        "--mount-overlay",
        "fuse",
        WS,
        "/st/u",
        "/st/w",
        "--status-fd",
        "3",
        "--fuse-binary",
        "/usr/bin/fuse-overlayfs",
        "--",
    )
    assert preview == plain.replace(
        argv=(*prefix, *plain.argv), broker=plain.broker.replace(launcher_ns=True)
    )


def test_copy_preview_binds_the_copy_at_the_workspace_path():
    spec = PreviewSpec(id="pv-1", mechanism="copy", workspace=WS, tree="/st/pv-1/tree")
    policy = Policy.for_workspace(WS, home="/home/me")
    policy = policy.replace(filesystem=policy.filesystem.replace(allow_write=(f"{WS}/build",)))
    plain, preview = plans(spec, policy)
    argv = list(plain.argv)
    i = argv.index(WS)  # "--ro-bind WS WS": the first occurrence is the source
    assert argv[i - 1 : i + 2] == ["--ro-bind", WS, WS]
    argv[i] = "/st/pv-1/tree"
    j = argv.index(f"{WS}/build")
    assert argv[j - 1 : j + 2] == ["--ro-bind", f"{WS}/build", f"{WS}/build"]
    argv[j] = "/st/pv-1/tree/build"
    broker = plain.broker.replace(
        roots=((WS, "/st/pv-1/tree"), (f"{WS}/build", "/st/pv-1/tree/build"))
    )
    assert preview == plain.replace(argv=tuple(argv), broker=broker)


def test_refuses_a_preview_of_another_workspace():
    spec = PreviewSpec(
        id="pv-1", mechanism="overlay", workspace="/elsewhere", upper="/u", work="/w"
    )
    with pytest.raises(UsageError, match="belongs to the workspace /elsewhere"):
        plans(spec)


def _root_plans(spec, allow_degraded=frozenset()):
    backend = BubblewrapBackend()
    policy = Policy.for_workspace(WS, home="/root").replace(allow_degraded=allow_degraded)
    request = ExecRequest.from_argv(["make"], cwd=WS).replace(sandbox_id="sbx-000000000000")
    root = facts().replace(uid=0, gid=0, home="/root")
    return backend.plan(request, policy, root), backend.plan(request, policy, root, preview=spec)


def test_a_root_callers_overlay_preview_mounts_it_over_idmapped_layers_as_the_sandbox_id():
    from corral.backends.bubblewrap import ROOT_SANDBOX_ID

    spec = PreviewSpec(
        id="pv-1", mechanism="overlay", workspace=WS, upper="/st/pv-1/upper", work="/st/pv-1/work"
    )
    plain, preview = _root_plans(spec)
    assert "--mount-overlay" not in preview.argv  # no stage of its own, never as uid 0
    argv = list(preview.argv)
    stage = argv[: argv.index("--") + 1]
    assert stage[:3] == ["/opt/corral/corral-exec", "--as-user", str(ROOT_SANDBOX_ID)]
    i = stage.index("--overlay")
    assert stage[i + 1 : i + 4] == [WS, "/st/pv-1/upper", "/st/pv-1/work"]
    idmapped = {stage[k + 1] for k, arg in enumerate(stage) if arg == "--idmap"}
    assert {WS, "/st/pv-1"} <= idmapped  # upper and work through one clone: one mount
    # the rest is the plain root plan's
    assert argv[len(stage) :] == list(plain.argv)[list(plain.argv).index("--") + 1 :]
    assert plain.broker is not None and preview.broker is not None
    assert preview.broker == plain.broker.replace(launcher_ns=True, through_idmap=True)


def test_a_root_callers_fuse_preview_is_refused_unless_degraded():
    from corral._exceptions import EnforcementUnavailable

    spec = PreviewSpec(
        id="pv-1",
        mechanism="fuse-overlayfs",
        workspace=WS,
        upper="/st/u",
        work="/st/w",
        fuse_binary="/usr/bin/fuse-overlayfs",
    )
    with pytest.raises(EnforcementUnavailable, match="keep the host's root identity"):
        _root_plans(spec)
    _plain, preview = _root_plans(spec, frozenset({"isolation"}))
    assert preview.argv[1] == "--mount-overlay" and "--as-user" not in preview.argv
    assert preview.degraded == ("isolation",)

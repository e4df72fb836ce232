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

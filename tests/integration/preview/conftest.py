"""Real previews: bubblewrap, the exec helper's overlay mount, real files on disk."""

from __future__ import annotations

import os
import shutil

import pytest

from corral.backends import _find_bwrap, helper_path
from corral.pipeline._request import ExecRequest
from corral.pipeline._runner import execute
from corral.policy import Policy, ResourceLimits
from corral.preview import Preview
from corral.preview._mechanism import probe
from tests.tree_listing import LISTING_SCRIPT


def sandbox_problem() -> str | None:
    if helper_path() is None:
        return "corral's exec helper is not built (run 'make native')"
    if _find_bwrap(dict(os.environ)) is None:
        return "bubblewrap is not installed (apt-get install bubblewrap)"
    return None


PROBLEM = sandbox_problem()
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=PROBLEM or "")


class World:
    """A workspace, a state dir and helpers to run commands in previews of it."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.workspace = os.path.join(root, "ws")
        self.xdg_state = os.path.join(root, "xdg-state")
        self.state = os.path.join(self.xdg_state, "corral")
        os.makedirs(self.workspace)
        os.makedirs(self.state)

    def write(self, rel: str, data: str | bytes = "x\n", mode: int = 0o644) -> str:
        path = os.path.join(self.workspace, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.chmod(path, mode)
        return path

    def read(self, rel: str) -> str:
        with open(os.path.join(self.workspace, rel)) as f:
            return f.read()

    def policy(self, **fs: object) -> Policy:
        policy = Policy.for_workspace(self.workspace, home=os.environ.get("HOME", "/root"))
        # no cgroup limits: they are not what these tests are about, and cost time
        policy = policy.replace(resources=ResourceLimits(timeout=120.0))
        if fs:
            policy = policy.replace(filesystem=policy.filesystem.replace(**fs))
        return policy

    def preview(self, mechanism: str = "overlay") -> Preview:
        return Preview.create(self.workspace, state_dir=self.state, mechanism=mechanism)

    def run(self, preview: Preview, script: str, *, policy: Policy | None = None, **kwargs: object):
        request = ExecRequest.from_argv(["/bin/sh", "-c", script], cwd=self.workspace)
        policy = policy or self.policy()
        if preview.mechanism == "fuse-overlayfs" and os.geteuid() == 0:
            # a root caller's fuse-overlayfs preview keeps uid 0 (FUSE cannot be
            # idmapped): refused unless accepted, as here, to test the mechanism
            policy = policy.replace(allow_degraded=policy.allow_degraded | {"isolation"})
        return execute(
            request,
            policy,
            environ=os.environ,
            preview=preview,
            state_dir=self.state,
            **kwargs,
        )

    def cli_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["XDG_STATE_HOME"] = self.xdg_state
        env.pop("CORRAL_PREVIEW_MECHANISM", None)
        return env


@pytest.fixture
def world(tmp_path) -> World:
    return World(str(tmp_path))


@pytest.fixture(params=["overlay", "fuse-overlayfs", "copy"])
def mechanism(request, tmp_path_factory) -> str:
    problem = probe(request.param, str(tmp_path_factory.mktemp("probe")), use_cache=False)
    if problem is not None:
        pytest.skip(f"{request.param} does not work here: {problem}")
    return request.param


#: print the tree of $PWD as the command sees it (see tests/tree_listing.py)
SHOW_TREE = "python3 -c " + "'" + LISTING_SCRIPT.replace("'", "'\"'\"'") + '\' "$PWD"'

__all__ = ["SHOW_TREE", "World", "shutil"]

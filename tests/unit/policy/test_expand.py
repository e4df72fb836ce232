"""denyRead globs expand into the host paths they match, within bounds, without following links."""

from __future__ import annotations

import os

import pytest

from corral._exceptions import UsageError
from corral.policy import Policy, _expand
from corral.policy._expand import expand_deny_read, expand_glob


def touch(path: str) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("x")
    return path


def test_a_glob_matches_at_any_depth_and_prunes_hidden_directories(tmp_path: object) -> None:
    root = str(tmp_path)
    a = touch(f"{root}/certs/a.pem")
    b = touch(f"{root}/certs/x/y/b.pem")
    touch(f"{root}/certs/x/y/b.txt")
    hidden_dir = f"{root}/certs/keys.pem"
    touch(f"{hidden_dir}/inner.pem")  # below a matching directory: not listed again
    assert expand_glob(f"{root}/certs/**/*.pem") == sorted([a, b, hidden_dir])
    assert expand_glob(f"{root}/nowhere/**/*.pem") == []


def test_a_matching_link_hides_its_target_too_and_links_are_not_walked(tmp_path: object) -> None:
    root = str(tmp_path)
    target = touch(f"{root}/elsewhere/real.key")
    touch(f"{root}/elsewhere/deep/other.key")
    os.makedirs(f"{root}/keys")
    os.symlink(target, f"{root}/keys/link.key")
    os.symlink(f"{root}/elsewhere", f"{root}/keys/dirlink")  # not followed
    assert expand_glob(f"{root}/keys/**/*.key") == sorted([f"{root}/keys/link.key", target])


def test_the_walk_and_the_matches_are_bounded(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = str(tmp_path)
    for i in range(20):
        touch(f"{root}/d/{i}/f.pem")
    monkeypatch.setattr(_expand, "MAX_MATCHES", 5)
    with pytest.raises(UsageError, match=r"denyRead .*: it matches more than 5 paths"):
        expand_glob(f"{root}/d/**/*.pem")
    monkeypatch.setattr(_expand, "MAX_VISITED", 10)
    with pytest.raises(UsageError, match="it looks at more than 10 entries"):
        expand_glob(f"{root}/d/**/nothing")


def test_the_policy_keeps_literal_entries_and_replaces_globs(tmp_path: object) -> None:
    root = str(tmp_path)
    pem = touch(f"{root}/ws/a/b.pem")
    policy = Policy.for_workspace(f"{root}/ws", home=f"{root}/home")
    assert expand_deny_read(policy) is policy  # no glob: unchanged
    fs = policy.filesystem
    globbed = policy.replace(
        filesystem=fs.replace(deny_read=(*fs.deny_read, f"{root}/ws/**/*.pem"))
    )
    assert expand_deny_read(globbed).filesystem.deny_read == (*fs.deny_read, pem)


def test_entries_reached_through_links_are_resolved(tmp_path: object) -> None:
    root = str(tmp_path)
    touch(f"{root}/dotfiles/aws/credentials")
    os.makedirs(f"{root}/home")
    os.symlink(f"{root}/dotfiles/aws", f"{root}/home/.aws")
    policy = Policy.for_workspace(f"{root}/ws", home=f"{root}/home")
    fs = policy.filesystem
    linked = policy.replace(
        filesystem=fs.replace(
            deny_read=(f"{root}/home/.aws",), allow_read=(f"{root}/home/.aws/public",)
        )
    )
    resolved = expand_deny_read(linked).filesystem
    assert resolved.deny_read == (f"{root}/dotfiles/aws",)  # the target is what must be hidden
    assert resolved.allow_read == (f"{root}/home/.aws/public",)  # missing: kept as written


def test_a_rule_through_a_link_the_sandbox_can_repoint_is_refused(tmp_path: object) -> None:
    """Followed from outside into the workspace, in a glob's directory, or in allowRead."""
    root = str(tmp_path)
    touch(f"{root}/elsewhere/credentials")
    touch(f"{root}/ws/real/a.pem")
    os.makedirs(f"{root}/home")
    os.symlink(f"{root}/elsewhere", f"{root}/ws/aws")  # the sandbox writes ws: it may re-point
    os.symlink("../ws/aws", f"{root}/home/.aws")  # the user's link leads through it
    os.symlink("real", f"{root}/ws/certs")
    os.symlink(f"{root}/elsewhere/credentials", f"{root}/ws/matched.pem")
    policy = Policy.for_workspace(f"{root}/ws", home=f"{root}/home")
    fs = policy.filesystem
    for deny, allow in (
        ((f"{root}/home/.aws",), ()),
        ((f"{root}/ws/certs/**/*.pem",), ()),
        ((), (f"{root}/home/.aws/public",)),
    ):
        steered = policy.replace(filesystem=fs.replace(deny_read=deny, allow_read=allow))
        with pytest.raises(
            UsageError, match=r"through the link .*/ws/aws|through the link .*/ws/certs"
        ):
            expand_deny_read(steered)
    # a link a glob matches is hidden with its target: nothing to steer
    matched = policy.replace(filesystem=fs.replace(deny_read=(f"{root}/ws/*.pem",)))
    assert expand_deny_read(matched).filesystem.deny_read == (f"{root}/elsewhere/credentials",)

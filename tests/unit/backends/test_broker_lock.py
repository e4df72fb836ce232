"""The supervised roots' lock (``_broker_lock.RootLocks``): which brokers exclude each other.

Each ``RootLocks`` stands for one broker; two of them in one process hold distinct open
file descriptions, so their flocks conflict exactly as two brokers' in two processes do
(one test takes the lock in another process to show that too).
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from corral.backends._broker_lock import LOCK_BOUND, RootLocks

#: A short bound for the tests (the broker's own is LOCK_BOUND).
BOUND = 0.3


def broker_on(*paths: str) -> RootLocks:
    locks = RootLocks()
    for path in paths:
        fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            locks.add_root(fd)
        finally:
            os.close(fd)
    return locks


def held_elsewhere(locks: RootLocks) -> bool:
    """Whether *locks* cannot be taken now (some other holder), after waiting BOUND."""
    start = time.monotonic()
    try:
        locks.acquire(BOUND)
    except OSError as exc:
        failed: OSError | None = exc
    else:
        failed = None
        locks.release()
    if failed is None:
        return False
    assert failed.errno == errno.EAGAIN
    assert BOUND <= time.monotonic() - start < BOUND + 5
    return True


def test_two_brokers_on_one_root_exclude_each_other_until_release(tmp_path: object) -> None:
    root = str(tmp_path)
    a, b = broker_on(root), broker_on(root)
    try:
        a.acquire()
        assert held_elsewhere(b)
        a.release()
        assert not held_elsewhere(b)
        b.acquire()
        assert held_elsewhere(a)  # both ways
        b.release()
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("outer_first", [True, False])
def test_nested_roots_exclude_each_other(tmp_path: object, outer_first: bool) -> None:
    """A sandbox started in /p and one started in /p/sub both write /p/sub/d."""
    outer = str(tmp_path)
    inner = os.path.join(outer, "sub", "deeper")
    os.makedirs(inner)
    first, second = (broker_on(outer), broker_on(inner))
    if not outer_first:
        first, second = second, first
    try:
        first.acquire()
        assert held_elsewhere(second)
        first.release()
        assert not held_elsewhere(second)
    finally:
        first.close()
        second.close()


def test_sibling_roots_do_not_wait_for_each_other(tmp_path: object) -> None:
    base = str(tmp_path)
    os.makedirs(os.path.join(base, "a"))
    os.makedirs(os.path.join(base, "b"))
    a, b = broker_on(os.path.join(base, "a")), broker_on(os.path.join(base, "b"))
    try:
        a.acquire()
        b.acquire(BOUND)  # shared locks on the common ancestors only
        b.release()
        a.release()
    finally:
        a.close()
        b.close()


def test_a_broker_with_a_root_inside_another_of_its_roots_takes_its_own_locks(
    tmp_path: object,
) -> None:
    """The workspace and an allowWrite inside it: one fd, locked exclusively, no self-conflict."""
    outer = str(tmp_path)
    inner = os.path.join(outer, "cache")
    os.makedirs(inner)
    locks, other = broker_on(inner, outer), broker_on(outer)
    try:
        locks.acquire(BOUND)
        assert held_elsewhere(other)
        locks.release()
    finally:
        locks.close()
        other.close()


def needs_a_private_lock_directory() -> None:
    from corral.backends._broker_lock import lock_directory

    if lock_directory() is None:
        pytest.skip("this user has no home (uid 65534): brokers lock the directories")


def lock_file(directory: str) -> str:
    """The private lock file of *directory* (``~/.cache/corral/locks/<dev>-<ino>``)."""
    import pwd

    needs_a_private_lock_directory()
    st = os.stat(directory)
    home = pwd.getpwuid(os.getuid()).pw_dir
    return os.path.join(home, ".cache", "corral", "locks", f"{st.st_dev:x}-{st.st_ino:x}")


_HOLD = (
    "import fcntl, os, sys\n"
    "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
    "fcntl.flock(fd, fcntl.LOCK_EX)\n"
    "print('held', flush=True)\n"
    "sys.stdin.readline()\n"
)


def test_a_lock_another_process_holds_fails_the_operation_within_the_bound(
    tmp_path: object,
) -> None:
    root = str(tmp_path)
    broker_on(root).close()  # the lock file exists once a broker looked at the root
    assert oct(os.stat(os.path.dirname(lock_file(root))).st_mode & 0o777) == "0o700"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, lock_file(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    locks = broker_on(root)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        assert held_elsewhere(locks)
        holder.communicate(b"\n", timeout=30)  # the holder exits: its lock goes
        locks.acquire(BOUND)
        locks.release()
    finally:
        holder.kill()
        holder.wait()
        locks.close()
    assert 1 <= LOCK_BOUND <= 30  # long past any broker's operation, short of a hang


def test_a_lock_on_the_directory_itself_delays_nothing(tmp_path: object) -> None:
    """Anyone who can read a workspace can flock the directory itself (another local user,
    a sandbox): the brokers' locks are private files, so that holds up no write."""
    needs_a_private_lock_directory()
    root = str(tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, root], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    locks = broker_on(root)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        assert not held_elsewhere(locks)
    finally:
        holder.kill()
        holder.communicate()
        locks.close()


def test_the_walk_stops_at_a_mount_boundary() -> None:
    """A root on another filesystem than its parent directory does not lock that parent."""
    base = "/dev/shm"
    if not os.path.isdir(base) or os.stat(base).st_dev == os.stat("/dev").st_dev:
        pytest.skip("/dev/shm is no separate mount here")
    if not os.access(base, os.W_OK):
        pytest.skip("/dev/shm is not writable")
    root = tempfile.mkdtemp(dir=base)
    broker_on("/dev").close()  # /dev's lock file exists
    parent = os.open(lock_file("/dev"), os.O_RDONLY | os.O_CLOEXEC)
    locks = broker_on(root)
    try:
        import fcntl

        fcntl.flock(parent, fcntl.LOCK_EX | fcntl.LOCK_NB)  # some broker holds /dev
        locks.acquire(BOUND)  # not an ancestor this broker locks: another filesystem
        locks.release()
    finally:
        os.close(parent)
        locks.close()
        os.rmdir(root)


@pytest.mark.parametrize("placement", ["elsewhere", "in-allow-write", "contains-workspace"])
def test_every_plan_hides_the_private_lock_directory(
    monkeypatch: pytest.MonkeyPatch, placement: str
) -> None:
    """``prepare`` hides the lock directory from every policy, whatever built it, and makes
    it read-only where it overlaps a writable area (a sandbox that could open a lock file
    could hold it; one that could replace it would split the brokers)."""
    from corral.backends import _broker_lock
    from corral.pipeline._runner import _hide_broker_locks
    from corral.policy import default_policy

    locks = "/home/u/.cache/corral/locks"
    monkeypatch.setattr(_broker_lock, "lock_directory", lambda: locks)
    workspace = {"contains-workspace": locks + "/ws"}.get(placement, "/srv/ws")
    policy = default_policy(workspace, home="/home/u")
    if placement == "in-allow-write":
        fs = policy.filesystem
        policy = policy.replace(filesystem=fs.replace(allow_write=("/home/u/.cache",)))
    hidden = _hide_broker_locks(policy).filesystem
    assert locks in hidden.deny_read
    read_only = placement != "elsewhere"
    assert (locks in hidden.deny_write and locks + "/**" in hidden.deny_write) == read_only
    assert _hide_broker_locks(_hide_broker_locks(policy)) == _hide_broker_locks(policy)


def test_without_a_private_lock_directory_the_policy_is_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from corral.backends import _broker_lock
    from corral.pipeline._runner import _hide_broker_locks
    from corral.policy import default_policy

    monkeypatch.setattr(_broker_lock, "lock_directory", lambda: None)
    policy = default_policy("/srv/ws", home="/home/u")
    assert _hide_broker_locks(policy) is policy


def _home(monkeypatch: pytest.MonkeyPatch, home: str) -> None:
    """This process's passwd home is *home*, and no private directory is known yet."""
    import pwd

    from corral.backends import _broker_lock

    real = pwd.getpwuid(os.getuid())
    fake = pwd.struct_passwd((*real[:5], home, *real[6:]))
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: fake)
    monkeypatch.setattr(_broker_lock, "_DIRECTORY", [])


@pytest.mark.parametrize("damage", ["link", "mode", "owner", "open-locks"])
def test_a_lock_directory_that_cannot_be_had_refuses_rather_than_locking_elsewhere(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, damage: str
) -> None:
    """ATK13: a sandbox whose workspace holds ~/.cache can chmod ~/.cache/corral; had
    corral then fallen back to the directories' own flock, new brokers would lock other
    objects than the running ones (no exclusion) and a sandbox could hold those locks.
    Where the user has a home, a lock directory that cannot be had refuses the run."""
    from corral._exceptions import BrokerFailed
    from corral.backends import _broker_lock
    from corral.pipeline._runner import _hide_broker_locks
    from corral.policy import default_policy

    home = tmp_path / "home"
    (home / ".cache" / "corral").mkdir(parents=True)
    if damage == "link":
        os.rename(home / ".cache" / "corral", home / "elsewhere")
        os.symlink(home / "elsewhere", home / ".cache" / "corral")
    elif damage == "mode":
        if os.geteuid() == 0:
            pytest.skip("root searches a directory of mode 000 anyway")
        os.chmod(home / ".cache" / "corral", 0)
    elif damage == "owner":
        if os.geteuid() != 0:
            pytest.skip("only root can give the directory to another user")
        os.chown(home / ".cache" / "corral", 65534, 65534)
    else:
        (home / ".cache" / "corral" / "locks").mkdir(mode=0o755)
        os.chmod(home / ".cache" / "corral" / "locks", 0o755)
    _home(monkeypatch, str(home))
    try:
        with pytest.raises(BrokerFailed, match="private lock directory"):
            _hide_broker_locks(default_policy(str(tmp_path), home=str(home)))
        with pytest.raises(BrokerFailed):
            broker_on(str(tmp_path))  # nor does a broker start
        assert _broker_lock._DIRECTORY == []  # not kept: fixed, the next run goes on
    finally:
        os.chmod(home / ".cache" / "corral", 0o700)


def test_only_a_user_without_a_home_locks_the_directories_themselves(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from corral.backends import _broker_lock

    _home(monkeypatch, str(tmp_path / "nonexistent"))
    assert _broker_lock.lock_directory() is None
    locks = broker_on(str(tmp_path))  # the directory's own flock
    try:
        locks.acquire(BOUND)
        locks.release()
    finally:
        locks.close()
    _home(monkeypatch, str(tmp_path))
    assert _broker_lock.lock_directory() == str(tmp_path / ".cache" / "corral" / "locks")
    assert os.stat(tmp_path / ".cache" / "corral" / "locks").st_mode & 0o777 == 0o700

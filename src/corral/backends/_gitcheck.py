"""The git check: nothing a run created may make the host's git run code.

Git finds repositories by *discovery*: in every directory from the user's
cwd upwards it looks at ``D/.git`` (a directory, a ``gitdir:`` file or a
symlink) and at ``D`` itself as a repository (``HEAD``, ``objects/``,
``refs/``), and a gitdir may redirect its shared part through ``commondir``.
Code then runs from the gitdir's ``config``/``config.worktree`` (fsmonitor,
hooksPath, sshCommand, pager, editor, ``!`` aliases, include, filter / diff /
merge drivers, credential helpers ...) and from ``hooks/``.

The rule (docs/threat-model.md, "Git"): after a run, every *code-bearing git
input* that the run created or changed, or that a link the run created or
changed leads to, must be inert:

* a ``config`` or ``config.worktree`` holds only keys from
  :data:`SAFE_KEYS` (the keys git writes itself for init, clone, fetch,
  worktree and submodule work, and plain identity/preference keys), with
  values checked where a value could choose a program (transports in URLs,
  ``submodule.*.update``); git's own parser reads it (``--no-includes``,
  so an ``include.path`` is just a key that is not allowed);
* a ``hooks`` entry is a directory holding only regular ``*.sample`` files
  (git never runs those);
* a ``.git`` file or ``commondir`` leads to a gitdir the run created (then
  checked by these same rules) or to a pre-existing administrative gitdir (a
  path with a ``.git`` component) outside the areas the sandbox can write;
* none of them is a symlink.

Whatever fails is *quarantined*: renamed (through directory fds, never
following a symlink) to ``<name>.corral-quarantined`` so git no longer reads
it, and reported. An allowlist needs no list of dangerous keys: a key git
learns tomorrow is refused until it is added here with a reason.

Which directories are looked at: the directories the run touched (from the
broker's :class:`Journal`) and all their ancestors up to the root; a
directory moved into place is walked entirely.
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = [
    "QUARANTINE_SUFFIX",
    "SAFE_KEYS",
    "Finding",
    "Journal",
    "check_root",
    "config_problem",
]

QUARANTINE_SUFFIX = ".corral-quarantined"

#: ``(section, subsection?, key, value kind, reason)`` of the git config keys a
#: run may leave in a repository it created. Value kinds: ``any`` (data only),
#: ``bool``, ``url`` (no ``transport::`` helper, no leading ``-``),
#: ``update`` (``submodule.*.update`` without ``!command``), ``rebase``.
SAFE_KEYS: tuple[tuple[str, bool, str, str, str], ...] = (
    ("core", False, "repositoryformatversion", "any", "written by git init"),
    ("core", False, "filemode", "bool", "written by git init"),
    ("core", False, "bare", "bool", "written by git init"),
    ("core", False, "logallrefupdates", "bool", "written by git init"),
    ("core", False, "symlinks", "bool", "written by git init on some file systems"),
    ("core", False, "ignorecase", "bool", "written by git init on some file systems"),
    ("core", False, "precomposeunicode", "bool", "written by git init on macOS"),
    ("core", False, "worktree", "any", "written for submodules (a path, runs nothing)"),
    ("core", False, "sparsecheckout", "bool", "written by git sparse-checkout"),
    ("core", False, "sparsecheckoutcone", "bool", "written by git sparse-checkout"),
    ("core", False, "autocrlf", "any", "line endings (data only)"),
    ("core", False, "eol", "any", "line endings (data only)"),
    ("extensions", False, "objectformat", "any", "written by git init --object-format"),
    ("extensions", False, "worktreeconfig", "bool", "written by git worktree"),
    ("extensions", False, "refstorage", "any", "written by git init --ref-format"),
    ("extensions", False, "partialclone", "any", "written by partial clones (a remote name)"),
    ("remote", True, "url", "url", "written by git clone / git remote add"),
    ("remote", True, "pushurl", "url", "written by git remote set-url --push"),
    ("remote", True, "fetch", "any", "written by git clone (a refspec)"),
    ("remote", True, "push", "any", "a refspec"),
    ("remote", True, "tagopt", "any", "written by git clone --no-tags"),
    ("remote", True, "mirror", "bool", "written by git clone --mirror"),
    ("remote", True, "promisor", "bool", "written by partial clones"),
    ("remote", True, "partialclonefilter", "any", "written by partial clones"),
    ("branch", True, "remote", "any", "written by git clone / checkout -b --track"),
    ("branch", True, "merge", "any", "written by git clone / checkout -b --track"),
    ("branch", True, "rebase", "rebase", "written by git branch --track with pull.rebase"),
    ("submodule", True, "url", "url", "written by git submodule init"),
    ("submodule", True, "active", "bool", "written by git submodule init"),
    ("submodule", True, "update", "update", "checkout/rebase/merge/none only, never !command"),
    ("submodule", True, "branch", "any", "a branch name"),
    ("user", False, "name", "any", "commit identity"),
    ("user", False, "email", "any", "commit identity"),
    ("init", False, "defaultbranch", "any", "a branch name"),
    ("pull", False, "rebase", "rebase", "a preference"),
    ("pull", False, "ff", "any", "a preference"),
    ("push", False, "default", "any", "a preference"),
    ("push", False, "autosetupremote", "bool", "a preference"),
    ("fetch", False, "prune", "bool", "a preference"),
    ("gc", False, "auto", "any", "a number"),
    ("lfs", False, "repositoryformatversion", "any", "written by git lfs install"),
)

_KEYS = {(section, sub, key): kind for section, sub, key, kind, _reason in SAFE_KEYS}
_BOOLS = frozenset({"", "true", "false", "yes", "no", "on", "off", "1", "0"})
#: the values git takes for a boolean (a code key set to one names no program)
GIT_BOOLEANS = _BOOLS
_UPDATES = frozenset({"checkout", "rebase", "merge", "none"})
_REBASES = _BOOLS | {"merges", "interactive", "i", "m"}
#: areas a redirect may not lead into: the sandbox could write there
_SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")
_MAX_LINK = 4096
_MAX_CONFIG = 1 << 20


class Finding:
    """One quarantined git input: its path inside the sandbox and why."""

    __slots__ = ("path", "quarantined_as", "reason")

    def __init__(self, path: str, reason: str, quarantined_as: str) -> None:
        self.path = path
        self.reason = reason
        self.quarantined_as = quarantined_as


class Journal:
    """What one run created or changed in each supervised root (relative paths).

    ``created``: names the run made (create, mkdir, symlink, link, rename
    target); everything below a created name is new too. ``changed``:
    existing files whose content or metadata the run changed. ``moved``:
    rename targets (a moved directory's content was not journaled entry by
    entry, so the check walks it).
    """

    __slots__ = ("changed", "created", "moved")

    def __init__(self) -> None:
        self.created: dict[str, set[str]] = {}
        self.changed: dict[str, set[str]] = {}
        self.moved: dict[str, set[str]] = {}

    def create(self, root: str, rel: str) -> None:
        """Record that *rel* was created (or moved into place) in *root*."""
        self.created.setdefault(root, set()).add(rel)

    def change(self, root: str, rel: str) -> None:
        """Record that the existing file *rel* in *root* was changed."""
        self.changed.setdefault(root, set()).add(rel)

    def move(self, root: str, rel: str) -> None:
        """Record that *rel* in *root* is a rename target."""
        self.create(root, rel)
        self.moved.setdefault(root, set()).add(rel)

    def is_new(self, root: str, rel: str) -> bool:
        """Whether *rel* or one of its ancestors was created in this run."""
        created = self.created.get(root)
        if not created:
            return False
        while True:
            if rel in created:
                return True
            if not rel:
                return False
            rel = rel.rpartition("/")[0]

    def is_changed(self, root: str, rel: str) -> bool:
        """Whether *rel* is new or was changed in this run."""
        return rel in self.changed.get(root, ()) or self.is_new(root, rel)

    def roots(self) -> set[str]:
        """The roots with any entry."""
        return set(self.created) | set(self.changed)


def _join(a: str, b: str) -> str:
    return f"{a}/{b}" if a else b


def config_problem(data: bytes, *, before: bytes | None = None) -> str | None:
    """Why the git config *data* could make git run code (None if it cannot).

    Parsed by git itself (``git config --file - --list --no-includes``), so
    what is checked is exactly what git would read. With *before* (the
    content it replaces, trusted), only entries it adds are checked.
    """
    entries = _entries(data)
    if entries is None:
        return "git cannot parse it"
    if before is not None:
        old = _entries(before) or []
        for entry in old:
            if entry in entries:
                entries.remove(entry)
    for name, value in entries:
        section, _, rest = name.partition(".")
        sub, _, key = rest.rpartition(".")
        kind = _KEYS.get((section.lower(), bool(sub), key.lower()))
        if kind is None:
            return f"the key {name} is not one git writes itself"
        if not _value_ok(kind, value):
            return f"the value of {name} could choose a program"
    return None


def _entries(data: bytes) -> list[tuple[str, str]] | None:
    """``(key, value)`` of every entry of the git config *data*; None if git cannot parse it."""
    import shutil
    import subprocess

    git = shutil.which("git", path="/usr/bin:/bin:/usr/local/bin")
    if git is None:
        return None
    env = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [git, "config", "--file", "-", "--no-includes", "--null", "--list"],
        input=data,
        capture_output=True,
        env=env,
        check=False,
        timeout=30,
    )
    if proc.returncode != 0:
        return None
    found: list[tuple[str, str]] = []
    for entry in proc.stdout.split(b"\0"):
        if entry:
            name_b, _, value_b = entry.partition(b"\n")
            found.append((os.fsdecode(name_b), os.fsdecode(value_b)))
    return found


def _value_ok(kind: str, value: str) -> bool:
    low = value.strip().lower()
    if kind == "bool":
        return low in _BOOLS
    if kind == "update":
        return low in _UPDATES
    if kind == "rebase":
        return low in _REBASES
    if kind == "url":
        scheme, sep, _ = value.partition("::")
        transport_helper = bool(sep) and all(c.isalnum() or c in "+-." for c in scheme)
        return not (transport_helper or value.startswith("-") or "\n" in value)
    return True


class _Checker:
    """One root's check; see :func:`check_root`."""

    def __init__(
        self, root_fd: int, root: str, journal: Journal, writable: tuple[str, ...]
    ) -> None:
        self.root_fd = root_fd
        self.root = root.rstrip("/") or "/"
        self.journal = journal
        self.writable = writable
        self.findings: list[Finding] = []
        self.seen_gitdirs: set[str] = set()

    # -------------------------------------------------------------- helpers
    def new(self, rel: str) -> bool:
        return self.journal.is_changed(self.root, rel)

    def sandbox(self, rel: str) -> str:
        return self.root if not rel else self.root.rstrip("/") + "/" + rel

    def open_dir(self, rel: str) -> int | None:
        """An fd for the directory *rel* below the root, through no symlink; None if none."""
        fd = os.dup(self.root_fd)
        for part in rel.split("/") if rel else ():
            try:
                if part in ("", ".", ".."):
                    raise OSError(errno.EINVAL, "not a normal path")
                nxt = os.open(
                    part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
                )
            except OSError:
                os.close(fd)
                return None
            os.close(fd)
            fd = nxt
        return fd

    def lstat(self, rel: str) -> os.stat_result | None:
        parent, _, name = rel.rpartition("/")
        fd = self.open_dir(parent)
        if fd is None:
            return None
        try:
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            return None
        finally:
            os.close(fd)

    def read(self, rel: str, limit: int) -> bytes | None:
        parent, _, name = rel.rpartition("/")
        dfd = self.open_dir(parent)
        if dfd is None:
            return None
        try:
            fd = os.open(
                name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd
            )
        except OSError:
            return None
        finally:
            os.close(dfd)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            chunks, total = [], 0
            while total <= limit:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def quarantine(self, rel: str, reason: str) -> None:
        """Rename *rel* out of git's way (never following a symlink) and record it."""
        parent, _, name = rel.rpartition("/")
        fd = self.open_dir(parent)
        target = name + QUARANTINE_SUFFIX
        if fd is not None:
            try:
                for n in range(100):
                    target = name + QUARANTINE_SUFFIX + (f".{n}" if n else "")
                    try:
                        os.stat(target, dir_fd=fd, follow_symlinks=False)
                    except FileNotFoundError:
                        os.rename(name, target, src_dir_fd=fd, dst_dir_fd=fd)
                        break
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    reason += f" (could not quarantine it: {exc.strerror})"
            finally:
                os.close(fd)
        self.findings.append(
            Finding(self.sandbox(rel), reason, self.sandbox(_join(parent, target)))
        )

    # -------------------------------------------------------------- the rules
    def check_dir(self, rel: str) -> None:
        """What git discovers in the directory *rel*: ``rel/.git`` and *rel* itself."""
        dot_git = _join(rel, ".git")
        st = self.lstat(dot_git)
        if st is not None:
            if stat.S_ISDIR(st.st_mode):
                self.check_gitdir(dot_git)
            elif self.new(dot_git):
                if stat.S_ISLNK(st.st_mode):
                    self.quarantine(dot_git, "a .git symlink made in the sandbox")
                elif stat.S_ISREG(st.st_mode):
                    self.check_link(dot_git, rel, b"gitdir:")
        name = rel.rpartition("/")[2]
        if name == ".git" or any(
            self.lstat(_join(rel, marker)) is not None for marker in ("HEAD", "commondir")
        ):
            self.check_gitdir(rel)

    def check_link(self, rel: str, base: str, prefix: bytes) -> None:
        """A ``.git`` file or ``commondir`` at *rel*, relative to *base*."""
        data = self.read(rel, _MAX_LINK)
        if data is None:
            self.quarantine(rel, "an unreadable git redirect made in the sandbox")
            return
        text = data.strip()
        if prefix:
            if not text.startswith(prefix):
                return  # git ignores a .git file without "gitdir:" (it is no repository)
            text = text[len(prefix) :].strip()
        target = os.path.normpath(os.path.join(self.sandbox(base), os.fsdecode(text)))
        problem = self.redirect_problem(target)
        if problem is not None:
            self.quarantine(rel, problem)

    def redirect_problem(self, target: str) -> str | None:
        """Why a redirect made in this run may not lead to *target* (None if it may)."""
        root = self.root.rstrip("/")
        if target == self.root or target.startswith(root + "/"):
            rel = target[len(root) :].strip("/")
            st = self.lstat(rel) if rel else None
            if st is None:
                if rel and not self._has_symlink(rel):
                    return None  # leads nowhere: git finds no repository there
                return "a git redirect made in the sandbox through a symlink or to the root"
            if not stat.S_ISDIR(st.st_mode):
                return "a git redirect made in the sandbox to something that is no directory"
            if self.new(rel):
                self.check_gitdir(rel)
                return None
            if ".git" in rel.split("/"):
                return None
            return (
                "a git redirect made in the sandbox to a directory that is no git "
                "administrative directory"
            )
        if any(target == w or target.startswith(w.rstrip("/") + "/") for w in self.writable):
            return "a git redirect made in the sandbox to an area the sandbox can write"
        if ".git" in target.split("/"):
            return None
        return "a git redirect made in the sandbox to a directory that is no git administrative directory"

    def _has_symlink(self, rel: str) -> bool:
        parts = rel.split("/")
        for i in range(1, len(parts) + 1):
            st = self.lstat("/".join(parts[:i]))
            if st is None:
                return False
            if stat.S_ISLNK(st.st_mode):
                return True
        return False

    def check_gitdir(self, rel: str) -> None:
        """The code-bearing inputs of the gitdir *rel* that this run created or changed."""
        if rel in self.seen_gitdirs:
            return
        self.seen_gitdirs.add(rel)
        for name in ("config", "config.worktree"):
            entry = _join(rel, name)
            st = self.lstat(entry)
            if st is None or not self.new(entry):
                continue
            if not stat.S_ISREG(st.st_mode):
                self.quarantine(entry, f"a git {name} that is no regular file, made in the sandbox")
                continue
            data = self.read(entry, _MAX_CONFIG)
            problem = "unreadable" if data is None else config_problem(data)
            if problem is not None:
                self.quarantine(entry, f"a git {name} made in the sandbox: {problem}")
        self.check_hooks(_join(rel, "hooks"))
        common = _join(rel, "commondir")
        st = self.lstat(common)
        if st is not None and self.new(common):
            if stat.S_ISREG(st.st_mode):
                self.check_link(common, rel, b"")
            else:
                self.quarantine(
                    common, "a git commondir that is no regular file, made in the sandbox"
                )

    def check_hooks(self, rel: str) -> None:
        st = self.lstat(rel)
        if st is None:
            return
        if stat.S_ISLNK(st.st_mode):
            if self.new(rel):
                self.quarantine(rel, "a git hooks symlink made in the sandbox")
            return
        if not stat.S_ISDIR(st.st_mode):
            return
        fd = self.open_dir(rel)
        if fd is None:
            return
        try:
            listing = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
        except OSError:
            return
        finally:
            os.close(fd)
        try:
            names = os.listdir(listing)
        finally:
            os.close(listing)
        for name in names:
            entry = _join(rel, name)
            if not self.new(entry):
                continue
            est = self.lstat(entry)
            if est is None:
                continue
            if not (stat.S_ISREG(est.st_mode) and name.endswith(".sample")):
                self.quarantine(entry, "a git hook made in the sandbox")


def check_root(
    root_fd: int, root: str, journal: Journal, writable: tuple[str, ...] = ()
) -> list[Finding]:
    """Check and quarantine what git would discover where the run touched *root*.

    *root_fd* is an ``O_PATH`` fd of the supervised root whose sandbox path is
    *root*; *writable* lists the other sandbox paths the sandbox could write
    (redirects may not lead there). Returns what was quarantined.
    """
    checker = _Checker(root_fd, root, journal, (*writable, *_SCRATCH))
    dirs: set[str] = set()
    touched = journal.created.get(checker.root, set()) | journal.changed.get(checker.root, set())
    # the parents of what the run touched, up to the root (a touched directory
    # that is nobody's parent holds nothing the run made: nothing to discover)
    for rel in touched:
        while rel:
            rel = rel.rpartition("/")[0]
            if rel in dirs:
                break
            dirs.add(rel)
    for moved in journal.moved.get(checker.root, ()):
        fd = checker.open_dir(moved)
        if fd is None:
            continue
        dirs.add(moved)
        try:
            for top, subdirs, _files, _dfd in os.fwalk(".", dir_fd=fd):
                here = _join(moved, top[2:]) if top.startswith("./") else moved
                for d in subdirs:
                    dirs.add(_join(here, d))
        finally:
            os.close(fd)
    for rel in sorted(dirs, key=lambda r: (r.count("/"), r)):
        st = checker.lstat(rel) if rel else os.fstat(root_fd)
        if st is not None and stat.S_ISDIR(st.st_mode):
            checker.check_dir(rel)
    return checker.findings

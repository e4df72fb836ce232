"""The settings keys, one declarative row each.

This table is the single source of truth about settings keys. It drives:

* validation (:mod:`corral.policy._validate`): which keys exist, their kinds;
* merging (:mod:`corral.policy._merge`): scalars replace, lists concatenate,
  maps merge per name (:attr:`Key.merge`);
* the untrusted-project rule: each row's *tighten direction* says which
  changes an untrusted project file may make (:attr:`Key.tighten`);
* building the :class:`~corral.policy.Policy` (:attr:`Key.attr`) and so the
  defaults, which come from :mod:`corral.policy._defaults`, never from here;
* the JSON Schema, ``docs/policy-reference.md`` and ``corral policy --explain``.

Keys are JSON camelCase paths (``resources.memory``). Rows are processed in
table order within a layer; ``isolation`` comes before ``backend`` because an
untrusted ``backend`` is judged against the isolation minimum in force.

Extending the table (``integrations.*``): integrations (the Claude Code hook,
the MCP server ...) declare their own settings as rows in
:data:`INTEGRATION_KEYS` below, e.g.::

    Key(path="integrations.claudeCode.unsandboxedCommands", kind=COMMAND_PATTERNS,
        tighten=LOOSENS, description="Commands the hook lets run without corral.")

Those rows use the same kinds and tighten directions as the core keys, so they
get validation, merging, the untrusted rule, schema and docs for free; their
values are returned in :attr:`ResolvedSettings.integrations
<corral.policy.ResolvedSettings.integrations>` (they are not part of the
Policy). Code that needs keys at run time only (tests, plugins) builds its own
table with :meth:`KeyTable.extended` and passes it to ``load_settings(keys=...)``.
"""

from __future__ import annotations

from .._frozen import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = [
    "BACKENDS",
    "BACKEND_ISOLATION",
    "CORE_KEYS",
    "INTEGRATION_KEYS",
    "KEYS",
    "Key",
    "KeyTable",
]

# ----------------------------------------------------------------- kinds
# Scalar kinds.
STRING = "string"  # a non-empty string
ENUM = "enum"  # one of Key.choices
BOOL = "bool"
INT = "int"  # a positive integer
NUMBER = "number"  # a positive number
SIZE = "size"  # bytes: 1073741824 or "1G" (see _units)
DURATION = "duration"  # seconds: 30 or "30s" (see _units)
PATH = "path"  # absolute, ~/..., or relative to the workspace
UNIX_SOCKETS = "unix-sockets"  # true, false, or a non-empty list of absolute socket paths
# List kinds: concatenate across layers; "!x" removes an earlier x.
STRINGS = "strings"  # non-empty strings
PATHS = "paths"  # like PATH, each
PATH_PATTERNS = "path-patterns"  # path globs; relative ones stay workspace-relative
ENV_PATTERNS = "env-patterns"  # environment variable names or globs (LC_*)
COMMAND_PATTERNS = "command-patterns"  # command-line globs ("npm publish*")
HOSTS = "hosts"  # host, *.host, host:port, IP, CIDR
KEY_PATHS = "key-paths"  # names of other keys ("resources.memory")
CREDENTIALS = "credentials"  # [{name, from, commands, hosts, mode}]; "!NAME" removes
RULES = "rules"  # [{match, ...overrides}]; "!MATCH" removes
# Map kinds: merge per name; a null value removes the name.
ENV_MAP = "env-map"  # {NAME: "value"}
PATH_MAP = "path-map"  # {name: path}
PROFILES = "profiles"  # {name: {...overrides}}

SCALAR_KINDS = frozenset({STRING, ENUM, BOOL, INT, NUMBER, SIZE, DURATION, PATH, UNIX_SOCKETS})
LIST_KINDS = frozenset(
    {
        STRINGS,
        PATHS,
        PATH_PATTERNS,
        ENV_PATTERNS,
        COMMAND_PATTERNS,
        HOSTS,
        KEY_PATHS,
        CREDENTIALS,
        RULES,
    }
)
MAP_KINDS = frozenset({ENV_MAP, PATH_MAP, PROFILES})

# ----------------------------------------------------------------- merge rules
REPLACE = "replace"  # the later layer's value replaces the earlier one
CONCAT = "concat"  # entries accumulate; duplicates dropped; "!x" removes x
PER_KEY = "per-key"  # names accumulate; a later value for a name replaces it; null removes it

# ----------------------------------------------------------------- tighten directions
# What an untrusted project layer may change (see docs/policy-reference.md).
LOOSENS = "loosens"  # every change loosens: ignored
HIGHER = "higher"  # a higher rank (Key.choices order) tightens
LOWER = "lower"  # a lower rank or smaller number tightens; null (no limit) loosens
TRUE_TIGHTENS = "true"  # setting true tightens
FALSE_TIGHTENS = "false"  # setting false tightens
BACKEND = "backend"  # a backend at least as strong as the current one and the minimum
ADDITIONS = "additions"  # list: adding entries tightens, "!x" removals loosen
REMOVALS = "removals"  # list: "!x" removals tighten, adding entries loosens

TIGHTEN_DIRECTIONS = frozenset(
    {LOOSENS, HIGHER, LOWER, TRUE_TIGHTENS, FALSE_TIGHTENS, BACKEND, ADDITIONS, REMOVALS}
)

#: Backend names and the isolation level each provides (``auto`` picks one
#: that meets ``isolation``; see DESIGN §3).
BACKEND_ISOLATION: dict[str, str] = {
    "auto": "",
    "bubblewrap": "namespace",
    "landlock": "process",
    "gvisor": "kernel",
    "podman": "namespace",
    "docker": "namespace",
    "microvm": "vm",
    "boxlite": "vm",
    "firecracker": "vm",
    "seatbelt": "process",
    "none": "none",
}

#: Valid values of ``backend``.
BACKENDS: tuple[str, ...] = tuple(BACKEND_ISOLATION)


class Key(Record):
    """One settings key.

    Attributes:
        path: dotted JSON path, e.g. ``"resources.memory"``.
        kind: what the value is (``SIZE``, ``PATHS`` ...; see the constants).
        description: one or two sentences for the docs, schema and explain.
        tighten: which changes an untrusted project layer may make.
        choices: the valid values of an ``ENUM``, weakest first where ranked.
        nullable: ``null`` is a valid value (for limits: no limit).
        attr: the matching :class:`~corral.policy.Policy` attribute path
            (``"resources.memory"``, ``"env.pass_through"``); its default comes
            from the built-in policy. ``None`` for keys outside the Policy.
        default: the default of a key without ``attr`` (``None`` for a list or
            map means empty).
        override: the key may appear in ``rules`` and ``profiles`` entries.

    Example::

        Key(path="integrations.mcp.maxSandboxes", kind=INT, tighten=LOWER,
            default=8, description="How many MCP sandboxes may exist at once.")
    """

    path: str
    kind: str
    description: str
    tighten: str
    choices: tuple[str, ...] = ()
    nullable: bool = False
    attr: str | None = None
    default: object = None
    override: bool = True

    @property
    def merge(self) -> str:
        """How layers combine: ``REPLACE``, ``CONCAT`` or ``PER_KEY``."""
        if self.kind in LIST_KINDS:
            return CONCAT
        if self.kind in MAP_KINDS:
            return PER_KEY
        return REPLACE

    @property
    def name(self) -> str:
        """The last component of :attr:`path`."""
        return self.path.rpartition(".")[2]


class KeyTable:
    """An indexed, validated set of :class:`Key` rows.

    Object nodes (``filesystem``, ``integrations.claudeCode`` ...) are the
    prefixes of the rows' paths; ``integrations`` always exists.
    """

    __slots__ = ("_by_path", "_children", "rows")

    def __init__(self, rows: Iterable[Key]) -> None:
        self.rows: tuple[Key, ...] = tuple(rows)
        self._by_path: dict[str, Key] = {}
        self._children: dict[str, list[str]] = {"": [], "integrations": []}
        for row in self.rows:
            _check_row(row)
            if row.path in self._by_path:
                raise ValueError(f"settings key {row.path!r} is declared twice")
            if row.path in self._children:
                raise ValueError(f"settings key {row.path!r} is both a value and an object")
            self._by_path[row.path] = row
            parent = ""
            for part in row.path.split("."):
                child = f"{parent}.{part}" if parent else part
                if child in self._by_path and child != row.path:
                    raise ValueError(f"settings key {child!r} is both a value and an object")
                siblings = self._children.setdefault(parent, [])
                if part not in siblings:
                    siblings.append(part)
                if child != row.path:
                    self._children.setdefault(child, [])
                parent = child
        if "integrations" not in self._children[""]:
            self._children[""].append("integrations")

    def get(self, path: str) -> Key | None:
        """Return the row for *path*, or ``None`` (unknown key or object node)."""
        return self._by_path.get(path)

    def children(self, path: str) -> tuple[str, ...] | None:
        """Return the names directly below the object node *path* (``""`` is the top)."""
        names = self._children.get(path)
        return None if names is None else tuple(names)

    def extended(self, rows: Iterable[Key]) -> KeyTable:
        """Return a new table with *rows* added (for ``integrations.*`` keys)."""
        return KeyTable(self.rows + tuple(rows))

    def restriction_paths(self) -> tuple[str, ...]:
        """Paths that ``allowDegraded`` may name: the Policy's restrictions and limits.

        Those are the keys that can tighten the policy; openings (``allowWrite``,
        ``env.set`` ...) and the backend choice cannot be "left unenforced".
        """
        return tuple(
            row.path
            for row in self.rows
            if row.attr is not None and row.tighten not in (LOOSENS, REMOVALS, BACKEND)
        )


_KINDS = SCALAR_KINDS | LIST_KINDS | MAP_KINDS
_LIST_DIRECTIONS = frozenset({LOOSENS, ADDITIONS, REMOVALS})
_MAP_DIRECTIONS = frozenset({LOOSENS})
_SCALAR_DIRECTIONS = TIGHTEN_DIRECTIONS - {ADDITIONS, REMOVALS}


def _check_row(row: Key) -> None:
    """Reject rows the loader could not honour (a programming error, not a user one)."""
    if row.kind not in _KINDS:
        raise ValueError(f"settings key {row.path!r}: unknown kind {row.kind!r}")
    if row.tighten not in TIGHTEN_DIRECTIONS:
        raise ValueError(f"settings key {row.path!r}: unknown tighten direction {row.tighten!r}")
    if (row.kind == ENUM) != bool(row.choices):
        raise ValueError(f"settings key {row.path!r}: choices go with kind 'enum' only")
    allowed = (
        _LIST_DIRECTIONS
        if row.kind in LIST_KINDS
        else _MAP_DIRECTIONS
        if row.kind in MAP_KINDS
        else _SCALAR_DIRECTIONS
    )
    if row.tighten not in allowed:
        raise ValueError(
            f"settings key {row.path!r}: tighten direction {row.tighten!r} does not fit kind "
            f"{row.kind!r}"
        )
    if not row.description:
        raise ValueError(f"settings key {row.path!r}: empty description")
    is_integration = row.path.startswith("integrations.")
    if is_integration and (row.attr is not None or row.path.count(".") < 2):
        raise ValueError(
            f"settings key {row.path!r}: integration keys are integrations.<tool>.<key> "
            "and have no Policy attribute"
        )
    if not is_integration and row.attr is None and row.kind not in (RULES, PROFILES):
        raise ValueError(f"settings key {row.path!r}: core keys need a Policy attribute")


#: The core keys (DESIGN §4), in processing order.
CORE_KEYS: tuple[Key, ...] = (
    Key(
        path="isolation",
        kind=ENUM,
        choices=("process", "namespace", "kernel", "vm"),
        tighten=HIGHER,
        attr="isolation",
        description=(
            "The minimum isolation level the backend must provide: process (Landlock, "
            "Seatbelt) < namespace (bubblewrap, containers) < kernel (gVisor) < vm "
            "(micro-VM). corral refuses to run when no available backend meets it."
        ),
    ),
    Key(
        path="backend",
        kind=ENUM,
        choices=BACKENDS,
        tighten=BACKEND,
        attr="backend",
        description=(
            '"auto" picks the fastest available backend that meets `isolation`; a name '
            'forces that backend. "none" runs without a sandbox (an explicit opt-out).'
        ),
    ),
    Key(
        path="allowDegraded",
        kind=KEY_PATHS,
        tighten=REMOVALS,
        attr="allow_degraded",
        description=(
            'Names of rules and limits (e.g. "resources.memory") that may be left '
            "unenforced when this machine cannot enforce them. Without an entry here "
            "such a run is refused; every weakening is recorded on the Outcome."
        ),
    ),
    Key(
        path="filesystem.workspace",
        kind=PATH,
        tighten=LOOSENS,
        attr="filesystem.workspace",
        override=False,
        description=(
            "The project directory, writable unless `readOnly`. Default: the git top-level "
            "above the current directory, else the current directory. Project files cannot "
            "set it (they are found through it); a relative value is relative to the "
            "current directory."
        ),
    ),
    Key(
        path="filesystem.allowHomeWorkspace",
        kind=BOOL,
        tighten=LOOSENS,
        attr="filesystem.allow_home_workspace",
        description=(
            "Accept the home directory (or a directory above it) as the workspace. Refused "
            "by default: it would make the shell rc files, the editor and agent configs and "
            "corral's own settings writable to the command. Project files cannot set it."
        ),
    ),
    Key(
        path="filesystem.readOnly",
        kind=BOOL,
        tighten=TRUE_TIGHTENS,
        attr="filesystem.read_only",
        description="Mount the workspace read-only too.",
    ),
    Key(
        path="filesystem.allowWrite",
        kind=PATHS,
        tighten=REMOVALS,
        attr="filesystem.allow_write",
        description="Paths writable in addition to the workspace and the private TMPDIR.",
    ),
    Key(
        path="filesystem.denyWrite",
        kind=PATH_PATTERNS,
        tighten=ADDITIONS,
        attr="filesystem.deny_write",
        description=(
            "Path globs that stay read-only even inside writable areas. Relative globs are "
            "relative to the workspace; `**` matches any number of directories."
        ),
    ),
    Key(
        path="filesystem.denyRead",
        kind=PATHS,
        tighten=ADDITIONS,
        attr="filesystem.deny_read",
        description=(
            "Paths that are unreadable (hidden) inside the sandbox. A glob "
            "(`/srv/certs/**/*.pem`, `**/.env`) hides every path it matches when the command "
            "starts, on every backend; the walk does not follow links and is bounded (a glob "
            "that looks at more than 50000 entries or matches more than 512 paths is refused, "
            "exit 125). Paths the host creates under a matching name during the run are not "
            "hidden."
        ),
    ),
    Key(
        path="filesystem.allowRead",
        kind=PATHS,
        tighten=REMOVALS,
        attr="filesystem.allow_read",
        description=(
            "Paths re-exposed, read-only, beneath a `denyRead` entry or inside the sandbox's "
            "private `/tmp` and `/var/tmp` (e.g. a virtualenv under /tmp)."
        ),
    ),
    Key(
        path="filesystem.protect",
        kind=PATH_PATTERNS,
        tighten=ADDITIONS,
        attr="filesystem.protect",
        description=(
            "Workspace-relative globs of persistence points (shell rc files, .git/hooks, "
            "agent configs ...) that may not be created, changed, renamed or deleted at "
            "any depth, whether or not they exist."
        ),
    ),
    Key(
        path="network.mode",
        kind=ENUM,
        choices=("none", "allowlist", "open"),
        tighten=LOWER,
        attr="network.mode",
        description=(
            '"none": no network at all; "allowlist": egress only through corral\'s proxy to '
            '`allow` minus `deny`; "open": the host network.'
        ),
    ),
    Key(
        path="network.allow",
        kind=HOSTS,
        tighten=REMOVALS,
        attr="network.allow",
        description=(
            "Hosts reachable in allowlist mode: host, *.host (subdomains only, not the apex), "
            "host:port, an IP address or a CIDR; matched case-insensitively after "
            "canonicalisation. Over-broad patterns (*, *.com, public or multi-tenant suffixes "
            "such as *.co.uk or *.ngrok.io, networks wider than /8 or /16) are refused. A name "
            "that resolves to a loopback, private, link-local, shared (CGNAT) or cloud-metadata "
            "address is refused unless that address is allowed too. localhost:PORT, "
            "127.0.0.1:PORT and [::1]:PORT name a local service on the host: it is forwarded "
            "to the same address inside the sandbox."
        ),
    ),
    Key(
        path="network.deny",
        kind=HOSTS,
        tighten=ADDITIONS,
        attr="network.deny",
        description=(
            "Hosts refused even when `allow` matches (checked first); also applied to the "
            "addresses an allowed name resolves to. Same patterns as `allow`, plus * and *.TLD."
        ),
    ),
    Key(
        path="network.allowUnixSockets",
        kind=UNIX_SOCKETS,
        tighten=FALSE_TIGHTENS,
        attr="network.allow_unix_sockets",
        description=(
            "true: let the command create AF_UNIX sockets, and so reach host sockets it can "
            "see (docker.sock, ssh-agent). A list of absolute socket paths "
            '(["/run/postgresql/.s.PGSQL.5432"]): only those host sockets are reachable; '
            "/run and /var/run are replaced by empty directories with the named sockets bound "
            "back, and every other listening socket of the host's network namespace is "
            "hidden. Bubblewrap only, network.mode none or allowlist; a named socket that is "
            "missing, not a socket, or under a writable directory is refused. An untrusted "
            "project may set false or a list narrower than the one in force."
        ),
    ),
    Key(
        path="network.allowRequests",
        kind=STRINGS,
        tighten=REMOVALS,
        attr="network.allow_requests",
        description=(
            'Request rules "METHOD host/path" (globs: * matches anything, also "/"; METHOD may '
            'be *), e.g. "GET github.com/*". Once a rule names a host, only the requests to it '
            "that some rule allows pass. Checked on plain HTTP and on HTTPS to the hosts whose "
            "TLS the proxy terminates: every host a request rule or a masked credential names "
            "(a rule for * terminates every host). Allowlist mode on bubblewrap only (refused "
            "elsewhere)."
        ),
    ),
    Key(
        path="network.denyRequests",
        kind=STRINGS,
        tighten=ADDITIONS,
        attr="network.deny_requests",
        description=(
            'Request rules refused with 403, checked before allowRequests: "POST '
            '*/git-receive-pack" (no git push), "PUT registry.npmjs.org/*" (no npm publish). '
            "Same syntax and scope as allowRequests."
        ),
    ),
    Key(
        path="resources.memory",
        kind=SIZE,
        nullable=True,
        tighten=LOWER,
        attr="resources.memory",
        description="Memory for the whole command tree. null: no limit.",
    ),
    Key(
        path="resources.pids",
        kind=INT,
        nullable=True,
        tighten=LOWER,
        attr="resources.pids",
        description="Processes and threads alive at once. null: no limit.",
    ),
    Key(
        path="resources.cpus",
        kind=NUMBER,
        nullable=True,
        tighten=LOWER,
        attr="resources.cpus",
        description="CPU bandwidth in cores, e.g. 1.5. null: no limit.",
    ),
    Key(
        path="resources.cpuTime",
        kind=DURATION,
        nullable=True,
        tighten=LOWER,
        attr="resources.cpu_time",
        description="CPU time per process (RLIMIT_CPU). null: no limit.",
    ),
    Key(
        path="resources.timeout",
        kind=DURATION,
        nullable=True,
        tighten=LOWER,
        attr="resources.timeout",
        description=(
            "Wall-clock time before the command tree is stopped (exit 124). null: no limit."
        ),
    ),
    Key(
        path="resources.output",
        kind=SIZE,
        nullable=True,
        tighten=LOWER,
        attr="resources.output",
        description=(
            "Bytes of stdout plus stderr passed on; the excess is dropped and reported. "
            "null: no limit."
        ),
    ),
    Key(
        path="resources.disk",
        kind=SIZE,
        nullable=True,
        tighten=LOWER,
        attr="resources.disk",
        description=(
            "Disk space the command may fill: each private temporary directory (/tmp, "
            "/var/tmp) and /dev/shm is a tmpfs of this size (bubblewrap, gVisor, podman, "
            "docker); on bubblewrap /dev itself is then read-only. /dev of gVisor, podman and "
            "docker is their own tmpfs, writable when the command is uid 0 inside (a root "
            "caller with an image or with isolation degraded): gVisor then refuses the rule, "
            "podman and docker refuse a size under their 64 MiB. Writes to "
            "the workspace, `allowWrite` paths and `caches` go to the host filesystem, which "
            "has no per-sandbox quota: with any of them writable the run is refused (exit 125) "
            "unless `allowDegraded` lists resources.disk. Landlock and Seatbelt (host "
            "directories as TMPDIR) refuse it. null: no limit."
        ),
    ),
    Key(
        path="resources.killGrace",
        kind=DURATION,
        tighten=LOWER,
        attr="resources.kill_grace",
        description="Time between SIGTERM and SIGKILL when the command tree is stopped.",
    ),
    Key(
        path="env.pass",
        kind=ENV_PATTERNS,
        tighten=REMOVALS,
        attr="env.pass_through",
        description=(
            "Host environment variables (names or globs such as LC_*) passed into the "
            "sandbox. Nothing else from the host environment is. The locale variables (LANG, "
            "LANGUAGE, LC_*) pass only when their value is a locale name (en_US.UTF-8@euro)."
        ),
    ),
    Key(
        path="env.set",
        kind=ENV_MAP,
        tighten=LOOSENS,
        attr="env.set",
        description="Variables set in the sandbox, after pass-through. null removes a name.",
    ),
    Key(
        path="env.deny",
        kind=ENV_PATTERNS,
        tighten=ADDITIONS,
        attr="env.deny",
        description="Names or globs never passed, even when `pass` matches.",
    ),
    Key(
        path="credentials",
        kind=CREDENTIALS,
        tighten=REMOVALS,
        attr="credentials",
        description=(
            'Secrets injected only for matching commands: {"name": variable, "from": '
            '"env:NAME" or "file:/path", "commands": [globs], "hosts": [hosts], "mode": '
            '"env" or "mask"}. The variable exists in the sandbox only when a command glob '
            "matches the command line and every host is reachable under the network policy; "
            "otherwise it is absent, even if env.pass would pass it. The audit log records the "
            'names injected, never the values. "mask": the sandbox gets a random per-run '
            "placeholder and the egress proxy puts the secret in its place only in requests to "
            '`hosts` (needs hosts and allowlist mode; "headers": ["authorization"] by default; '
            '"query": true also replaces it in the URL query). '
            '"!NAME" removes an earlier credential.'
        ),
    ),
    Key(
        path="caches",
        kind=PATH_MAP,
        tighten=LOOSENS,
        attr="caches",
        description=(
            "Persistent cache volumes, {name: path}. null removes a name. On bubblewrap, "
            "Landlock, gVisor and Seatbelt the path is an existing host directory made writable "
            "at the same path (a missing one is refused, exit 125); podman and docker mount "
            "the named volume `corral-cache-NAME` at the path instead."
        ),
    ),
    Key(
        path="image",
        kind=STRING,
        nullable=True,
        tighten=LOOSENS,
        attr="image",
        description=(
            "For container and VM backends: an OCI image reference, an OCI layout "
            "directory, a root filesystem directory or corral:NAME (built by 'corral "
            "image build NAME'). Unset: podman and docker run corral:python, gVisor "
            "the host's / read-only. Backends that run the host's root filesystem "
            "(bubblewrap, Landlock, Seatbelt) refuse it (exit 125), so `auto` picks one "
            "that runs images."
        ),
    ),
    Key(
        path="rules",
        kind=RULES,
        tighten=LOOSENS,
        override=False,
        description=(
            'Per-command overrides: [{"match": command glob, ...any other key except '
            "rules, profiles and filesystem.workspace}]. Every rule whose glob matches the "
            'command line applies, in order, after the profile. "!GLOB" removes earlier '
            "rules with that match."
        ),
    ),
    Key(
        path="profiles",
        kind=PROFILES,
        tighten=LOOSENS,
        override=False,
        description=(
            "Named sets of overrides, {name: {...}}, selected with --profile or "
            "CORRAL_PROFILE. null removes a name."
        ),
    ),
)

#: Keys of integrations (``integrations.<tool>.<key>``). Integration modules
#: append their rows here; see the module docstring.
INTEGRATION_KEYS: tuple[Key, ...] = (
    Key(
        path="integrations.claudeCode.unsandboxedCommands",
        kind=COMMAND_PATTERNS,
        tighten=REMOVALS,
        override=False,
        description=(
            'Command-line globs ("docker build*") that the Claude Code hook does not '
            "sandbox: it answers `ask`, so Claude Code asks the user before running the "
            "command WITHOUT corral. The glob is matched against the whole command line, "
            "so `docker build*` also matches `docker build . && rm -rf ~`; the user sees it."
        ),
    ),
    Key(
        path="integrations.mcp.maxSandboxes",
        kind=INT,
        tighten=LOWER,
        default=8,
        override=False,
        description="How many sandboxes one `corral mcp` server keeps open at once.",
    ),
    Key(
        path="integrations.mcp.maxOutput",
        kind=SIZE,
        tighten=LOWER,
        default=65536,
        override=False,
        description=(
            "Bytes of stdout and of stderr (each) an MCP tool result carries; the rest is "
            "cut and marked with the number of bytes dropped."
        ),
    ),
    Key(
        path="integrations.mcp.preview",
        kind=BOOL,
        tighten=TRUE_TIGHTENS,
        default=True,
        override=False,
        description=(
            "MCP sandboxes work on a copy-on-write preview of the workspace, so their "
            "changes are reviewed (`sandbox_diff`) before they land (`sandbox_apply`)."
        ),
    ),
    Key(
        path="integrations.cluster.warmVms",
        kind=INT,
        tighten=LOWER,
        nullable=True,
        override=False,
        description=(
            "Booted micro-VMs a `corral.cluster` node agent keeps ready per VM configuration "
            "(memory, CPUs, network device, image) for runs with the microvm backend on that "
            "node; each serves one run, and the agent boots the next in the background. Read "
            "from the node's own settings when its agent starts. null: none."
        ),
    ),
    Key(
        path="integrations.image.packages",
        kind=STRINGS,
        tighten=LOOSENS,
        override=False,
        description="Extra apt packages that `corral image build` installs on top of the preset.",
    ),
)

#: The table the loader, the schema and the docs use.
KEYS = KeyTable(CORE_KEYS + INTEGRATION_KEYS)

"""Package presets for ``corral image build``: ``(package, reason)`` rows per preset."""

from __future__ import annotations

__all__ = ["BASE_PACKAGES", "PRESETS"]

#: Installed in every image on top of Debian's ``minbase`` variant.
BASE_PACKAGES: tuple[tuple[str, str], ...] = (
    ("ca-certificates", "TLS to package indexes through the egress proxy"),
)

#: preset name -> extra packages.
PRESETS: dict[str, tuple[tuple[str, str], ...]] = {
    "base": (),
    "python": (
        ("python3", "the interpreter"),
        ("python3-venv", "virtual environments (and pip through ensurepip)"),
    ),
    "node": (
        ("nodejs", "the runtime"),
        ("npm", "the package manager"),
    ),
    "go": (
        ("golang-go", "the toolchain"),
        ("git", "go get fetches modules with git"),
    ),
}

"""Fixtures for the settings tests: a throw-away home, workspace and environment."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from corral.policy import ResolvedSettings, load_settings, trust_project


class SettingsWorld:
    """A home directory, a git workspace and an environment, all under tmp_path.

    Every load passes cwd, home and environ explicitly, so nothing depends on
    the real user's files or environment.
    """

    def __init__(self, root: str) -> None:
        self.root = root
        self.home = os.path.join(root, "home")
        self.workspace = os.path.join(root, "ws")
        os.makedirs(self.home)
        os.makedirs(os.path.join(self.workspace, ".git"))
        self.environ: dict[str, str] = {"HOME": self.home}

    @property
    def user_file(self) -> str:
        return os.path.join(self.home, ".config", "corral", "settings.json")

    @property
    def project_file(self) -> str:
        return os.path.join(self.workspace, ".corral", "settings.json")

    @property
    def local_file(self) -> str:
        return os.path.join(self.workspace, ".corral", "settings.local.json")

    @property
    def trust_file(self) -> str:
        return os.path.join(self.home, ".local", "state", "corral", "trust.json")

    def write(self, path: str, data: Any) -> str:
        """Write *data* (JSON-encoded unless it is str/bytes) to *path*; return the path."""
        path = os.path.join(self.root, path)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if isinstance(data, bytes):
            content = data
        elif isinstance(data, str):
            content = data.encode()
        else:
            content = json.dumps(data).encode()
        with open(path, "wb") as file:
            file.write(content)
        return path

    def user(self, data: Any) -> str:
        return self.write(self.user_file, data)

    def project(self, data: Any) -> str:
        return self.write(self.project_file, data)

    def local(self, data: Any) -> str:
        return self.write(self.local_file, data)

    def trust(self) -> list[str]:
        return trust_project(self.workspace, home=self.home, environ=self.environ)

    def load(self, **kwargs: Any) -> ResolvedSettings:
        kwargs.setdefault("cwd", self.workspace)
        kwargs.setdefault("home", self.home)
        kwargs.setdefault("environ", self.environ)
        return load_settings(**kwargs)


@pytest.fixture
def world(tmp_path: Any) -> SettingsWorld:
    return SettingsWorld(str(tmp_path))

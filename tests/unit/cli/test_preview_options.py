"""The run-option parser's subcommand extras, as ``corral preview`` uses them."""

from __future__ import annotations

from corral.cli._options import parse_run_options
from corral.cli.commands.preview import EXTRA


def test_preview_options_and_repeatable_allow_protected():
    opts = parse_run_options(
        [
            "--memory",
            "none",
            "--id",
            "pv-0123456789ab",
            "--apply-on-success",
            "--allow-protected",
            ".bashrc",
            "--allow-protected=.git/hooks",
            "--",
            "make",
            "test",
        ],
        extra=EXTRA,
    )
    assert opts.argv == ["make", "test"]
    assert opts.flags == {"resources": {"memory": None}}
    assert opts.extra == {
        "--id": "pv-0123456789ab",
        "--apply-on-success": True,
        "--allow-protected": [".bashrc", ".git/hooks"],
    }

"""How the sessions page names the process that owns a session."""

from corral.ui._sessions import Session


def _session(owner: str) -> Session:
    return Session("sbx-1", 1, owner, "MCP", 0.0, 0, 0, 0, 0.0)


def test_programs_and_paths_are_named_by_their_last_part() -> None:
    owner = "/check/work/main/.venv/bin/python3 /check/work/main/.venv/bin/corral mcp"
    assert _session(owner).owner_short == "python3 corral mcp"


def test_a_long_command_line_is_cut_with_an_ellipsis() -> None:
    shown = _session("python3 -c " + "x" * 100).owner_short
    assert len(shown) == 60 and shown.endswith("\u2026") and shown.startswith("python3 -c x")

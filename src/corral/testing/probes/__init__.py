"""Tiny probe programs run inside sandboxes by the conformance suite.

Each is a standalone Python script (no corral imports) that tries one thing
and reports it on stdout; the suite judges the result and checks the host.
They are copied into the sandbox's workspace, so every backend can run them.
"""

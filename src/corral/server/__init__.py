"""The corral server and its clients' side of the wire (docs/design.md, "The corral server").

``_wire`` (socket path, code stamp, frames), ``_fastclient`` (where the
compiled client is, its sidecar), ``_peers`` (who may connect), ``_server``
(the server itself), ``_codewatch`` (its watch on its own code), ``_slots``
(how many servers a user runs; the ``busy`` record clients read),
``_control`` (``--status`` / ``--stop``).

Deliberately empty: the Python client imports ``_wire`` alone on its hot path.
"""

"""The run pipeline: request -> plan -> launch -> outcome (docs/design.md, "The pipeline").

``_request`` (ExecRequest), ``_outcome`` (Outcome, Violation), ``_runner``
(prepare, launch, audit: the one path every entry point takes), ``_engine``
(spawn, contain, supervise, stop), ``_cgroups`` and ``_launchers`` (limits
and the server's pool of ready cgroups).

Deliberately empty: ``corral run``'s hot path imports single modules of this
package, never the package's re-exports.
"""

"""Testing support: the conformance checks (:mod:`.conformance`) and their probe programs."""

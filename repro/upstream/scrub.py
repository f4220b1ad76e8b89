"""Moved to `repro.core.scrub`: the report (a lower layer than this package) scrubs with it too.
Kept so that `from repro.upstream.scrub import Scrubber` in older code and tests still works."""

from repro.core.scrub import Scrubber as Scrubber
from repro.core.scrub import secret_name as secret_name

__all__ = ["Scrubber", "secret_name"]

"""Old home of the shared CLI options: ``cmr.fleet`` still imports them from here.
Remove once it imports ``cmr.cli.options``."""

from cmr.cli.options import Profile, Region, err, fail

__all__ = ["Profile", "Region", "err", "fail"]

"""A user module that fails while it is imported."""

raise RuntimeError("broken on purpose")

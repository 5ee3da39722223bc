"""The application layer: the ``guardstack`` command and the demo's scenes. Nothing imports it."""

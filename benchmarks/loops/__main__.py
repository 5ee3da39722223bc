"""``python -m benchmarks.loops``: the detector table (see ``score.py``)."""

from benchmarks.loops.score import main

main()

"""Files that mypy checks (``make lint``; ``tests/test_typecheck.py``); never run by pytest."""

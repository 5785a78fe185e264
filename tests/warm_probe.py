"""Run by tests/test_warm.py as ``python -m tests.warm_probe``: prints how it was started."""

import json
import sys

print(json.dumps({"name": __name__, "argv0": sys.argv[0], "path0": sys.path[0]}))

"""Whether the server's python has module ARGV[1], sent as ``python -c`` (never imported by tuitune).

Exit 0: the module is there; 3: it (or its package: find_spec raises for "sglang.x" without
sglang) is not installed; 5: its package fails to import, the reason on stderr."""

import importlib.util
import sys

try:
    found = importlib.util.find_spec(sys.argv[1]) is not None
except ImportError:
    found = False
except Exception as e:
    print(f"{type(e).__name__}: {e}", file=sys.stderr)
    sys.exit(5)
sys.exit(0 if found else 3)

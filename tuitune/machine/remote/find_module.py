"""Whether the server's python has module ARGV[1], sent as ``python -c`` (never imported by tuitune).

Exit 0: the module is there; 3: it (or its package: find_spec raises for "sglang.x" without
sglang) is not installed; 5: its package fails to import, the reason on stderr."""

import importlib.util
import sys


def main() -> int:
    try:
        found = importlib.util.find_spec(sys.argv[1]) is not None
    except ImportError:
        found = False
    except Exception as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 5
    return 0 if found else 3


if __name__ == "__main__":  # (as ``python -c`` too; importing it runs nothing)
    sys.exit(main())

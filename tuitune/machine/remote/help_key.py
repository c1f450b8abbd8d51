"""The key of a cached flag listing, printed (40 hex digits); sent as ``python -c`` with the module
and the listing's own arguments and environment hash as arguments (never imported by tuitune).

What the listing depends on, read without importing the engine (an import of vLLM is most of the
15-30 s its `serve --help=all` takes): the python, the working directory, the module and the
listing's own arguments and environment (argv), the versions of the distributions that provide the
module's top package, and the count and newest modification time of that package's .py files (a
reinstall or an edited checkout changes them; 2,600 files: ~50 ms)."""

import hashlib
import importlib.util
import os
import sys


def main() -> None:
    top = sys.argv[1].split(".")[0]
    parts = [os.path.realpath(sys.executable), sys.version, os.getcwd()] + sys.argv[1:]
    try:
        from importlib import metadata

        try:
            names = sorted(set(metadata.packages_distributions().get(top, [])) | {top})
        except AttributeError:
            names = [top]
        for n in names:
            try:
                parts.append(n + "==" + metadata.version(n))
            except Exception:
                pass
    except ImportError:
        pass
    try:
        spec = importlib.util.find_spec(top)
    except Exception:
        spec = None
    roots = []
    if spec is not None:
        roots = list(spec.submodule_search_locations or []) or ([spec.origin] if spec.origin else [])
    count, newest, stack = 0, 0, list(roots)
    while stack:
        d = stack.pop()
        if os.path.isfile(d):
            count, newest = count + 1, max(newest, os.stat(d).st_mtime_ns)
            continue
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    if e.name != "__pycache__":
                        stack.append(e.path)
                elif e.name.endswith(".py"):
                    count, newest = count + 1, max(newest, e.stat().st_mtime_ns)
            except OSError:
                pass
    parts += [repr(roots), str(count), str(newest)]
    print(hashlib.sha256("\0".join(parts).encode("utf-8", "replace")).hexdigest()[:40])


if __name__ == "__main__":  # (as ``python -c`` too; importing it runs nothing)
    main()

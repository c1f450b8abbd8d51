"""The house's figures (issue 43): modules and lines of tuitune/, the modules over 650 lines, the
functions over 50 and 80 lines and over 8 parameters (self/cls not counted), the imports of an
engine module (engines.sglang / engines.vllm) from outside engines/, and the reads by string key in
the experiments (``x["key"]`` and ``x.get("key")`` in tuitune/experiments/ and the commands that run
them: what typed results replace; the verdict dicts they still share count too).

    python benchmarks/house_figures.py [TREE]        (TREE: a checkout's root; default this one)
    git archive REV tuitune | tar -x -C /tmp/rev && python benchmarks/house_figures.py /tmp/rev
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ENGINE_IMPORT = re.compile(
    r"\s*(from tuitune\.engines\.(sglang|vllm)(_\w+)?\b|from tuitune\.engines import .*\b(sglang|vllm)(_\w+)?\b"
    r"|import tuitune\.engines\.(sglang|vllm)(_\w+)?)"
)


def figures(tree: Path) -> dict:
    root = tree / "tuitune"
    mods = [p for p in root.rglob("*.py") if "__pycache__" not in p.parts]
    sizes = sorted((len(p.read_text().splitlines()), str(p.relative_to(tree))) for p in mods)
    over50 = over80 = params = engine_imports = key_reads = 0
    for p in mods:
        text = p.read_text()
        rel = p.relative_to(root).parts
        experiments = rel[0] == "experiments" or rel == ("commands", "experiments.py")
        for node in ast.walk(ast.parse(text)):
            if experiments and _string_key_read(node):
                key_reads += 1
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                over50 += n > 50
                over80 += n > 80
                a = node.args
                k = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)
                params += k - (1 if a.args and a.args[0].arg in ("self", "cls") else 0) > 8
        if p.relative_to(root).parts[0] != "engines":
            engine_imports += sum(1 for line in text.splitlines() if ENGINE_IMPORT.match(line))
    return {
        "modules": len(mods),
        "lines": sum(n for n, _ in sizes),
        "over_650": [(path, n) for n, path in sizes if n > 650],
        "functions_over_50": over50,
        "functions_over_80": over80,
        "over_8_parameters": params,
        "engine_imports_outside_engines": engine_imports,
        "string_key_reads_experiments": key_reads,
    }


def _string_key_read(node: ast.AST) -> bool:
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
        return isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and bool(node.args)
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    )


def main() -> int:
    tree = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent
    for key, value in figures(tree).items():
        print(f"{key:<32} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

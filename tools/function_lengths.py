"""Count the functions of a package by length: lines from `def` to the function's last line,
docstring included (decorators not). Prints the figures over each limit, then the longest.

Usage, in the project's root:  python tools/function_lengths.py [ninfer] [--list N]
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

LIMITS = (60, 40)


def function_lengths(root: Path) -> list[tuple[int, str]]:
    """(lines, "path:line name") for every function and method under `root`."""
    out = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                out.append((lines, f"{path}:{node.lineno} {node.name}"))
    return sorted(out, reverse=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default="ninfer")
    parser.add_argument("--list", type=int, default=0, help="list the N longest")
    args = parser.parse_args()
    lengths = function_lengths(Path(args.root))
    for limit in LIMITS:
        print(f"functions over {limit} lines: {sum(n > limit for n, _ in lengths)}")
    for n, where in lengths[: args.list]:
        print(f"{n:5d}  {where}")


if __name__ == "__main__":
    main()

"""Mutation run of duragent's correctness core: which mutants the tests kill.

    python scripts/mutate.py [MODULE ...] [--tests FILE ...] [--jobs N] [--only K,...]

Each mutant is one classic change to one place of a module (a comparison
flipped, `and`/`or` swapped, a `not` dropped, a boolean or number changed, a
return value replaced by None, a call statement removed, one entry of a set,
list or dict literal dropped: the transition table's rows). For each, the
module's tests run (`pytest -x -q -m "not slow"`, the fast lane's files that
cover the module, `TESTS` below) against a copy of `src/` holding the mutant;
a mutant is killed when they fail (or hang past `--timeout`).

Survivors are printed with their line and change. A survivor that cannot be
told apart from the original by any test (an equivalent mutant: `x >= 0` for a
count that is never negative) is listed in `scripts/mutate-equivalent.txt` as
`module:line:change`, with a `# why` comment; the figure is taken over the
others. The list is checked: an entry no mutant matches any more is reported.

Prints a table: module, mutants, equivalent, killed, survived, and the share
of non-equivalent mutants killed.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import copy
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The fast lane's files that cover each module of the core.
TESTS: dict[str, list[str]] = {
    "src/duragent/store/_tx.py": [
        "tests/test_transitions.py",
        "tests/test_store_conformance.py",
        "tests/test_store_group_commit.py",
        "tests/test_store_fork.py",
    ],
    "src/duragent/_payloads.py": ["tests/test_payloads.py", "tests/test_store_encoding.py"],
    # test_recovery_rules.py first: it kills most of these mutants, and -x stops there.
    "src/duragent/runtime/_recovery.py": [
        "tests/test_recovery_rules.py",
        "tests/test_crash_recovery.py",
        "tests/test_engine_defects.py",
    ],
    "src/duragent/runtime/_calls.py": [
        "tests/test_recovery_rules.py",
        "tests/test_runtime.py",
        "tests/test_approvals.py",
    ],
    "src/duragent/types.py": ["tests/test_transitions.py", "tests/test_store_conformance.py"],
}

_FLIP = {
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Lt: ast.GtE,
    ast.GtE: ast.Lt,
    ast.Gt: ast.LtE,
    ast.LtE: ast.Gt,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
_ARITH = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult}


@dataclass(frozen=True)
class Mutant:
    module: str
    index: int  # the n-th mutation point of the module, in walk order
    line: int
    change: str

    @property
    def key(self) -> str:
        return f"{self.module}:{self.line}:{self.change}"


def _skipped(tree: ast.AST) -> set[int]:
    """Nodes never mutated: annotations, docstrings, `if TYPE_CHECKING`, logging."""
    skip: set[int] = set()

    def all_of(node: ast.AST | None) -> None:
        if node is not None:
            skip.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        if isinstance(node, (ast.arg, ast.AnnAssign)):
            all_of(node.annotation)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            all_of(node.returns)
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
        if docstring and isinstance(first.value.value, str):  # type: ignore[union-attr]
            all_of(first)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            all_of(node)
        if isinstance(node, ast.Call) and ast.unparse(node.func).startswith(("log.", "logger.")):
            all_of(node)
    return skip


def _points(tree: ast.AST) -> list[tuple[ast.AST, str, int]]:
    """(node, change, sub-index) for every mutation of the tree, in a fixed order."""
    skip = _skipped(tree)
    out: list[tuple[ast.AST, str, int]] = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                if type(op) in _FLIP:
                    out.append((node, f"{type(op).__name__}->{_FLIP[type(op)].__name__}", i))
        elif isinstance(node, ast.BoolOp):
            out.append((node, "and->or" if isinstance(node.op, ast.And) else "or->and", 0))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            out.append((node, "drop not", 0))
        elif isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
            out.append((node, f"{type(node.op).__name__}->{_ARITH[type(node.op)].__name__}", 0))
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            out.append((node, f"{node.value}->{not node.value}", 0))
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            out.append((node, f"{node.value}->{node.value + 1}", 0))
        elif isinstance(node, ast.Return) and node.value is not None:
            if not (isinstance(node.value, ast.Constant) and node.value.value is None):
                out.append((node, "return None", 0))
        elif isinstance(node, ast.Expr) and isinstance(node.value, (ast.Call, ast.Await)):
            out.append((node, "drop call", 0))
        elif isinstance(node, (ast.Set, ast.List)) and len(node.elts) > 1:
            for i, elt in enumerate(node.elts):  # a table's entries: each one dropped
                out.append((node, f"drop {ast.unparse(elt)}", i))
        elif isinstance(node, ast.Dict) and len(node.keys) > 1:
            for i, key in enumerate(node.keys):
                if key is not None:
                    out.append((node, f"drop key {ast.unparse(key)}", i))
    return out


def _apply(node: ast.AST, change: str, sub: int) -> None:
    if isinstance(node, ast.Compare):
        node.ops[sub] = _FLIP[type(node.ops[sub])]()
    elif isinstance(node, ast.BoolOp):
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif isinstance(node, ast.UnaryOp):  # drop `not`: the operand stands alone
        node.op = ast.UAdd()  # rewritten below, so unparse keeps the operand only
    elif isinstance(node, ast.BinOp):
        node.op = _ARITH[type(node.op)]()
    elif isinstance(node, ast.Constant):
        value = node.value
        node.value = (not value) if isinstance(value, bool) else int(value) + 1  # type: ignore[arg-type]
    elif isinstance(node, (ast.Return, ast.Expr)):
        node.value = ast.Constant(value=None)
    elif isinstance(node, (ast.Set, ast.List)):
        del node.elts[sub]
    elif isinstance(node, ast.Dict):
        del node.keys[sub]
        del node.values[sub]


class _DropUAdd(ast.NodeTransformer):
    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.AST:
        self.generic_visit(node)
        return node.operand if isinstance(node.op, ast.UAdd) else node


def mutants_of(module: str) -> tuple[str, list[Mutant]]:
    source = (ROOT / module).read_text()
    tree = ast.parse(source)
    found = [
        Mutant(module, i, getattr(node, "lineno", 0), change)
        for i, (node, change, _) in enumerate(_points(tree))
    ]
    return source, found


def mutated_source(source: str, index: int) -> str:
    tree = ast.parse(source)
    node, change, sub = _points(tree)[index]
    _apply(node, change, sub)
    tree = _DropUAdd().visit(copy.deepcopy(tree))
    return ast.unparse(ast.fix_missing_locations(tree))


def run_tests(overlay: Path, tests: list[str], timeout: float) -> bool:
    """True when the tests pass (the mutant survived)."""
    env = dict(os.environ, PYTHONPATH=str(overlay / "src"), PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"]
    cmd += ["-m", "not slow", "-o", "addopts=", *tests]
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("modules", nargs="*", default=list(TESTS))
    ap.add_argument("--tests", nargs="*", help="test files (default: TESTS for the module)")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant's tests")
    ap.add_argument("--only", help="comma-separated mutant indexes (with one module)")
    ap.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    args = ap.parse_args()

    equivalent_file = ROOT / "scripts" / "mutate-equivalent.txt"
    equivalent = {
        line.split("#")[0].strip()
        for line in (equivalent_file.read_text().splitlines() if equivalent_file.exists() else [])
        if line.split("#")[0].strip()
    }
    rows = []
    matched: set[str] = set()
    for module in args.modules:
        source, mutants = mutants_of(module)
        if args.only:
            wanted = {int(x) for x in args.only.split(",")}
            mutants = [m for m in mutants if m.index in wanted]
        if args.list:
            for m in mutants:
                print(f"{m.index:4} {m.key}")
            continue
        tests = [t for t in (args.tests or TESTS.get(module, [])) if (ROOT / t).exists()]
        if not tests:
            print(f"{module}: no tests to run", file=sys.stderr)
            return 2
        unchanged = _overlay(None)
        passed = run_tests(unchanged, tests, args.timeout)
        shutil.rmtree(unchanged, ignore_errors=True)
        if not passed:
            print(f"{module}: the tests fail on the unchanged code", file=sys.stderr)
            return 2

        def one(
            m: Mutant, source: str = source, module: str = module, tests: list[str] = tests
        ) -> tuple[Mutant, bool]:
            overlay = _overlay((module, mutated_source(source, m.index)))
            try:
                return m, run_tests(overlay, tests, args.timeout)
            finally:
                shutil.rmtree(overlay, ignore_errors=True)

        killed = survived = equiv = 0
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            for m, lived in pool.map(one, mutants):
                if m.key in equivalent:
                    matched.add(m.key)
                    equiv += 1
                elif lived:
                    survived += 1
                    print(f"survived {m.index:4} {m.key}", flush=True)
                else:
                    killed += 1
        share = killed / (killed + survived) if killed + survived else 1.0
        rows.append((module, len(mutants), equiv, killed, survived, share))
    if args.list:
        return 0
    print("\n| module | mutants | equivalent | killed | survived | killed of non-equivalent |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for module, n, equiv, killed, survived, share in rows:
        print(f"| {module} | {n} | {equiv} | {killed} | {survived} | {share:.1%} |")
    if not args.only:
        stale = sorted(
            e for e in equivalent if e.split(":")[0] in args.modules and e not in matched
        )
        for e in stale:
            print(f"stale entry in {equivalent_file.name}: {e}")
    return 0


def _overlay(mutant: tuple[str, str] | None) -> Path:
    """A copy of src/ (with the mutant written in place of its module)."""
    tmp = Path(tempfile.mkdtemp(prefix="duragent-mutant-"))
    shutil.copytree(ROOT / "src", tmp / "src", ignore=shutil.ignore_patterns("__pycache__"))
    if mutant is not None:
        module, text = mutant
        (tmp / module).write_text(text)
    return tmp


if __name__ == "__main__":
    sys.exit(main())

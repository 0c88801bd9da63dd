"""duragent against LangGraph and DBOS, in one command.

    python -m bench                    # the full run (~10 min), writes bench/RESULTS.md
    python -m bench --quick            # a smoke run (~1 min), writes bench/RESULTS.partial.md
    python -m bench --runs 3 --only rounds,storage

Workloads: rounds (per-round overhead), storage (bytes after N rounds), resume
(reopen a 10,000-entry task), concurrent (200 tasks at once, group commit),
failover (SIGKILL a worker, time the takeover). Peers come from the `bench`
extra: pip install -e '.[bench]'. Postgres figures need a server at
DURAGENT_BENCH_PG_URL (default postgresql://postgres@127.0.0.1:5432/test); each
system works in a throwaway schema that is dropped afterwards.

To measure a commit rather than a working tree someone is editing:
    git archive HEAD | tar -x -C /tmp/dg && cd /tmp/dg && PYTHONPATH=src python -m bench
(bench/RESULTS.md records the revision measured; DURAGENT_BENCH_REV overrides it.)
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

from bench import report, suite

HERE = Path(__file__).parent


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one short run of everything")
    ap.add_argument("--runs", type=int, default=None, help="runs per figure (default 5; 1 quick)")
    ap.add_argument(
        "--only",
        action="append",
        default=[],
        help=f"workloads to run, comma-separated or repeated: {', '.join(suite.WORKLOADS)}",
    )
    ap.add_argument("--out", type=Path, default=None, help="where to write the markdown report")
    ap.add_argument("--workdir", default=None, help="scratch directory (default: a temp dir)")
    a = ap.parse_args()
    only = [w.strip() for spec in a.only for w in spec.split(",") if w.strip()]
    unknown = set(only) - set(suite.WORKLOADS)
    if unknown:
        ap.error(f"unknown workload(s) {sorted(unknown)}; choose from {', '.join(suite.WORKLOADS)}")
    out_path = a.out or (
        HERE / "RESULTS.md" if not (a.quick or only or a.runs) else HERE / "RESULTS.partial.md"
    )
    command = "python -m bench" + "".join(f" {shlex.quote(x)}" for x in sys.argv[1:])
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    res = suite.Results(suite.Settings.make(a.quick, a.runs))

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="duragent-bench-", dir=a.workdir) as workdir:
        suite.run_all(res, only, os.path.abspath(workdir), log)
    text = report.render(res, command, started, time.perf_counter() - t0, only)
    out_path.write_text(text)
    print(text)
    log(f"wrote {out_path}")
    return 1 if res.errors else 0


if __name__ == "__main__":
    sys.exit(main())

"""Run one measurement in a fresh process and print its result as JSON (last line).

    python -m bench.run SYSTEM WORKLOAD 'JSON PARAMS'

Each measurement gets its own interpreter so no system's imports, caches,
singletons (DBOS) or leftover threads affect another's numbers.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys

SYSTEMS = {
    "duragent": "bench.sys_duragent",
    "langgraph": "bench.sys_langgraph",
    "dbos": "bench.sys_dbos",
}


def main() -> None:
    system, workload, params = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    logging.basicConfig(level=logging.WARNING)
    module = importlib.import_module(SYSTEMS[system])
    result = module.run(workload, params)
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

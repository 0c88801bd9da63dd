"""The baseline of `bench.http_load`: a bare FastAPI endpoint doing the least a
submission must do, driven by the same client in the same run.

    python -m bench.http_bare --port 8123 --db /tmp/bare.db

`POST /v1/tasks` validates the body with duragent's own request model
(`TaskCreate`) and inserts one row into SQLite in WAL mode at
`synchronous=NORMAL`, the durability of duragent's SQLite store by default,
one transaction per request; `GET /v1/tasks/{id}` reads the row back. No
authentication, no task, no worker, no log: what is left when all of that is
taken away.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import uuid

import uvicorn
from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse

from duragent.server._schemas import TaskCreate


def app(db: str) -> FastAPI:
    conn = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("CREATE TABLE IF NOT EXISTS tasks (id TEXT PRIMARY KEY, body TEXT NOT NULL)")
    api = FastAPI()

    @api.post("/v1/tasks", status_code=201)
    async def create(body: TaskCreate) -> JSONResponse:
        task_id = uuid.uuid4().hex
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO tasks VALUES (?, ?)", (task_id, body.model_dump_json()))
        conn.execute("COMMIT")
        return JSONResponse({"id": task_id, "status": "pending"}, status_code=201)

    @api.get("/v1/tasks/{task_id}")
    async def get(task_id: str) -> JSONResponse:
        row = conn.execute("SELECT body FROM tasks WHERE id=?", (task_id,)).fetchone()
        if row is None:
            raise HTTPException(404)
        return JSONResponse({"id": task_id, "status": "pending", **json.loads(row[0])})

    @api.get("/v1/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return api


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--db", required=True)
    args = parser.parse_args()
    uvicorn.run(app(args.db), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()

"""The PostgreSQL store's schema: its tables, numbered migrations, advisory-lock keys.

Migrations are forward-only and run on open under an advisory lock, so any
number of processes may open the same database at once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import psycopg
from psycopg import sql
from psycopg.rows import DictRow

from duragent.errors import StoreVersionError
from duragent.store._codec import SEQ_BITS
from duragent.store._session_scopes import LEGACY_PREFIX, UNCLAIMED_PREFIX, migrated_scope

Conn = psycopg.Connection[DictRow]
# A migration step: a statement, or a function for what SQL alone cannot say.
Step = str | Callable[[Conn], None]

# Forward-only: MIGRATIONS[n] takes a schema from version n-1 to n.
# Ids and keys sort byte-wise (COLLATE "C") so every backend lists in the same order.
MIGRATIONS: dict[int, list[Step]] = {
    1: [
        """CREATE TABLE tasks (
            id text COLLATE "C" PRIMARY KEY,
            owner text, request_id text, session_id text, parent_id text, root_id text,
            agent text NOT NULL, status text NOT NULL, status_reason text,
            created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL,
            wake_at timestamptz, lease_owner text, lease_expires timestamptz,
            lease_epoch bigint NOT NULL DEFAULT 0, last_seq bigint NOT NULL DEFAULT 0,
            version bigint NOT NULL DEFAULT 0, data text NOT NULL, input text NOT NULL
        )""",
        "CREATE UNIQUE INDEX tasks_request ON tasks (coalesce(owner, ''), request_id)"
        " WHERE request_id IS NOT NULL",
        "CREATE INDEX tasks_runnable ON tasks (status, created_at)",
        "CREATE INDEX tasks_owner ON tasks (owner, created_at)",
        "CREATE INDEX tasks_parent ON tasks (parent_id)",
        "CREATE INDEX tasks_session ON tasks (session_id, created_at)",
        """CREATE TABLE entries (
            task_id text NOT NULL, seq bigint NOT NULL, kind text NOT NULL,
            round integer NOT NULL, payload text NOT NULL, created_at timestamptz NOT NULL,
            PRIMARY KEY (task_id, seq)
        )""",
        """CREATE TABLE documents (
            scope text NOT NULL, key text COLLATE "C" NOT NULL, value text NOT NULL,
            version bigint NOT NULL, updated_at timestamptz NOT NULL,
            PRIMARY KEY (scope, key)
        )""",
    ],
}


def _scope_sessions_per_owner(conn: Conn) -> None:
    """Version 2: `session:<id>` documents go to their session's one owner (_session_scopes.py).

    First every one is set aside under the unclaimed prefix, so that renaming
    one can never collide with another not yet renamed.
    """
    conn.execute(
        "UPDATE documents SET scope = %s || substr(scope, %s) WHERE left(scope, %s) = %s",
        (UNCLAIMED_PREFIX, len(LEGACY_PREFIX) + 1, len(LEGACY_PREFIX), LEGACY_PREFIX),
    )
    scopes = conn.execute(
        "SELECT DISTINCT scope FROM documents WHERE left(scope, %s) = %s",
        (len(UNCLAIMED_PREFIX), UNCLAIMED_PREFIX),
    ).fetchall()
    for row in scopes:
        session_id = row["scope"][len(UNCLAIMED_PREFIX) :]
        owners = conn.execute(
            "SELECT DISTINCT owner FROM tasks WHERE session_id = %s", (session_id,)
        ).fetchall()
        scope = migrated_scope(session_id, [o["owner"] for o in owners])
        if scope != row["scope"]:
            conn.execute("UPDATE documents SET scope = %s WHERE scope = %s", (scope, row["scope"]))


MIGRATIONS[2] = [_scope_sessions_per_owner]

# Queues: every task has a queue and a priority; claims are served
# by indexes instead of a sort of the table: ready tasks per queue in claim
# order, timers and delayed starts by due time. Metadata is jsonb with a GIN
# index for equality filters (`metadata @> '{"k": "v"}'`).
QUEUES_MIGRATION: list[Step] = [
    'ALTER TABLE tasks ADD COLUMN queue text COLLATE "C"',
    "ALTER TABLE tasks ADD COLUMN priority integer NOT NULL DEFAULT 0",
    "ALTER TABLE tasks ADD COLUMN metadata jsonb",
    "UPDATE tasks SET queue = agent",
    "CREATE INDEX tasks_ready ON tasks (queue, priority DESC, created_at)"
    " WHERE status = 'pending' AND wake_at IS NULL",
    "CREATE INDEX tasks_due ON tasks (status, wake_at) WHERE wake_at IS NOT NULL",
    "CREATE INDEX tasks_leases ON tasks ((coalesce(lease_expires, 'epoch'::timestamptz)))"
    " WHERE status = 'running'",
    "CREATE INDEX tasks_queue ON tasks (queue, status)",
    "CREATE INDEX tasks_metadata ON tasks USING gin (metadata jsonb_path_ops)",
]
MIGRATIONS[3] = QUEUES_MIGRATION

# Version 4: a fork's copied entries reference their source's payload instead
# of holding a copy (`src_task`, `src_seq`, the payload left empty). A reference
# always names an entry that holds its payload (a fork of a fork names the
# first source), and a task is purged only after its referrers got their
# payloads back (`_delete_trees`). Readers take entries through `entry_rows`,
# which resolves references; only writers touch `entries`.
FORK_REFERENCES: list[Step] = [
    "ALTER TABLE entries ADD COLUMN src_task text",  # task_id's collation: its index serves it
    "ALTER TABLE entries ADD COLUMN src_seq bigint",
    "CREATE INDEX entries_src ON entries (src_task) WHERE src_task IS NOT NULL",
    """CREATE VIEW entry_rows AS SELECT e.task_id, e.seq, e.kind, e.round, e.created_at,
        CASE WHEN e.src_task IS NULL THEN e.payload ELSE (SELECT s.payload FROM entries s
            WHERE s.task_id = e.src_task AND s.seq = e.src_seq) END AS payload
        FROM entries e""",
]
MIGRATIONS[4] = FORK_REFERENCES

# Version 5: entries keyed by one integer, `eid` = the task's number << 32 |
# seq (store/_codec.py `entry_key`), as on SQLite: the 34-character task id was
# in every entry's row and in its key, 40% of the entries' bytes beside the
# payloads. Tasks get a number; a fork's reference is one key (`src`). The
# view still gives `task_num` and `seq`; readers select a task's entries by an
# `eid` range (ENTRY_RANGE), which the primary key serves.
ENTRY_KEYS: list[Step] = [
    "ALTER TABLE tasks ADD COLUMN num bigint GENERATED ALWAYS AS IDENTITY",
    "CREATE UNIQUE INDEX tasks_num ON tasks (num)",
    "DROP VIEW entry_rows",
    # Fixed-width columns first: no padding between them.
    """CREATE TABLE entries_v5 (
        eid bigint NOT NULL, created_at timestamptz NOT NULL, src bigint,
        round integer NOT NULL, kind text NOT NULL, payload text NOT NULL
    )""",
    "INSERT INTO entries_v5 (eid, created_at, src, round, kind, payload)"
    " SELECT (t.num << 32) + e.seq, e.created_at, (s.num << 32) + e.src_seq, e.round,"
    " e.kind, e.payload FROM entries e JOIN tasks t ON t.id = e.task_id"
    " LEFT JOIN tasks s ON s.id = e.src_task ORDER BY t.num, e.seq",
    "DROP TABLE entries",
    "ALTER TABLE entries_v5 RENAME TO entries",
    "ALTER TABLE entries ADD CONSTRAINT entries_pkey PRIMARY KEY (eid)",
    "CREATE INDEX entries_src ON entries (src) WHERE src IS NOT NULL",
    """CREATE VIEW entry_rows AS SELECT e.eid, e.eid >> 32 AS task_num,
        e.eid & 4294967295 AS seq, e.kind, e.round, e.created_at,
        CASE WHEN e.src IS NULL THEN e.payload
            ELSE (SELECT s.payload FROM entries s WHERE s.eid = e.src) END AS payload
        FROM entries e""",
]
MIGRATIONS[5] = ENTRY_KEYS

# Version 6: the agent version a task runs on (`Task.agent_version`), a column
# so that a claim filters by it; NULL for the tasks of before (any version).
MIGRATIONS[6] = ['ALTER TABLE tasks ADD COLUMN agent_version text COLLATE "C"']
# Version 7: listing and counting that do not grow with the store. Indexes that
# give a filtered page in list order (newest first) by a range seek, and the
# counts of tasks per (owner, agent, queue, status) kept by triggers in the
# transaction of every write of a task row (creation, transition, deletion,
# purge, fork), so a failed commit leaves them as they were. The owner is a key
# column as `okey`: '' for no owner, '.' and the owner's name otherwise.
#
# One row per key would serialize every commit that moves a task of that key
# (its row lock is held to the commit's end), so the counts are kept in
# COUNT_SHARDS shards, a row per key and shard, summed by readers. A
# transaction takes a shard for itself on its first counted change: the first
# whose advisory lock is free (a try: it never waits while one is free), held
# to its end, so no two transactions ever touch one row at once and none waits
# for another's. Its changes are updates in place of a few small rows (HOT,
# pruned as the pages are read): the table stays as small as its keys times
# the shards ever in use at once. (Rows appended per change and folded later
# left a heap of dead rows behind to scan: 50-70 ms for counts after a
# million changes, vacuumed or not.) With every shard taken, a transaction
# waits for a random one.
COUNT_SHARDS = 64
_OKEY = "CASE WHEN {t}.owner IS NULL THEN '' ELSE '.' || {t}.owner END"


def _count_step(t: str, n: int) -> str:
    return (
        "INSERT INTO task_counts (okey, agent, queue, status, shard, n)"
        f" VALUES ({_OKEY.format(t=t)}, {t}.agent, {t}.queue, {t}.status, my_shard, {n})"
        " ON CONFLICT (okey, agent, queue, status, shard)"
        f" DO UPDATE SET n = task_counts.n + {n};"
    )


COUNTS_AND_LIST_INDEXES: list[Step] = [
    # Older processes may be writing meanwhile (a rolling deploy): their writes
    # wait from here to the commit, so none lands between the count below and
    # the trigger that keeps it (its commit would be in neither).
    "LOCK TABLE tasks IN SHARE ROW EXCLUSIVE MODE",
    """CREATE TABLE task_counts (
        okey text COLLATE "C" NOT NULL, agent text NOT NULL, queue text COLLATE "C" NOT NULL,
        status text NOT NULL, shard integer NOT NULL, n bigint NOT NULL,
        PRIMARY KEY (okey, agent, queue, status, shard)
    ) WITH (fillfactor = 50)""",
    "INSERT INTO task_counts (okey, agent, queue, status, shard, n)"
    f" SELECT {_OKEY.format(t='tasks')}, agent, queue, status, 0, count(*) FROM tasks"
    " GROUP BY 1, 2, 3, 4",
    f"""CREATE FUNCTION duragent_count_task() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        my_shard integer := nullif(current_setting('duragent.count_shard', true), '')::integer;
        space integer := hashtext('duragent_count_shards:' || current_schema());
    BEGIN
        IF my_shard IS NULL THEN
            FOR i IN 0..{COUNT_SHARDS - 1} LOOP
                IF pg_try_advisory_xact_lock(space, i) THEN
                    my_shard := i;
                    EXIT;
                END IF;
            END LOOP;
            IF my_shard IS NULL THEN
                my_shard := floor(random() * {COUNT_SHARDS})::integer;
                PERFORM pg_advisory_xact_lock(space, my_shard);
            END IF;
            PERFORM set_config('duragent.count_shard', my_shard::text, true);
        END IF;
        IF TG_OP <> 'INSERT' THEN
            {_count_step("OLD", -1)}
        END IF;
        IF TG_OP <> 'DELETE' THEN
            {_count_step("NEW", 1)}
        END IF;
        RETURN NULL;
    END $$""",
    "CREATE TRIGGER tasks_counted AFTER INSERT OR DELETE ON tasks"
    " FOR EACH ROW EXECUTE FUNCTION duragent_count_task()",
    "CREATE TRIGGER tasks_counted_moves AFTER UPDATE OF owner, agent, queue, status ON tasks"
    " FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status"
    " OR OLD.queue IS DISTINCT FROM NEW.queue OR OLD.agent IS DISTINCT FROM NEW.agent"
    " OR OLD.owner IS DISTINCT FROM NEW.owner) EXECUTE FUNCTION duragent_count_task()",
    # Newest first with no filter or a time range; by agent; by owner and status.
    "CREATE INDEX tasks_created ON tasks (created_at, id)",
    "CREATE INDEX tasks_agent ON tasks (agent, created_at)",
    "CREATE INDEX tasks_owner_status ON tasks (owner, status, created_at)",
    # By queue and status in list order (it serves what `tasks_queue` served).
    "DROP INDEX tasks_queue",
    "CREATE INDEX tasks_queue ON tasks (queue, status, created_at)",
]
MIGRATIONS[7] = COUNTS_AND_LIST_INDEXES
SCHEMA_VERSION = max(MIGRATIONS)

# A task's entries with seqs in a range, by `eid`: served by the primary key.
# Its parameters come from `entry_range(task_id, first, last)` (store/_codec.py).
ENTRY_RANGE = (
    f"eid BETWEEN ((SELECT num FROM tasks WHERE id = %s) << {SEQ_BITS}) + %s"
    f" AND ((SELECT num FROM tasks WHERE id = %s) << {SEQ_BITS}) + %s"
)


def lock_key(*parts: str) -> int:
    """A stable signed 64-bit advisory-lock key for a name."""
    digest = hashlib.blake2b("\x00".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def migrate(conn: Conn, schema: str | None, where: str) -> tuple[int, str]:
    """Bring the schema to SCHEMA_VERSION; return (version found, schema name).

    An advisory lock makes concurrent openers take turns: the first migrates,
    the rest find the work done. A newer version is refused untouched. A store
    already at this version is only read: opening it writes nothing (no commit
    to wait for), which is most of what reopening a store costs.
    """
    try:
        row = conn.execute(
            "SELECT value, current_schema() AS name FROM duragent_meta WHERE key = 'schema_version'"
        ).fetchone()
    except psycopg.errors.UndefinedTable:
        row = None  # a new store (or schema): create it below
    if row is not None and int(row["value"]) == SCHEMA_VERSION:
        return SCHEMA_VERSION, str(row["name"])
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key("migrate", schema or ""),))
        if schema is not None:
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS duragent_meta (key text PRIMARY KEY, value text NOT NULL)"
        )
        row = conn.execute(
            "SELECT value FROM duragent_meta WHERE key = 'schema_version'"
        ).fetchone()
        found = int(row["value"]) if row else 0
        if found > SCHEMA_VERSION:
            raise StoreVersionError(where, found, SCHEMA_VERSION)
        for version in range(found + 1, SCHEMA_VERSION + 1):
            for step in MIGRATIONS[version]:
                if isinstance(step, str):
                    conn.execute(step)
                else:
                    step(conn)
        conn.execute(
            "INSERT INTO duragent_meta (key, value) VALUES ('schema_version', %s)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (str(SCHEMA_VERSION),),
        )
        current = conn.execute("SELECT current_schema() AS name").fetchone()
    return found, str(current["name"] if current else "")

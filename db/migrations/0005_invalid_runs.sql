-- A run whose figures break a physical ceiling (memory bandwidth above what the machine's caches
-- or DIMMs can move, GFLOP/s above the measured peak) is stored as `invalid`, with the reason, and
-- is never a result. SQLite cannot widen a CHECK constraint in place: the table is rebuilt, rows in
-- their order (nothing references `runs` by foreign key since schema 3: the values tables are keyed
-- by `run_numbers`).
CREATE TABLE runs_v5 (
    id                  TEXT PRIMARY KEY NOT NULL,
    host_id             TEXT NOT NULL REFERENCES hosts(id),
    inventory_id        TEXT REFERENCES inventories(id),
    software_id         TEXT REFERENCES software_stacks(id),
    benchmark           TEXT NOT NULL,
    config              TEXT NOT NULL,
    started_at          TEXT NOT NULL,
    finished_at         TEXT,
    status              TEXT NOT NULL CHECK (status IN ('running', 'ok', 'unstable', 'failed', 'aborted', 'invalid')),
    status_reason       TEXT
);
INSERT INTO runs_v5 (id, host_id, inventory_id, software_id, benchmark, config, started_at, finished_at, status)
    SELECT id, host_id, inventory_id, software_id, benchmark, config, started_at, finished_at, status
    FROM runs ORDER BY rowid;
DROP TABLE runs;
ALTER TABLE runs_v5 RENAME TO runs;
CREATE INDEX runs_by_host ON runs(host_id, started_at);
CREATE INDEX runs_by_benchmark ON runs(benchmark, started_at);

-- A run whose CPUs other processes (or the hypervisor: steal time) used beyond the limit while it
-- measured is stored as `disturbed`, with the figures in its reason: kept, shown, never a result
-- (no peak, comparison or verdict reads it). SQLite cannot widen a CHECK constraint in place: the
-- table is rebuilt as in 0005, rows in their order.
CREATE TABLE runs_v6 (
    id                  TEXT PRIMARY KEY NOT NULL,
    host_id             TEXT NOT NULL REFERENCES hosts(id),
    inventory_id        TEXT REFERENCES inventories(id),
    software_id         TEXT REFERENCES software_stacks(id),
    benchmark           TEXT NOT NULL,
    config              TEXT NOT NULL,
    started_at          TEXT NOT NULL,
    finished_at         TEXT,
    status              TEXT NOT NULL CHECK (status IN ('running', 'ok', 'unstable', 'failed', 'aborted', 'invalid', 'disturbed')),
    status_reason       TEXT
);
INSERT INTO runs_v6 (id, host_id, inventory_id, software_id, benchmark, config, started_at, finished_at, status, status_reason)
    SELECT id, host_id, inventory_id, software_id, benchmark, config, started_at, finished_at, status, status_reason
    FROM runs ORDER BY rowid;
DROP TABLE runs;
ALTER TABLE runs_v6 RENAME TO runs;
CREATE INDEX runs_by_host ON runs(host_id, started_at);
CREATE INDEX runs_by_benchmark ON runs(benchmark, started_at);

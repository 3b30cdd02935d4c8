-- Provisioning applies go to the fleet service too: the outbox takes a fourth kind. SQLite cannot
-- change a CHECK in place, so the table is made again with its rows, in their order (uploads take
-- the oldest first, ties by rowid).
CREATE TABLE outbox_new (
    kind                TEXT NOT NULL CHECK (kind IN ('inventory', 'run', 'verdict', 'apply')),
    id                  TEXT NOT NULL,
    queued_at           TEXT NOT NULL,
    attempts            INTEGER NOT NULL DEFAULT 0,
    next_attempt_at     TEXT,
    last_error          TEXT,
    PRIMARY KEY (kind, id)
);
INSERT INTO outbox_new (kind, id, queued_at, attempts, next_attempt_at, last_error)
    SELECT kind, id, queued_at, attempts, next_attempt_at, last_error FROM outbox ORDER BY rowid;
DROP TABLE outbox;
ALTER TABLE outbox_new RENAME TO outbox;

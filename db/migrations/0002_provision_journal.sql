-- The provisioning journal: every apply of an image, and each of its steps, written before the
-- step starts and after it ends. A step left 'started' belongs to a kiln that died; the next
-- `apply --resume` marks it 'interrupted' and carries on in the same apply.
CREATE TABLE provision_applies (
    id                  TEXT PRIMARY KEY,
    image               TEXT NOT NULL,
    image_version       TEXT NOT NULL,
    image_hash          TEXT NOT NULL,
    root                TEXT NOT NULL,
    hostname            TEXT,
    started_at          TEXT NOT NULL,
    finished_at         TEXT,
    resumes             INTEGER NOT NULL DEFAULT 0,
    status              TEXT NOT NULL CHECK (status IN ('running', 'succeeded', 'failed', 'interrupted'))
);
CREATE INDEX provision_applies_by_image ON provision_applies(image, root, started_at);

CREATE TABLE provision_steps (
    id                  INTEGER PRIMARY KEY,
    apply_id            TEXT NOT NULL REFERENCES provision_applies(id) ON DELETE CASCADE,
    seq                 INTEGER NOT NULL,
    step_key            TEXT NOT NULL,
    summary             TEXT NOT NULL,
    command             TEXT NOT NULL,
    image_hash          TEXT NOT NULL,
    started_at          TEXT NOT NULL,
    finished_at         TEXT,
    status              TEXT NOT NULL CHECK (status IN ('started', 'succeeded', 'failed', 'interrupted')),
    exit_code           INTEGER,
    duration_ms         INTEGER,
    output_tail         TEXT
);
CREATE INDEX provision_steps_by_apply ON provision_steps(apply_id, seq);

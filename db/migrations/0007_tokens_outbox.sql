-- The fleet service's bearer tokens: only a hash of each is kept (SHA-256 of the secret part; the
-- token is printed once, when it is made). `id` is the token's public prefix, by which a request's
-- token is found before its secret is compared in constant time. A revoked token keeps its row
-- (revoked_at set), so that `kiln token list` still says who it was.
CREATE TABLE tokens (
    id                  TEXT PRIMARY KEY NOT NULL,
    name                TEXT NOT NULL,
    role                TEXT NOT NULL CHECK (role IN ('agent', 'reader', 'admin')),
    secret_sha256       BLOB NOT NULL,
    created_at          TEXT NOT NULL,
    revoked_at          TEXT,
    last_used_at        TEXT
);
CREATE UNIQUE INDEX tokens_live_name ON tokens(name) WHERE revoked_at IS NULL;

-- An agent's results waiting for the fleet service: written in the same transaction as the result
-- itself (so a result is never stored without its upload queued), removed once the server has
-- taken it. `attempts` and `next_attempt_at` pace the retries (back-off); `kiln sync` ignores the
-- pacing and sends everything.
CREATE TABLE outbox (
    kind                TEXT NOT NULL CHECK (kind IN ('inventory', 'run', 'verdict')),
    id                  TEXT NOT NULL,
    queued_at           TEXT NOT NULL,
    attempts            INTEGER NOT NULL DEFAULT 0,
    next_attempt_at     TEXT,
    last_error          TEXT,
    PRIMARY KEY (kind, id)
);

-- Fleet trust, as SQLite's migration 0009: an agent token bound to one host identity, the
-- importer role, and every accepted upload recorded. Differences from SQLite as in 0007.
ALTER TABLE tokens DROP CONSTRAINT tokens_role_check;
ALTER TABLE tokens ADD CONSTRAINT tokens_role_check CHECK (role IN ('agent', 'reader', 'admin', 'importer'));
ALTER TABLE tokens ADD COLUMN host_identity TEXT COLLATE "C";

CREATE TABLE uploads (
    rowid               BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
    token_id            TEXT COLLATE "C" NOT NULL,
    host_identity       TEXT COLLATE "C",
    received_at         TEXT COLLATE "C" NOT NULL,
    client              TEXT COLLATE "C",
    records             BIGINT NOT NULL,
    stats               TEXT NOT NULL
);
CREATE INDEX uploads_token ON uploads(token_id, received_at);

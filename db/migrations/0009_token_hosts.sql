-- Fleet trust: an agent token speaks for one host, named by its identity (bound when the token is
-- made, `kiln token create --host`, or by its first upload); a fourth role, importer, loads other
-- sites' exports; and every accepted upload is recorded (which token, for which host, from where,
-- what it added). SQLite cannot change a CHECK in place, so the tokens table is made again with
-- its rows, in their order (listings break ties by rowid).
CREATE TABLE tokens_new (
    id                  TEXT PRIMARY KEY NOT NULL,
    name                TEXT NOT NULL,
    role                TEXT NOT NULL CHECK (role IN ('agent', 'reader', 'admin', 'importer')),
    secret_sha256       BLOB NOT NULL,
    created_at          TEXT NOT NULL,
    revoked_at          TEXT,
    last_used_at        TEXT,
    host_identity       TEXT
);
INSERT INTO tokens_new (id, name, role, secret_sha256, created_at, revoked_at, last_used_at)
    SELECT id, name, role, secret_sha256, created_at, revoked_at, last_used_at FROM tokens ORDER BY rowid;
DROP TABLE tokens;
ALTER TABLE tokens_new RENAME TO tokens;
CREATE UNIQUE INDEX tokens_live_name ON tokens(name) WHERE revoked_at IS NULL;

CREATE TABLE uploads (
    token_id            TEXT NOT NULL,
    host_identity       TEXT,
    received_at         TEXT NOT NULL,
    client              TEXT,
    records             INTEGER NOT NULL,
    stats               TEXT NOT NULL
);
CREATE INDEX uploads_token ON uploads(token_id, received_at);

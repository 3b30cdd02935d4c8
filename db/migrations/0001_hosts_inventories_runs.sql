-- kiln results store, schema 1: hosts and their inventories, and the shape of benchmark runs.
-- Identifiers are UUIDs (text) so that results from many agents merge without collisions.
-- Timestamps are RFC 3339 UTC text, which sorts chronologically.

CREATE TABLE hosts (
    id                  TEXT PRIMARY KEY NOT NULL,
    identity            TEXT NOT NULL UNIQUE,      -- host identity fingerprint (this physical box)
    hostname            TEXT,
    config_fingerprint  TEXT NOT NULL,             -- latest configuration seen on the host
    config_name         TEXT NOT NULL,
    first_seen          TEXT NOT NULL,
    last_seen           TEXT NOT NULL
);

CREATE TABLE inventories (
    id                  TEXT PRIMARY KEY NOT NULL,
    host_id             TEXT NOT NULL REFERENCES hosts(id),
    collected_at        TEXT NOT NULL,
    schema_version      INTEGER NOT NULL,          -- of the JSON document
    config_fingerprint  TEXT NOT NULL,
    config_name         TEXT NOT NULL,
    cpu_model           TEXT,
    cpu_packages        INTEGER,
    cpu_cores           INTEGER,
    cpu_threads         INTEGER,
    memory_bytes        INTEGER,
    kernel_release      TEXT,
    problem_count       INTEGER NOT NULL,
    document            TEXT NOT NULL              -- the full inventory, as `kiln inventory --json` prints it
);
CREATE INDEX inventories_by_host ON inventories(host_id, collected_at);
CREATE INDEX inventories_by_config ON inventories(config_fingerprint);

-- The software a run was measured on (kernel, driver, CUDA, frameworks, image), shared by runs.
CREATE TABLE software_stacks (
    id                  TEXT PRIMARY KEY NOT NULL,
    fingerprint         TEXT NOT NULL UNIQUE,
    document            TEXT NOT NULL
);

CREATE TABLE runs (
    id                  TEXT PRIMARY KEY NOT NULL,
    host_id             TEXT NOT NULL REFERENCES hosts(id),
    inventory_id        TEXT REFERENCES inventories(id),
    software_id         TEXT REFERENCES software_stacks(id),
    benchmark           TEXT NOT NULL,             -- "train", "gemm", "membw", ...
    config              TEXT NOT NULL,             -- JSON: the benchmark's exact configuration and seed
    started_at          TEXT NOT NULL,
    finished_at         TEXT,
    status              TEXT NOT NULL CHECK (status IN ('running', 'ok', 'unstable', 'failed', 'aborted'))
);
CREATE INDEX runs_by_host ON runs(host_id, started_at);
CREATE INDEX runs_by_benchmark ON runs(benchmark, started_at);

CREATE TABLE metrics (
    run_id              TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    name                TEXT NOT NULL,
    value               REAL NOT NULL,
    unit                TEXT NOT NULL,
    direction           TEXT NOT NULL CHECK (direction IN ('higher', 'lower', 'none')),
    PRIMARY KEY (run_id, name)
) WITHOUT ROWID;
CREATE INDEX metrics_by_name ON metrics(name);

-- Every raw repetition behind a metric.
CREATE TABLE samples (
    run_id              TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    metric              TEXT NOT NULL,
    idx                 INTEGER NOT NULL,
    value               REAL NOT NULL,
    PRIMARY KEY (run_id, metric, idx)
) WITHOUT ROWID;

-- Telemetry sampled during a run: source "cpu" or "gpu<N>", name "power_watts", "sm_clock_mhz", ...
CREATE TABLE telemetry (
    run_id              TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    t_ms                INTEGER NOT NULL,
    source              TEXT NOT NULL,
    name                TEXT NOT NULL,
    value               REAL NOT NULL
);
CREATE INDEX telemetry_by_run ON telemetry(run_id, source, name, t_ms);

-- Derived data for fleet analysis (compare, outliers, regressions, reports): every metric's nightly
-- series, packed per host in one blob, so that a whole fleet loads in a few thousand rows instead of
-- millions. Written in the same transaction as the runs it is derived from (save and import), and
-- rebuilt from `runs`/`metrics` when missing. The normalized tables stay the source of truth.

-- What makes results comparable: the same configuration, benchmark and benchmark configuration, and
-- (unless asked otherwise) software stack. One row per such group and metric.
CREATE TABLE series_keys (
    id                    INTEGER PRIMARY KEY,
    config_fingerprint    TEXT NOT NULL,
    config_name           TEXT NOT NULL,
    benchmark             TEXT NOT NULL,
    bench_config          TEXT NOT NULL,
    software_fingerprint  TEXT NOT NULL,          -- '' when the run recorded none
    metric                TEXT NOT NULL,
    unit                  TEXT NOT NULL,
    direction             TEXT NOT NULL,
    UNIQUE (config_fingerprint, benchmark, bench_config, software_fingerprint, metric)
);

-- Per host: its runs (id, time, mean GPU power) and, per series key, the (run, value) points.
-- Format: see db/src/fleet.rs (`SeriesBlob`).
CREATE TABLE host_series (
    host_id               TEXT PRIMARY KEY NOT NULL REFERENCES hosts(id),
    runs                  INTEGER NOT NULL,
    points                INTEGER NOT NULL,
    data                  BLOB NOT NULL
);

-- Fleet queries read the series above; nothing looks metrics up by name any more, and every
-- import paid for this index on every row.
DROP INDEX metrics_by_name;

-- Commissioning verdicts: a box's inventory (and the runs taken with it) judged against a SKU
-- spec. The spec's text and hash are kept with the verdict, so that a fleet re-judged against a
-- tightened spec says which spec judged each box. `document` is the verdict as `--json` prints it
-- (its checks with expected, measured, status and evidence); it carries no clock, `judged_at` does.
CREATE TABLE verdicts (
    id                  TEXT PRIMARY KEY NOT NULL,
    host_id             TEXT NOT NULL REFERENCES hosts(id),
    inventory_id        TEXT NOT NULL REFERENCES inventories(id),
    judged_at           TEXT NOT NULL,
    spec_name           TEXT NOT NULL,
    spec_hash           TEXT NOT NULL,
    spec                TEXT NOT NULL,
    verdict             TEXT NOT NULL CHECK (verdict IN ('accept', 'reject', 'inconclusive')),
    failed              INTEGER NOT NULL,
    document            TEXT NOT NULL
);
CREATE INDEX verdicts_by_host ON verdicts(host_id, judged_at);
CREATE INDEX verdicts_by_inventory ON verdicts(inventory_id, judged_at);

//! Stored commissioning verdicts, and the evidence a verdict is re-judged from: the runs taken
//! with an inventory, and the metric values of a configuration's accepted boxes.

use std::collections::BTreeMap;

use sqlx::{Connection, Row};

use crate::{Result, Store};

/// A verdict to store. `document` is the verdict JSON; the agent owns its shape.
#[derive(Debug, Clone)]
pub struct NewVerdict {
    pub host_id: String,
    pub inventory_id: String,
    pub judged_at: String,
    pub spec_name: String,
    pub spec_hash: String,
    pub spec: String,
    /// "accept", "reject" or "inconclusive".
    pub verdict: String,
    pub failed: i64,
    pub document: String,
}

/// An accepted inventory and the serials that identify its box (`accepted_inventories_of_config`).
#[derive(Debug, Clone)]
pub struct AcceptedInventory {
    pub verdict_id: String,
    pub inventory_id: String,
    pub judged_at: String,
    pub product_serial: Option<String>,
    pub board_serial: Option<String>,
    pub gpu_serials: Vec<String>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct VerdictRow {
    pub id: String,
    pub host_id: String,
    pub inventory_id: String,
    pub judged_at: String,
    pub spec_name: String,
    pub spec_hash: String,
    pub verdict: String,
    pub failed: i64,
    /// The verdict JSON, where the query asked for it.
    #[serde(skip)]
    pub document: Option<String>,
}

impl Store {
    /// Stores a verdict (one statement, committed at once).
    pub async fn save_verdict(&mut self, v: &NewVerdict) -> Result<String> {
        let err = self.sql_err();
        let id = uuid::Uuid::new_v4().to_string();
        let mut tx = self.conn.begin_with(crate::WRITE).await.map_err(&err)?;
        crate::queries::reads::insert_verdict(&mut crate::engine::Conn::Sqlite(&mut tx), &id, v).await.map_err(&err)?;
        if self.queue_uploads {
            crate::outbox::queue(&mut tx, "verdict", &id).await.map_err(&err)?;
        }
        tx.commit().await.map_err(&err)?;
        Ok(id)
    }

    /// The telemetry a verdict reads of the runs taken with one inventory — PCIe link readings
    /// (`pcie:<address>`), GPU throttling and temperature (`gpu<N>` `throttled_*`,
    /// `temperature_c`): (run id, milliseconds,
    /// source, name, value), in time order per run.
    pub async fn verdict_telemetry_of_inventory(
        &mut self,
        inventory_id: &str,
    ) -> Result<Vec<(String, i64, String, String, f64)>> {
        let err = self.sql_err();
        let rows = sqlx::query(
            "SELECT t.run_id, t.t_ms, t.source, t.name, t.value FROM telemetry t JOIN runs r ON r.id = t.run_id \
             WHERE r.inventory_id = ? AND (t.source LIKE 'pcie:%' OR (t.source LIKE 'gpu%' AND (t.name LIKE 'throttled_%' OR t.name = 'temperature_c'))) ORDER BY r.started_at, t.run_id, t.t_ms, t.source, t.name",
        )
        .bind(inventory_id)
        .fetch_all(&mut self.conn)
        .await
        .map_err(err)?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4))).collect())
    }

    /// Every inventory of configuration `config` that a verdict accepted, with the first such
    /// verdict and the serials that say which physical box it was (the system's and board's from
    /// SMBIOS, each GPU's), oldest acceptance first: the candidates for a box's drift baseline.
    /// Other than inventory `except`.
    pub async fn accepted_inventories_of_config(
        &mut self,
        config: &str,
        except: &str,
    ) -> Result<Vec<AcceptedInventory>> {
        let err = self.sql_err();
        let rows = sqlx::query(
            "SELECT v.id, v.inventory_id, v.judged_at, \
                    json_extract(i.document, '$.system.product.serial'), json_extract(i.document, '$.system.board.serial'), \
                    (SELECT json_group_array(json_extract(d.value, '$.serial')) FROM json_each(i.document, '$.gpus.devices') d) \
             FROM verdicts v JOIN inventories i ON i.id = v.inventory_id \
             WHERE v.verdict = 'accept' AND i.config_fingerprint = ? AND v.inventory_id <> ? \
               AND v.rowid = (SELECT w.rowid FROM verdicts w WHERE w.inventory_id = v.inventory_id AND w.verdict = 'accept' \
                              ORDER BY w.judged_at, w.rowid LIMIT 1) \
             ORDER BY v.judged_at, v.rowid",
        )
        .bind(config)
        .bind(except)
        .fetch_all(&mut self.conn)
        .await
        .map_err(err)?;
        Ok(rows
            .iter()
            .map(|r| {
                let gpus: Option<String> = r.get(5);
                AcceptedInventory {
                    verdict_id: r.get(0),
                    inventory_id: r.get(1),
                    judged_at: r.get(2),
                    product_serial: r.get(3),
                    board_serial: r.get(4),
                    gpu_serials: gpus
                        .and_then(|g| serde_json::from_str::<Vec<Option<String>>>(&g).ok())
                        .unwrap_or_default()
                        .into_iter()
                        .flatten()
                        .collect(),
                }
            })
            .collect())
    }

    /// The repetitions of every metric of the result runs (`ok`, `unstable`) taken with one
    /// inventory: (run id, metric, value), runs in time order.
    pub async fn result_samples_of_inventory(&mut self, inventory_id: &str) -> Result<Vec<(String, String, f64)>> {
        let err = self.sql_err();
        let rows = sqlx::query(
            "SELECT s.run_id, s.metric, s.value FROM samples s JOIN runs r ON r.id = s.run_id \
             WHERE r.inventory_id = ? AND r.status IN ('ok', 'unstable') ORDER BY r.started_at, s.run_id, s.metric, s.idx",
        )
        .bind(inventory_id)
        .fetch_all(&mut self.conn)
        .await
        .map_err(err)?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect())
    }

    /// Per metric, one value per accepted box of configuration `config` (other than `except_host`):
    /// from the runs of the inventory its newest verdict accepted.
    pub async fn accepted_metric_values(
        &mut self,
        config: &str,
        except_host: &str,
    ) -> Result<BTreeMap<String, Vec<f64>>> {
        let err = self.sql_err();
        let rows = sqlx::query(
            "WITH latest AS (SELECT v.host_id, v.inventory_id, v.verdict FROM verdicts v \
               WHERE v.rowid = (SELECT rowid FROM verdicts w WHERE w.host_id = v.host_id ORDER BY judged_at DESC, rowid DESC LIMIT 1)) \
             SELECT l.host_id, m.name, m.value FROM latest l \
             JOIN inventories i ON i.id = l.inventory_id \
             JOIN runs r ON r.inventory_id = l.inventory_id AND r.status IN ('ok', 'unstable') \
             JOIN metrics m ON m.run_id = r.id \
             WHERE l.verdict = 'accept' AND i.config_fingerprint = ? AND l.host_id <> ? \
             ORDER BY l.host_id, m.name, r.started_at",
        )
        .bind(config)
        .bind(except_host)
        .fetch_all(&mut self.conn)
        .await
        .map_err(err)?;
        // The last value of each (host, metric).
        let mut last: BTreeMap<(String, String), f64> = BTreeMap::new();
        for r in rows {
            last.insert((r.get(0), r.get(1)), r.get(2));
        }
        let mut out: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for ((_, metric), value) in last {
            out.entry(metric).or_default().push(value);
        }
        Ok(out)
    }
}

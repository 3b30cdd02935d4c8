//! Importing an export (a file, or the fleet service's uploads): every record checked, then
//! stored all-or-nothing and idempotently — written once, compiled for each engine. Parsing and
//! the record types are in `crate::exchange`.

use std::collections::{HashMap, HashSet};

use super::index::{index_runs, IndexRun};
use crate::engine::{query, sql_err, Arg, Backend, Builder, Conn, Row};
use crate::exchange::{
    parse_export, HostRec, ImportError, ImportStats, InventoryRec, Record, RunRec, Sender, SoftwareRec, Upload,
};
use crate::fleet::mean_power;
use crate::{DbError, MAX_BINDS};

/// Imports an export: every line is parsed and checked first (a malformed or truncated file is
/// refused with its line number, and nothing is imported), then everything goes in as one
/// transaction. Records carry UUIDs: what is already here is skipped, so importing twice adds
/// nothing. Hosts merge by identity, software stacks by fingerprint.
pub(crate) async fn import(
    s: &mut impl Backend,
    file: &str,
    text: &str,
) -> std::result::Result<ImportStats, ImportError> {
    let malformed = |line: usize, message: String| ImportError::Malformed { file: file.to_string(), line, message };
    let records = parse_export(file, text)?;
    import_records(s, records, &malformed).await
}

async fn import_records(
    s: &mut impl Backend,
    records: Vec<(usize, Record<'_>)>,
    malformed: &dyn Fn(usize, String) -> ImportError,
) -> std::result::Result<ImportStats, ImportError> {
    let err = sql_err(s);
    let mut conn = s.conn();
    // A page cache large enough that a big import does not spill pages mid-transaction.
    conn.prepare_import().await;
    let mut tx = conn.begin_write().await.map_err(&err)?;
    tx.one_writer().await.map_err(&err)?;
    let stats = import_into(&mut tx.conn(), records, malformed, None).await.map_err(|e| e.into_import(&err))?;
    tx.commit().await.map_err(&err)?;
    Ok(stats)
}

/// Several uploads (label, export text) in one transaction, each whole or not at all: each is
/// parsed first, then applied inside a savepoint that a failure rolls back, and one commit (one
/// sync to disk) stores them all. A failed commit fails every upload of the batch. The fleet
/// service's writer takes the uploads that queued while it was busy this way (group commit).
pub(crate) async fn import_many(
    s: &mut impl Backend,
    uploads: &[Upload],
) -> Vec<std::result::Result<ImportStats, ImportError>> {
    let err = sql_err(s);
    let path = s.path().to_path_buf();
    let mut results: Vec<std::result::Result<ImportStats, ImportError>> = Vec::with_capacity(uploads.len());
    let parsed: Vec<_> = uploads.iter().map(|u| parse_export(&u.label, &u.text)).collect();
    if parsed.iter().all(|p| p.is_err()) {
        return parsed.into_iter().map(|p| p.map(|_| ImportStats::default())).collect();
    }
    // As `import`: a page cache large enough that the batch does not spill pages mid-transaction.
    // (Only a hint: a failure here fails nothing.)
    let mut conn = s.conn();
    conn.prepare_import().await;
    let begun = match conn.begin_write().await {
        Ok(mut tx) => tx.one_writer().await.map(|()| tx),
        Err(e) => Err(e),
    };
    let mut tx = match begun {
        Ok(tx) => tx,
        Err(e) => {
            let cause = err(e);
            return parsed
                .into_iter()
                .map(|p| p.and_then(|_| Err(ImportError::Db(shared_failure(&path, &cause)))))
                .collect();
        }
    };
    for (upload, records) in uploads.iter().zip(parsed) {
        let file = &upload.label;
        let records = match records {
            Ok(r) => r,
            Err(e) => {
                results.push(Err(e));
                continue;
            }
        };
        let malformed = |line: usize, message: String| ImportError::Malformed { file: file.to_string(), line, message };
        let result = async {
            let mut c = tx.conn();
            query("SAVEPOINT upload").execute(&mut c).await?;
            match import_into(&mut c, records, &malformed, Some((file, &upload.sender))).await {
                Ok(stats) => {
                    query("RELEASE upload").execute(&mut c).await?;
                    Ok(stats)
                }
                Err(e) => {
                    query("ROLLBACK TO upload").execute(&mut c).await?;
                    query("RELEASE upload").execute(&mut c).await?;
                    Err(e)
                }
            }
        }
        .await;
        results.push(result.map_err(|e: Failed| e.into_import(&err)));
    }
    if let Err(e) = tx.commit().await {
        let cause = err(e);
        for r in results.iter_mut().filter(|r| r.is_ok()) {
            *r = Err(ImportError::Db(shared_failure(&path, &cause)));
        }
    }
    results
}

/// A failure that every upload of a batch shares (the transaction could not begin or commit). A
/// database server that is down stays that (the service answers 503 and agents try again).
fn shared_failure(path: &std::path::Path, cause: &DbError) -> DbError {
    match cause {
        DbError::Unavailable { cause, .. } => DbError::Unavailable {
            path: path.to_path_buf(),
            cause: sqlx::Error::Io(std::io::Error::other(format!("none of a batch of uploads was stored: {cause}"))),
        },
        _ => DbError::Conflict {
            path: path.to_path_buf(),
            what: format!("storing a batch of uploads failed, none was stored: {cause}"),
        },
    }
}

/// Applies parsed records on a connection inside a transaction (or a savepoint). An upload to the
/// fleet service names its file and sender: a sender that speaks for one host has its records
/// confined to that host ([`own_host`], [`confine`]), and the upload (with its token's last use) is recorded once stored.
async fn import_into(
    tx: &mut Conn<'_>,
    records: Vec<(usize, Record<'_>)>,
    malformed: &dyn Fn(usize, String) -> ImportError,
    sent: Option<(&str, &Sender)>,
) -> std::result::Result<ImportStats, Failed> {
    let mut stats = ImportStats { records: records.len() as u64, ..Default::default() };
    let own = match sent {
        Some((file, sender)) if sender.one_host => {
            let refused = |message: String| Failed::File(ImportError::Refused { file: file.to_string(), message });
            Some((own_host(tx, sender, &records, &refused).await?, refused))
        }
        _ => None,
    };
    let parents = import_parents(tx, &records, malformed, &mut stats).await?;
    if let Some((own, refused)) = &own {
        confine(tx, &records, &parents, own.as_deref(), refused).await?;
    }
    let fresh = fresh_runs(tx, &records, &parents, malformed, &mut stats).await?;
    insert_runs(tx, &fresh, &mut stats).await?;
    index_fresh(tx, &fresh, &parents).await?;
    import_verdicts(tx, &records, &parents, malformed, &mut stats).await?;
    import_applies(tx, &records, &mut stats, own.as_ref().map(|(_, refused)| refused as &dyn Fn(String) -> Failed))
        .await?;
    if let Some((_, sender)) = sent {
        let host = own.as_ref().and_then(|(host, _)| host.clone());
        let at = kiln_text::timefmt::now_rfc3339();
        // The token's last use, in the upload's transaction: no write of its own per upload.
        query("UPDATE tokens SET last_used_at = $1 WHERE id = $2").bind(&at).bind(&sender.token_id).execute(tx).await?;
        query(
            "INSERT INTO uploads (token_id, host_identity, received_at, client, records, stats) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&sender.token_id)
        .bind(&host)
        .bind(&at)
        .bind(&sender.client)
        .bind(stats.records as i64)
        .bind(serde_json::to_string(&stats).unwrap_or_default())
        .execute(tx)
        .await?;
    }
    Ok(stats)
}

/// The host an agent token speaks for: the identity it was bound to, or, on its first upload that
/// carries a host, that host's (bound now, in the upload's transaction; a token bound meanwhile by
/// another upload is read back and holds). `None`: not bound, and this upload carries no host
/// (provisioning applies alone). A host record of any other identity is refused.
async fn own_host(
    tx: &mut Conn<'_>,
    sender: &Sender,
    records: &[(usize, Record<'_>)],
    refused: &dyn Fn(String) -> Failed,
) -> std::result::Result<Option<String>, Failed> {
    let carried: std::collections::BTreeSet<&str> = records
        .iter()
        .filter_map(|(_, r)| if let Record::Host(h) = r { Some(h.identity.as_str()) } else { None })
        .collect();
    // The token's row: `None` when it is gone, then its host, `None` while unbound.
    let bound = async |tx: &mut Conn<'_>| {
        query("SELECT host_identity FROM tokens WHERE id = $1")
            .bind(&sender.token_id)
            .scalar_optional::<Option<String>>(tx)
            .await
    };
    let Some(mut host) = bound(tx).await? else {
        return Err(refused(format!("token {} no longer exists", sender.token_id)));
    };
    if host.is_none() {
        match carried.len() {
            0 => return Ok(None),
            1 => {
                let first = carried.first().copied().unwrap_or_default();
                // A host another live agent token speaks for is not claimed by a second one's first
                // upload: that takes `kiln token create --host`, or revoking the other token.
                let holder: Option<String> = query(
                    "SELECT name FROM tokens WHERE host_identity = $1 AND revoked_at IS NULL AND id <> $2 LIMIT 1",
                )
                .bind(first)
                .bind(&sender.token_id)
                .scalar_optional(tx)
                .await?;
                if let Some(holder) = holder {
                    return Err(refused(format!(
                        "host {first} is the host of token {holder:?}; this token's first upload may not claim it \
                         (revoke that token, or make this one with `kiln token create --host {first}`)"
                    )));
                }
                query("UPDATE tokens SET host_identity = $1 WHERE id = $2 AND host_identity IS NULL")
                    .bind(first)
                    .bind(&sender.token_id)
                    .execute(tx)
                    .await?;
                host = bound(tx).await?.flatten();
            }
            n => {
                let all: Vec<&str> = carried.iter().copied().collect();
                return Err(refused(format!(
                    "an agent token speaks for one host, and this upload carries {n} ({}); upload each host's \
                     records with its own token, or import a site's export with an importer token",
                    all.join(", ")
                )));
            }
        }
    }
    let host = host.unwrap_or_default();
    if let Some(other) = carried.iter().find(|i| **i != host) {
        return Err(refused(format!(
            "token {} speaks for host {host}, and this upload carries host {other}: an agent token uploads its own \
             host's records only",
            sender.token_id
        )));
    }
    Ok(Some(host))
}

/// An agent's records name its own host only: each run's, inventory's and verdict's host is one of
/// the upload's host records (which [`own_host`] confined), and an inventory a run or verdict
/// names that the upload does not carry must be one the fleet holds for that same host.
async fn confine(
    tx: &mut Conn<'_>,
    records: &[(usize, Record<'_>)],
    p: &Parents,
    own: Option<&str>,
    refused: &dyn Fn(String) -> Failed,
) -> std::result::Result<(), Failed> {
    let mut outside = Vec::new();
    for (_, rec) in records {
        let (what, id, host, inventory) = match rec {
            Record::Run(r) => ("run", &r.id, &r.host_id, r.inventory_id.as_ref()),
            Record::Verdict(v) => ("verdict", &v.id, &v.host_id, Some(&v.inventory_id)),
            Record::Inventory(i) => ("inventory", &i.id, &i.host_id, None),
            _ => continue,
        };
        if !p.host_ids.contains_key(host) {
            return Err(refused(format!(
                "{what} {id} names host {host}, which this upload does not carry: an agent token uploads its own \
                 host's records only"
            )));
        }
        if let Some(inv) = inventory.filter(|i| !p.inventory_configs.contains_key(*i)) {
            outside.push((what, id, inv));
        }
    }
    // The fleet's id of the agent's host, looked up only when an inventory from outside is named.
    let own_id: Option<String> = match own.filter(|_| !outside.is_empty()) {
        Some(identity) => query("SELECT id FROM hosts WHERE identity = $1").bind(identity).scalar_optional(tx).await?,
        None => None,
    };
    for (what, id, inv) in outside {
        let holder: Option<String> =
            query("SELECT host_id FROM inventories WHERE id = $1").bind(inv).scalar_optional(tx).await?;
        if holder.is_some() && holder != own_id {
            return Err(refused(format!(
                "{what} {id} names inventory {inv}, which belongs to another host: an agent token uploads its own \
                 host's records only"
            )));
        }
    }
    Ok(())
}

/// Provisioning applies with their journals. One that is new here goes in whole; one already here
/// is replaced, steps and all, when the record tells more of its story (resumed again, more steps,
/// or finished since it was sent), and otherwise left as it is (the same upload twice).
async fn import_applies(
    tx: &mut Conn<'_>,
    records: &[(usize, Record<'_>)],
    stats: &mut ImportStats,
    one_host: Option<&dyn Fn(String) -> Failed>,
) -> std::result::Result<(), Failed> {
    for (_, rec) in records {
        let Record::Apply(a) = rec else { continue };
        let here: Option<(i64, i64, Option<String>, Option<String>)> = query(
            "SELECT resumes, (SELECT COUNT(*) FROM provision_steps s WHERE s.apply_id = a.id), finished_at, hostname \
             FROM provision_applies a WHERE id = $1",
        )
        .bind(&a.id)
        .fetch_optional_as(tx)
        .await?;
        // An agent continues its own applies only: one stored under another host name is not its.
        if let (Some(refused), Some((_, _, _, stored))) = (one_host, &here) {
            if stored != &a.hostname {
                return Err(refused(format!(
                    "apply {} is stored for host {}, and this upload sends it for {}",
                    a.id,
                    stored.as_deref().unwrap_or("(none)"),
                    a.hostname.as_deref().unwrap_or("(none)")
                )));
            }
        }
        let story =
            |resumes: i64, steps: i64, finished: Option<&str>| (resumes, steps, finished.unwrap_or("").to_string());
        let told = story(a.resumes, a.steps.len() as i64, a.finished_at.as_deref());
        match here {
            Some((r, n, f, _)) if story(r, n, f.as_deref()) >= told => continue,
            Some(_) => {
                query("DELETE FROM provision_steps WHERE apply_id = $1").bind(&a.id).execute(tx).await?;
                query(
                    "UPDATE provision_applies SET image_hash = $2, finished_at = $3, resumes = $4, status = $5 WHERE id = $1",
                )
                .bind(&a.id)
                .bind(&a.image_hash)
                .bind(&a.finished_at)
                .bind(a.resumes)
                .bind(a.status.as_str())
                .execute(tx)
                .await?;
                stats.applies_updated += 1;
            }
            None => {
                query(
                    "INSERT INTO provision_applies \
                     (id, image, image_version, image_hash, root, hostname, started_at, finished_at, resumes, status) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                )
                .bind(&a.id)
                .bind(&a.image)
                .bind(&a.image_version)
                .bind(&a.image_hash)
                .bind(&a.root)
                .bind(&a.hostname)
                .bind(&a.started_at)
                .bind(&a.finished_at)
                .bind(a.resumes)
                .bind(a.status.as_str())
                .execute(tx)
                .await?;
                stats.applies_new += 1;
            }
        }
        for chunk in a.steps.chunks(MAX_BINDS / 12) {
            let mut q =
                Builder::new(format!("INSERT INTO provision_steps (apply_id, {}) ", super::reads::STEP_COLUMNS));
            q.values(chunk.iter().map(|st| {
                [
                    Arg::from(&a.id),
                    Arg::from(st.seq),
                    Arg::from(&st.step_key),
                    Arg::from(&st.summary),
                    Arg::from(&st.command),
                    Arg::from(&st.image_hash),
                    Arg::from(&st.started_at),
                    Arg::from(&st.finished_at),
                    Arg::from(st.status.as_str()),
                    Arg::from(st.exit_code),
                    Arg::from(st.duration_ms),
                    Arg::from(&st.output_tail),
                ]
            }));
            q.build().execute(tx).await?;
        }
    }
    Ok(())
}

/// Verdicts, under the host and inventory earlier records gave (or that this database holds).
async fn import_verdicts(
    tx: &mut Conn<'_>,
    records: &[(usize, Record<'_>)],
    p: &Parents,
    malformed: &dyn Fn(usize, String) -> ImportError,
    stats: &mut ImportStats,
) -> std::result::Result<(), Failed> {
    for (n, rec) in records {
        let Record::Verdict(v) = rec else { continue };
        let host = match p.host_ids.get(&v.host_id) {
            Some(h) => h.clone(),
            None => {
                let here: Option<String> = query("SELECT host_id FROM inventories WHERE id = $1")
                    .bind(&v.inventory_id)
                    .scalar_optional(tx)
                    .await?;
                here.ok_or_else(|| {
                    Failed::File(malformed(
                        *n,
                        format!("verdict {} names host {}, which no record gives", v.id, v.host_id),
                    ))
                })?
            }
        };
        let known: Option<String> =
            query("SELECT id FROM inventories WHERE id = $1").bind(&v.inventory_id).scalar_optional(tx).await?;
        if known.is_none() {
            let why = format!(
                "verdict {} names inventory {}, which neither the file nor the database holds",
                v.id, v.inventory_id
            );
            return Err(Failed::File(malformed(*n, why)));
        }
        let record = crate::NewVerdict {
            host_id: host,
            inventory_id: v.inventory_id.clone(),
            judged_at: v.judged_at.clone(),
            spec_name: v.spec_name.clone(),
            spec_hash: v.spec_hash.clone(),
            spec: v.spec.clone(),
            verdict: v.verdict.clone(),
            failed: v.failed,
            document: v.document.get().to_string(),
        };
        stats.verdicts_new += super::reads::insert_verdict(tx, &v.id, &record).await?;
    }
    Ok(())
}

/// A failure inside an import: the database's (converted by the caller, who knows its path) or the
/// file's.
enum Failed {
    Sql(sqlx::Error),
    File(ImportError),
}

impl Failed {
    fn into_import(self, sql: &impl Fn(sqlx::Error) -> DbError) -> ImportError {
        match self {
            Failed::Sql(e) => ImportError::Db(sql(e)),
            Failed::File(e) => e,
        }
    }
}

impl From<sqlx::Error> for Failed {
    fn from(e: sqlx::Error) -> Failed {
        Failed::Sql(e)
    }
}

/// How the records that runs name map onto this database: hosts by identity, software by
/// fingerprint, and the configuration each host and inventory had.
#[derive(Default)]
struct Parents {
    host_ids: HashMap<String, String>,
    software_ids: HashMap<String, String>,
    host_configs: HashMap<String, (String, String)>,
    inventory_configs: HashMap<String, (String, String)>,
}

/// Hosts (an export's id maps onto the id this database already has for the identity), software
/// stacks and inventories.
async fn import_parents(
    tx: &mut Conn<'_>,
    records: &[(usize, Record<'_>)],
    malformed: &dyn Fn(usize, String) -> ImportError,
    stats: &mut ImportStats,
) -> std::result::Result<Parents, Failed> {
    // Only the hosts and stacks these records name: an upload must not read the whole fleet.
    let identities =
        records.iter().filter_map(|(_, r)| if let Record::Host(h) = r { Some(h.identity.as_str()) } else { None });
    let existing_hosts = pairs_in(tx, "SELECT identity, id FROM hosts WHERE identity IN (", identities).await?;
    let fingerprints =
        records
            .iter()
            .filter_map(|(_, r)| if let Record::Software(s) = r { Some(s.fingerprint.as_str()) } else { None });
    let existing_software =
        pairs_in(tx, "SELECT fingerprint, id FROM software_stacks WHERE fingerprint IN (", fingerprints).await?;
    let mut p = Parents::default();
    for (n, rec) in records {
        match rec {
            Record::Host(h) => import_host(tx, *n, h, &existing_hosts, &mut p, malformed, stats).await?,
            Record::Software(SoftwareRec { id, fingerprint, document, .. }) => {
                if let Some(known) = existing_software.get(fingerprint) {
                    p.software_ids.insert(id.clone(), known.clone());
                    continue;
                }
                query("INSERT INTO software_stacks (id, fingerprint, document) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING")
                    .bind(id)
                    .bind(fingerprint)
                    .bind(document.get())
                    .execute(tx)
                    .await?;
                p.software_ids.insert(id.clone(), id.clone());
                stats.software_new += 1;
            }
            Record::Inventory(i) => import_inventory(tx, *n, i, &mut p, malformed, stats).await?,
            Record::Run(_) | Record::Verdict(_) | Record::Apply(_) | Record::End(_) => {}
        }
    }
    Ok(p)
}

/// A host: merged into the one with its identity (its newest name and configuration win), or new.
async fn import_host(
    tx: &mut Conn<'_>,
    n: usize,
    h: &HostRec,
    existing: &HashMap<String, String>,
    p: &mut Parents,
    malformed: &dyn Fn(usize, String) -> ImportError,
    stats: &mut ImportStats,
) -> std::result::Result<(), Failed> {
    p.host_configs.insert(h.id.clone(), (h.config_fingerprint.clone(), h.config_name.clone()));
    if let Some(known) = existing.get(&h.identity) {
        p.host_ids.insert(h.id.clone(), known.clone());
        query(
            "UPDATE hosts SET last_seen = CASE WHEN $1 > last_seen THEN $1 ELSE last_seen END, \
             first_seen = CASE WHEN $2 < first_seen THEN $2 ELSE first_seen END, \
             hostname = CASE WHEN $1 > last_seen THEN COALESCE($3, hostname) ELSE hostname END, \
             config_fingerprint = CASE WHEN $1 > last_seen THEN $4 ELSE config_fingerprint END, \
             config_name = CASE WHEN $1 > last_seen THEN $5 ELSE config_name END WHERE id = $6",
        )
        .bind(&h.last_seen)
        .bind(&h.first_seen)
        .bind(&h.hostname)
        .bind(&h.config_fingerprint)
        .bind(&h.config_name)
        .bind(known)
        .execute(tx)
        .await?;
        return Ok(());
    }
    query(
        "INSERT INTO hosts (id, identity, hostname, config_fingerprint, config_name, first_seen, last_seen) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(&h.id)
    .bind(&h.identity)
    .bind(&h.hostname)
    .bind(&h.config_fingerprint)
    .bind(&h.config_name)
    .bind(&h.first_seen)
    .bind(&h.last_seen)
    .execute(tx)
    .await
    .map_err(|e| Failed::File(malformed(n, format!("host {}: {e}", h.id))))?;
    p.host_ids.insert(h.id.clone(), h.id.clone());
    stats.hosts_new += 1;
    Ok(())
}

/// An inventory, under the host an earlier record gave.
async fn import_inventory(
    tx: &mut Conn<'_>,
    n: usize,
    i: &InventoryRec<'_>,
    p: &mut Parents,
    malformed: &dyn Fn(usize, String) -> ImportError,
    stats: &mut ImportStats,
) -> std::result::Result<(), Failed> {
    let Some(host) = p.host_ids.get(&i.host_id) else {
        let why = format!("inventory {} names host {}, which no earlier host record gives", i.id, i.host_id);
        return Err(Failed::File(malformed(n, why)));
    };
    p.inventory_configs.insert(i.id.clone(), (i.config_fingerprint.clone(), i.config_name.clone()));
    stats.inventories_new += query(
        "INSERT INTO inventories (id, host_id, collected_at, schema_version, config_fingerprint, \
         config_name, cpu_model, cpu_packages, cpu_cores, cpu_threads, memory_bytes, kernel_release, problem_count, \
         document) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) \
         ON CONFLICT DO NOTHING",
    )
    .bind(&i.id)
    .bind(host)
    .bind(&i.collected_at)
    .bind(i.schema_version)
    .bind(&i.config_fingerprint)
    .bind(&i.config_name)
    .bind(&i.cpu_model)
    .bind(i.cpu_packages)
    .bind(i.cpu_cores)
    .bind(i.cpu_threads)
    .bind(i.memory_bytes)
    .bind(&i.kernel_release)
    .bind(i.problem_count)
    .bind(i.document.get())
    .execute(tx)
    .await?;
    Ok(())
}

/// The (key, value) rows of `select` (which ends in `IN (`) for the distinct `keys`, in batches;
/// no statement at all for no keys.
async fn pairs_in<'k>(
    tx: &mut Conn<'_>,
    select: &str,
    keys: impl Iterator<Item = &'k str>,
) -> std::result::Result<HashMap<String, String>, sqlx::Error> {
    let keys: Vec<&str> = keys.collect::<HashSet<_>>().into_iter().collect();
    let mut found = HashMap::new();
    for chunk in keys.chunks(MAX_BINDS) {
        let mut q = Builder::new(select);
        q.list(chunk.iter().copied());
        q.push(")");
        found.extend(q.build().fetch_all(tx).await?.into_iter().map(|r: Row| (r.get(0), r.get(1))));
    }
    Ok(found)
}

/// Which of `ids` are already in `table` (batched lookups; a fresh database answers with nothing).
async fn existing_ids(
    tx: &mut Conn<'_>,
    table: &str,
    ids: &[&str],
) -> std::result::Result<HashSet<String>, sqlx::Error> {
    let mut found = HashSet::new();
    for chunk in ids.chunks(MAX_BINDS) {
        let mut q = Builder::new(format!("SELECT id FROM {table} WHERE id IN ("));
        q.list(chunk.iter().copied());
        q.push(")");
        for r in q.build().fetch_all(tx).await? {
            found.insert(r.get(0));
        }
    }
    Ok(found)
}

/// A run of the file that this database lacks, with its parents mapped.
struct NewRunRef<'r> {
    id: &'r str,
    host: String,
    inventory: Option<&'r str>,
    software: Option<String>,
    rec: &'r RunRec<'r>,
}

/// The file's runs that are not here yet, checked (their host, software and inventory must be
/// given, their id a UUID), sorted by id.
async fn fresh_runs<'r>(
    tx: &mut Conn<'_>,
    records: &'r [(usize, Record<'_>)],
    p: &Parents,
    malformed: &dyn Fn(usize, String) -> ImportError,
    stats: &mut ImportStats,
) -> std::result::Result<Vec<NewRunRef<'r>>, Failed> {
    let runs: Vec<(usize, &RunRec<'_>)> =
        records.iter().filter_map(|(n, r)| if let Record::Run(r) = r { Some((*n, r)) } else { None }).collect();
    let ids: Vec<&str> = runs.iter().map(|(_, r)| r.id.as_str()).collect();
    let mut known_runs = existing_ids(tx, "runs", &ids).await?;
    // Inventories a run may name: those in this file (inserted above) and those already here.
    let mut known_inventories: HashSet<String> = p.inventory_configs.keys().cloned().collect();
    let outside: Vec<&str> = runs
        .iter()
        .filter_map(|(_, r)| r.inventory_id.as_deref())
        .filter(|i| !known_inventories.contains(*i))
        .collect();
    known_inventories.extend(existing_ids(tx, "inventories", &outside).await?);
    let mut fresh = Vec::new();
    for (n, rec) in runs {
        let RunRec { id, host_id, inventory_id, software_id, .. } = rec;
        if known_runs.contains(id) {
            stats.runs_known += 1;
            continue;
        }
        let bad = |why: String| Failed::File(malformed(n, why));
        let host = p
            .host_ids
            .get(host_id)
            .ok_or_else(|| bad(format!("run {id} names host {host_id}, which no host record gives")))?;
        let software =
            match software_id {
                Some(s) => Some(p.software_ids.get(s).cloned().ok_or_else(|| {
                    bad(format!("run {id} names software stack {s}, which no software record gives"))
                })?),
                None => None,
            };
        if let Some(inv) = inventory_id.as_ref().filter(|i| !known_inventories.contains(*i)) {
            return Err(bad(format!("run {id} names inventory {inv}, which no inventory record gives")));
        }
        if uuid::Uuid::parse_str(id).is_err() {
            return Err(bad(format!("run id {id:?} is not a UUID")));
        }
        known_runs.insert(id.clone());
        let inventory = inventory_id.as_deref();
        fresh.push(NewRunRef { id, host: host.clone(), inventory, software, rec });
    }
    fresh.sort_unstable_by(|a, b| a.id.cmp(b.id));
    stats.runs_new = fresh.len() as u64;
    Ok(fresh)
}

/// The new runs and their values, numbered in run-id order and written key-sorted.
async fn insert_runs(
    tx: &mut Conn<'_>,
    fresh: &[NewRunRef<'_>],
    stats: &mut ImportStats,
) -> std::result::Result<(), sqlx::Error> {
    tx.insert_rows(
        "runs (id, host_id, inventory_id, software_id, benchmark, config, started_at, finished_at, status, status_reason)",
        10,
        fresh,
        |r, out| {
            let RunRec { benchmark, config, started_at, finished_at, status, status_reason, .. } = r.rec;
            out.extend([
                Some(r.id),
                Some(r.host.as_str()),
                r.inventory,
                r.software.as_deref(),
                Some(benchmark.as_str()),
                Some(config.as_str()),
                Some(started_at.as_str()),
                finished_at.as_deref(),
                Some(status.as_str()),
                status_reason.as_deref(),
            ]
            .map(crate::bulk::Field::from));
        },
    )
    .await?;
    let ids: Vec<&str> = fresh.iter().map(|r| r.id).collect();
    let nums = super::values::run_numbers(tx, &ids).await?;
    // Sized up front: growing vectors of millions of rows by doubling cost a tenth of an import
    // in reallocations and fresh pages.
    let mut v = super::values::Values {
        metrics: Vec::with_capacity(fresh.iter().map(|r| r.rec.metrics.len()).sum()),
        samples: Vec::with_capacity(fresh.iter().map(|r| r.rec.samples.len()).sum()),
        telemetry: Vec::with_capacity(fresh.iter().map(|r| r.rec.telemetry.len()).sum()),
    };
    for r in fresh {
        let rec = r.rec;
        v.metrics.extend(rec.metrics.iter().map(|(n, x, u, d)| (r.id, n.as_str(), u.as_str(), d.as_str(), *x)));
        v.samples.extend(rec.samples.iter().map(|(m, i, x)| (r.id, m.as_str(), *i, *x)));
        v.telemetry.extend(rec.telemetry.iter().map(|(t, src, n, x)| (r.id, src.as_str(), n.as_str(), *t, *x)));
    }
    super::values::write(tx, &nums, &v).await?;
    (stats.metrics, stats.samples, stats.telemetry) =
        (v.metrics.len() as u64, v.samples.len() as u64, v.telemetry.len() as u64);
    Ok(())
}

/// The series of the new runs (only results: `ok` and `unstable`).
async fn index_fresh(tx: &mut Conn<'_>, fresh: &[NewRunRef<'_>], p: &Parents) -> std::result::Result<(), sqlx::Error> {
    let used = fresh.iter().filter_map(|r| r.software.as_deref());
    let software_fps = pairs_in(tx, "SELECT id, fingerprint FROM software_stacks WHERE id IN (", used).await?;
    let empty = (String::new(), String::new());
    let index: Vec<IndexRun> = fresh
        .iter()
        .filter(|r| r.rec.status.is_result())
        .map(|r| {
            let RunRec { host_id, benchmark, config, started_at, metrics, telemetry, .. } = r.rec;
            let (cfp, cname) = r
                .inventory
                .and_then(|i| p.inventory_configs.get(i))
                .or_else(|| p.host_configs.get(host_id))
                .unwrap_or(&empty);
            IndexRun {
                host_id: &r.host,
                run_id: r.id,
                started_at,
                config_fingerprint: cfp,
                config_name: cname,
                benchmark,
                bench_config: config,
                software_fingerprint: r.software.as_ref().and_then(|s| software_fps.get(s)).map_or("", String::as_str),
                metrics: metrics.iter().map(|(n, v, u, d)| (n.as_str(), *v, u.as_str(), d.as_str())).collect(),
                power_watts: mean_power(telemetry.iter().map(|(_, s, n, v)| (s.as_str(), n.as_str(), *v))),
            }
        })
        .collect();
    index_runs(tx, &index).await
}

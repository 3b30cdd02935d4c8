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

/// Several uploads (label, export text) in one transaction, each whole or not at all, and one
/// commit (one sync to disk) for them all. The fleet service's writer takes the uploads that
/// queued while it was busy this way (group commit).
///
/// First as one import: each upload admitted on its own (its sender's host bound and its records
/// confined to it, [`admit`]; a refused one is left out), then every admitted upload's records
/// stored together, a statement per table rather than per upload. Where that fails (a malformed
/// record, two uploads that clash), it is undone and each upload goes again in a savepoint of its
/// own, so that one bad upload fails alone and with its own error. A failed commit fails every
/// upload of the batch.
pub(crate) async fn import_many(
    s: &mut impl Backend,
    uploads: &[Upload],
) -> Vec<std::result::Result<ImportStats, ImportError>> {
    let err = sql_err(s);
    let path = s.path().to_path_buf();
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
    let together = if parsed.iter().filter(|p| p.is_ok()).count() > 1 {
        let mut c = tx.conn();
        combined(&mut c, uploads, parsed).await
    } else {
        Together::Undone(parsed)
    };
    let mut results = match together {
        Together::Stored(results) => results,
        Together::Undone(parsed) => one_by_one(&mut tx.conn(), uploads, parsed, &err).await,
        // The transaction is dropped uncommitted: nothing of the batch is stored.
        Together::Broken(e) => {
            let cause = err(e);
            return uploads.iter().map(|_| Err(ImportError::Db(shared_failure(&path, &cause)))).collect();
        }
    };
    if let Err(e) = tx.commit().await {
        let cause = err(e);
        for r in results.iter_mut().filter(|r| r.is_ok()) {
            *r = Err(ImportError::Db(shared_failure(&path, &cause)));
        }
    }
    results
}

type Parsed<'t> = std::result::Result<Vec<(usize, Record<'t>)>, ImportError>;

/// How a batch went as one import.
enum Together<'t> {
    /// Stored: each upload's result (a refused upload's refusal among them).
    Stored(Vec<std::result::Result<ImportStats, ImportError>>),
    /// Undone: the uploads, parsed again, for [`one_by_one`].
    Undone(Vec<Parsed<'t>>),
    /// Not undone (the savepoint could not be rolled back): the transaction must not commit.
    Broken(sqlx::Error),
}

/// The uploads of a batch as one import, inside a savepoint.
async fn combined<'t>(c: &mut Conn<'_>, uploads: &'t [Upload], parsed: Vec<Parsed<'t>>) -> Together<'t> {
    let again = || uploads.iter().map(|u| parse_export(&u.label, &u.text)).collect::<Vec<_>>();
    if let Err(e) = query("SAVEPOINT batch").execute(c).await {
        return Together::Broken(e);
    }
    let mut results: Vec<std::result::Result<ImportStats, ImportError>> = Vec::with_capacity(uploads.len());
    // Every admitted upload's records, numbered across the batch (each upload from its own start).
    let mut all: Vec<(usize, Record<'t>)> = Vec::new();
    let mut tally = Tally { starts: Vec::new(), stats: Vec::new() };
    let mut admitted: Vec<(usize, Option<Option<String>>)> = Vec::new();
    // The agents' tokens and the holders of the hosts they carry, read once for the batch.
    let senders: Vec<&str> = uploads.iter().filter(|u| u.sender.one_host).map(|u| u.sender.token_id.as_str()).collect();
    let identities: Vec<&str> = parsed
        .iter()
        .flatten()
        .flatten()
        .filter_map(|(_, r)| if let Record::Host(h) = r { Some(h.identity.as_str()) } else { None })
        .collect();
    let mut known = match Known::load(c, &senders, &identities).await {
        Ok(k) => k,
        Err(_) => return undo(c, again).await,
    };
    let mut ok = true;
    for (i, (upload, records)) in uploads.iter().zip(parsed).enumerate() {
        let records = match records {
            Ok(r) => r,
            Err(e) => {
                results.push(Err(e));
                continue;
            }
        };
        match admit(c, &upload.label, &upload.sender, &records, Some(&mut known)).await {
            Ok(own) => {
                let start = all.last().map_or(0, |(n, _)| n + 1);
                tally.starts.push(start);
                tally.stats.push(ImportStats { records: records.len() as u64, ..Default::default() });
                all.extend(records.into_iter().map(|(n, r)| (start + n, r)));
                admitted.push((i, own));
                results.push(Ok(ImportStats::default()));
            }
            Err(Failed::File(e)) => results.push(Err(e)),
            Err(Failed::Sql(_)) => {
                ok = false;
                break;
            }
        }
    }
    if ok {
        // Any failure here (a record that does not hold, a clash between uploads) is one that the
        // uploads on their own say better.
        let malformed = |line: usize, message: String| ImportError::Malformed { file: "batch".into(), line, message };
        let refused = |message: String| Failed::File(ImportError::Refused { file: "batch".into(), message });
        let one_host = admitted.iter().any(|(_, own)| own.is_some()).then_some(&refused as &dyn Fn(String) -> Failed);
        ok = store_records(c, &all, &malformed, &mut tally, one_host).await.is_ok();
    }
    if ok {
        let stored: Vec<(&Sender, Option<String>, &ImportStats)> = admitted
            .iter()
            .zip(&tally.stats)
            .map(|((i, own), stats)| (&uploads[*i].sender, own.clone().flatten(), stats))
            .collect();
        ok = record_uploads(c, &stored).await.is_ok();
    }
    if ok && query("RELEASE batch").execute(c).await.is_ok() {
        for ((i, _), stats) in admitted.into_iter().zip(tally.stats) {
            results[i] = Ok(stats);
        }
        return Together::Stored(results);
    }
    drop(all);
    undo(c, again).await
}

/// A batch that failed as one: rolled back to its savepoint, the uploads parsed again for
/// [`one_by_one`] (or, where even that fails, the transaction broken).
async fn undo<'t>(c: &mut Conn<'_>, again: impl FnOnce() -> Vec<Parsed<'t>>) -> Together<'t> {
    for undo in ["ROLLBACK TO batch", "RELEASE batch"] {
        if let Err(e) = query(undo).execute(c).await {
            return Together::Broken(e);
        }
    }
    Together::Undone(again())
}

/// The agent tokens of a batch's senders and the holders of the hosts its uploads carry, read in
/// two statements for the whole batch and kept up to date as the batch binds tokens, so that an
/// agent's upload is admitted without statements of its own (but its first, which binds).
struct Known {
    /// Token id → (its name, its bound host); a token not here is gone.
    tokens: HashMap<String, (String, Option<String>)>,
    /// Host identity → the live tokens bound to it (id, name).
    holders: HashMap<String, Vec<(String, String)>>,
}

impl Known {
    async fn load(tx: &mut Conn<'_>, senders: &[&str], identities: &[&str]) -> sqlx::Result<Known> {
        let mut k = Known { tokens: HashMap::new(), holders: HashMap::new() };
        let senders: Vec<&str> = senders.iter().copied().collect::<HashSet<_>>().into_iter().collect();
        for chunk in senders.chunks(MAX_BINDS) {
            let mut q = Builder::new("SELECT id, name, host_identity FROM tokens WHERE id IN (");
            q.list(chunk.iter().copied());
            q.push(")");
            for r in q.build().fetch_all(tx).await? {
                k.tokens.insert(r.get(0), (r.get(1), r.get(2)));
            }
        }
        let identities: Vec<&str> = identities.iter().copied().collect::<HashSet<_>>().into_iter().collect();
        for chunk in identities.chunks(MAX_BINDS) {
            let mut q = Builder::new(
                "SELECT host_identity, id, name FROM tokens WHERE revoked_at IS NULL AND host_identity IN (",
            );
            q.list(chunk.iter().copied());
            q.push(")");
            for r in q.build().fetch_all(tx).await? {
                k.holders.entry(r.get(0)).or_default().push((r.get(1), r.get(2)));
            }
        }
        Ok(k)
    }
}

/// Each upload in a savepoint of its own: applied, or rolled back with its own error.
async fn one_by_one(
    c: &mut Conn<'_>,
    uploads: &[Upload],
    parsed: Vec<Parsed<'_>>,
    err: &impl Fn(sqlx::Error) -> DbError,
) -> Vec<std::result::Result<ImportStats, ImportError>> {
    let mut results = Vec::with_capacity(uploads.len());
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
            query("SAVEPOINT upload").execute(&mut *c).await?;
            match import_into(c, records, &malformed, Some((file, &upload.sender))).await {
                Ok(stats) => {
                    query("RELEASE upload").execute(&mut *c).await?;
                    Ok(stats)
                }
                Err(e) => {
                    query("ROLLBACK TO upload").execute(&mut *c).await?;
                    query("RELEASE upload").execute(&mut *c).await?;
                    Err(e)
                }
            }
        }
        .await;
        results.push(result.map_err(|e: Failed| e.into_import(err)));
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
    let mut tally = Tally::one(records.len());
    let own = match sent {
        Some((file, sender)) => admit(tx, file, sender, &records, None).await?,
        None => None,
    };
    let refused = sent.map(|(file, _)| refusal(file));
    let one_host = own.as_ref().and(refused.as_ref()).map(|r| r as &dyn Fn(String) -> Failed);
    store_records(tx, &records, malformed, &mut tally, one_host).await?;
    let stats = tally.stats.pop().unwrap_or_default();
    if let Some((_, sender)) = sent {
        record_uploads(tx, &[(sender, own.flatten(), &stats)]).await?;
    }
    Ok(stats)
}

/// A refusal of `file`'s upload: a sender speaking for a host it may not.
fn refusal(file: &str) -> impl Fn(String) -> Failed + '_ {
    move |message: String| Failed::File(ImportError::Refused { file: file.to_string(), message })
}

/// Whether an upload may be stored, before anything of it is: a sender that speaks for one host
/// has it bound ([`own_host`]) and its records confined to it ([`confine`]). `Some(host)` for
/// such a sender (`None` inside: not bound, and the upload carries no host), `None` for one that
/// may send any host's.
async fn admit(
    tx: &mut Conn<'_>,
    file: &str,
    sender: &Sender,
    records: &[(usize, Record<'_>)],
    known: Option<&mut Known>,
) -> std::result::Result<Option<Option<String>>, Failed> {
    if !sender.one_host {
        return Ok(None);
    }
    let refused = refusal(file);
    let own = own_host(tx, sender, records, &refused, known).await?;
    confine(tx, records, own.as_deref(), &refused).await?;
    Ok(Some(own))
}

/// Stores checked records: parents, runs with their values and series, verdicts, applies.
/// `one_host`: applies are refused where stored for another host name.
async fn store_records(
    tx: &mut Conn<'_>,
    records: &[(usize, Record<'_>)],
    malformed: &dyn Fn(usize, String) -> ImportError,
    tally: &mut Tally,
    one_host: Option<&dyn Fn(String) -> Failed>,
) -> std::result::Result<(), Failed> {
    let parents = import_parents(tx, records, malformed, tally).await?;
    let fresh = fresh_runs(tx, records, &parents, malformed, tally).await?;
    insert_runs(tx, &fresh, tally).await?;
    index_fresh(tx, &fresh, &parents).await?;
    import_verdicts(tx, records, &parents, malformed, tally).await?;
    import_applies(tx, records, tally, one_host).await
}

/// Each stored upload recorded (token, host, counts, time, client), and its token's last use, in
/// the uploads' transaction: no write of their own per upload.
async fn record_uploads(
    tx: &mut Conn<'_>,
    uploads: &[(&Sender, Option<String>, &ImportStats)],
) -> std::result::Result<(), sqlx::Error> {
    if uploads.is_empty() {
        return Ok(());
    }
    let at = kiln_text::timefmt::now_rfc3339();
    let tokens: Vec<&str> = uploads
        .iter()
        .map(|(s, ..)| s.token_id.as_str())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    for chunk in tokens.chunks(MAX_BINDS - 1) {
        let mut q = Builder::new("UPDATE tokens SET last_used_at = ");
        q.list([at.as_str()]);
        q.push(" WHERE id IN (");
        q.list(chunk.iter().copied());
        q.push(")");
        q.build().execute(tx).await?;
    }
    for chunk in uploads.chunks(MAX_BINDS / 6) {
        let mut q = Builder::new("INSERT INTO uploads (token_id, host_identity, received_at, client, records, stats) ");
        q.values(chunk.iter().map(|(sender, host, stats)| {
            [
                Arg::from(&sender.token_id),
                Arg::from(host.as_deref()),
                Arg::from(at.as_str()),
                Arg::from(&sender.client),
                Arg::from(stats.records as i64),
                Arg::from(serde_json::to_string(stats).unwrap_or_default()),
            ]
        }));
        q.build().execute(tx).await?;
    }
    Ok(())
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
    known: Option<&mut Known>,
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
    let stored = match known.as_deref() {
        Some(k) => k.tokens.get(&sender.token_id).map(|(_, host)| host.clone()),
        None => bound(tx).await?,
    };
    let Some(mut host) = stored else {
        return Err(refused(format!("token {} no longer exists", sender.token_id)));
    };
    if host.is_none() {
        match carried.len() {
            0 => return Ok(None),
            1 => {
                let first = carried.first().copied().unwrap_or_default();
                // A host another live agent token speaks for is not claimed by a second one's first
                // upload: that takes `kiln token create --host`, or revoking the other token.
                let holder: Option<String> = match known.as_deref() {
                    Some(k) => k
                        .holders
                        .get(first)
                        .and_then(|h| h.iter().find(|(id, _)| *id != sender.token_id))
                        .map(|(_, name)| name.clone()),
                    None => {
                        query(
                            "SELECT name FROM tokens WHERE host_identity = $1 AND revoked_at IS NULL AND id <> $2 \
                             LIMIT 1",
                        )
                        .bind(first)
                        .bind(&sender.token_id)
                        .scalar_optional(tx)
                        .await?
                    }
                };
                if let Some(holder) = holder {
                    return Err(refused(format!(
                        "host {first} is the host of token {holder:?}; this token's first upload may not claim it \
                         (revoke that token, or make this one with `kiln token create --host {first}`)"
                    )));
                }
                let updated = query("UPDATE tokens SET host_identity = $1 WHERE id = $2 AND host_identity IS NULL")
                    .bind(first)
                    .bind(&sender.token_id)
                    .execute(tx)
                    .await?;
                // Bound now; or bound meanwhile by another writer, and then what it holds is read.
                host = if updated == 1 { Some(first.to_string()) } else { bound(tx).await?.flatten() };
                if let (Some(k), Some(h)) = (known, &host) {
                    let name = k.tokens.get(&sender.token_id).map(|(n, _)| n.clone()).unwrap_or_default();
                    k.tokens.insert(sender.token_id.clone(), (name.clone(), Some(h.clone())));
                    k.holders.entry(h.clone()).or_default().push((sender.token_id.clone(), name));
                }
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
    own: Option<&str>,
    refused: &dyn Fn(String) -> Failed,
) -> std::result::Result<(), Failed> {
    // The upload's own host and inventory records (not those of another upload in its batch).
    let mut hosts = HashSet::new();
    let mut inventories = HashSet::new();
    for (_, rec) in records {
        match rec {
            Record::Host(h) => {
                hosts.insert(h.id.as_str());
            }
            Record::Inventory(i) => {
                inventories.insert(i.id.as_str());
            }
            _ => {}
        }
    }
    let mut outside = Vec::new();
    for (_, rec) in records {
        let (what, id, host, inventory) = match rec {
            Record::Run(r) => ("run", &r.id, &r.host_id, r.inventory_id.as_ref()),
            Record::Verdict(v) => ("verdict", &v.id, &v.host_id, Some(&v.inventory_id)),
            Record::Inventory(i) => ("inventory", &i.id, &i.host_id, None),
            _ => continue,
        };
        if !hosts.contains(host.as_str()) {
            return Err(refused(format!(
                "{what} {id} names host {host}, which this upload does not carry: an agent token uploads its own \
                 host's records only"
            )));
        }
        if let Some(inv) = inventory.filter(|i| !inventories.contains(i.as_str())) {
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
    tally: &mut Tally,
    one_host: Option<&dyn Fn(String) -> Failed>,
) -> std::result::Result<(), Failed> {
    for (n, rec) in records {
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
                tally.of(*n).applies_updated += 1;
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
                tally.of(*n).applies_new += 1;
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
    tally: &mut Tally,
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
        tally.of(*n).verdicts_new += super::reads::insert_verdict(tx, &v.id, &record).await?;
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

/// What an import added, per upload: a combined batch numbers its records across the uploads
/// (each upload's from its own start), and a record's number says whose counts it adds to.
struct Tally {
    starts: Vec<usize>,
    stats: Vec<ImportStats>,
}

impl Tally {
    /// One file or upload of `records` records.
    fn one(records: usize) -> Tally {
        Tally { starts: vec![0], stats: vec![ImportStats { records: records as u64, ..Default::default() }] }
    }

    /// The counts of the upload that record `n` belongs to.
    fn of(&mut self, n: usize) -> &mut ImportStats {
        let i = self.starts.partition_point(|s| *s <= n).saturating_sub(1);
        &mut self.stats[i]
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
    tally: &mut Tally,
) -> std::result::Result<Parents, Failed> {
    // Only the hosts and stacks these records name: an upload must not read the whole fleet.
    let identities =
        records.iter().filter_map(|(_, r)| if let Record::Host(h) = r { Some(h.identity.as_str()) } else { None });
    let mut existing_hosts = pairs_in(tx, "SELECT identity, id FROM hosts WHERE identity IN (", identities).await?;
    let fingerprints =
        records
            .iter()
            .filter_map(|(_, r)| if let Record::Software(s) = r { Some(s.fingerprint.as_str()) } else { None });
    let mut existing_software =
        pairs_in(tx, "SELECT fingerprint, id FROM software_stacks WHERE fingerprint IN (", fingerprints).await?;
    let mut p = Parents::default();
    for (n, rec) in records {
        match rec {
            Record::Host(h) => import_host(tx, *n, h, &mut existing_hosts, &mut p, malformed, tally).await?,
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
                // The same stack in a later record (another agent's upload of the batch) is this one.
                existing_software.insert(fingerprint.clone(), id.clone());
                tally.of(*n).software_new += 1;
            }
            Record::Inventory(i) => import_inventory(tx, *n, i, &mut p, malformed, tally).await?,
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
    existing: &mut HashMap<String, String>,
    p: &mut Parents,
    malformed: &dyn Fn(usize, String) -> ImportError,
    tally: &mut Tally,
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
    existing.insert(h.identity.clone(), h.id.clone());
    tally.of(n).hosts_new += 1;
    Ok(())
}

/// An inventory, under the host an earlier record gave.
async fn import_inventory(
    tx: &mut Conn<'_>,
    n: usize,
    i: &InventoryRec<'_>,
    p: &mut Parents,
    malformed: &dyn Fn(usize, String) -> ImportError,
    tally: &mut Tally,
) -> std::result::Result<(), Failed> {
    let Some(host) = p.host_ids.get(&i.host_id) else {
        let why = format!("inventory {} names host {}, which no earlier host record gives", i.id, i.host_id);
        return Err(Failed::File(malformed(n, why)));
    };
    p.inventory_configs.insert(i.id.clone(), (i.config_fingerprint.clone(), i.config_name.clone()));
    tally.of(n).inventories_new += query(
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
    /// The record's number (whose counts it adds to).
    n: usize,
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
    tally: &mut Tally,
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
            tally.of(n).runs_known += 1;
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
        fresh.push(NewRunRef { n, id, host: host.clone(), inventory, software, rec });
        tally.of(n).runs_new += 1;
    }
    fresh.sort_unstable_by(|a, b| a.id.cmp(b.id));
    Ok(fresh)
}

/// The new runs and their values, numbered in run-id order and written key-sorted.
async fn insert_runs(
    tx: &mut Conn<'_>,
    fresh: &[NewRunRef<'_>],
    tally: &mut Tally,
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
        let stats = tally.of(r.n);
        stats.metrics += rec.metrics.len() as u64;
        stats.samples += rec.samples.len() as u64;
        stats.telemetry += rec.telemetry.len() as u64;
        v.metrics.extend(rec.metrics.iter().map(|(n, x, u, d)| (r.id, n.as_str(), u.as_str(), d.as_str(), *x)));
        v.samples.extend(rec.samples.iter().map(|(m, i, x)| (r.id, m.as_str(), *i, *x)));
        v.telemetry.extend(rec.telemetry.iter().map(|(t, src, n, x)| (r.id, src.as_str(), n.as_str(), *t, *x)));
    }
    super::values::write(tx, &nums, &v).await?;
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

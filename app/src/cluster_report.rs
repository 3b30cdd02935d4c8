//! `kiln report --cluster ID`: one cluster run from the stored runs of its ranks — each rail's pair
//! matrix as a heat map, judged again from the stored rows (every rank stored its own), the
//! collectives' bus bandwidth against message size, and the weak-scaling curve. Pure: the runs
//! in, the report out.

use std::collections::BTreeMap;

use kiln_bench::cluster::{judge_fabric, Link};
use kiln_db::RunDetail;
use serde_json::Value;

use crate::report::{Chart, Report, Section};
use kiln_text::num;

/// A run's configuration, parsed.
fn config(run: &RunDetail) -> Value {
    serde_json::from_str(&run.run.config).unwrap_or(Value::Null)
}

/// The newest run of `benchmark` per rank (a rank may have stored a run twice, from a retry of the
/// same job id only by hand; the newest wins).
fn by_rank<'a>(runs: &'a [RunDetail], benchmark: &str) -> BTreeMap<usize, (&'a RunDetail, Value)> {
    let mut out = BTreeMap::new();
    for r in runs.iter().filter(|r| r.run.benchmark == benchmark) {
        let c = config(r);
        if let Some(rank) = c["rank"].as_u64() {
            out.insert(rank as usize, (r, c));
        }
    }
    out
}

/// The report of one cluster run; `asked` is what the user gave (the id or its prefix).
pub fn build(asked: &str, runs: &[RunDetail]) -> Report {
    let id = runs.first().map(|r| config(r)["cluster_id"].as_str().unwrap_or(asked).to_string()).unwrap_or_default();
    let mut sections = Vec::new();
    let hosts: std::collections::BTreeSet<&str> = runs.iter().filter_map(|r| r.run.hostname.as_deref()).collect();
    let benchmarks: std::collections::BTreeSet<&str> = runs.iter().map(|r| r.run.benchmark.as_str()).collect();
    sections.push(Section {
        heading: "Cluster run".into(),
        text: vec![format!(
            "Cluster run {id}: {} stored runs ({}) from {} host(s), started {}.",
            runs.len(),
            benchmarks.into_iter().collect::<Vec<_>>().join(", "),
            hosts.len(),
            runs.first().map_or("-", |r| r.run.started_at.as_str())
        )],
        ..Section::default()
    });
    sections.extend(fabric_sections(runs));
    sections.extend(collectives_section(runs));
    sections.extend(scaling_section(runs));
    Report {
        title: format!("Cluster run {}", &id[..id.len().min(8)]),
        generated_at: kiln_text::timefmt::now_rfc3339(),
        sections,
    }
}

/// Each rail's matrix from every rank's stored row, judged again.
fn fabric_sections(runs: &[RunDetail]) -> Vec<Section> {
    let ranks = by_rank(runs, "fabric");
    let Some((_, (_, first))) = ranks.iter().next() else { return Vec::new() };
    let n = first["world_size"].as_u64().unwrap_or(0) as usize;
    let labels: Vec<String> = match first["nodes"].as_array() {
        Some(a) => a.iter().map(|v| v.as_str().unwrap_or("?").to_string()).collect(),
        None => (0..n).map(|r| format!("rank {r}")).collect(),
    };
    let rails: Vec<String> = first["rails"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str().map(String::from)).collect())
        .unwrap_or_default();
    let floor = first["fabric"]["floor_gbps"].as_f64();
    let missing: Vec<String> = (0..n).filter(|r| !ranks.contains_key(r)).map(|r| r.to_string()).collect();
    let mut sections = Vec::new();
    for rail in &rails {
        let prefix = if rails.len() > 1 { format!("fabric.{rail}.") } else { "fabric.".to_string() };
        let mut links = Vec::new();
        for (&from, (run, _)) in &ranks {
            let rtt: BTreeMap<i64, f64> =
                run.samples.iter().filter(|s| s.0 == format!("{prefix}rtt_us")).map(|s| (s.1, s.2)).collect();
            for s in run.samples.iter().filter(|s| s.0 == format!("{prefix}tx_gbps")) {
                let to = s.1 as usize;
                links.push(Link { from, to, gbps: s.2, rtt_us: rtt.get(&s.1).copied().unwrap_or(f64::NAN) });
            }
        }
        let verdict = judge_fabric(n, &links, floor);
        let mut cells = vec![vec![None; n]; n];
        for l in &links {
            if l.from < n && l.to < n {
                cells[l.from][l.to] = Some(l.gbps);
            }
        }
        let mut text = vec![format!(
            "{n} nodes, {} directed links measured; baseline {} Gb/s (the median of the nodes' medians), slow below {} Gb/s{}.",
            links.len(),
            num(verdict.baseline.median_gbps),
            num(verdict.baseline.slow_below_gbps),
            floor.map(|f| format!(" (spec floor {})", num(f))).unwrap_or_default()
        )];
        if !missing.is_empty() {
            text.push(format!("No stored run from rank(s) {}: their rows are blank.", missing.join(", ")));
        }
        text.push(if verdict.findings.is_empty() {
            "No slow node, NIC or link.".to_string()
        } else {
            format!("{} finding(s):", verdict.findings.len())
        });
        text.extend(verdict.findings.iter().map(|f| format!("SLOW {}", kiln_cluster::describe(&labels, rail, f))));
        let matrix = (n <= 32).then(|| {
            let mut m = format!("{:>5}", "");
            for j in 0..n {
                m.push_str(&format!(" {:>7}", format!("#{j}")));
            }
            for (i, row) in cells.iter().enumerate() {
                m.push_str(&format!("\n{:>5}", format!("#{i}")));
                for c in row {
                    m.push_str(&format!(" {:>7}", c.map_or("-".to_string(), |v| format!("{v:.2}"))));
                }
            }
            m
        });
        sections.push(Section {
            heading: format!("Fabric, rail {rail}"),
            text,
            preformatted: matrix,
            table: Some((
                vec!["rank".into(), "node".into()],
                labels.iter().enumerate().map(|(r, l)| vec![r.to_string(), l.clone()]).collect(),
            )),
            charts: vec![Chart::Heatmap {
                title: format!("Bandwidth, rail {rail}"),
                unit: "Gb/s".into(),
                labels: labels.clone(),
                cells,
                reference: verdict.baseline.median_gbps,
            }],
        });
    }
    sections
}

/// Bus bandwidth against message size, per collective (rank 0's run, which every rank's equals).
fn collectives_section(runs: &[RunDetail]) -> Option<Section> {
    let ranks = by_rank(runs, "collectives");
    let (_, (run, c)) = ranks.iter().next()?;
    let nccl = c["nccl"] == true;
    let prefix = if nccl { "coll.nccl." } else { "coll." };
    let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let mut rows = Vec::new();
    for s in &run.samples {
        if let Some(name) = s.0.strip_prefix(prefix).and_then(|m| m.strip_suffix(".busbw_gbs")) {
            series.entry(name.to_string()).or_default().push(((s.1 as f64).log2(), s.2));
            let time = run.samples.iter().find(|t| t.0 == format!("{prefix}{name}.time_us") && t.1 == s.1).map(|t| t.2);
            rows.push(vec![name.to_string(), s.1.to_string(), time.map_or("-".into(), num), num(s.2)]);
        }
    }
    Some(Section {
        heading: "Collectives".into(),
        text: vec![format!(
            "{} ranks over {}; bus bandwidth as nccl-tests computes it (all-reduce 2(n-1)/n of the algorithm \
             bandwidth, the others (n-1)/n).",
            c["world_size"],
            if nccl { "NCCL, one GPU each" } else { "MPI" }
        )],
        table: Some((vec!["collective".into(), "bytes".into(), "time (us)".into(), "bus GB/s".into()], rows)),
        charts: vec![Chart::Curve {
            title: "Bus bandwidth against message size".into(),
            unit: "GB/s".into(),
            x_unit: "log2 bytes".into(),
            series: series.into_iter().collect(),
        }],
        ..Section::default()
    })
}

/// The weak-scaling curve and the loss curve at the full world size.
fn scaling_section(runs: &[RunDetail]) -> Option<Section> {
    let ranks = by_rank(runs, "scaling");
    let (_, (run, c)) = ranks.iter().next()?;
    let pick =
        |name: &str| -> Vec<(i64, f64)> { run.samples.iter().filter(|s| s.0 == name).map(|s| (s.1, s.2)).collect() };
    let (tps, eff, comm) =
        (pick("scaling.tokens_per_s_per_rank"), pick("scaling.efficiency"), pick("scaling.comm_share"));
    // On GPUs (`--nccl`), the MFU against the datasheet too.
    let mfu = pick("scaling.mfu");
    let rows = tps
        .iter()
        .map(|(k, t)| {
            let find = |v: &[(i64, f64)]| v.iter().find(|x| x.0 == *k).map_or(f64::NAN, |x| x.1);
            let mut row = vec![
                k.to_string(),
                num(*t),
                num(t * *k as f64),
                format!("{:.1} %", 100.0 * find(&eff)),
                format!("{:.1} %", 100.0 * find(&comm)),
            ];
            if !mfu.is_empty() {
                row.push(format!("{:.1} %", 100.0 * find(&mfu)));
            }
            row
        })
        .collect();
    let loss: Vec<(f64, f64)> = pick("scaling.loss").into_iter().map(|(i, l)| (i as f64, l)).collect();
    let train = &c["train"]["train"];
    Some(Section {
        heading: "Data-parallel training".into(),
        text: vec![
            format!(
            "The reference training run ({}, batch {} x seq {} per rank, {} steps) on 1, 2, 4 ... {} ranks, gradients \
             all-reduced every step (weak scaling).",
            train["size"].as_str().unwrap_or("?"),
            train["batch"],
            train["seq"],
            train["steps"],
            c["world_size"]
        ) + if c["train"]["nccl"] == true { " On each rank's GPU, NCCL summing the gradients." } else { "" },
        ],
        table: Some((
            ["ranks", "tokens/s per rank", "tokens/s", "efficiency", "all-reduce", "MFU"]
                .into_iter()
                .take(if mfu.is_empty() { 5 } else { 6 })
                .map(String::from)
                .collect(),
            rows,
        )),
        charts: vec![
            Chart::Curve {
                title: "Weak-scaling efficiency".into(),
                unit: "ratio".into(),
                x_unit: "ranks".into(),
                series: vec![("efficiency".into(), eff.iter().map(|(k, e)| (*k as f64, *e)).collect())],
            },
            Chart::Curve {
                title: format!("Loss on {} ranks", c["world_size"]),
                unit: "nats".into(),
                x_unit: "steps".into(),
                series: vec![("loss".into(), loss)],
            },
        ],
        ..Section::default()
    })
}

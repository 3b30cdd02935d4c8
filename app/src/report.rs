//! `kiln report`: one host, configuration or run against the fleet, as a self-contained HTML page
//! (inline CSS and SVG, no scripts, no external assets) or as Markdown for a ticket.
//!
//! The report's evidence is read once (`gather`), then built (`build`, pure) as plain data — sections of text, tables and charts — and
//! then written either way, so that both say the same thing.

use std::collections::BTreeMap;
use std::fmt::Write;

use kiln_bench::stats::{median, percentile_sorted};
use kiln_db::{AnyStore, Direction, Fleet, Queries, RunDetail};

use crate::fleet::{self, by_group, detect, Filter, FleetError, HostValues, Subject};
use kiln_text::{num, pct, short, short6};

#[derive(Debug, Clone)]
pub enum Chart {
    /// A box (p10, quartiles, median, p90) over a strip of the fleet's host values; the subject's value marked.
    Distribution { title: String, unit: String, direction: Direction, values: Vec<f64>, mark: Option<(String, f64)> },
    /// A series over time, the detected change (if any) marked from its first point on.
    History { title: String, unit: String, points: Vec<(i64, f64)>, change_at: Option<usize> },
    /// Telemetry channels of one run against seconds since its start.
    Lines { title: String, unit: String, series: Vec<(String, Vec<(f64, f64)>)> },
    /// Curves against a quantity other than time (`x_unit` names it): a scaling curve, bandwidth
    /// against message size.
    Curve { title: String, unit: String, x_unit: String, series: Vec<(String, Vec<(f64, f64)>)> },
    /// A square matrix (row → column), each cell coloured by its share of `reference`: red at 0,
    /// green at or above it; `None` where nothing was measured.
    Heatmap { title: String, unit: String, labels: Vec<String>, cells: Vec<Vec<Option<f64>>>, reference: f64 },
}

#[derive(Debug, Clone, Default)]
pub struct Section {
    pub heading: String,
    pub text: Vec<String>,
    pub preformatted: Option<String>,
    pub table: Option<(Vec<String>, Vec<Vec<String>>)>,
    pub charts: Vec<Chart>,
}

#[derive(Debug, Clone)]
pub struct Report {
    pub title: String,
    pub generated_at: String,
    pub sections: Vec<Section>,
}

/// At most this many dots in a strip plot (the box is computed from all values).
const STRIP_MAX: usize = 400;

fn host_label(fleet: &Fleet, h: usize) -> String {
    let host = &fleet.hosts[h];
    host.hostname.clone().unwrap_or_else(|| host.id[..8.min(host.id.len())].to_string())
}

fn distribution_table_row(
    group_metric: &str,
    unit: &str,
    direction: Direction,
    values: &[f64],
    mine: Option<f64>,
) -> Vec<String> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mut row = vec![
        group_metric.to_string(),
        unit.to_string(),
        match direction {
            Direction::Higher => "higher".into(),
            Direction::Lower => "lower".into(),
            Direction::None => "-".into(),
        },
    ];
    if let Some(v) = mine {
        let below = sorted.iter().filter(|x| **x < v).count();
        row.push(num(v));
        // A percentile among fewer than three hosts says nothing.
        row.push(if sorted.len() < 3 {
            "-".into()
        } else {
            format!("{:.0}", 100.0 * below as f64 / sorted.len() as f64)
        });
    }
    row.extend([
        num(percentile_sorted(&sorted, 0.10)),
        num(median(&sorted)),
        num(percentile_sorted(&sorted, 0.90)),
        sorted.len().to_string(),
    ]);
    row
}

/// Everything a report shows, read from the store once; the sections are built from it without
/// further I/O.
pub struct Evidence {
    pub fleet: Fleet,
    /// The start of the window, seconds since the epoch.
    pub since: i64,
    /// A host (index into `fleet.hosts`) or a configuration (fingerprint).
    pub subject: Subject,
    /// The run asked for (`--run`).
    pub run: Option<RunDetail>,
    /// The host's latest inventory: (collected at, document).
    pub inventory: Option<(String, String)>,
    /// The run whose telemetry is drawn: the one asked for, or the host's latest.
    pub telemetry: Option<RunDetail>,
    /// The host's newest commissioning verdict.
    pub verdict: Option<kiln_db::VerdictRow>,
}

/// What a report is asked on, as [`gather`] takes it: exactly one of a host, a configuration or a
/// run (`host:NEEDLE`, `config:NEEDLE`, `run:ID`); `None` for none or several.
pub fn subject(host: Option<String>, config: Option<String>, run: Option<String>) -> Option<String> {
    match (host, config, run) {
        (Some(h), None, None) => Some(format!("host:{h}")),
        (None, Some(c), None) => Some(format!("config:{c}")),
        (None, None, Some(r)) => Some(format!("run:{r}")),
        _ => None,
    }
}

/// Reads what a report on `asked` needs: `host:NEEDLE`, `config:NEEDLE` (resolved as
/// `kiln compare` resolves its subjects) or `run:ID`.
///
/// # Errors
/// A subject that matches nothing, or several things; a database error.
pub async fn gather(store: &mut AnyStore, asked: &str, since: i64) -> Result<Evidence, FleetError> {
    let fleet = store.fleet(Some(since)).await?;
    let (subject, run) = match asked.strip_prefix("run:") {
        Some(id) => {
            let detail = store.run(id).await?;
            let h = fleet.hosts.iter().position(|x| x.id == detail.run.host_id).ok_or(FleetError::RunWithoutHost)?;
            (Subject::Host(h), Some(detail))
        }
        None => match fleet::resolve(&fleet, asked)? {
            (Subject::Software(_), _) => return Err(FleetError::Mixed),
            (subject, _) => (subject, None),
        },
    };
    let (mut inventory, mut telemetry, mut verdict) = (None, run.clone(), None);
    if let Subject::Host(h) = subject {
        let host = &fleet.hosts[h];
        inventory = store.latest_inventory(&host.id).await?;
        verdict = store.latest_verdict(&host.id).await?;
        if telemetry.is_none() {
            if let Some(latest) = host.data.runs.last() {
                telemetry = store.run(&latest.run_id.to_string()).await.ok();
            }
        }
    }
    Ok(Evidence { fleet, since, subject, run, inventory, telemetry, verdict })
}

/// The report from its evidence: pure, so that the same evidence gives the same report.
pub fn build(e: &Evidence) -> Report {
    let filter = Filter { since: Some(e.since), metric: None, across_software: false };
    let groups = by_group(&e.fleet, &filter);
    let (title, sections) = match &e.subject {
        Subject::Host(h) => host_report(e, *h, &groups),
        Subject::Config(fp) => config_report(e, fp, &groups, &filter),
        Subject::Software(_) => unreachable!("gather refuses software stacks"),
    };
    Report { title, generated_at: kiln_text::timefmt::now_rfc3339(), sections }
}

type Groups = BTreeMap<fleet::Group, (fleet::GroupInfo, Vec<HostValues>)>;

fn host_report(e: &Evidence, h: usize, groups: &Groups) -> (String, Vec<Section>) {
    let (fleet, run) = (&e.fleet, e.run.as_ref());
    let host = &fleet.hosts[h];
    let title = match run {
        Some(r) => format!("Run {} ({} on {})", short(&r.run.id), r.run.benchmark, host_label(fleet, h)),
        None => format!("Host {}", host_label(fleet, h)),
    };
    let mut overview = Section { heading: "Overview".into(), ..Default::default() };
    overview.text.push(format!(
        "Host {} ({}), configuration {} ({}).",
        host_label(fleet, h),
        host.id,
        host.config_name,
        short(&host.config_fingerprint)
    ));
    overview.text.push(match run {
        Some(r) => {
            format!("Run {} of {}, started {}, status {}.", r.run.id, r.run.benchmark, r.run.started_at, r.run.status)
        }
        None => format!("{} runs stored for this host.", host.data.runs.len()),
    });
    let mut sections = vec![overview];
    if let Some(v) = &e.verdict {
        sections.push(verdict_section(v));
    }
    if let Some((collected, doc)) = &e.inventory {
        let mut s = Section { heading: "Inventory".into(), ..Default::default() };
        s.text.push(format!("Collected {collected}."));
        s.preformatted = Some(match serde_json::from_str::<kiln_inventory::Inventory>(doc) {
            Ok(inv) => kiln_inventory::summary::summary(&inv),
            Err(_) => "(an inventory document this kiln cannot read)".into(),
        });
        sections.push(s);
    }
    sections.push(host_results(e, h, groups));
    if run.is_none() {
        sections.push(host_history(e, h));
    }
    if let Some(d) = &e.telemetry {
        sections.push(telemetry_section(d));
    }
    (title, sections)
}

/// The host's last verdict, first thing after the overview: the decision and every check that did
/// not pass.
fn verdict_section(v: &kiln_db::VerdictRow) -> Section {
    let mut s = Section { heading: "Verdict".into(), ..Default::default() };
    s.text.push(format!(
        "{} against spec {} (sha256 {}), judged {}, inventory {}.",
        v.verdict.to_uppercase(),
        v.spec_name,
        short(&v.spec_hash),
        v.judged_at,
        v.inventory_id
    ));
    match serde_json::from_str::<kiln_sku::verdict::Verdict>(v.document.as_deref().unwrap_or_default()) {
        Ok(doc) => {
            let c = &doc.counts;
            s.text.push(format!(
                "{} checks: {} passed, {} failed, {} skipped, {} warnings.",
                doc.checks.len(),
                c.pass,
                c.fail,
                c.skip,
                c.warn
            ));
            let rows: Vec<Vec<String>> = doc
                .checks
                .iter()
                .filter(|c| c.status != kiln_sku::verdict::Status::Pass)
                .map(|c| {
                    let mut row = c.row();
                    row.push(c.remedy.as_ref().map_or(String::new(), |r| format!("{} [{}]", r.action, r.source)));
                    row.push(c.reference.as_ref().map_or(String::new(), |r| {
                        format!("{:.2} × {} {} ({}) [{}]", r.ratio, kiln_text::num(r.value), r.unit, r.kind, r.source)
                    }));
                    row
                })
                .collect();
            if !rows.is_empty() {
                let mut head: Vec<String> = kiln_sku::verdict::Check::COLUMNS.iter().map(|h| h.to_string()).collect();
                head.push("remedy".into());
                head.push("reference".into());
                s.table = Some((head, rows));
            }
        }
        Err(_) => s.text.push("(a verdict document this kiln cannot read)".into()),
    }
    s
}

/// Results against the fleet: per metric, the group of the host's latest run (its current
/// software stack); when too few hosts share that stack, the configuration's hosts on every stack.
fn host_results(e: &Evidence, h: usize, groups: &Groups) -> Section {
    let (fleet, run) = (&e.fleet, e.run.as_ref());
    let mut results = Section { heading: "Results against the fleet".into(), ..Default::default() };
    results.text.push(
        "Each plot: the configuration's hosts (one dot per host, the median of its runs), the box from p25 to p75 \
         with the median, whiskers at p10 and p90; the marked value is this host's."
            .into(),
    );
    let mut rows = Vec::new();
    let merged = by_group(fleet, &Filter { since: Some(e.since), metric: None, across_software: true });
    let mut latest: BTreeMap<(String, String, String), (&fleet::Group, i64)> = BTreeMap::new();
    for (g, (_, hosts)) in groups {
        if let Some(mine) = hosts.iter().find(|v| v.host == h) {
            let k = (g.benchmark.clone(), g.bench_config.clone(), g.metric.clone());
            if latest.get(&k).is_none_or(|(_, t)| mine.last_t > *t) {
                latest.insert(k, (g, mine.last_t));
            }
        }
    }
    let mut pooled = Vec::new();
    let mut lonely = 0;
    for (g, _) in latest.values() {
        let Some(current) = groups[*g].1.iter().find(|v| v.host == h).map(HostValues::median) else { continue };
        let (mut info, mut hosts, mut label_g) = (&groups[*g].0, &groups[*g].1, (*g).clone());
        if hosts.len() < 3 {
            let wide = fleet::Group { software: String::new(), ..(*g).clone() };
            if let Some((i, hs)) = merged.get(&wide) {
                if hs.len() >= 3 {
                    pooled.push(format!("{}:{}", g.benchmark, g.metric));
                    (info, hosts, label_g) = (i, hs, wide);
                } else {
                    lonely = lonely.max(hs.len());
                }
            }
        }
        let value = match run {
            Some(r) if r.run.benchmark == g.benchmark => match r.run.metrics.iter().find(|m| m.name == g.metric) {
                Some(m) => m.value,
                None => continue,
            },
            Some(_) => continue,
            None => current,
        };
        let values: Vec<f64> = hosts.iter().map(HostValues::median).collect();
        let all_stacks = if label_g.software.is_empty() && !g.software.is_empty() { " (all stacks)" } else { "" };
        let name = format!("{}:{}{all_stacks}", label_g.benchmark, label_g.metric);
        rows.push(distribution_table_row(&name, &info.unit, info.direction, &values, Some(value)));
        results.charts.push(Chart::Distribution {
            title: format!("{name} — {} hosts", values.len()),
            unit: info.unit.clone(),
            direction: info.direction,
            values,
            mark: Some((if run.is_some() { "this run".into() } else { "this host".into() }, value)),
        });
    }
    if lonely > 0 {
        results.text.push(format!(
            "Only {lonely} host{} of this configuration {} results here: a fleet distribution needs at least 3 \
             (import other hosts' results with `kiln import`).",
            if lonely == 1 { "" } else { "s" },
            if lonely == 1 { "has" } else { "have" }
        ));
    }
    if !pooled.is_empty() {
        results.text.push(format!(
            "Fewer than 3 hosts run this host's current software stack for {}: compared with the configuration's \
             hosts on every stack.",
            if pooled.len() > 3 { format!("{} metrics", pooled.len()) } else { pooled.join(", ") }
        ));
    }
    let columns =
        ["metric", "unit", "better", "value", "percentile", "fleet p10", "fleet median", "fleet p90", "hosts"];
    results.table = Some((columns.map(String::from).to_vec(), rows));
    results
}

/// A history chart per series, the detected change marked and said in words.
fn history_chart(section: &mut Section, label: String, unit: &str, points: Vec<(i64, f64)>) {
    let values: Vec<f64> = points.iter().map(|p| p.1).collect();
    let change = detect(&values, fleet::NOISE, 7);
    if let Some(c) = &change {
        section.text.push(format!(
            "{label} changed {} on {} ({} → {} {unit}).",
            pct(c.ratio),
            kiln_text::timefmt::rfc3339(points[c.at].0),
            num(c.before),
            num(c.after)
        ));
    }
    section.charts.push(Chart::History {
        title: label,
        unit: unit.to_string(),
        points,
        change_at: change.map(|c| c.at),
    });
}

/// The host's series, merged across software like `kiln regressions`, with the change marked.
fn host_history(e: &Evidence, h: usize) -> Section {
    let (fleet, host) = (&e.fleet, &e.fleet.hosts[h]);
    let mut history = Section { heading: "History".into(), ..Default::default() };
    let mut merged: BTreeMap<(String, String), (String, Vec<(i64, f64)>)> = BTreeMap::new();
    for s in &host.data.series {
        let Some(key) = fleet.keys.get(&s.key) else { continue };
        let e_ =
            merged.entry((key.benchmark.clone(), key.metric.clone())).or_insert_with(|| (key.unit.clone(), vec![]));
        for &(r, v) in &s.points {
            let t = host.data.runs[r as usize].t;
            if t >= e.since {
                e_.1.push((t, v));
            }
        }
    }
    for ((benchmark, metric), (unit, mut points)) in merged {
        points.sort_by_key(|p| p.0);
        history_chart(&mut history, format!("{benchmark}:{metric}"), &unit, points);
    }
    if history.text.is_empty() {
        history.text.push("No step changes beyond the noise threshold.".into());
    }
    history
}

fn config_report(e: &Evidence, fp: &str, groups: &Groups, filter: &Filter) -> (String, Vec<Section>) {
    let fleet = &e.fleet;
    let name =
        fleet.keys.values().find(|k| k.config_fingerprint == fp).map(|k| k.config_name.clone()).unwrap_or_default();
    let mine = || groups.iter().filter(|(g, _)| g.config_fingerprint == fp);
    let hosts: std::collections::BTreeSet<usize> = mine().flat_map(|(_, (_, hs))| hs.iter().map(|h| h.host)).collect();
    let mut overview = Section { heading: "Overview".into(), ..Default::default() };
    overview.text.push(format!(
        "{name} ({fp}): {} hosts with results since {}.",
        hosts.len(),
        kiln_text::timefmt::rfc3339(e.since)
    ));
    let mut results = Section { heading: "Distribution over hosts".into(), ..Default::default() };
    let mut rows = Vec::new();
    let mut history = Section { heading: "Nightly median".into(), ..Default::default() };
    for (g, (info, hs)) in mine() {
        let values: Vec<f64> = hs.iter().map(HostValues::median).collect();
        let stack = if g.software.is_empty() { String::new() } else { format!(" [{}]", short6(&g.software)) };
        let label = format!("{}:{}{stack}", g.benchmark, g.metric);
        rows.push(distribution_table_row(&label, &info.unit, info.direction, &values, None));
        results.charts.push(Chart::Distribution {
            title: format!("{label} — {} hosts", values.len()),
            unit: info.unit.clone(),
            direction: info.direction,
            values,
            mark: None,
        });
        let points = fleet::nightly_medians(group_points(fleet, g, hs, e.since));
        history_chart(&mut history, label, &info.unit, points);
    }
    results.table =
        Some((["metric", "unit", "better", "p10", "median", "p90", "hosts"].map(String::from).to_vec(), rows));
    if history.text.is_empty() {
        history.text.push("No step changes beyond the noise threshold.".into());
    }
    let sections = vec![overview, results, history, outlier_section(fleet, fp, filter)];
    (format!("Configuration {name}"), sections)
}

/// Every (time, value) of a group's hosts since `since`.
fn group_points(fleet: &Fleet, g: &fleet::Group, hosts: &[HostValues], since: i64) -> Vec<(i64, f64)> {
    let mut out = Vec::new();
    for hv in hosts {
        let host = &fleet.hosts[hv.host];
        for s in &host.data.series {
            let Some(k) = fleet.keys.get(&s.key) else { continue };
            if k.config_fingerprint != g.config_fingerprint
                || k.benchmark != g.benchmark
                || k.metric != g.metric
                || k.software_fingerprint != g.software
                || k.bench_config != g.bench_config
            {
                continue;
            }
            out.extend(s.points.iter().map(|&(r, v)| (host.data.runs[r as usize].t, v)).filter(|p| p.0 >= since));
        }
    }
    out
}

fn outlier_section(fleet: &Fleet, fp: &str, filter: &Filter) -> Section {
    let outs: Vec<fleet::Outlier> = fleet::outliers(fleet, filter, 3.5, fleet::MIN_DEVIATION)
        .into_iter()
        .filter(|o| o.group.config_fingerprint == fp)
        .collect();
    let mut s = Section { heading: "Outlier hosts".into(), ..Default::default() };
    if outs.is_empty() {
        s.text.push("None: no host beyond |z| 3.5 and 5 % from the configuration's median.".into());
        return s;
    }
    let rows = outs
        .iter()
        .map(|o| {
            vec![
                o.host.label(),
                format!("{}:{}", o.group.benchmark, o.group.metric),
                num(o.host.value),
                num(o.group_median),
                pct(1.0 + o.deviation),
                format!("{:+.1}", o.z),
                if o.worse { "worse".into() } else { "better".into() },
            ]
        })
        .collect();
    s.table = Some((["host", "metric", "value", "median", "deviation", "z", ""].map(String::from).to_vec(), rows));
    s
}

fn telemetry_section(d: &kiln_db::RunDetail) -> Section {
    let mut s = Section {
        heading: format!("Telemetry of run {} ({})", short(&d.run.id), d.run.started_at),
        ..Default::default()
    };
    let mut by_name: BTreeMap<String, BTreeMap<String, Vec<(f64, f64)>>> = BTreeMap::new();
    for (t, source, name, value) in &d.telemetry {
        by_name.entry(name.clone()).or_default().entry(source.clone()).or_default().push((*t as f64 / 1000.0, *value));
    }
    if by_name.is_empty() {
        s.text.push("This run recorded no telemetry.".into());
    }
    let mut rows = Vec::new();
    for (name, sources) in by_name {
        for (source, pts) in &sources {
            let vals: Vec<f64> = pts.iter().map(|p| p.1).collect();
            let (lo, hi) = vals.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(*v), b.max(*v)));
            rows.push(vec![
                source.clone(),
                name.clone(),
                num(lo),
                num(vals.iter().sum::<f64>() / vals.len() as f64),
                num(hi),
                vals.len().to_string(),
            ]);
        }
        let unit = if name.ends_with("_mhz") {
            "MHz"
        } else if name.ends_with("_watts") {
            "W"
        } else if name.ends_with("_c") {
            "°C"
        } else if name.contains("pct") || name.starts_with("throttled") || name.contains("util") {
            "%"
        } else {
            ""
        };
        s.charts.push(Chart::Lines { title: name, unit: unit.into(), series: sources.into_iter().collect() });
    }
    s.table = Some((["source", "channel", "min", "mean", "max", "samples"].map(String::from).to_vec(), rows));
    s
}

// ---------------------------------------------------------------------------------------------
// SVG

pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

const W: f64 = 640.0;
const PAD_L: f64 = 70.0;
const PAD_R: f64 = 20.0;

fn scale(lo: f64, hi: f64, a: f64, b: f64) -> impl Fn(f64) -> f64 {
    let span = if hi > lo { hi - lo } else { 1.0 };
    move |v| a + (v - lo) / span * (b - a)
}

fn padded(lo: f64, hi: f64) -> (f64, f64) {
    let span = hi - lo;
    if span > 0.0 {
        (lo - span * 0.05, hi + span * 0.05)
    } else {
        (lo - lo.abs() * 0.05 - 1e-9, hi + hi.abs() * 0.05 + 1e-9)
    }
}

const PALETTE: [&str; 8] = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

pub fn svg(chart: &Chart) -> String {
    match chart {
        Chart::Distribution { title, unit, direction, values, mark } => {
            svg_distribution(title, unit, *direction, values, mark.as_ref())
        }
        Chart::History { title, unit, points, change_at } => svg_history(title, unit, points, *change_at),
        Chart::Lines { title, unit, series } => svg_lines(title, unit, series, "s"),
        Chart::Curve { title, unit, x_unit, series } => svg_lines(title, unit, series, x_unit),
        Chart::Heatmap { title, unit, labels, cells, reference } => svg_heatmap(title, unit, labels, cells, *reference),
    }
}

/// A pair matrix: rows send, columns receive; a cell's hue runs from red (0) to green (the
/// reference and above); each cell's exact figure in its tooltip.
fn svg_heatmap(title: &str, unit: &str, labels: &[String], cells: &[Vec<Option<f64>>], reference: f64) -> String {
    let n = labels.len().max(1);
    let side = ((W - PAD_L - PAD_R) / n as f64).clamp(1.0, 28.0);
    let top = 40.0;
    let h = top + side * n as f64 + 24.0;
    let mut o = String::new();
    svg_open(&mut o, h, title);
    let _ = write!(
        o,
        r#"<text x="{PAD_L}" y="14" class="t">{} ({}; row sends to column; red 0, green {} and above)</text>"#,
        esc(title),
        esc(unit),
        num(reference)
    );
    let show_labels = side >= 10.0;
    for (i, label) in labels.iter().enumerate() {
        if show_labels {
            let y = top + side * (i as f64 + 0.5) + 3.0;
            let _ =
                write!(o, r#"<text x="{}" y="{y:.1}" class="a" text-anchor="end">{}</text>"#, PAD_L - 4.0, esc(label));
            let x = PAD_L + side * (i as f64 + 0.5);
            let _ = write!(o, r#"<text x="{x:.1}" y="{}" class="a" text-anchor="middle">{i}</text>"#, top - 4.0);
        }
        for (j, cell) in cells.get(i).map(Vec::as_slice).unwrap_or(&[]).iter().enumerate() {
            let (x, y) = (PAD_L + side * j as f64, top + side * i as f64);
            let (fill, tip) = match cell {
                Some(v) => {
                    let share = if reference > 0.0 { (v / reference).clamp(0.0, 1.0) } else { 1.0 };
                    (
                        format!("hsl({:.0},70%,50%)", 120.0 * share),
                        format!("{} -> {}: {} {}", labels[i], labels.get(j).map_or("?", String::as_str), num(*v), unit),
                    )
                }
                None => (
                    "#eee".to_string(),
                    format!("{} -> {}: not measured", labels[i], labels.get(j).map_or("?", String::as_str)),
                ),
            };
            let _ = write!(
                o,
                r##"<rect x="{x:.1}" y="{y:.1}" width="{side:.1}" height="{side:.1}" fill="{fill}" stroke="#fff" stroke-width="0.5"><title>{}</title></rect>"##,
                esc(&tip)
            );
        }
    }
    o.push_str("</svg>");
    o
}

/// The opening of a chart of height `h`, with its title for screen readers.
fn svg_open(o: &mut String, h: f64, title: &str) {
    let _ = write!(
        o,
        r#"<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {h}" width="{W}" height="{h}" role="img"><title>{}</title>"#,
        esc(title)
    );
}

/// The value axis (from `vlo` to `vhi`) and the time axis of the history and telemetry charts.
fn svg_axes(o: &mut String, vlo: f64, vhi: f64) {
    let _ = write!(
        o,
        r##"<line x1="{PAD_L}" x2="{PAD_L}" y1="24" y2="140" stroke="#999"/><line x1="{PAD_L}" x2="{}" y1="140" y2="140" stroke="#999"/>"##,
        W - PAD_R
    );
    let _ = write!(
        o,
        r#"<text x="{}" y="28" class="a" text-anchor="end">{}</text><text x="{}" y="140" class="a" text-anchor="end">{}</text>"#,
        PAD_L - 4.0,
        num(vhi),
        PAD_L - 4.0,
        num(vlo)
    );
}

/// Box and strip over the fleet's values, the subject's value marked.
fn svg_distribution(
    title: &str,
    unit: &str,
    direction: Direction,
    values: &[f64],
    mark: Option<&(String, f64)>,
) -> String {
    let mut o = String::new();
    let h = 138.0;
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mut lo = sorted[0];
    let mut hi = sorted[sorted.len() - 1];
    if let Some((_, v)) = mark {
        lo = lo.min(*v);
        hi = hi.max(*v);
    }
    let (lo, hi) = padded(lo, hi);
    let x = scale(lo, hi, PAD_L, W - PAD_R);
    let q = |p: f64| percentile_sorted(&sorted, p);
    svg_open(&mut o, h, title);
    let _ = write!(
        o,
        r#"<text x="{PAD_L}" y="14" class="t">{} ({}{})</text>"#,
        esc(title),
        esc(unit),
        match direction {
            Direction::Higher => ", higher is better",
            Direction::Lower => ", lower is better",
            Direction::None => "",
        }
    );
    // Strip: at most STRIP_MAX dots, evenly chosen, jittered deterministically.
    let step = (sorted.len() as f64 / STRIP_MAX as f64).max(1.0);
    let mut i = 0.0;
    let mut k = 0u64;
    while (i as usize) < sorted.len() {
        let v = sorted[i as usize];
        k = k.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let jitter = ((k >> 33) % 30) as f64;
        let _ = write!(
            o,
            r##"<circle cx="{:.1}" cy="{:.1}" r="2" fill="#1f77b4" fill-opacity="0.45"/>"##,
            x(v),
            32.0 + jitter
        );
        i += step;
    }
    // Box: p25–p75, median, whiskers at p10 and p90.
    let (p10, p25, p50, p75, p90) = (q(0.10), q(0.25), median(&sorted), q(0.75), q(0.90));
    let _ = write!(o, r##"<line x1="{:.1}" x2="{:.1}" y1="88" y2="88" stroke="#333"/>"##, x(p10), x(p90));
    let _ = write!(
        o,
        r##"<rect x="{:.1}" y="76" width="{:.1}" height="24" fill="#ddd" stroke="#333"/>"##,
        x(p25),
        (x(p75) - x(p25)).max(1.0)
    );
    let _ = write!(o, r##"<line x1="{0:.1}" x2="{0:.1}" y1="74" y2="102" stroke="#000" stroke-width="2"/>"##, x(p50));
    if let Some((label, v)) = mark {
        let mx = x(*v);
        let anchor = if mx < PAD_L + 60.0 {
            "start"
        } else if mx > W - PAD_R - 60.0 {
            "end"
        } else {
            "middle"
        };
        let _ = write!(
            o,
            r##"<line x1="{mx:.1}" x2="{mx:.1}" y1="24" y2="106" stroke="#d62728" stroke-width="2"/><text x="{mx:.1}" y="118" class="m" text-anchor="{anchor}">{} {}</text>"##,
            esc(label),
            num(*v)
        );
    }
    let _ = write!(
        o,
        r#"<text x="{PAD_L}" y="132" class="a">{}</text><text x="{}" y="132" class="a" text-anchor="end">{}</text>"#,
        num(lo),
        W - PAD_R,
        num(hi)
    );
    o.push_str("</svg>");
    o
}

/// A series over time, the change (from its first point on) in red.
fn svg_history(title: &str, unit: &str, points: &[(i64, f64)], change_at: Option<usize>) -> String {
    let mut o = String::new();
    let h = 170.0;
    svg_open(&mut o, h, title);
    let _ = write!(o, r#"<text x="{PAD_L}" y="14" class="t">{} ({})</text>"#, esc(title), esc(unit));
    if points.is_empty() {
        o.push_str(r#"<text x="320" y="90" class="a" text-anchor="middle">no points in the window</text></svg>"#);
        return o;
    }
    let (t0, t1) = (points[0].0 as f64, points[points.len() - 1].0 as f64);
    let (vlo, vhi) = points.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| (a.min(p.1), b.max(p.1)));
    let (vlo, vhi) = padded(vlo, vhi);
    let x = scale(t0, if t1 > t0 { t1 } else { t0 + 1.0 }, PAD_L, W - PAD_R);
    let y = scale(vlo, vhi, 140.0, 24.0);
    svg_axes(&mut o, vlo, vhi);
    let path: Vec<String> = points.iter().map(|p| format!("{:.1},{:.1}", x(p.0 as f64), y(p.1))).collect();
    let _ = write!(o, r##"<polyline points="{}" fill="none" stroke="#1f77b4" stroke-width="1.5"/>"##, path.join(" "));
    for (i, p) in points.iter().enumerate() {
        let bad = change_at.is_some_and(|c| i >= c);
        let _ = write!(
            o,
            r##"<circle cx="{:.1}" cy="{:.1}" r="2.5" fill="{}"/>"##,
            x(p.0 as f64),
            y(p.1),
            if bad { "#d62728" } else { "#1f77b4" }
        );
    }
    if let Some(c) = change_at {
        let cx = x(points[c].0 as f64);
        let (tx, anchor) = if cx > W - PAD_R - 120.0 { (cx - 4.0, "end") } else { (cx + 4.0, "start") };
        let _ = write!(
            o,
            r##"<line class="change" x1="{cx:.1}" x2="{cx:.1}" y1="22" y2="140" stroke="#d62728" stroke-dasharray="4 3"/><text x="{tx:.1}" y="34" class="m" text-anchor="{anchor}">change {}</text>"##,
            kiln_text::timefmt::rfc3339(points[c].0).get(..10).unwrap_or("")
        );
    }
    let _ = write!(
        o,
        r#"<text x="{PAD_L}" y="158" class="a">{}</text><text x="{}" y="158" class="a" text-anchor="end">{}</text>"#,
        kiln_text::timefmt::rfc3339(points[0].0).get(..10).unwrap_or(""),
        W - PAD_R,
        kiln_text::timefmt::rfc3339(points[points.len() - 1].0).get(..10).unwrap_or("")
    );
    o.push_str("</svg>");
    o
}

/// Telemetry channels against seconds since the run's start.
fn svg_lines(title: &str, unit: &str, series: &[(String, Vec<(f64, f64)>)], x_unit: &str) -> String {
    let mut o = String::new();
    let h = 170.0;
    svg_open(&mut o, h, title);
    let _ = write!(
        o,
        r#"<text x="{PAD_L}" y="14" class="t">{}{}</text>"#,
        esc(title),
        if unit.is_empty() { String::new() } else { format!(" ({})", esc(unit)) }
    );
    let all = series.iter().flat_map(|(_, p)| p.iter());
    let (tlo, thi, vlo, vhi) = all
        .fold((f64::INFINITY, f64::NEG_INFINITY, f64::INFINITY, f64::NEG_INFINITY), |(a, b, c, d), p| {
            (a.min(p.0), b.max(p.0), c.min(p.1), d.max(p.1))
        });
    if !tlo.is_finite() {
        o.push_str("</svg>");
        return o;
    }
    let (vlo, vhi) = padded(vlo, vhi);
    let x = scale(tlo, if thi > tlo { thi } else { tlo + 1.0 }, PAD_L, W - PAD_R);
    let y = scale(vlo, vhi, 140.0, 24.0);
    svg_axes(&mut o, vlo, vhi);
    for (i, (label, pts)) in series.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        let path: Vec<String> = pts.iter().map(|p| format!("{:.1},{:.1}", x(p.0), y(p.1))).collect();
        let _ = write!(
            o,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="1.2"><title>{}</title></polyline>"#,
            path.join(" "),
            esc(label)
        );
        let _ = write!(
            o,
            r#"<text x="{}" y="{}" class="a" fill="{colour}">{}</text>"#,
            W - PAD_R - 90.0,
            30 + 12 * (i % 8),
            esc(label)
        );
    }
    let _ = write!(
        o,
        r#"<text x="{PAD_L}" y="158" class="a">{} {}</text><text x="{}" y="158" class="a" text-anchor="end">{} {}</text>"#,
        if x_unit == "s" { "0".to_string() } else { num(tlo) },
        esc(x_unit),
        W - PAD_R,
        num(thi),
        esc(x_unit)
    );
    o.push_str("</svg>");
    o
}

pub const CSS: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:2em auto;max-width:1400px;color:#222}\
h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}\
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}\
td:first-child,th:first-child{text-align:left}pre{background:#f6f6f6;padding:.8em;overflow:auto}\
.charts{display:flex;flex-wrap:wrap;gap:12px}svg.chart{border:1px solid #eee;background:#fff}\
svg .t{font-size:12px;font-weight:600}svg .a{font-size:10px;fill:#555}svg .m{font-size:10px;fill:#d62728}";

/// The report as one HTML page: no scripts, no external assets.
pub fn html(r: &Report) -> String {
    let mut o = String::new();
    let _ = write!(o, "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{CSS}</style></head><body>", esc(&r.title));
    let _ = write!(
        o,
        "<h1>{}</h1><p>kiln {} report, generated {}.</p>",
        esc(&r.title),
        env!("CARGO_PKG_VERSION"),
        esc(&r.generated_at)
    );
    for s in &r.sections {
        let _ = write!(o, "<h2>{}</h2>", esc(&s.heading));
        for t in &s.text {
            let _ = write!(o, "<p>{}</p>", esc(t));
        }
        if let Some(p) = &s.preformatted {
            let _ = write!(o, "<pre>{}</pre>", esc(p));
        }
        if let Some((head, rows)) = &s.table {
            o.push_str("<table><thead><tr>");
            for h in head {
                let _ = write!(o, "<th>{}</th>", esc(h));
            }
            o.push_str("</tr></thead><tbody>");
            for row in rows {
                o.push_str("<tr>");
                for c in row {
                    let _ = write!(o, "<td>{}</td>", esc(c));
                }
                o.push_str("</tr>");
            }
            o.push_str("</tbody></table>");
        }
        if !s.charts.is_empty() {
            o.push_str("<div class=\"charts\">");
            for c in &s.charts {
                o.push_str(&svg(c));
            }
            o.push_str("</div>");
        }
    }
    o.push_str("</body></html>\n");
    o
}

/// Eight-level bars for a series in one line of text.
pub fn sparkline(values: &[f64]) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let (lo, hi) = values.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(*v), b.max(*v)));
    values
        .iter()
        .map(|v| if hi > lo { BARS[(((v - lo) / (hi - lo)) * 7.0).round() as usize] } else { BARS[3] })
        .collect()
}

/// Text from the database made inert for Markdown renderers: HTML (`<script>`, `&…;`) becomes
/// entities, and Markdown's own syntax (emphasis, links, code, tables, headings) is escaped.
fn md_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '\\' | '`' | '*' | '_' | '[' | ']' | '(' | ')' | '#' | '|' | '!' | '~' => {
                out.push('\\');
                out.push(c);
            }
            '\n' | '\r' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

fn md_cell(s: &str) -> String {
    md_text(s)
}

/// A fenced code block whose fence is longer than any run of backticks inside it, so that the
/// content cannot close it.
fn md_code(text: &str) -> String {
    let longest = text.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest.max(2) + 1);
    format!("{fence}text\n{}\n{fence}\n", text.trim_end())
}

/// The same report as Markdown: tables, and sparklines where the HTML has plots.
pub fn markdown(r: &Report) -> String {
    let mut o = format!(
        "# {}\n\nkiln {} report, generated {}.\n",
        md_text(&r.title),
        env!("CARGO_PKG_VERSION"),
        r.generated_at
    );
    for s in &r.sections {
        let _ = write!(o, "\n## {}\n\n", md_text(&s.heading));
        for t in &s.text {
            let _ = writeln!(o, "{}\n", md_text(t));
        }
        if let Some(p) = &s.preformatted {
            let _ = writeln!(o, "{}", md_code(p));
        }
        if let Some((head, rows)) = &s.table {
            let _ = writeln!(o, "| {} |", head.iter().map(|h| md_cell(h)).collect::<Vec<_>>().join(" | "));
            let _ = writeln!(o, "|{}", "---|".repeat(head.len()));
            for row in rows {
                let _ = writeln!(o, "| {} |", row.iter().map(|c| md_cell(c)).collect::<Vec<_>>().join(" | "));
            }
            o.push('\n');
        }
        let histories: Vec<&Chart> = s.charts.iter().filter(|c| matches!(c, Chart::History { .. })).collect();
        if !histories.is_empty() {
            o.push_str("| series | first | last | trend | change |\n|---|---|---|---|---|\n");
            for c in histories {
                if let Chart::History { title, unit, points, change_at } = c {
                    let values: Vec<f64> = points.iter().map(|p| p.1).collect();
                    let (first, last) =
                        (values.first().copied().unwrap_or(f64::NAN), values.last().copied().unwrap_or(f64::NAN));
                    let change = change_at.map_or("-".to_string(), |i| {
                        format!("from {}", kiln_text::timefmt::rfc3339(points[i].0).get(..10).unwrap_or(""))
                    });
                    let _ = writeln!(
                        o,
                        "| {} | {} {unit} | {} {unit} | {} | {change} |",
                        md_cell(title),
                        num(first),
                        num(last),
                        sparkline(&values),
                        unit = md_cell(unit),
                    );
                }
            }
            o.push('\n');
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a hostile database can put in a report (a host name, a metric, an inventory) comes out
    /// of the Markdown inert: no HTML, no link, no code fence it can close.
    #[test]
    fn markdown_escapes_what_renderers_turn_into_html() {
        let evil = "<script>alert(1)</script> [x](javascript:alert(1)) ![i](http://x/t.png) **b** `c` | d";
        let report = Report {
            title: format!("Host {evil}"),
            generated_at: "2026-12-03T00:00:00Z".into(),
            sections: vec![Section {
                heading: evil.into(),
                text: vec![format!("line one\n# not a heading {evil}")],
                preformatted: Some("host ```\n```html\n<img src=x onerror=alert(1)>".into()),
                table: Some((vec!["metric".into()], vec![vec![evil.into()]])),
                charts: vec![],
            }],
        };
        let md = markdown(&report);
        assert!(!md.contains("<script") && md.contains("&lt;script&gt;"), "{md}");
        assert!(!md.contains("](javascript") && !md.contains("!["), "{md}");
        assert!(!md.contains("\n# not a heading"), "{md}");
        // The preformatted block holds three backticks: its fence is four, so it cannot be closed early.
        assert!(md.contains("````text\nhost ```\n```html\n<img src=x onerror=alert(1)>\n````"), "{md}");
        let cells = md.lines().filter(|l| l.starts_with("| ")).nth(1).unwrap();
        assert_eq!(cells.matches(" | ").count(), 0, "a | in a cell does not open a column: {cells}");
    }
}

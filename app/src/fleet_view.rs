//! Text for people: `kiln compare`, `kiln outliers`, `kiln regressions`, and the details that need
//! the database (telemetry beside an outlier, what changed at a regression).

use std::fmt::Write;

use kiln_db::{AnyStore, Direction, Queries};

use std::collections::{BTreeMap, BTreeSet, HashMap};

use kiln_text::{num, pct, short, short6};

use crate::fleet::{differences, Comparison, ConfigSummary, MetricSummary, Outlier, Regression};

fn arrow(d: Direction) -> &'static str {
    match d {
        Direction::Higher => "↑",
        Direction::Lower => "↓",
        Direction::None => " ",
    }
}

pub fn render_configs(configs: &[ConfigSummary]) -> String {
    let mut out = String::new();
    if configs.is_empty() {
        return "no results to compare yet: store runs with `kiln commission`, `kiln bench …` or `kiln import`\n"
            .into();
    }
    for c in configs {
        let _ = writeln!(
            out,
            "{} ({}) — {} host{}{}",
            c.config_name,
            c.config_fingerprint,
            c.hosts,
            if c.hosts == 1 { "" } else { "s" },
            c.price.map_or(String::new(), |p| format!(", price {}", num(p)))
        );
        // A benchmark run under several configurations has a row per configuration: tell them apart.
        let mut configs_of: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for m in &c.metrics {
            configs_of.entry(&m.benchmark).or_default().insert(&m.bench_config);
        }
        let tagged = |m: &MetricSummary| configs_of.get(m.benchmark.as_str()).is_some_and(|s| s.len() > 1);
        let names: Vec<String> = c
            .metrics
            .iter()
            .map(|m| {
                let stack = if m.software.is_empty() { String::new() } else { format!("[{}] ", short6(&m.software)) };
                let bench = if tagged(m) { format!(" {{{}}}", config_tag(&m.bench_config)) } else { String::new() };
                format!("{}{stack}{}:{}{bench}", arrow(m.direction), m.benchmark, m.metric)
            })
            .collect();
        let w = names.iter().map(|n| n.chars().count()).max().unwrap_or(0).max(6);
        let _ = writeln!(
            out,
            "  {:<w$} {:>5} {:>6} {:>10} {:>10} {:>10}  {:<28} {:<28} {:>10} {:>10}",
            "METRIC", "HOSTS", "RUNS", "P10", "MEDIAN", "P90", "BEST", "WORST", "PER WATT", "PER PRICE"
        );
        for (m, name) in c.metrics.iter().zip(&names) {
            let _ = writeln!(
                out,
                "  {:<w$} {:>5} {:>6} {:>10} {:>10} {:>10}  {:<28} {:<28} {:>10} {:>10}   {}",
                name,
                m.hosts,
                m.runs,
                num(m.p10),
                num(m.median),
                num(m.p90),
                format!("{} {}", m.best.label(), num(m.best.value)),
                format!("{} {}", m.worst.label(), num(m.worst.value)),
                m.per_watt.map_or("-".into(), num),
                m.per_price.map_or("-".into(), num),
                m.unit
            );
        }
        for (bench, set) in configs_of.iter().filter(|(_, s)| s.len() > 1) {
            for cfg in set {
                let _ = writeln!(out, "  {{{}}} {bench} configuration {}", config_tag(cfg), clip(cfg, 100));
            }
        }
        out.push('\n');
    }
    out.push_str(
        "Values are per-host medians of their runs; p10/median/p90 are over hosts. ↑ higher is better, ↓ lower is \
         better; [xxxxxx] is the software stack, {xxxxxx} the benchmark's configuration.\n",
    );
    out
}

/// A short stable name for a benchmark configuration (its JSON text).
fn config_tag(config: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(config.as_bytes()).iter().take(3).map(|b| format!("{b:02x}")).collect()
}

/// At most `n` characters of `s`, with an ellipsis when cut.
fn clip(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

pub fn render_comparison(c: &Comparison) -> String {
    let mut out = format!("A = {}\nB = {}\n", c.a, c.b);
    if c.rows.is_empty() {
        out += if c.across_software {
            "no metric measured on both sides under the same benchmark configuration\n"
        } else {
            "no metric measured on both sides under the same benchmark configuration (and software stack: try \
             --across-software)\n"
        };
        return out;
    }
    let names: Vec<String> =
        c.rows.iter().map(|r| format!("{} {}:{}", arrow(r.direction), r.benchmark, r.metric)).collect();
    let w = names.iter().map(|n| n.chars().count()).max().unwrap_or(0).max(6);
    let _ = writeln!(out, "{:<w$} {:>10} {:>10} {:>9} {:>21}  VERDICT", "METRIC", "A", "B", "B/A", "95 % INTERVAL");
    for (r, name) in c.rows.iter().zip(&names) {
        let _ = writeln!(
            out,
            "{:<w$} {:>10} {:>10} {:>9} {:>21}  {}{}",
            name,
            format!("{} (n={})", num(r.a_median), r.a_n),
            format!("{} (n={})", num(r.b_median), r.b_n),
            format!("{:.3}", r.ratio),
            format!("[{:.3}, {:.3}]", r.ci.0, r.ci.1),
            r.verdict,
            if r.context.is_empty() { String::new() } else { format!("  ({})", r.context) }
        );
    }
    let _ = writeln!(out, "A verdict is stated only when the interval excludes 1 ± {:.0} % (noise).", c.noise * 100.0);
    out
}

/// Telemetry means of an outlier's last run beside those of typical hosts.
pub async fn outlier_telemetry(store: &mut AnyStore, o: &Outlier) -> kiln_db::Result<Vec<String>> {
    let mine = store.telemetry_means(&o.last_run.to_string()).await?;
    let mut peers: std::collections::BTreeMap<(String, String), Vec<f64>> = std::collections::BTreeMap::new();
    for run in &o.peer_runs {
        for (source, name, mean, _) in store.telemetry_means(&run.to_string()).await? {
            peers.entry((source, name)).or_default().push(mean);
        }
    }
    let mut out = Vec::new();
    for (source, name, mean, _) in mine {
        let typical = peers.get(&(source.clone(), name.clone())).map(|v| kiln_bench::stats::median(v));
        let differs = typical.is_some_and(|t| t != 0.0 && (mean / t - 1.0).abs() > 0.05)
            || (name.starts_with("throttled") && mean > 0.0);
        if differs {
            out.push(format!(
                "{source} {name} {}{}",
                num(mean),
                typical.map_or(String::new(), |t| format!(" (typical {})", num(t)))
            ));
        }
    }
    Ok(out)
}

/// An outlier host with the telemetry of its last run that differs from typical hosts'.
#[derive(Debug, Clone, serde::Serialize)]
pub struct OutlierEntry {
    pub outlier: Outlier,
    pub telemetry: Vec<String>,
}

pub fn render_outliers(outliers: &[OutlierEntry], threshold: f64, min_deviation: f64) -> String {
    if outliers.is_empty() {
        return format!(
            "no outliers: no host beyond |z| {threshold} and {:.0} % from its configuration's median (groups of 5 hosts or more)\n",
            min_deviation * 100.0
        );
    }
    let mut out = String::new();
    for OutlierEntry { outlier: o, telemetry } in outliers {
        let _ = writeln!(
            out,
            "{} {:<24} {}:{} = {} {} vs median {} of {} hosts ({}, z {:+.1}) — {}",
            if o.worse { "WORSE " } else { "BETTER" },
            o.host.label(),
            o.group.benchmark,
            o.group.metric,
            num(o.host.value),
            o.unit,
            num(o.group_median),
            o.hosts_in_group,
            pct(1.0 + o.deviation),
            o.z,
            o.config_name
        );
        for t in telemetry {
            let _ = writeln!(out, "         telemetry: {t}");
        }
    }
    out
}

/// What the runs around the regressions were measured on, and the differences already worked out
/// (the regressions of one host share their runs; a fleet-wide software update shares its pair of
/// stacks across hosts).
struct Explainer {
    contexts: kiln_db::RunContexts,
    /// `contexts.runs` by parsed id.
    runs: HashMap<uuid::Uuid, kiln_db::RunRefs>,
    /// The answer for each pair of consecutive runs already asked about.
    pairs: HashMap<(uuid::Uuid, uuid::Uuid), Vec<String>>,
    software: HashMap<(Option<String>, Option<String>), Vec<String>>,
    inventories: HashMap<(Option<String>, Option<String>), Vec<String>>,
}

impl Explainer {
    /// What differs between two runs: software stack, firmware, kernel, configuration.
    fn between(&mut self, good: uuid::Uuid, bad: uuid::Uuid) -> Vec<String> {
        if let Some(d) = self.pairs.get(&(good, bad)) {
            return d.clone();
        }
        let d = self.differences(good, bad);
        self.pairs.insert((good, bad), d.clone());
        d
    }

    fn differences(&mut self, good: uuid::Uuid, bad: uuid::Uuid) -> Vec<String> {
        let (Some(a), Some(b)) = (self.runs.get(&good), self.runs.get(&bad)) else { return vec![] };
        let mut out = Vec::new();
        if a.software_fingerprint != b.software_fingerprint {
            let docs = &self.contexts.software;
            let diffs = self.software.entry((a.software_id.clone(), b.software_id.clone())).or_insert_with(|| {
                differences(&parse(docs, &a.software_id), &parse(docs, &b.software_id), &|_| true, 8)
            });
            out.push(format!(
                "software stack {} → {}",
                a.software_fingerprint.as_deref().map_or("-", short),
                b.software_fingerprint.as_deref().map_or("-", short)
            ));
            out.extend(diffs.iter().map(|d| format!("  {d}")));
        }
        if a.inventory_id != b.inventory_id {
            let firmware = |k: &str| {
                let k = k.to_ascii_lowercase();
                ["bios", "firmware", "vbios", "microcode", "kernel_release", "driver_version", "fingerprints.config"]
                    .iter()
                    .any(|w| k.contains(w))
            };
            let docs = &self.contexts.inventories;
            let diffs = self.inventories.entry((a.inventory_id.clone(), b.inventory_id.clone())).or_insert_with(|| {
                differences(&parse(docs, &a.inventory_id), &parse(docs, &b.inventory_id), &firmware, 8)
            });
            if !diffs.is_empty() {
                out.push("inventory:".into());
                out.extend(diffs.iter().map(|d| format!("  {d}")));
            }
        }
        out
    }
}

/// A stored document by id, parsed (`null` when absent or not JSON).
fn parse(docs: &HashMap<String, String>, id: &Option<String>) -> serde_json::Value {
    id.as_ref()
        .and_then(|id| docs.get(id))
        .and_then(|d| serde_json::from_str(d).ok())
        .unwrap_or(serde_json::Value::Null)
}

/// Says what changed at each regression ([`explain`]), reading what the runs around all of them
/// were measured on in a few batched statements.
pub async fn explain_all(store: &mut AnyStore, regressions: &mut [Regression]) -> kiln_db::Result<()> {
    let boundaries: BTreeSet<(uuid::Uuid, uuid::Uuid)> =
        regressions.iter().flat_map(|r| r.around.windows(2).map(|w| (w[0].1, w[1].1))).collect();
    if boundaries.is_empty() {
        return Ok(());
    }
    let asked: Vec<(String, String)> = boundaries.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
    let mut contexts = store.run_contexts(&asked).await?;
    let runs = std::mem::take(&mut contexts.runs)
        .into_iter()
        .filter_map(|(id, refs)| Some((id.parse().ok()?, refs)))
        .collect();
    let mut explainer =
        Explainer { contexts, runs, pairs: HashMap::new(), software: HashMap::new(), inventories: HashMap::new() };
    for r in regressions {
        explain(&mut explainer, r);
    }
    Ok(())
}

/// What changed at a host's regression: the software, firmware or inventory difference between
/// consecutive runs nearest the estimated change point (within two runs). When the nearest change
/// is not at the estimate, the regression is moved to it, and says so.
fn explain(explainer: &mut Explainer, r: &mut Regression) {
    if r.around.len() < 2 {
        return;
    }
    // Boundaries (i-1, i) by distance from the estimated one.
    let mut order: Vec<usize> = (1..r.around.len()).collect();
    order.sort_by_key(|&i| i.abs_diff(r.around_at));
    for i in order {
        let (good, bad) = (r.around[i - 1], r.around[i]);
        let diffs = explainer.between(good.1, bad.1);
        if !diffs.is_empty() {
            if i != r.around_at {
                r.changed.push(format!(
                    "(at the nearest change, {} run{} from the estimated change point)",
                    i.abs_diff(r.around_at),
                    if i.abs_diff(r.around_at) == 1 { "" } else { "s" }
                ));
                r.started = bad.0;
                r.last_good_run = Some(good.1);
                r.first_bad_run = Some(bad.1);
            }
            r.changed.extend(diffs);
            return;
        }
    }
    r.changed.push("no change in software, firmware or inventory near the change point".into());
}

pub fn render_regressions(regs: &[Regression], since_days: f64) -> String {
    if regs.is_empty() {
        return format!("no regressions in the last {since_days:.0} days\n");
    }
    let mut out = String::new();
    for r in regs {
        let who = match &r.host {
            Some(h) => format!("host {}", h.label()),
            None => format!("config {}", r.config_name),
        };
        let _ = writeln!(
            out,
            "REGRESSION {who}: {}:{} {} → {} {} ({}, 99 % interval {} to {}) since {} ({} points)",
            r.benchmark,
            r.metric,
            num(r.change.before),
            num(r.change.after),
            r.unit,
            pct(r.change.ratio),
            pct(r.change.ci.0),
            pct(r.change.ci.1),
            kiln_text::timefmt::rfc3339(r.started),
            r.points
        );
        for c in &r.changed {
            let _ = writeln!(out, "    {c}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::HostRef;

    fn metric(metric: &str, bench_config: &str) -> MetricSummary {
        let host = HostRef { id: "0123456789".into(), hostname: Some("gpu-01".into()), value: 1.0 };
        MetricSummary {
            benchmark: "gemm".into(),
            bench_config: bench_config.into(),
            software: String::new(),
            metric: metric.into(),
            unit: "GFLOP/s".into(),
            direction: Direction::Higher,
            hosts: 3,
            runs: 9,
            median: 100.0,
            p10: 90.0,
            p90: 110.0,
            best: host.clone(),
            worst: host,
            per_watt: None,
            per_price: None,
        }
    }

    /// Rows that differ only by the benchmark's configuration are told apart, and a long metric
    /// name widens the column instead of shifting the row.
    #[test]
    fn configurations_are_named_and_columns_hold() {
        let long = "gemm.f32.4096.gflops_with_a_name_longer_than_the_column_was";
        let c = ConfigSummary {
            config_fingerprint: "c0f16".into(),
            config_name: "2× EPYC".into(),
            hosts: 3,
            price: None,
            metrics: vec![metric("gemm.f32.1024.gflops", r#"{"sizes":[1024]}"#), metric(long, r#"{"sizes":[4096]}"#)],
        };
        let text = render_configs(&[c]);
        let (a, b) = (config_tag(r#"{"sizes":[1024]}"#), config_tag(r#"{"sizes":[4096]}"#));
        assert_ne!(a, b);
        assert!(text.contains(&format!("{{{a}}} gemm configuration {{\"sizes\":[1024]}}")), "{text}");
        let rows: Vec<&str> = text.lines().filter(|l| l.contains("GFLOP/s")).collect();
        let col = |l: &str| l.find("100.0").unwrap();
        assert_eq!(col(rows[0]), col(rows[1]), "{text}");
    }
}

//! Text for people: `kiln compare`, `kiln outliers`, `kiln regressions`, and the details that need
//! the database (telemetry beside an outlier, what changed at a regression).

use std::fmt::Write;

use kiln_db::{AnyStore, Direction};

use std::collections::{BTreeMap, BTreeSet};

use crate::fleet::{differences, Comparison, ConfigSummary, MetricSummary, Outlier, Regression};

/// A value with three or four significant digits.
pub fn num(v: f64) -> String {
    let a = v.abs();
    if !v.is_finite() {
        "-".into()
    } else if a >= 10_000.0 {
        format!("{v:.0}")
    } else if a >= 100.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else if a == 0.0 {
        "0".into()
    } else {
        format!("{v:.3e}")
    }
}

pub fn pct(ratio: f64) -> String {
    format!("{:+.1} %", (ratio - 1.0) * 100.0)
}

fn arrow(d: Direction) -> &'static str {
    match d {
        Direction::Higher => "↑",
        Direction::Lower => "↓",
        Direction::None => " ",
    }
}

pub fn short(s: &str) -> &str {
    &s[..s.len().min(12)]
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

/// The first six characters of a fingerprint, as the tables show a software stack.
pub fn short6(s: &str) -> &str {
    &s[..s.len().min(6)]
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

type Context = Option<(Option<String>, Option<String>, Option<String>)>;

/// Run contexts already read: the regressions of one host share their runs.
#[derive(Default)]
pub struct Explainer {
    contexts: std::collections::HashMap<String, Context>,
    differences: std::collections::HashMap<(String, String), Vec<String>>,
}

impl Explainer {
    async fn context(&mut self, store: &mut AnyStore, run: &str) -> kiln_db::Result<Context> {
        if let Some(c) = self.contexts.get(run) {
            return Ok(c.clone());
        }
        let c = store.run_context(run).await?;
        self.contexts.insert(run.to_string(), c.clone());
        Ok(c)
    }

    async fn between(&mut self, store: &mut AnyStore, good: &str, bad: &str) -> kiln_db::Result<Vec<String>> {
        let key = (good.to_string(), bad.to_string());
        if let Some(d) = self.differences.get(&key) {
            return Ok(d.clone());
        }
        let a = self.context(store, good).await?;
        let b = self.context(store, bad).await?;
        let d = run_differences(a, b);
        self.differences.insert(key, d.clone());
        Ok(d)
    }
}

/// What differs between two runs: software stack, firmware, kernel, configuration.
fn run_differences(a: Context, b: Context) -> Vec<String> {
    let (Some(a), Some(b)) = (a, b) else { return vec![] };
    let mut out = Vec::new();
    let parse = |s: &Option<String>| {
        s.as_deref().and_then(|d| serde_json::from_str::<serde_json::Value>(d).ok()).unwrap_or(serde_json::Value::Null)
    };
    if a.0 != b.0 {
        let diffs = differences(&parse(&a.1), &parse(&b.1), &|_| true, 8);
        out.push(format!(
            "software stack {} → {}",
            a.0.as_deref().map_or("-", short),
            b.0.as_deref().map_or("-", short)
        ));
        out.extend(diffs.into_iter().map(|d| format!("  {d}")));
    }
    let firmware = |k: &str| {
        let k = k.to_ascii_lowercase();
        ["bios", "firmware", "vbios", "microcode", "kernel_release", "driver_version", "fingerprints.config"]
            .iter()
            .any(|w| k.contains(w))
    };
    let diffs = differences(&parse(&a.2), &parse(&b.2), &firmware, 8);
    if !diffs.is_empty() {
        out.push("inventory:".into());
        out.extend(diffs.into_iter().map(|d| format!("  {d}")));
    }
    out
}

/// What changed at a host's regression: the software, firmware or inventory difference between
/// consecutive runs nearest the estimated change point (within two runs). When the nearest change
/// is not at the estimate, the regression is moved to it, and says so.
pub async fn explain(store: &mut AnyStore, cache: &mut Explainer, r: &mut Regression) -> kiln_db::Result<()> {
    if r.around.len() < 2 {
        return Ok(());
    }
    // Boundaries (i-1, i) by distance from the estimated one.
    let mut order: Vec<usize> = (1..r.around.len()).collect();
    order.sort_by_key(|&i| i.abs_diff(r.around_at));
    for i in order {
        let (good, bad) = (r.around[i - 1], r.around[i]);
        let diffs = cache.between(store, &good.1.to_string(), &bad.1.to_string()).await?;
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
            return Ok(());
        }
    }
    r.changed.push("no change in software, firmware or inventory near the change point".into());
    Ok(())
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
            crate::timefmt::rfc3339(r.started),
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

//! Text for people: `kiln compare`, `kiln outliers`, `kiln regressions`, and the details that need
//! the database (telemetry beside an outlier, what changed at a regression).

use std::fmt::Write;

use kiln_db::{Direction, Store};

use crate::fleet::{differences, CompareRow, ConfigSummary, Outlier, Regression};

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
        let _ = writeln!(
            out,
            "  {:<44} {:>5} {:>6} {:>10} {:>10} {:>10}  {:<28} {:<28} {:>10} {:>10}",
            "METRIC", "HOSTS", "RUNS", "P10", "MEDIAN", "P90", "BEST", "WORST", "PER WATT", "PER PRICE"
        );
        for m in &c.metrics {
            let name = format!(
                "{}{} {}:{}",
                arrow(m.direction),
                if m.software.is_empty() {
                    String::new()
                } else {
                    format!("[{}] ", &m.software[..m.software.len().min(6)])
                },
                m.benchmark,
                m.metric
            );
            let _ = writeln!(
                out,
                "  {:<44} {:>5} {:>6} {:>10} {:>10} {:>10}  {:<28} {:<28} {:>10} {:>10}   {}",
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
        out.push('\n');
    }
    out.push_str("Values are per-host medians of their runs; p10/median/p90 are over hosts. ↑ higher is better, ↓ lower is better; [xxxxxx] is the software stack.\n");
    out
}

pub fn render_comparison(a: &str, b: &str, noise: f64, rows: &[CompareRow]) -> String {
    let mut out = format!("A = {a}\nB = {b}\n");
    if rows.is_empty() {
        out += "no metric measured on both sides under the same benchmark configuration (and software stack: try --across-software)\n";
        return out;
    }
    let _ = writeln!(out, "{:<34} {:>10} {:>10} {:>9} {:>21}  VERDICT", "METRIC", "A", "B", "B/A", "95 % INTERVAL");
    for r in rows {
        let _ = writeln!(
            out,
            "{:<34} {:>10} {:>10} {:>9} {:>21}  {}{}",
            format!("{} {}:{}", arrow(r.direction), r.benchmark, r.metric),
            format!("{} (n={})", num(r.a_median), r.a_n),
            format!("{} (n={})", num(r.b_median), r.b_n),
            format!("{:.3}", r.ratio),
            format!("[{:.3}, {:.3}]", r.ci.0, r.ci.1),
            r.verdict,
            if r.context.is_empty() { String::new() } else { format!("  ({})", r.context) }
        );
    }
    let _ = writeln!(out, "A verdict is stated only when the interval excludes 1 ± {:.0} % (noise).", noise * 100.0);
    out
}

/// Telemetry means of an outlier's last run beside those of typical hosts.
pub async fn outlier_telemetry(store: &mut Store, o: &Outlier) -> kiln_db::Result<Vec<String>> {
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

pub fn render_outliers(outliers: &[(Outlier, Vec<String>)], threshold: f64, min_deviation: f64) -> String {
    if outliers.is_empty() {
        return format!(
            "no outliers: no host beyond |z| {threshold} and {:.0} % from its configuration's median (groups of 5 hosts or more)\n",
            min_deviation * 100.0
        );
    }
    let mut out = String::new();
    for (o, telemetry) in outliers {
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
    async fn context(&mut self, store: &mut Store, run: &str) -> kiln_db::Result<Context> {
        if let Some(c) = self.contexts.get(run) {
            return Ok(c.clone());
        }
        let c = store.run_context(run).await?;
        self.contexts.insert(run.to_string(), c.clone());
        Ok(c)
    }

    async fn between(&mut self, store: &mut Store, good: &str, bad: &str) -> kiln_db::Result<Vec<String>> {
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
pub async fn explain(store: &mut Store, cache: &mut Explainer, r: &mut Regression) -> kiln_db::Result<()> {
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

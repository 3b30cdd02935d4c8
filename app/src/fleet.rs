//! Fleet analysis over the stored series (`kiln_db::Fleet`): configurations side by side, two
//! subjects compared with a confidence interval, outlier hosts, and nightly regressions.
//!
//! Like is compared with like: a value belongs to a `Group` — configuration fingerprint, benchmark,
//! the benchmark's exact configuration, software stack (unless `across_software`) and metric. A
//! host's value in a group is the median of its runs there, so that every box weighs the same in a
//! fleet distribution however often it ran.
//!
//! Pure functions: the CLI loads the fleet, calls these, and adds what only the database knows
//! (telemetry, what changed between two runs).

use std::collections::BTreeMap;

use kiln_bench::stats::{
    bootstrap_ratio_ci, mad, median, median_in_place, percentile_sorted, shift_ci_overlaps, shift_ratio_ci, splitmix64,
};
use kiln_db::{Direction, Fleet, SeriesKey};
use serde::Serialize;

/// The default noise threshold: changes smaller than this are never called differences.
pub const NOISE: f64 = 0.02;

/// The least deviation from its group's median that makes a host an outlier, however tight the
/// group: hosts of one configuration differ by a few per cent (silicon, cooling) as a rule.
pub const MIN_DEVIATION: f64 = 0.05;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Group {
    pub config_fingerprint: String,
    pub benchmark: String,
    pub bench_config: String,
    /// The software stack's fingerprint; empty when stacks are merged or unknown.
    pub software: String,
    pub metric: String,
}

#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Only series whose points are at or after this time (seconds since the epoch).
    pub since: Option<i64>,
    /// A metric name, or `benchmark:metric`.
    pub metric: Option<String>,
    pub across_software: bool,
}

impl Filter {
    pub fn wants(&self, key: &SeriesKey) -> bool {
        match &self.metric {
            None => true,
            Some(m) => match m.split_once(':') {
                Some((b, name)) => key.benchmark == b && key.metric == name,
                None => key.metric == *m,
            },
        }
    }
}

/// One host's runs in one group.
#[derive(Debug, Clone)]
pub struct HostValues {
    pub host: usize,
    /// In time order as collected; `by_group` leaves them sorted by value.
    pub values: Vec<f64>,
    pub powers: Vec<f64>,
    pub last_run: uuid::Uuid,
    pub last_t: i64,
    median: f64,
}

impl HostValues {
    /// The median of the host's runs in the group.
    pub fn median(&self) -> f64 {
        self.median
    }
}

/// Metadata of a group (from any of its keys).
#[derive(Debug, Clone, Serialize)]
pub struct GroupInfo {
    pub config_name: String,
    pub unit: String,
    pub direction: Direction,
}

/// Every group with its hosts' values. Series keys are mapped to groups once (a few hundred
/// keys), so the pass over millions of points copies no strings.
pub fn by_group(fleet: &Fleet, filter: &Filter) -> BTreeMap<Group, (GroupInfo, Vec<HostValues>)> {
    let mut groups: Vec<(Group, GroupInfo, Vec<HostValues>)> = Vec::new();
    let mut index: std::collections::HashMap<Group, usize> = std::collections::HashMap::new();
    let mut of_key: std::collections::HashMap<i64, usize> = std::collections::HashMap::new();
    for key in fleet.keys.values().filter(|k| filter.wants(k)) {
        let group = Group {
            config_fingerprint: key.config_fingerprint.clone(),
            benchmark: key.benchmark.clone(),
            bench_config: key.bench_config.clone(),
            software: if filter.across_software { String::new() } else { key.software_fingerprint.clone() },
            metric: key.metric.clone(),
        };
        let gi = *index.entry(group.clone()).or_insert_with(|| {
            groups.push((
                group,
                GroupInfo { config_name: key.config_name.clone(), unit: key.unit.clone(), direction: key.direction },
                Vec::new(),
            ));
            groups.len() - 1
        });
        of_key.insert(key.id, gi);
    }
    for (h, host) in fleet.hosts.iter().enumerate() {
        for s in &host.data.series {
            let Some(&gi) = of_key.get(&s.key) else { continue };
            let list = &mut groups[gi].2;
            if list.last().is_none_or(|hv| hv.host != h) {
                list.push(HostValues {
                    host: h,
                    values: vec![],
                    powers: vec![],
                    last_run: uuid::Uuid::nil(),
                    last_t: i64::MIN,
                    median: f64::NAN,
                });
            }
            let hv = list.last_mut().unwrap();
            for &(run, value) in &s.points {
                let r = &host.data.runs[run as usize];
                if filter.since.is_some_and(|since| r.t < since) {
                    continue;
                }
                hv.values.push(value);
                if let Some(p) = r.power_watts {
                    hv.powers.push(f64::from(p));
                }
                if r.t >= hv.last_t {
                    hv.last_t = r.t;
                    hv.last_run = r.run_id;
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    for (g, info, mut hosts) in groups {
        hosts.retain(|h| !h.values.is_empty());
        for hv in hosts.iter_mut() {
            hv.values.sort_unstable_by(f64::total_cmp);
            let n = hv.values.len();
            hv.median = if n % 2 == 1 { hv.values[n / 2] } else { (hv.values[n / 2 - 1] + hv.values[n / 2]) / 2.0 };
        }
        if !hosts.is_empty() {
            out.insert(g, (info, hosts));
        }
    }
    out
}

#[derive(Debug, Clone, Serialize)]
pub struct HostRef {
    pub id: String,
    pub hostname: Option<String>,
    pub value: f64,
}

impl HostRef {
    pub fn label(&self) -> String {
        self.hostname.clone().unwrap_or_else(|| self.id[..8.min(self.id.len())].to_string())
    }
}

fn host_ref(fleet: &Fleet, h: usize, value: f64) -> HostRef {
    HostRef { id: fleet.hosts[h].id.clone(), hostname: fleet.hosts[h].hostname.clone(), value }
}

#[derive(Debug, Clone, Serialize)]
pub struct MetricSummary {
    pub benchmark: String,
    pub bench_config: String,
    pub software: String,
    pub metric: String,
    pub unit: String,
    pub direction: Direction,
    pub hosts: usize,
    pub runs: usize,
    pub median: f64,
    pub p10: f64,
    pub p90: f64,
    pub best: HostRef,
    pub worst: HostRef,
    /// Median over hosts of (host median / host median GPU power), for higher-is-better metrics.
    pub per_watt: Option<f64>,
    /// Median / the configuration's price.
    pub per_price: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ConfigSummary {
    pub config_fingerprint: String,
    pub config_name: String,
    pub hosts: usize,
    pub price: Option<f64>,
    pub metrics: Vec<MetricSummary>,
}

/// What a fleet question cannot be answered for, in words a user can act on.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("{0:?} is not a duration such as 30d, 12h or 2w")]
    Duration(String),
    #[error("{0:?}: the unit must be s, m, h, d or w")]
    DurationUnit(String),
    #[error("prices: {0}")]
    Prices(String),
    #[error("{0:?} names no configuration, host or software stack in the database")]
    NoSubject(String),
    #[error(
        "{text:?} is ambiguous ({count} matches: {examples}); give more characters or a prefix config:, host: or \
         software:"
    )]
    Ambiguous { text: String, count: usize, examples: String },
    #[error("compare two of a kind: two configurations, two hosts or two software stacks")]
    Mixed,
    #[error("no {what} matches {needle:?}")]
    NoMatch { what: &'static str, needle: String },
    #[error("{needle:?} matches {count} {what}s; give more of the {by}")]
    Several { what: &'static str, needle: String, count: usize, by: &'static str },
    #[error("the run's host is not in the database")]
    RunWithoutHost,
    #[error(transparent)]
    Db(#[from] kiln_db::DbError),
}

/// Prices per configuration, from a TOML file: `"<config fingerprint, or its name>" = 250000`.
pub fn parse_prices(text: &str) -> Result<BTreeMap<String, f64>, FleetError> {
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| FleetError::Prices(e.to_string()))?;
    let mut out = BTreeMap::new();
    for (k, v) in table {
        let price = v
            .as_float()
            .or_else(|| v.as_integer().map(|i| i as f64))
            .ok_or_else(|| FleetError::Prices(format!("price of {k:?} must be a number")))?;
        out.insert(k, price);
    }
    Ok(out)
}

/// `kiln compare --by config`.
pub fn compare_configs(fleet: &Fleet, filter: &Filter, prices: &BTreeMap<String, f64>) -> Vec<ConfigSummary> {
    let groups = by_group(fleet, filter);
    let mut configs: BTreeMap<String, ConfigSummary> = BTreeMap::new();
    let mut config_hosts: BTreeMap<String, std::collections::BTreeSet<usize>> = BTreeMap::new();
    for (g, (info, hosts)) in &groups {
        let c = configs.entry(g.config_fingerprint.clone()).or_insert_with(|| ConfigSummary {
            config_fingerprint: g.config_fingerprint.clone(),
            config_name: info.config_name.clone(),
            hosts: 0,
            price: prices.get(&g.config_fingerprint).or_else(|| prices.get(&info.config_name)).copied(),
            metrics: vec![],
        });
        config_hosts.entry(g.config_fingerprint.clone()).or_default().extend(hosts.iter().map(|h| h.host));
        let mut medians: Vec<(f64, usize)> = hosts.iter().map(|h| (h.median(), h.host)).collect();
        medians.sort_by(|a, b| a.0.total_cmp(&b.0));
        let sorted: Vec<f64> = medians.iter().map(|m| m.0).collect();
        let (lo, hi) = (medians[0], medians[medians.len() - 1]);
        let (best, worst) = match info.direction {
            Direction::Lower => (lo, hi),
            _ => (hi, lo),
        };
        let med = median(&sorted);
        let per_watt = (info.direction == Direction::Higher)
            .then(|| {
                let v: Vec<f64> = hosts
                    .iter()
                    .filter(|h| !h.powers.is_empty())
                    .map(|h| h.median() / median(&h.powers))
                    .filter(|x| x.is_finite())
                    .collect();
                (!v.is_empty()).then(|| median(&v))
            })
            .flatten();
        c.metrics.push(MetricSummary {
            benchmark: g.benchmark.clone(),
            bench_config: g.bench_config.clone(),
            software: g.software.clone(),
            metric: g.metric.clone(),
            unit: info.unit.clone(),
            direction: info.direction,
            hosts: hosts.len(),
            runs: hosts.iter().map(|h| h.values.len()).sum(),
            median: med,
            p10: percentile_sorted(&sorted, 0.10),
            p90: percentile_sorted(&sorted, 0.90),
            best: host_ref(fleet, best.1, best.0),
            worst: host_ref(fleet, worst.1, worst.0),
            per_watt,
            per_price: c.price.filter(|p| *p > 0.0 && info.direction == Direction::Higher).map(|p| med / p),
        });
    }
    for (fp, c) in configs.iter_mut() {
        c.hosts = config_hosts.get(fp).map_or(0, |s| s.len());
    }
    let mut out: Vec<ConfigSummary> = configs.into_values().collect();
    out.sort_by(|a, b| b.hosts.cmp(&a.hosts).then(a.config_name.cmp(&b.config_name)));
    out
}

/// What `kiln compare A B` compares.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", content = "id", rename_all = "snake_case")]
pub enum Subject {
    Config(String),
    Host(usize),
    Software(String),
}

/// Resolves a name: a configuration (fingerprint prefix or exact name), a host (id prefix or host
/// name) or a software stack (fingerprint prefix). `config:`, `host:`, `software:` force the kind.
pub fn resolve(fleet: &Fleet, text: &str) -> Result<(Subject, String), FleetError> {
    let (kind, needle) = match text.split_once(':') {
        Some((k @ ("config" | "host" | "software"), rest)) => (Some(k), rest),
        _ => (None, text),
    };
    let mut found: Vec<(Subject, String)> = Vec::new();
    if kind.is_none() || kind == Some("config") {
        let mut seen = std::collections::BTreeSet::new();
        for k in fleet.keys.values() {
            if (k.config_fingerprint.starts_with(needle) || k.config_name == needle)
                && seen.insert(k.config_fingerprint.clone())
            {
                found.push((
                    Subject::Config(k.config_fingerprint.clone()),
                    format!("config {} ({})", k.config_name, k.config_fingerprint),
                ));
            }
        }
    }
    if kind.is_none() || kind == Some("host") {
        for (i, h) in fleet.hosts.iter().enumerate() {
            if h.id.starts_with(needle) || h.hostname.as_deref() == Some(needle) {
                found.push((
                    Subject::Host(i),
                    format!("host {} ({})", h.hostname.as_deref().unwrap_or("-"), &h.id[..8.min(h.id.len())]),
                ));
            }
        }
    }
    if kind.is_none() || kind == Some("software") {
        let mut seen = std::collections::BTreeSet::new();
        for k in fleet.keys.values() {
            if !k.software_fingerprint.is_empty()
                && k.software_fingerprint.starts_with(needle)
                && seen.insert(k.software_fingerprint.clone())
            {
                found.push((
                    Subject::Software(k.software_fingerprint.clone()),
                    format!("software {}", k.software_fingerprint),
                ));
            }
        }
    }
    match found.len() {
        0 => Err(match kind {
            Some(kind) => FleetError::NoMatch {
                what: match kind {
                    "config" => "configuration",
                    "host" => "host",
                    _ => "software stack",
                },
                needle: needle.to_string(),
            },
            None => FleetError::NoSubject(text.to_string()),
        }),
        1 => Ok(found.pop().expect("one")),
        n => Err(FleetError::Ambiguous {
            text: text.to_string(),
            count: n,
            examples: found.iter().take(5).map(|f| f.1.clone()).collect::<Vec<_>>().join("; "),
        }),
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct CompareRow {
    /// What is held equal on both sides.
    pub benchmark: String,
    pub metric: String,
    pub unit: String,
    pub direction: Direction,
    pub context: String,
    pub a_n: usize,
    pub b_n: usize,
    pub a_median: f64,
    pub b_median: f64,
    /// median(B) / median(A), with its 95 % bootstrap interval.
    pub ratio: f64,
    pub ci: (f64, f64),
    /// `better`, `worse`, or `no difference beyond noise`.
    pub verdict: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub a: String,
    pub b: String,
    pub noise: f64,
    pub rows: Vec<CompareRow>,
    /// Whether software stacks were merged (`--across-software`), for the text.
    #[serde(skip)]
    pub across_software: bool,
}

/// The fewest values on each side for a verdict: a bootstrap of two runs says nothing.
pub const MIN_SAMPLES: usize = 5;

/// The verdict on a ratio's interval: stated only when it excludes 1 ± noise.
pub fn verdict(ci: (f64, f64), direction: Direction, noise: f64) -> &'static str {
    let higher = ci.0 > 1.0 + noise;
    let lower = ci.1 < 1.0 - noise;
    match (higher, lower, direction) {
        (true, _, Direction::Higher) | (_, true, Direction::Lower) => "better",
        (true, _, Direction::Lower) | (_, true, Direction::Higher) => "worse",
        (true, _, Direction::None) => "higher",
        (_, true, Direction::None) => "lower",
        _ => "no difference beyond noise",
    }
}

/// `kiln compare A B`: both subjects of one kind.
pub fn compare_two(
    fleet: &Fleet,
    a: &Subject,
    b: &Subject,
    filter: &Filter,
    noise: f64,
) -> Result<Vec<CompareRow>, FleetError> {
    let groups = by_group(fleet, filter);
    // The context held equal (config/software/host parts that are not the subject) → values per side.
    type Side = Vec<f64>;
    let mut pairs: BTreeMap<(String, String, String, String), (GroupInfo, Side, Side)> = BTreeMap::new();
    let short = |s: &str| s[..s.len().min(12)].to_string();
    for (g, (info, hosts)) in &groups {
        let software_ctx =
            || if g.software.is_empty() { String::new() } else { format!("software {}", short(&g.software)) };
        // Which side a group's host medians belong to, when the subject is one of its fields.
        let split = |field: &String, a: &String, b: &String, ctx: String| {
            let vals: Side = hosts.iter().map(HostValues::median).collect();
            if field == a {
                Some((ctx, vals, vec![]))
            } else if field == b {
                Some((ctx, vec![], vals))
            } else {
                None
            }
        };
        let (context, side_a, side_b): (String, Side, Side) = match (a, b) {
            (Subject::Config(ca), Subject::Config(cb)) => match split(&g.config_fingerprint, ca, cb, software_ctx()) {
                Some(x) => x,
                None => continue,
            },
            (Subject::Software(sa), Subject::Software(sb)) => {
                match split(&g.software, sa, sb, format!("config {}", info.config_name)) {
                    Some(x) => x,
                    None => continue,
                }
            }
            (Subject::Host(ha), Subject::Host(hb)) => {
                let pick = |h: usize| hosts.iter().find(|v| v.host == h).map(|v| v.values.clone()).unwrap_or_default();
                (software_ctx(), pick(*ha), pick(*hb))
            }
            _ => return Err(FleetError::Mixed),
        };
        // For hosts and configs the configuration may differ between sides; the key drops it.
        let key = (g.benchmark.clone(), g.bench_config.clone(), g.metric.clone(), context);
        let e = pairs.entry(key).or_insert_with(|| (info.clone(), vec![], vec![]));
        e.1.extend(side_a);
        e.2.extend(side_b);
    }
    let mut rows = Vec::new();
    for ((benchmark, bench_config, metric, context), (info, va, vb)) in pairs {
        if va.is_empty() || vb.is_empty() {
            continue;
        }
        let seed = benchmark.bytes().chain(metric.bytes()).fold(0x6b696c6eu64, |h, b| h.rotate_left(5) ^ u64::from(b));
        let ci = bootstrap_ratio_ci(&va, &vb, 2000, seed, 0.95);
        let (ma, mb) = (median(&va), median(&vb));
        let _ = bench_config;
        rows.push(CompareRow {
            benchmark,
            metric,
            unit: info.unit.clone(),
            direction: info.direction,
            context,
            a_n: va.len(),
            b_n: vb.len(),
            a_median: ma,
            b_median: mb,
            ratio: mb / ma,
            ci,
            verdict: if va.len().min(vb.len()) < MIN_SAMPLES {
                format!("too few values for a verdict (fewer than {MIN_SAMPLES} on a side)")
            } else {
                verdict(ci, info.direction, noise).to_string()
            },
        });
    }
    Ok(rows)
}

#[derive(Debug, Clone, Serialize)]
pub struct Outlier {
    pub group: Group,
    pub config_name: String,
    pub unit: String,
    pub direction: Direction,
    pub host: HostRef,
    pub group_median: f64,
    pub hosts_in_group: usize,
    /// Robust z-score: 0.6745 · (x − median) / MAD (Iglewicz and Hoaglin).
    pub z: f64,
    /// x / median − 1.
    pub deviation: f64,
    /// Whether the deviation is in the bad direction.
    pub worse: bool,
    pub last_run: uuid::Uuid,
    /// Runs of typical hosts of the group, for the telemetry comparison.
    pub peer_runs: Vec<uuid::Uuid>,
}

/// Hosts whose median sits far from their group's: |robust z| > `threshold` and at least
/// `min_deviation` from the median.
pub fn outliers(fleet: &Fleet, filter: &Filter, threshold: f64, min_deviation: f64) -> Vec<Outlier> {
    let mut out = Vec::new();
    for (g, (info, hosts)) in by_group(fleet, filter) {
        if hosts.len() < 5 {
            continue;
        }
        let medians: Vec<f64> = hosts.iter().map(HostValues::median).collect();
        let m = median(&medians);
        // `mad` is scaled to σ (×1.4826); the modified z-score wants the raw MAD.
        let raw_mad = mad(&medians) / 1.4826;
        for (h, &x) in hosts.iter().zip(&medians) {
            let z = if raw_mad > 0.0 {
                0.6745 * (x - m) / raw_mad
            } else if x != m {
                f64::INFINITY.copysign(x - m)
            } else {
                0.0
            };
            let deviation = x / m - 1.0;
            if z.abs() > threshold && deviation.abs() > min_deviation {
                let worse = match info.direction {
                    Direction::Higher => x < m,
                    Direction::Lower => x > m,
                    Direction::None => true,
                };
                let mut peers: Vec<(f64, uuid::Uuid)> = hosts
                    .iter()
                    .zip(&medians)
                    .filter(|(p, _)| p.host != h.host)
                    .map(|(p, v)| ((v - m).abs(), p.last_run))
                    .collect();
                peers.sort_by(|a, b| a.0.total_cmp(&b.0));
                out.push(Outlier {
                    group: g.clone(),
                    config_name: info.config_name.clone(),
                    unit: info.unit.clone(),
                    direction: info.direction,
                    host: host_ref(fleet, h.host, x),
                    group_median: m,
                    hosts_in_group: hosts.len(),
                    z,
                    deviation,
                    worse,
                    last_run: h.last_run,
                    peer_runs: peers.into_iter().take(3).map(|p| p.1).collect(),
                });
            }
        }
    }
    out.sort_by(|a, b| b.z.abs().total_cmp(&a.z.abs()));
    out
}

/// A step change in a series.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Change {
    /// Index of the first point after the change.
    pub at: usize,
    pub before: f64,
    pub after: f64,
    /// after / before: the Hodges–Lehmann estimate, with its 99 % Moses interval.
    pub ratio: f64,
    pub ci: (f64, f64),
}

/// The least points on each side of a change.
pub const MIN_SIDE: usize = 4;

/// Finds the most likely single step in `values` (the split maximising Welch's t between the two
/// sides) and keeps it only when it is significant — the 99 % interval of the shift (Moses,
/// from the Mann–Whitney statistic) clears 1 ± noise/2 — and its estimate is larger than `noise`
/// (criterion's rule, made stricter for the search over split points).
pub fn detect(values: &[f64], noise: f64, seed: u64) -> Option<Change> {
    let n = values.len();
    if n < 2 * MIN_SIDE {
        return None;
    }
    let mut sum = vec![0.0; n + 1];
    let mut sq = vec![0.0; n + 1];
    for (i, v) in values.iter().enumerate() {
        sum[i + 1] = sum[i] + v;
        sq[i + 1] = sq[i] + v * v;
    }
    let stats = |a: usize, b: usize| {
        let k = (b - a) as f64;
        let mean = (sum[b] - sum[a]) / k;
        let var = ((sq[b] - sq[a]) - k * mean * mean).max(0.0) / (k - 1.0);
        (mean, var, k)
    };
    let mut best = (0.0, 0);
    for k in MIN_SIDE..=n - MIN_SIDE {
        let (m1, v1, k1) = stats(0, k);
        let (m2, v2, k2) = stats(k, n);
        let se = (v1 / k1 + v2 / k2).sqrt();
        let t = if se > 0.0 {
            (m2 - m1).abs() / se
        } else if m1 != m2 {
            f64::INFINITY
        } else {
            0.0
        };
        if t > best.0 {
            best = (t, k);
        }
    }
    let k = best.1;
    if k == 0 {
        return None;
    }
    let (before, after) = (&values[..k], &values[k..]);
    // Most series have no change worth the exact interval: where its 99 % interval certainly
    // overlaps the band of half the noise threshold (the test below), it is not built.
    if shift_ci_overlaps(before, after, 2.576, 1.0 + noise / 2.0, 1.0 - noise / 2.0) {
        return None;
    }
    let (mb, ma) = (median(before), median(after));
    // The shift's size and interval: Hodges–Lehmann with the Moses 99 % interval (rank-based,
    // exact, cheap); a bootstrap of the ratio of medians where values are not all positive.
    let (ratio, ci) = match shift_ratio_ci(before, after, 2.576) {
        Some((est, lo, hi)) => (est, (lo, hi)),
        None => (ma / mb, bootstrap_ratio_ci(before, after, 1000, seed, 0.99)),
    };
    if !ratio.is_finite() || (ratio - 1.0).abs() <= noise {
        return None;
    }
    // The split was chosen as the most extreme of many, so a plain "interval excludes 1" would
    // fire too often on noise alone: the 99 % interval must clear half the noise threshold.
    if ci.0 <= 1.0 + noise / 2.0 && ci.1 >= 1.0 - noise / 2.0 {
        return None;
    }
    Some(Change { at: k, before: mb, after: ma, ratio, ci })
}

#[derive(Debug, Clone, Serialize)]
pub struct Regression {
    /// `host` (one box's series) or `config` (the nightly median of a configuration's hosts).
    pub scope: &'static str,
    pub host: Option<HostRef>,
    pub config_fingerprint: String,
    pub config_name: String,
    pub benchmark: String,
    pub metric: String,
    pub unit: String,
    pub direction: Direction,
    /// Seconds since the epoch of the first run after the change.
    pub started: i64,
    pub change: Change,
    /// The last run before the change and the first after it (host scope).
    pub last_good_run: Option<uuid::Uuid>,
    pub first_bad_run: Option<uuid::Uuid>,
    pub points: usize,
    /// Filled in by the caller from the database: what differs between the two runs.
    pub changed: Vec<String>,
    /// Runs (time, id) around the change point (host scope), for finding the change that explains
    /// it when the estimate is a night off.
    #[serde(skip)]
    pub around: Vec<(i64, uuid::Uuid)>,
    /// Index in `around` of the first run after the estimated change.
    #[serde(skip)]
    pub around_at: usize,
}

fn is_worse(direction: Direction, ratio: f64) -> bool {
    match direction {
        Direction::Higher => ratio < 1.0,
        Direction::Lower => ratio > 1.0,
        Direction::None => false,
    }
}

/// Regressions in the nightly series since `since`: per host (across software and configuration
/// changes, so that the change that caused it shows) and per configuration (the nightly median of
/// its hosts). Improvements and metrics without a better direction are not regressions.
pub fn regressions(fleet: &Fleet, filter: &Filter, noise: f64) -> Vec<Regression> {
    // Hosts are independent: their series are searched on every core (10,000 hosts × 20 metrics
    // is 200,000 series), in contiguous chunks whose results are joined in host order, so the
    // answer does not depend on the number of cores.
    let n = fleet.hosts.len();
    let workers = std::thread::available_parallelism().map_or(1, |c| c.get()).clamp(1, 8).min(n.max(1));
    let chunk = n.div_ceil(workers).max(1);
    let parts: Vec<(Vec<Regression>, ConfigNights)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..n)
            .step_by(chunk)
            .map(|start| scope.spawn(move || host_regressions(fleet, filter, noise, start..(start + chunk).min(n))))
            .collect();
        handles.into_iter().map(|h| h.join().expect("a regression search thread panicked")).collect()
    });
    let mut out = Vec::new();
    // Each configuration's points stay in the parts the threads gathered (joining them would copy
    // every point of the fleet once more).
    let mut config_nights: BTreeMap<_, (&str, &str, Direction, Vec<Vec<(i64, f64)>>)> = BTreeMap::new();
    for (found, nights) in parts {
        out.extend(found);
        for (k, (name, unit, direction, points)) in nights {
            config_nights.entry(k).or_insert_with(|| (name, unit, direction, Vec::new())).3.push(points);
        }
    }
    // Each configuration's nightly series, on every core too (a configuration's series gathers
    // every host's runs: 1,250 hosts × 90 nights in the 10,000-host fleet).
    let series: Vec<_> = config_nights.into_iter().collect();
    let chunk = series.len().div_ceil(workers).max(1);
    let found: Vec<Vec<Regression>> = std::thread::scope(|scope| {
        let handles: Vec<_> = series
            .chunks(chunk)
            .map(|part| scope.spawn(move || part.iter().filter_map(|s| config_regression(s, noise)).collect()))
            .collect();
        handles.into_iter().map(|h| h.join().expect("a regression search thread panicked")).collect()
    });
    out.extend(found.into_iter().flatten());
    out.sort_by(|a, b| a.change.ratio.min(1.0 / a.change.ratio).total_cmp(&b.change.ratio.min(1.0 / b.change.ratio)));
    out
}

/// The regression of one configuration's nightly median series, if it has one.
fn config_regression(
    ((config, (benchmark, _, metric)), (config_name, unit, direction, points)): &(
        (&str, SeriesId<'_>),
        (&str, &str, Direction, Vec<Vec<(i64, f64)>>),
    ),
    noise: f64,
) -> Option<Regression> {
    let series = nightly_medians(points.iter().flatten().copied());
    let values: Vec<f64> = series.iter().map(|p| p.1).collect();
    let change = detect(&values, noise, 0x636f6e66)?;
    is_worse(*direction, change.ratio).then(|| Regression {
        scope: "config",
        host: None,
        config_fingerprint: config.to_string(),
        config_name: config_name.to_string(),
        benchmark: benchmark.to_string(),
        metric: metric.to_string(),
        unit: unit.to_string(),
        direction: *direction,
        started: series[change.at].0,
        last_good_run: None,
        first_bad_run: None,
        points: values.len(),
        change,
        changed: vec![],
        around: vec![],
        around_at: 0,
    })
}

/// A metric's series by (benchmark, benchmark configuration, metric), borrowed from the fleet.
type SeriesId<'f> = (&'f str, &'f str, &'f str);

/// Each configuration's points per series, for its nightly medians: (configuration name, unit,
/// direction, (time, value) of every host's runs).
type ConfigNights<'f> = BTreeMap<(&'f str, SeriesId<'f>), (&'f str, &'f str, Direction, Vec<(i64, f64)>)>;

/// The regressions of the hosts in `hosts`, each host's series merged across software and
/// configuration changes, and their points gathered per configuration.
fn host_regressions<'f>(
    fleet: &'f Fleet,
    filter: &Filter,
    noise: f64,
    hosts: std::ops::Range<usize>,
) -> (Vec<Regression>, ConfigNights<'f>) {
    let mut out = Vec::new();
    let mut config_nights = ConfigNights::new();
    for h in hosts {
        let host = &fleet.hosts[h];
        type Merged<'f> = (&'f str, &'f str, Direction, &'f str, Vec<(i64, uuid::Uuid, f64)>);
        let mut merged: BTreeMap<SeriesId<'f>, Merged<'f>> = BTreeMap::new();
        for s in &host.data.series {
            let Some(key) = fleet.keys.get(&s.key) else { continue };
            if !filter.wants(key) || key.direction == Direction::None {
                continue;
            }
            let id = (key.benchmark.as_str(), key.bench_config.as_str(), key.metric.as_str());
            let e = merged
                .entry(id)
                .or_insert_with(|| (&key.unit, &key.config_fingerprint, key.direction, &key.config_name, vec![]));
            let config_points = &mut config_nights
                .entry((key.config_fingerprint.as_str(), id))
                .or_insert_with(|| (&key.config_name, &key.unit, key.direction, Vec::new()))
                .3;
            for &(run, value) in &s.points {
                let r = &host.data.runs[run as usize];
                if filter.since.is_some_and(|since| r.t < since) {
                    continue;
                }
                e.4.push((r.t, r.run_id, value));
                config_points.push((r.t, value));
            }
        }
        for ((benchmark, _, metric), (unit, config, direction, config_name, mut points)) in merged {
            points.sort_by_key(|p| p.0);
            let values: Vec<f64> = points.iter().map(|p| p.2).collect();
            let seed = {
                let mut s = (h as u64) << 20 ^ metric.len() as u64;
                splitmix64(&mut s)
            };
            let Some(change) = detect(&values, noise, seed) else { continue };
            if !is_worse(direction, change.ratio) {
                continue;
            }
            out.push(Regression {
                scope: "host",
                host: Some(host_ref(fleet, h, change.after)),
                config_fingerprint: config.to_string(),
                config_name: config_name.to_string(),
                benchmark: benchmark.to_string(),
                metric: metric.to_string(),
                unit: unit.to_string(),
                direction,
                started: points[change.at].0,
                last_good_run: Some(points[change.at - 1].1),
                first_bad_run: Some(points[change.at].1),
                points: values.len(),
                around: points[change.at.saturating_sub(3)..(change.at + 3).min(points.len())]
                    .iter()
                    .map(|p| (p.0, p.1))
                    .collect(),
                around_at: change.at - change.at.saturating_sub(3),
                change,
                changed: vec![],
            });
        }
    }
    (out, config_nights)
}

/// The median of each UTC day's values, at the day's start: a configuration's nightly series.
pub fn nightly_medians<I>(points: I) -> Vec<(i64, f64)>
where
    I: IntoIterator<Item = (i64, f64)>,
    I::IntoIter: Clone,
{
    let points = points.into_iter().map(|(t, v)| (t.div_euclid(86_400), v));
    let (first, last, count) =
        points.clone().fold((i64::MAX, i64::MIN, 0u64), |(a, b, n), p| (a.min(p.0), b.max(p.0), n + 1));
    if count == 0 {
        return vec![];
    }
    // A configuration's series has one night per day of the window (and 100,000 points in a large
    // fleet): binned by day in a dense table where the days are that dense, in a map otherwise.
    let span = last.abs_diff(first);
    if span < 4 * count + 1024 {
        let mut nights: Vec<Vec<f64>> = vec![Vec::new(); span as usize + 1];
        for (day, v) in points {
            nights[(day - first) as usize].push(v);
        }
        (first..)
            .zip(nights)
            .filter(|(_, v)| !v.is_empty())
            .map(|(day, mut v)| (day * 86_400, median_in_place(&mut v)))
            .collect()
    } else {
        let mut nights: BTreeMap<i64, Vec<f64>> = BTreeMap::new();
        for (day, v) in points {
            nights.entry(day).or_default().push(v);
        }
        nights.into_iter().map(|(day, mut v)| (day * 86_400, median_in_place(&mut v))).collect()
    }
}

/// `30d`, `12h`, `2w`, `90m` → seconds.
pub fn parse_duration(text: &str) -> Result<i64, FleetError> {
    let t = text.trim();
    let (num, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let n: i64 = num.parse().map_err(|_| FleetError::Duration(text.to_string()))?;
    let mult = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" | "" => 86_400,
        "w" => 7 * 86_400,
        _ => return Err(FleetError::DurationUnit(text.to_string())),
    };
    Ok(n * mult)
}

/// Leaves of a JSON document as `path = value`, for saying what changed between two runs.
pub fn flatten(value: &serde_json::Value, prefix: &str, out: &mut BTreeMap<String, String>) {
    match value {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                flatten(v, &if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") }, out);
            }
        }
        serde_json::Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                flatten(v, &format!("{prefix}[{i}]"), out);
            }
        }
        other => {
            out.insert(prefix.to_string(), other.to_string());
        }
    }
}

/// The differences between two documents, limited to keys that `keep` accepts.
pub fn differences(
    before: &serde_json::Value,
    after: &serde_json::Value,
    keep: &dyn Fn(&str) -> bool,
    limit: usize,
) -> Vec<String> {
    let (mut a, mut b) = (BTreeMap::new(), BTreeMap::new());
    flatten(before, "", &mut a);
    flatten(after, "", &mut b);
    let mut out = Vec::new();
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    for k in keys {
        if !keep(k) {
            continue;
        }
        let (x, y) = (a.get(k), b.get(k));
        if x != y {
            out.push(format!(
                "{k}: {} → {}",
                x.map_or("(absent)", String::as_str),
                y.map_or("(absent)", String::as_str)
            ));
        }
    }
    if out.len() > limit {
        let more = out.len() - limit;
        out.truncate(limit);
        out.push(format!("… and {more} more"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A series of `n` points around 100 with relative noise `sigma` (Box–Muller on SplitMix64),
    /// stepping by `step` (relative) at `at`.
    fn series(n: usize, sigma: f64, step: f64, at: usize, seed: u64) -> Vec<f64> {
        let mut s = seed;
        let mut uniform = || (splitmix64(&mut s) >> 11) as f64 / (1u64 << 53) as f64;
        (0..n)
            .map(|i| {
                let (u1, u2) = (uniform().max(1e-12), uniform());
                let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
                let level = if i >= at { 100.0 * (1.0 + step) } else { 100.0 };
                level * (1.0 + sigma * z)
            })
            .collect()
    }

    /// Each UTC day's median at the day's start, in day order, whether the days are dense (a table)
    /// or sparse (a map), before the epoch too.
    #[test]
    fn nightly_medians_bin_by_utc_day() {
        let day = 86_400;
        let dense = [(5 * day + 10, 3.0), (3 * day + 5, 1.0), (5 * day + 20, 5.0), (3 * day, 2.0), (5 * day + 1, 4.0)];
        assert_eq!(nightly_medians(dense), vec![(3 * day, 1.5), (5 * day, 4.0)]);
        let sparse = [(9_000 * day + 1, 7.0), (-day + 1, 1.0), (-day + 2, 3.0)];
        assert_eq!(nightly_medians(sparse), vec![(-day, 2.0), (9_000 * day, 7.0)]);
        assert_eq!(nightly_medians([]), vec![]);
    }

    /// Detection and false-alarm rates on synthetic nightly series (30 nights, 1 % noise, noise
    /// threshold 2 %): the figures ARCHITECTURE.md and the README quote.
    #[test]
    fn detection_and_false_alarm_rates() {
        let trials = 400;
        let mut detected = 0;
        let mut located = 0;
        for t in 0..trials {
            let at = 6 + (t % 19);
            let v = series(30, 0.01, -0.05, at, 1000 + t as u64);
            if let Some(c) = detect(&v, NOISE, t as u64) {
                detected += 1;
                if c.at.abs_diff(at) <= 1 {
                    located += 1;
                }
            }
        }
        let mut false_alarms = 0;
        for t in 0..trials {
            let v = series(30, 0.01, 0.0, 0, 5000 + t as u64);
            if detect(&v, NOISE, t as u64).is_some() {
                false_alarms += 1;
            }
        }
        // A step as large as the noise threshold is not a regression, however clear.
        let mut small = 0;
        for t in 0..trials {
            let v = series(30, 0.002, -0.015, 15, 9000 + t as u64);
            if detect(&v, NOISE, t as u64).is_some() {
                small += 1;
            }
        }
        let rate = |k: usize| k as f64 / trials as f64;
        eprintln!(
            "5 % step, 1 % noise: detected {:.1} %, located within one night {:.1} %; noise only: false alarms {:.2} %; 1.5 % step: flagged {:.1} %",
            100.0 * rate(detected),
            100.0 * rate(located),
            100.0 * rate(false_alarms),
            100.0 * rate(small)
        );
        assert!(rate(detected) >= 0.98, "detection rate {}", rate(detected));
        assert!(rate(located) >= 0.95, "location rate {}", rate(located));
        assert!(rate(false_alarms) <= 0.01, "false-alarm rate {}", rate(false_alarms));
        assert_eq!(small, 0, "changes under the noise threshold are never flagged");

        // Harder: noise as large as the threshold.
        let (mut hard_detected, mut hard_false) = (0, 0);
        for t in 0..trials {
            if detect(&series(30, 0.02, -0.05, 6 + (t % 19), 20_000 + t as u64), NOISE, t as u64).is_some() {
                hard_detected += 1;
            }
            if detect(&series(30, 0.02, 0.0, 0, 30_000 + t as u64), NOISE, t as u64).is_some() {
                hard_false += 1;
            }
        }
        eprintln!(
            "5 % step, 2 % noise: detected {:.1} %; noise only: false alarms {:.2} %",
            100.0 * rate(hard_detected),
            100.0 * rate(hard_false)
        );
        assert!(rate(hard_detected) >= 0.85, "detection rate at 2 % noise {}", rate(hard_detected));
        assert!(rate(hard_false) <= 0.02, "false-alarm rate at 2 % noise {}", rate(hard_false));
    }

    #[test]
    fn verdicts_need_the_interval_to_clear_the_noise() {
        assert_eq!(verdict((1.05, 1.10), Direction::Higher, 0.02), "better");
        assert_eq!(verdict((1.05, 1.10), Direction::Lower, 0.02), "worse");
        assert_eq!(verdict((1.01, 1.10), Direction::Higher, 0.02), "no difference beyond noise");
        assert_eq!(verdict((0.90, 0.95), Direction::Higher, 0.02), "worse");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30d").unwrap(), 30 * 86_400);
        assert_eq!(parse_duration("12h").unwrap(), 12 * 3600);
        assert!(parse_duration("soon").is_err());
    }
}

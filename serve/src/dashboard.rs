//! `GET /`: the fleet on one page, from the report's parts (its style, its inline SVG charts, no
//! scripts, no external assets): every host with its configuration, newest verdict and the age of
//! its last run, each linking to its report; each configuration's distributions; the open
//! regressions and the outliers.

use std::collections::BTreeMap;
use std::fmt::Write;

use kiln_db::{AnyStore, Direction, Queries};

use kiln_app::defaults;
use kiln_app::fleet::{by_group, Filter};
use kiln_app::report::{esc, svg, Chart, CSS};
use kiln_app::views::{self, View};

/// At most this many distribution charts (the first groups in configuration order).
const MAX_CHARTS: usize = 48;

fn age(seconds: i64) -> String {
    match seconds {
        s if s < 120 => format!("{s} s"),
        s if s < 7_200 => format!("{} min", s / 60),
        s if s < 172_800 => format!("{} h", s / 3_600),
        s => format!("{} d", s / 86_400),
    }
}

fn query(value: &str) -> String {
    value.bytes().fold(String::new(), |mut o, b| {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            o.push(b as char);
        } else {
            let _ = write!(o, "%{b:02X}");
        }
        o
    })
}

/// The dashboard's HTML.
pub async fn page(store: &mut AnyStore) -> anyhow::Result<String> {
    let now = kiln_text::timefmt::now_unix();
    let hosts = store.hosts().await?;
    let verdicts = store.latest_verdicts().await?;
    let last_runs = store.last_runs().await?;
    let since = views::window_start(defaults::WINDOW)?;
    let regressions = views::regressions_view(store, defaults::WINDOW, None, defaults::NOISE).await?;
    let filter = Filter { since: Some(since), metric: None, across_software: false };
    let outliers = views::outliers_view(store, &filter, defaults::OUTLIER_THRESHOLD, defaults::MIN_DEVIATION).await?;
    let fleet = store.fleet(Some(since)).await?;

    let mut o = String::new();
    let _ = write!(
        o,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>kiln fleet</title>\
         <style>{CSS}a{{color:#1f5fa8}}</style></head><body><h1>kiln fleet</h1><p>kiln {}, {} hosts, generated {}.</p>",
        env!("CARGO_PKG_VERSION"),
        hosts.len(),
        esc(&kiln_text::timefmt::now_rfc3339())
    );

    let mut per_config: BTreeMap<(String, String), BTreeMap<String, usize>> = BTreeMap::new();
    o.push_str("<h2>Hosts</h2><table><thead><tr><th>host</th><th>name</th><th>configuration</th><th>verdict</th><th>last run</th></tr></thead><tbody>");
    for h in &hosts {
        let verdict = verdicts.get(&h.id).map(|v| v.verdict.clone()).unwrap_or_else(|| "-".into());
        *per_config
            .entry((h.config_name.clone(), h.config_fingerprint.clone()))
            .or_default()
            .entry(verdict.clone())
            .or_default() += 1;
        let last = last_runs
            .get(&h.id)
            .and_then(|t| kiln_db::parse_rfc3339(t))
            .map(|t| format!("{} ago", age((now - t).max(0))))
            .unwrap_or_else(|| "never".into());
        let _ = write!(
            o,
            "<tr><td><a href=\"/api/v1/report?host={}\">{}</a></td><td>{}</td><td><a href=\"/api/v1/report?config={}\">{}</a></td><td>{}</td><td>{}</td></tr>",
            query(&h.id),
            esc(&h.id[..h.id.len().min(8)]),
            esc(h.hostname.as_deref().unwrap_or("-")),
            query(&h.config_fingerprint),
            esc(&h.config_name),
            esc(&verdict),
            esc(&last)
        );
    }
    o.push_str("</tbody></table>");

    o.push_str("<h2>Configurations</h2><table><thead><tr><th>configuration</th><th>fingerprint</th><th>hosts</th><th>verdicts</th></tr></thead><tbody>");
    for ((name, fp), counts) in &per_config {
        let total: usize = counts.values().sum();
        let verdicts: Vec<String> = counts.iter().map(|(v, n)| format!("{n} {v}")).collect();
        let _ = write!(
            o,
            "<tr><td><a href=\"/api/v1/report?config={}\">{}</a></td><td>{}</td><td>{total}</td><td>{}</td></tr>",
            query(fp),
            esc(name),
            esc(&fp[..fp.len().min(12)]),
            esc(&verdicts.join(", "))
        );
    }
    o.push_str("</tbody></table>");

    let charts: Vec<Chart> = by_group(&fleet, &filter)
        .into_iter()
        .filter(|(_, (info, hosts))| info.direction != Direction::None && !hosts.is_empty())
        .take(MAX_CHARTS)
        .map(|(g, (info, hosts))| Chart::Distribution {
            title: format!("{} · {}:{}", info.config_name, g.benchmark, g.metric),
            unit: info.unit.clone(),
            direction: info.direction,
            values: hosts.iter().map(|h| h.median()).collect(),
            mark: None,
        })
        .collect();
    if !charts.is_empty() {
        o.push_str("<h2>Distributions (30 days, each host's median)</h2><div class=\"charts\">");
        for c in &charts {
            o.push_str(&svg(c));
        }
        o.push_str("</div>");
    }
    let _ = write!(o, "<h2>Regressions (30 days)</h2><pre>{}</pre>", esc(&regressions.render()));
    let _ = write!(o, "<h2>Outliers (30 days)</h2><pre>{}</pre>", esc(&outliers.render()));
    o.push_str("</body></html>\n");
    Ok(o)
}

//! Fleet comparison through the binary: a synthetic fleet (`fleet_gen.rs`, with a slow host, a
//! software regression on one host and a BIOS regression on one configuration) exported as JSON
//! lines, imported, compared, searched for outliers and regressions, and reported on — the HTML
//! page checked in headless Chromium.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::fleet_gen::{config_fp, generate, hostname, FleetSpec};
use crate::util::{kiln, Run};

fn spec() -> FleetSpec {
    spec_seeded(42)
}

/// The test fleet (40 hosts, 4 configurations, 30 nights) from `seed`.
pub fn spec_seeded(seed: u64) -> FleetSpec {
    FleetSpec {
        hosts: 40,
        configs: 4,
        nights: 30,
        metrics: 6,
        samples_per_metric: 3,
        sampled_metrics: 2,
        gpus: 2,
        telemetry_points: 3,
        end: kiln_text::timefmt::now_unix() - 3600,
        seed,
    }
}

struct Lab {
    dir: tempfile::TempDir,
}

impl Lab {
    fn new() -> Lab {
        Lab { dir: tempfile::tempdir().unwrap() }
    }
    fn db(&self) -> PathBuf {
        self.dir.path().join("fleet.db")
    }
    fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
    fn kiln(&self, args: &[&str]) -> Run {
        kiln(args, &[("KILN_DB", &self.db())])
    }
    /// A fleet imported into this lab's database; returns the export file.
    fn imported(&self) -> PathBuf {
        let (text, ..) = generate(&spec());
        let f = self.file("fleet.jsonl", &text);
        self.kiln(&["import", f.to_str().unwrap()]).success();
        f
    }
}

#[test]
fn import_is_idempotent_and_a_bad_file_imports_nothing() {
    let lab = Lab::new();
    let (text, metrics, samples, telemetry) = generate(&spec());
    let file = lab.file("fleet.jsonl", &text);
    let first = lab.kiln(&["import", file.to_str().unwrap(), "--json"]).success().json();
    let stats = &first["imports"][0]["stats"];
    assert_eq!(stats["runs_new"], 1200);
    assert_eq!(stats["hosts_new"], 40);
    assert_eq!(
        (stats["metrics"].as_u64(), stats["samples"].as_u64(), stats["telemetry"].as_u64()),
        (Some(metrics as u64), Some(samples as u64), Some(telemetry as u64))
    );
    let again = lab.kiln(&["import", file.to_str().unwrap(), "--json"]).success().json();
    let stats = &again["imports"][0]["stats"];
    assert_eq!(
        (
            stats["runs_new"].as_u64(),
            stats["runs_known"].as_u64(),
            stats["hosts_new"].as_u64(),
            stats["metrics"].as_u64()
        ),
        (Some(0), Some(1200), Some(0), Some(0))
    );

    // A round trip: export what was imported, import it elsewhere, export again: the same records.
    let exported = lab.kiln(&["export"]).success().stdout();
    let other = Lab::new();
    let f2 = other.file("again.jsonl", &exported);
    other.kiln(&["import", f2.to_str().unwrap()]).success();
    let sorted = |t: &str| {
        let mut l: Vec<String> = t.lines().skip(1).map(str::to_string).collect();
        l.sort();
        l
    };
    assert_eq!(
        sorted(&exported),
        sorted(&other.kiln(&["export"]).success().stdout()),
        "export → import → export changes nothing"
    );

    // Bad files, each refused with its line, and the database left as it was.
    let lines: Vec<&str> = text.lines().collect();
    let cut = text.len() - lines.last().unwrap().len() - 1 - lines[lines.len() - 2].len() / 2 - 1;
    let mut broken_metric = lines.clone();
    let bad_line = 300;
    let replaced = broken_metric[bad_line - 1].replacen(r#""metrics":[["#, r#""metrics":[[7,"#, 1);
    broken_metric[bad_line - 1] = &replaced;
    let cases: Vec<(&str, String, String)> = vec![
        (
            "truncated.jsonl",
            text[..cut].to_string(),
            format!(
                ":{}: the last line is cut off (no newline): the file is truncated; nothing was imported",
                lines.len() - 1
            ),
        ),
        (
            "no-end.jsonl",
            lines[..lines.len() - 1].join("\n") + "\n",
            ": no end record: the file is truncated; nothing was imported".into(),
        ),
        (
            "bad-record.jsonl",
            broken_metric.join("\n") + "\n",
            format!(":{bad_line}: invalid type: integer `7`, expected a string at line 1 column"),
        ),
        ("not-an-export.jsonl", "hello\n".into(), ":1: not a kiln export header".into()),
        (
            "newer.jsonl",
            "{\"kiln_export\":99,\"exported_at\":\"x\"}\n{\"type\":\"end\",\"records\":0}\n".into(),
            ":1: export format 99 is newer than this kiln knows (1); upgrade kiln; nothing was imported".into(),
        ),
    ];
    // Into no database at all: a refused import creates none (nor its lock or log files).
    let fresh = Lab::new();
    for (name, body, want) in cases {
        let f = fresh.file(name, &body);
        let run = fresh.kiln(&["import", f.to_str().unwrap()]);
        assert_eq!(run.code(), Some(2), "{}", run.describe());
        let expected = format!("kiln: error: {}{want}", f.display());
        assert!(run.stderr().starts_with(&expected), "{name}: want {expected}\n{}", run.describe());
        let left: Vec<_> = std::fs::read_dir(fresh.dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("fleet.db"))
            .collect();
        assert!(left.is_empty(), "{name}: a refused import left {left:?}");
        // Into a database with a fleet in it: refused the same way, and nothing changes.
        let into = lab.kiln(&["import", f.to_str().unwrap()]);
        assert_eq!(into.code(), Some(2), "{}", into.describe());
    }
    assert_eq!(sorted(&exported), sorted(&lab.kiln(&["export"]).success().stdout()), "a refused import changed data");
    let missing = fresh.kiln(&["hosts"]);
    assert_eq!(missing.code(), Some(2), "{}", missing.describe());
    assert!(missing.stderr().contains("no database here"), "{}", missing.describe());
}

fn by_host<'a>(list: &'a [Value], host: &str) -> Vec<&'a Value> {
    list.iter().filter(|o| o["host"]["hostname"] == host).collect()
}

#[test]
fn compare_outliers_and_regressions_find_what_was_planted() {
    let lab = Lab::new();
    lab.imported();
    let s = spec();

    // Configurations side by side.
    let prices = lab.file("prices.toml", &format!("\"{}\" = 250000\n", config_fp(0)));
    let out = lab.kiln(&["compare", "--by", "config", "--prices", prices.to_str().unwrap(), "--json"]).success().json();
    let configs = out["configs"].as_array().unwrap();
    assert_eq!(configs.len(), 4);
    assert!(configs.iter().all(|c| c["hosts"] == 10), "{out}");
    let c0 = configs.iter().find(|c| c["config_fingerprint"] == config_fp(0)).unwrap();
    let m0 = c0["metrics"].as_array().unwrap().iter().find(|m| m["metric"] == "metric_00").unwrap();
    assert!((m0["median"].as_f64().unwrap() / 50.0 - 1.0).abs() < 0.02, "{m0}");
    assert_eq!(m0["runs"], 10 * s.nights);
    assert!(
        m0["p10"].as_f64().unwrap() <= m0["median"].as_f64().unwrap()
            && m0["median"].as_f64().unwrap() <= m0["p90"].as_f64().unwrap()
    );
    let per_price = m0["per_price"].as_f64().unwrap();
    assert!((per_price - m0["median"].as_f64().unwrap() / 250_000.0).abs() < 1e-12);
    assert!(m0["per_watt"].as_f64().unwrap() > 0.0, "power telemetry gives perf per watt: {m0}");
    // Host 7 (configuration 3) is the worst of its configuration on every metric.
    let c3 = configs.iter().find(|c| c["config_fingerprint"] == config_fp(3)).unwrap();
    for m in c3["metrics"].as_array().unwrap() {
        assert_eq!(m["worst"]["hostname"], hostname(7), "{m}");
    }
    // Host 13's new software stack is kept apart: its configuration has two stacks' rows.
    let c1 = configs.iter().find(|c| c["config_fingerprint"] == config_fp(1)).unwrap();
    let stacks: std::collections::BTreeSet<&str> =
        c1["metrics"].as_array().unwrap().iter().map(|m| m["software"].as_str().unwrap()).collect();
    assert_eq!(stacks.len(), 2, "{c1}");
    let text = lab.kiln(&["compare", "--by", "config"]).success().stdout();
    assert!(text.contains("2× EPYC 9654 · 8× H100 80GB HBM3 · 2 TiB") && text.contains("gpu-node-0007"), "{text}");

    // Two hosts: the slow one is worse on every metric, with an interval clear of the noise.
    let out = lab.kiln(&["compare", &hostname(3), &hostname(7), "--json"]).success().json();
    let rows = out["rows"].as_array().unwrap();
    assert_eq!(rows.len(), s.metrics);
    for r in rows {
        assert_eq!(r["verdict"], "worse", "{r}");
        let ratio = r["ratio"].as_f64().unwrap();
        let expected = if r["direction"] == "higher" { 0.8 } else { 1.25 };
        assert!((ratio / expected - 1.0).abs() < 0.04, "{r}");
        assert!(r["ci"][0].as_f64().unwrap() <= ratio && ratio <= r["ci"][1].as_f64().unwrap());
    }
    // Two configurations: configuration 2 is 20 % higher on everything (before its BIOS update).
    let out =
        lab.kiln(&["compare", &format!("config:{}", &config_fp(0)[..14]), &config_fp(2), "--json"]).success().json();
    for r in out["rows"].as_array().unwrap() {
        let want = if r["direction"] == "higher" { "better" } else { "worse" };
        assert_eq!(r["verdict"], want, "{r}");
    }
    let ambiguous = lab.kiln(&["compare", "c0f16", &hostname(1)]);
    assert_eq!(ambiguous.code(), Some(2));
    assert!(ambiguous.stderr().contains("is ambiguous (4 matches"), "{}", ambiguous.describe());

    // Outliers: host 7, on every metric, and nobody else.
    let out = lab.kiln(&["outliers", "--json"]).success().json();
    let list: Vec<Value> = out["outliers"].as_array().unwrap().iter().map(|o| o["outlier"].clone()).collect();
    assert_eq!(by_host(&list, &hostname(7)).len(), s.metrics, "{out}");
    assert_eq!(list.len(), s.metrics, "only host 7: {out}");
    assert!(list.iter().all(|o| o["worse"] == true && o["z"].as_f64().unwrap().abs() > 3.5));
    // …with the telemetry that may explain it: its GPUs drew less power than typical hosts'.
    for o in out["outliers"].as_array().unwrap() {
        let t: Vec<&str> = o["telemetry"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
        assert!(t.iter().any(|l| l.starts_with("gpu0 power_watts 5") && l.contains("(typical 6")), "{t:?}");
    }
    let text = lab.kiln(&["outliers"]).success().stdout();
    assert!(text.contains("telemetry: gpu1 power_watts"), "{text}");

    // Regressions: host 13 (software) and configuration 2 (BIOS), with what changed; nothing else.
    let run = lab.kiln(&["regressions", "--since", "40d", "--json"]);
    assert_eq!(run.code(), Some(1), "regressions found → exit 1\n{}", run.describe());
    let regs = run.json()["regressions"].as_array().unwrap().clone();
    let host13 = by_host(&regs, &hostname(13));
    assert_eq!(host13.len(), s.metrics, "{regs:?}");
    for r in &host13 {
        assert!(
            (r["change"]["ratio"].as_f64().unwrap() - if r["direction"] == "higher" { 0.9 } else { 1.0 / 0.9 }).abs()
                < 0.03,
            "{r}"
        );
        let changed = r["changed"].as_array().unwrap();
        assert!(changed.iter().any(|c| c.as_str().unwrap().starts_with("software stack 5f0a11ce0000")), "{r}");
        assert!(
            changed.iter().any(|c| c.as_str().unwrap().contains(r#"stack.python./opt/venv.torch: "2.6.0" → "2.7.0""#)),
            "{r}"
        );
        let started = r["started"].as_i64().unwrap();
        let night = (started - (s.end - (s.nights as i64 - 1) * 86_400)).div_euclid(86_400);
        assert_eq!(night as usize, s.nights - 10, "{r}");
    }
    let config2: Vec<&Value> = regs.iter().filter(|r| r["scope"] == "config").collect();
    assert_eq!(config2.len(), s.metrics, "one per metric of configuration 2: {config2:?}");
    assert!(config2.iter().all(|r| r["config_fingerprint"] == config_fp(2)));
    let bios: Vec<&Value> =
        regs.iter().filter(|r| r["scope"] == "host" && r["config_fingerprint"] == config_fp(2)).collect();
    assert_eq!(bios.len(), 10 * s.metrics, "every host of configuration 2, every metric");
    assert!(
        bios.iter().all(|r| r["changed"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c.as_str().unwrap().contains(r#"system.bios.version: "1.2.0" → "1.3.0""#))),
        "{:?}",
        bios[0]
    );
    assert_eq!(
        regs.len(),
        host13.len() + config2.len() + bios.len(),
        "no false alarms among the other {} series",
        29 * s.metrics
    );
    let text = lab.kiln(&["regressions", "--since", "40d"]).stdout();
    assert!(text.contains(&format!("REGRESSION host {}", hostname(13))) && text.contains("software stack"), "{text}");
    let quiet = lab.kiln(&["regressions", "--since", "40d", "--metric", "no_such_metric"]);
    assert_eq!(quiet.code(), Some(0), "{}", quiet.describe());
}

fn chromium() -> Option<&'static str> {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"]
        .into_iter()
        .find(|p| Path::new(p).exists())
}

#[test]
fn reports_render_in_headless_chromium() {
    let lab = Lab::new();
    lab.imported();
    let html = lab.dir.path().join("host.html");
    let md = lab.dir.path().join("host.md");
    lab.kiln(&[
        "report",
        "--host",
        &hostname(13),
        "--since",
        "40d",
        "--html",
        html.to_str().unwrap(),
        "--markdown",
        md.to_str().unwrap(),
    ])
    .success();
    let page = std::fs::read_to_string(&html).unwrap();
    for want in [
        "<h2>Results against the fleet</h2>",
        "<h2>History</h2>",
        "<h2>Telemetry of run",
        "class=\"change\"",
        "this host",
    ] {
        assert!(page.contains(want), "the host report lacks {want:?}");
    }
    assert!(
        !page.contains("<script") && !page.contains("src=") && !page.contains("href="),
        "self-contained: no scripts, no external assets"
    );
    let text = std::fs::read_to_string(&md).unwrap();
    assert!(
        text.contains("## Results against the fleet")
            && text.contains("| metric | unit | better | value | percentile |"),
        "{text}"
    );
    assert!(
        text.contains("changed -10.0 %") || text.contains("changed -9."),
        "the software regression is named: {text}"
    );
    assert!(text.chars().any(|c| ('▁'..='█').contains(&c)), "sparklines in the history table");

    let cfg_html = lab.dir.path().join("config.html");
    lab.kiln(&[
        "report",
        "--config",
        crate::fleet_gen::CONFIG_NAMES[2],
        "--since",
        "40d",
        "--html",
        cfg_html.to_str().unwrap(),
    ])
    .success();
    let cfg = std::fs::read_to_string(&cfg_html).unwrap();
    assert!(
        cfg.contains("<h2>Nightly median</h2>") && cfg.contains("class=\"change\""),
        "the BIOS regression is marked"
    );
    let runs = lab.kiln(&["runs", "--json", "--limit", "1"]).success().json();
    let run_id = runs["runs"][0]["id"].as_str().unwrap().to_string();
    let run_md = lab.dir.path().join("run.md");
    lab.kiln(&["report", "--run", &run_id, "--markdown", run_md.to_str().unwrap()]).success();
    assert!(
        std::fs::read_to_string(&run_md).unwrap().contains("this run")
            || std::fs::read_to_string(&run_md).unwrap().contains("| value |")
    );
    let none = lab.kiln(&["report", "--host", "nope", "--html", "/dev/null"]);
    assert_eq!(none.code(), Some(2));
    assert!(none.stderr().contains("no host matches \"nope\""), "{}", none.describe());

    // Headless Chromium: the page loads without console errors and the plots are in the DOM.
    let browser = chromium();
    let missing: Vec<String> =
        browser.is_none().then(|| "headless Chromium (Debian package chromium)".into()).into_iter().collect();
    if !crate::util::needs("reports_render_in_headless_chromium (its browser half)", &missing) {
        return;
    }
    let browser = browser.expect("checked");
    for (page, min_svgs) in [(&html, 10), (&cfg_html, 10)] {
        let profile = tempfile::tempdir().unwrap();
        let out = std::process::Command::new(browser)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--enable-logging=stderr",
                "--v=0",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("--dump-dom")
            .arg(format!("file://{}", page.display()))
            .output()
            .expect("running chromium");
        let dom = String::from_utf8_lossy(&out.stdout);
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "chromium failed: {log}");
        let console: Vec<&str> = log.lines().filter(|l| l.contains("CONSOLE") || l.contains("Uncaught")).collect();
        assert!(console.is_empty(), "console messages: {console:?}");
        let svgs = dom.matches("<svg").count();
        assert!(svgs >= min_svgs, "{} plots in the rendered DOM of {}", svgs, page.display());
        assert!(dom.matches("<circle").count() > 100 && dom.contains("<polyline"), "points and lines are drawn");
    }
}

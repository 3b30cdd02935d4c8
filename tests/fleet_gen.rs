//! A synthetic fleet as a `kiln export` file, shared by the fleet tests and the fleet benchmark:
//! hosts of a few configurations, one suite run per host per night with `metrics` metrics (1 %
//! noise), raw samples and GPU power telemetry, and known faults:
//! - host 7 is 20 % slower than its configuration on every metric (an outlier), its GPUs held to
//!   520 W where the others draw 650 W (the telemetry that explains it);
//! - host 13 gets a new software stack at night `nights - 10`, and is 10 % slower from then on;
//! - every host of configuration 2 gets a BIOS update at night `nights - 6`, 6 % slower from then on.

#![allow(dead_code)]

use std::fmt::Write as _;

#[derive(Clone, Copy)]
pub struct FleetSpec {
    pub hosts: usize,
    pub configs: usize,
    pub nights: usize,
    pub metrics: usize,
    pub samples_per_metric: usize,
    /// Metrics (the first ones) that carry raw samples.
    pub sampled_metrics: usize,
    pub gpus: usize,
    pub telemetry_points: usize,
    /// The last night's start, seconds since the epoch.
    pub end: i64,
    pub seed: u64,
}

fn gauss(s: &mut u64) -> f64 {
    let u1 = ((kiln_bench::stats::splitmix64(s) >> 11) as f64 / (1u64 << 53) as f64).max(1e-12);
    let u2 = (kiln_bench::stats::splitmix64(s) >> 11) as f64 / (1u64 << 53) as f64;
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

fn uuid(kind: u8, a: u64, b: u64) -> String {
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        (a >> 16) as u32 ^ u32::from(kind) << 24,
        a & 0xffff,
        (b >> 48) & 0xfff,
        (b >> 36) & 0xfff,
        b & 0xffff_ffff_ffff
    )
}

use kiln_text::timefmt::rfc3339;

pub const CONFIG_NAMES: [&str; 4] = [
    "2× EPYC 9654 · 8× H100 80GB HBM3 · 2 TiB",
    "2× Xeon 8480+ · 8× H100 80GB HBM3 · 2 TiB",
    "2× EPYC 9654 · 8× H200 141GB · 2 TiB",
    "2× Xeon 8568Y+ · 8× H200 141GB · 2 TiB",
];

pub fn config_fp(c: usize) -> String {
    format!("{:016x}", 0xc0f1_6000_0000_0000u64 + c as u64 * 0x1111)
}

pub fn hostname(h: usize) -> String {
    format!("gpu-node-{h:04}")
}

pub fn metric_name(m: usize) -> String {
    format!("metric_{m:02}")
}

/// Higher is better for even metrics, lower for odd ones.
pub fn higher(m: usize) -> bool {
    m.is_multiple_of(2)
}

/// Writes the export; returns (text, metric rows, sample rows, telemetry rows).
pub fn generate(spec: &FleetSpec) -> (String, usize, usize, usize) {
    let mut s = spec.seed;
    let mut out = String::with_capacity(spec.hosts * spec.nights * spec.metrics * 40);
    let (mut n_metrics, mut n_samples, mut n_telemetry, mut records) = (0, 0, 0, 0usize);
    let first = spec.end - (spec.nights as i64 - 1) * 86_400;
    let _ = writeln!(out, r#"{{"kiln_export":1,"exported_at":"{}"}}"#, rfc3339(spec.end));
    let software = [(uuid(5, 1, 1), "5f0a11ce00000001", "2.6.0"), (uuid(5, 2, 2), "5f0a11ce00000002", "2.7.0")];
    for (id, fp, torch) in &software {
        let _ = writeln!(
            out,
            r#"{{"type":"software","id":"{id}","fingerprint":"{fp}","document":{{"kiln":"0.1.0","stack":{{"python":{{"/opt/venv":{{"torch":"{torch}"}}}}}}}}}}"#
        );
        records += 1;
    }
    let levels: Vec<f64> = (0..spec.metrics).map(|m| 50.0 + 37.0 * m as f64).collect();
    let bios_night = spec.nights.saturating_sub(6);
    let stack_night = spec.nights.saturating_sub(10);
    for h in 0..spec.hosts {
        let c = h % spec.configs;
        let host_id = uuid(1, h as u64, 0xabc);
        let _ = writeln!(
            out,
            r#"{{"type":"host","id":"{host_id}","identity":"identity-{h}","hostname":"{}","config_fingerprint":"{}","config_name":"{}","first_seen":"{}","last_seen":"{}"}}"#,
            hostname(h),
            config_fp(c),
            CONFIG_NAMES[c % 4],
            rfc3339(first),
            rfc3339(spec.end)
        );
        records += 1;
        let inventory = |n: u64, bios: &str| {
            format!(
                r#"{{"type":"inventory","id":"{}","host_id":"{host_id}","collected_at":"{}","schema_version":1,"config_fingerprint":"{}","config_name":"{}","cpu_model":"x","cpu_packages":2,"cpu_cores":192,"cpu_threads":384,"memory_bytes":2199023255552,"kernel_release":"6.8.0-48-generic","problem_count":0,"document":{{"system":{{"bios":{{"version":"{bios}"}}}},"fingerprints":{{"config":"{}"}}}}}}"#,
                uuid(2, h as u64, n),
                rfc3339(first - 3600 + n as i64 * 86_400 * bios_night as i64),
                config_fp(c),
                CONFIG_NAMES[c % 4],
                config_fp(c)
            )
        };
        out.push_str(&inventory(0, "1.2.0"));
        out.push('\n');
        records += 1;
        if c == 2 {
            out.push_str(&inventory(1, "1.3.0"));
            out.push('\n');
            records += 1;
        }
        let host_bias = 1.0 + 0.01 * gauss(&mut s);
        for n in 0..spec.nights {
            let t = first + n as i64 * 86_400 + (h as i64 % 600);
            let mut factor = host_bias;
            if h == 7 {
                factor *= 0.8;
            }
            let new_stack = h == 13 && n >= stack_night;
            if new_stack {
                factor *= 0.9;
            }
            let new_bios = c == 2 && n >= bios_night;
            if new_bios {
                factor *= 0.94;
            }
            let run_id = uuid(3, h as u64, n as u64);
            let _ = write!(
                out,
                r#"{{"type":"run","id":"{run_id}","host_id":"{host_id}","inventory_id":"{}","software_id":"{}","benchmark":"suite","config":"{{\"quick\":true}}","started_at":"{}","finished_at":"{}","status":"ok","metrics":["#,
                uuid(2, h as u64, u64::from(new_bios)),
                software[usize::from(new_stack)].0,
                rfc3339(t),
                rfc3339(t + 600)
            );
            let mut samples = String::new();
            for (m, level) in levels.iter().enumerate().take(spec.metrics) {
                let good = if higher(m) { factor } else { 1.0 / factor };
                let v = level * (1.0 + c as f64 * 0.1) * good * (1.0 + 0.01 * gauss(&mut s));
                let _ = write!(
                    out,
                    r#"{}["{}",{v:.6},"u","{}"]"#,
                    if m > 0 { "," } else { "" },
                    metric_name(m),
                    if higher(m) { "higher" } else { "lower" }
                );
                n_metrics += 1;
                if m < spec.sampled_metrics {
                    for i in 0..spec.samples_per_metric {
                        let _ = write!(
                            samples,
                            r#"{}["{}",{i},{:.6}]"#,
                            if samples.is_empty() { "" } else { "," },
                            metric_name(m),
                            v * (1.0 + 0.005 * gauss(&mut s))
                        );
                        n_samples += 1;
                    }
                }
            }
            let _ = write!(out, r#"],"samples":[{samples}],"telemetry":["#);
            let mut firstt = true;
            for g in 0..spec.gpus {
                for p in 0..spec.telemetry_points {
                    let watts = if h == 7 { 520.0 } else { 650.0 };
                    let _ = write!(
                        out,
                        r#"{}[{},"gpu{g}","power_watts",{:.1}]"#,
                        if firstt { "" } else { "," },
                        p * 1000,
                        watts + 20.0 * gauss(&mut s)
                    );
                    firstt = false;
                    n_telemetry += 1;
                }
            }
            out.push_str("]}\n");
            records += 1;
        }
    }
    let _ = writeln!(out, r#"{{"type":"end","records":{records}}}"#);
    (out, n_metrics, n_samples, n_telemetry)
}

/// An export split by host into `parts` complete exports: the i-th host of the file, with its
/// records, goes to part i % `parts`, and every part carries the software records. `parts` equal
/// to the number of hosts gives one export per host, as each host's agent uploads it.
pub fn split_by_host(export: &str, parts: usize) -> Vec<String> {
    let lines: Vec<&str> = export.lines().collect();
    let (header, body) = (lines[0], &lines[1..lines.len() - 1]);
    let is_software = |l: &str| l.starts_with(r#"{"type":"software""#);
    let software: Vec<&str> = body.iter().copied().filter(|l| is_software(l)).collect();
    let mut groups: Vec<Vec<&str>> = vec![software; parts];
    let mut host = None;
    for l in body.iter().copied().filter(|l| !is_software(l)) {
        if l.starts_with(r#"{"type":"host""#) {
            host = Some(host.map_or(0, |h| h + 1));
        }
        if let Some(h) = host {
            groups[h % parts].push(l);
        }
    }
    groups
        .into_iter()
        .map(|g| format!("{header}\n{}\n{{\"type\":\"end\",\"records\":{}}}\n", g.join("\n"), g.len()))
        .collect()
}

//! Heat: a GPU already hot at rest (a cooling fault shows before any load), a GPU too hot under
//! the suite's load, and the board's own sensors (hwmon): a sensor in alarm or at its critical
//! limit, a fan stopped below its minimum, the air coming in too hot.

use super::hardware::gpu_subject;
use super::{Checks, Evidence, Measured, Severity};
use crate::spec::SkuSpec;

pub fn check(spec: &SkuSpec, evidence: &Evidence<'_>, c: &mut Checks) {
    let Some(h) = &spec.heat else { return };
    let inv = evidence.inventory;
    if let Some(max) = &h.max_gpu_idle {
        for g in &inv.gpus.devices {
            let Some(t) = g.temperature_celsius else { continue };
            c.add(
                "gpu.at_rest.temperature",
                &gpu_subject(g),
                Severity::Major,
                format!("≤ {max} at rest"),
                Measured::of(format!("{t} °C"), f64::from(t) <= max.value()),
                "the GPU is hot before any load: blocked airflow, a stopped fan, a heatsink off its die, or a hot aisle",
                &format!("NVML GPU {} nvmlDeviceGetTemperature, read with the inventory", g.index),
            );
        }
    }
    if let Some(max) = &h.max_gpu_load {
        for g in &inv.gpus.devices {
            let hottest = evidence
                .runs
                .iter()
                .flat_map(|r| r.hottest.iter().filter(|(i, _)| *i == g.index).map(move |(_, t)| (*t, r.id.as_str())))
                .max_by(|a, b| a.0.total_cmp(&b.0));
            let Some((t, run)) = hottest else { continue };
            c.add(
                "gpu.temperature.load",
                &gpu_subject(g),
                Severity::Major,
                format!("≤ {max} under load"),
                Measured::of(format!("{t:.0} °C"), t <= max.value()),
                "the GPU ran too hot under load: airflow, fans, heatsink or the room's cooling",
                &format!("GPU telemetry temperature_c (run {run})"),
            );
        }
    }
    for chip in &inv.hwmon {
        let subject = format!("{} {}", chip.hwmon, chip.name.as_deref().unwrap_or("?"));
        if h.board_sensors == Some(true) && !(chip.temperatures.is_empty() && chip.fans.is_empty()) {
            let mut faults: Vec<String> = chip
                .temperatures
                .iter()
                .filter(|t| t.faulted())
                .map(|t| {
                    let name = t.label.clone().unwrap_or_else(|| format!("temp{}", t.index));
                    match (t.celsius, t.crit_celsius) {
                        (Some(v), Some(crit)) if v >= crit => {
                            format!("{name} {v:.0} °C at its critical limit {crit:.0} °C")
                        }
                        (Some(v), _) => format!("{name} in alarm at {v:.0} °C"),
                        _ => format!("{name} in alarm"),
                    }
                })
                .collect();
            faults.extend(chip.fans.iter().filter(|f| f.faulted()).map(|f| {
                let name = f.label.clone().unwrap_or_else(|| format!("fan{}", f.index));
                match (f.rpm, f.min_rpm) {
                    (Some(r), Some(m)) if r < m => format!("{name} {r} RPM, below its minimum {m} RPM"),
                    _ => format!("{name} in alarm"),
                }
            }));
            let sensors = chip.temperatures.len() + chip.fans.len();
            c.add(
                "board.sensors",
                &subject,
                Severity::Major,
                "no sensor in alarm or at its critical limit, no fan stopped",
                Measured::of(
                    if faults.is_empty() { format!("{sensors} sensors fine") } else { faults.join("; ") },
                    faults.is_empty(),
                ),
                "the board's own sensors report a cooling fault",
                &format!("/sys/class/hwmon/{}", chip.hwmon),
            );
        }
        if let Some(max) = &h.max_inlet {
            for t in chip.temperatures.iter().filter(|t| t.is_inlet()) {
                let Some(v) = t.celsius else { continue };
                let name = t.label.clone().unwrap_or_default();
                c.add(
                    "board.inlet",
                    &format!("{subject} {name}"),
                    Severity::Major,
                    format!("≤ {max}"),
                    Measured::of(format!("{v:.1} °C"), v <= max.value()),
                    "the air coming into the box is too hot: the rack's or the room's cooling, or hot air recirculating",
                    &format!("/sys/class/hwmon/{}/temp{}_input", chip.hwmon, t.index),
                );
            }
        }
    }
}

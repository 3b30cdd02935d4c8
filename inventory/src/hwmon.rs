//! The board's sensors as the kernel's hwmon drivers expose them (`/sys/class/hwmon/hwmon*`):
//! temperatures with their limits and alarms, fans with their speed, minimum and alarm. What a
//! chip does not expose is absent; kiln judges only what is there (a fan header that reads 0 RPM
//! without a minimum may simply have no fan on it).

use serde::{Deserialize, Serialize};

use super::source::Source;

const HWMON_DIR: &str = "sys/class/hwmon";

/// One temperature sensor (`temp<N>_*`), in degrees Celsius.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TempSensor {
    pub index: u32,
    pub label: Option<String>,
    pub celsius: Option<f64>,
    pub max_celsius: Option<f64>,
    pub crit_celsius: Option<f64>,
    /// `temp<N>_alarm` or `temp<N>_crit_alarm` reads 1: the chip itself says the limit was passed.
    pub alarm: bool,
}

/// One fan (`fan<N>_*`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fan {
    pub index: u32,
    pub label: Option<String>,
    pub rpm: Option<u32>,
    pub min_rpm: Option<u32>,
    /// `fan<N>_alarm` reads 1.
    pub alarm: bool,
}

/// One hwmon chip.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Chip {
    /// The sysfs name ("hwmon3").
    pub hwmon: String,
    /// The driver's name for the chip ("k10temp", "nct6779", "acpi_fan", "nvme").
    pub name: Option<String>,
    pub temperatures: Vec<TempSensor>,
    pub fans: Vec<Fan>,
}

impl TempSensor {
    /// Whether the sensor reports a fault: its alarm, or a reading at or above its critical limit.
    pub fn faulted(&self) -> bool {
        self.alarm || matches!((self.celsius, self.crit_celsius), (Some(t), Some(c)) if c > 0.0 && t >= c)
    }

    /// Whether the label names the air coming into the box ("Inlet Temp", "Ambient").
    pub fn is_inlet(&self) -> bool {
        self.label.as_deref().is_some_and(|l| {
            let l = l.to_ascii_lowercase();
            l.contains("inlet") || l.contains("ambient")
        })
    }
}

impl Fan {
    /// Whether the fan has stopped or the chip raised its alarm: a reading of 0 RPM counts only
    /// where the chip states a minimum above 0 (so that an empty header is not a stopped fan).
    pub fn faulted(&self) -> bool {
        self.alarm || matches!((self.rpm, self.min_rpm), (Some(r), Some(m)) if m > 0 && r < m)
    }
}

/// The numbered sensors of kind `prefix` ("temp", "fan") that have an `_input`.
fn indices(files: &[String], prefix: &str) -> Vec<u32> {
    let mut out: Vec<u32> =
        files.iter().filter_map(|f| f.strip_prefix(prefix)?.strip_suffix("_input")?.parse().ok()).collect();
    out.sort_unstable();
    out.dedup();
    out
}

pub fn collect(src: &Source) -> Vec<Chip> {
    let mut chips = Vec::new();
    for hwmon in src.list_dir(HWMON_DIR) {
        let base = format!("{HWMON_DIR}/{hwmon}");
        let files = src.list_dir(&base);
        let attr = |f: String| src.attr(&format!("{base}/{f}"));
        let number = |f: String| attr(f).and_then(|v| v.parse::<f64>().ok());
        let flag = |f: String| attr(f).is_some_and(|v| v == "1");
        let temperatures = indices(&files, "temp")
            .into_iter()
            .map(|i| TempSensor {
                index: i,
                label: attr(format!("temp{i}_label")),
                // hwmon writes millidegrees.
                celsius: number(format!("temp{i}_input")).map(|v| v / 1000.0),
                max_celsius: number(format!("temp{i}_max")).map(|v| v / 1000.0),
                crit_celsius: number(format!("temp{i}_crit")).map(|v| v / 1000.0),
                alarm: flag(format!("temp{i}_alarm")) || flag(format!("temp{i}_crit_alarm")),
            })
            .collect();
        let fans = indices(&files, "fan")
            .into_iter()
            .map(|i| Fan {
                index: i,
                label: attr(format!("fan{i}_label")),
                rpm: number(format!("fan{i}_input")).map(|v| v as u32),
                min_rpm: number(format!("fan{i}_min")).map(|v| v as u32),
                alarm: flag(format!("fan{i}_alarm")),
            })
            .collect();
        chips.push(Chip { name: attr("name".into()), hwmon, temperatures, fans });
    }
    chips
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_board_with_a_stopped_fan_and_a_hot_inlet() {
        let dir = tempfile::tempdir().unwrap();
        let chip = dir.path().join("sys/class/hwmon/hwmon2");
        std::fs::create_dir_all(&chip).unwrap();
        for (f, v) in [
            ("name", "nct6779"),
            ("temp1_input", "41000"),
            ("temp1_label", "Inlet Temp"),
            ("temp1_crit", "85000"),
            ("temp2_input", "97000"),
            ("temp2_crit", "95000"),
            ("fan1_input", "0"),
            ("fan1_min", "600"),
            ("fan2_input", "0"),
            ("fan3_input", "5200"),
            ("fan3_alarm", "0"),
        ] {
            std::fs::write(chip.join(f), format!("{v}\n")).unwrap();
        }
        let chips = collect(&Source::new(dir.path()));
        assert_eq!(chips.len(), 1);
        let c = &chips[0];
        assert_eq!(c.name.as_deref(), Some("nct6779"));
        assert_eq!(c.temperatures.len(), 2);
        assert!(c.temperatures[0].is_inlet() && !c.temperatures[0].faulted());
        assert_eq!(c.temperatures[0].celsius, Some(41.0));
        assert!(c.temperatures[1].faulted(), "97 °C at a critical limit of 95 °C");
        let faulted: Vec<u32> = c.fans.iter().filter(|f| f.faulted()).map(|f| f.index).collect();
        // Fan 2 reads 0 RPM but states no minimum: an empty header, not a stopped fan.
        assert_eq!(faulted, [1]);
        assert_eq!(crate::summary::sensor_faults(c), ["temp2 97 °C in alarm", "fan1 at 0 RPM (stopped or in alarm)"]);
    }
}

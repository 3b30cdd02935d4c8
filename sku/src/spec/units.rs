//! Typed quantities for specs: "80 GiB", "1.9 TB/s", "400 Gb/s", "700 W", "Gen5", "x16", "5 %".
//! Every number in a spec that has a dimension must carry its unit, and the unit must have the
//! dimension the field expects: a bare "2333" where a bandwidth belongs is an error at load time
//! (DCGM's H200 HBM floor is exactly that slip). Bits and bytes, decimal and binary prefixes are
//! all distinct; an ambiguous "KB" is refused.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What a quantity measures. Values are kept in the base unit of their dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dimension {
    /// Bytes.
    Bytes,
    /// Bytes per second (bit rates are converted: 400 Gb/s = 50 GB/s).
    DataRate,
    /// Watts.
    Power,
    /// Hertz.
    Frequency,
    /// Transfers per second (DIMM speed "4800 MT/s", PCIe "32 GT/s").
    TransferRate,
    /// Floating-point operations per second.
    FlopRate,
    /// Tokens, samples or I/O operations per second (the item is part of the unit).
    ItemRate,
    /// Seconds.
    Time,
    /// A fraction (written in %, stored as 0..1).
    Fraction,
    /// A PCIe generation ("Gen5").
    PcieGen,
    /// A PCIe link width ("x16").
    LinkWidth,
    /// Degrees Celsius ("85 °C", "85 degC").
    Temperature,
}

impl Dimension {
    /// What to write, for error messages.
    pub fn example(self) -> &'static str {
        match self {
            Dimension::Bytes => "a size like \"80 GiB\" or \"3.84 TB\"",
            Dimension::DataRate => "a data rate like \"1.9 TB/s\" or \"400 Gb/s\"",
            Dimension::Power => "a power like \"700 W\"",
            Dimension::Frequency => "a frequency like \"1980 MHz\"",
            Dimension::TransferRate => "a transfer rate like \"4800 MT/s\"",
            Dimension::FlopRate => "a compute rate like \"29250 GFLOP/s\"",
            Dimension::ItemRate => "a rate like \"12000 tokens/s\" or \"500000 IOPS\"",
            Dimension::Time => "a time like \"2 s\" or \"150 us\"",
            Dimension::Fraction => "a percentage like \"5 %\"",
            Dimension::PcieGen => "a PCIe generation like \"Gen5\"",
            Dimension::LinkWidth => "a link width like \"x16\"",
            Dimension::Temperature => "a temperature like \"85 °C\"",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Dimension::Bytes => "size",
            Dimension::DataRate => "data rate",
            Dimension::Power => "power",
            Dimension::Frequency => "frequency",
            Dimension::TransferRate => "transfer rate",
            Dimension::FlopRate => "compute rate",
            Dimension::ItemRate => "item rate",
            Dimension::Time => "time",
            Dimension::Fraction => "fraction",
            Dimension::PcieGen => "PCIe generation",
            Dimension::LinkWidth => "link width",
            Dimension::Temperature => "temperature",
        }
    }
}

/// A parsed quantity: its value in the base unit, and the text it was written as (kept for
/// messages and for writing specs back).
#[derive(Debug, Clone, PartialEq)]
pub struct Quantity {
    pub value: f64,
    pub dimension: Dimension,
    /// For [`Dimension::ItemRate`]: "tokens", "samples", "IO".
    pub item: Option<String>,
    pub text: String,
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Why a quantity did not parse.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum UnitError {
    #[error("\"{text}\" has no unit: write {}", expected.example())]
    NoUnit { text: String, expected: Dimension },
    #[error("\"{text}\" is a {}, not a {}: write {}", found.name(), expected.name(), expected.example())]
    WrongDimension { text: String, found: Dimension, expected: Dimension },
    #[error("\"{text}\": unknown unit \"{unit}\"{hint}")]
    UnknownUnit { text: String, unit: String, hint: String },
    #[error("\"{text}\" has no unit: write one, like \"1.9 TB/s\"")]
    Bare { text: String },
    #[error("\"{text}\": not a number followed by a unit")]
    NotANumber { text: String },
    #[error("\"{text}\": out of range")]
    OutOfRange { text: String },
}

fn decimal_prefix(p: &str) -> Option<f64> {
    Some(match p {
        "" => 1.0,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        _ => return None,
    })
}

fn binary_prefix(p: &str) -> Option<f64> {
    Some(match p {
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "Pi" => 1024.0 * 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    })
}

/// A prefix, decimal or binary, in front of `base`: ("Gi", 2^30) for "GiB" with base "B".
fn prefixed(unit: &str, base: &str) -> Option<f64> {
    let p = unit.strip_suffix(base)?;
    decimal_prefix(p).or_else(|| binary_prefix(p))
}

/// The dimension, scale to the base unit and item of a unit ("GB/s" → DataRate, 1e9).
pub fn parse_unit(unit: &str) -> Result<(Dimension, f64, Option<String>), String> {
    let unit = unit.trim();
    if matches!(unit, "KB" | "KB/s" | "Kb/s") {
        return Err(": \"K\" is ambiguous, write kB (1000) or KiB (1024)".into());
    }
    if unit == "%" {
        return Ok((Dimension::Fraction, 0.01, None));
    }
    if matches!(unit, "°C" | "degC") {
        return Ok((Dimension::Temperature, 1.0, None));
    }
    if unit == "ratio" {
        return Ok((Dimension::Fraction, 1.0, None));
    }
    if let Some(s) = prefixed(unit, "B") {
        return Ok((Dimension::Bytes, s, None));
    }
    if let Some(per) = unit.strip_suffix("/s") {
        if let Some(s) = prefixed(per, "B") {
            return Ok((Dimension::DataRate, s, None));
        }
        if let Some(s) = prefixed(per, "b").or_else(|| prefixed(per, "bit")) {
            return Ok((Dimension::DataRate, s / 8.0, None));
        }
        if let Some(s) = prefixed(per, "T") {
            return Ok((Dimension::TransferRate, s, None));
        }
        if let Some(s) = prefixed(per, "FLOP") {
            return Ok((Dimension::FlopRate, s, None));
        }
        // Integer operations (int8 dot products): "900 GOP/s".
        if let Some(s) = prefixed(per, "OP") {
            return Ok((Dimension::ItemRate, s, Some("ops".to_string())));
        }
        if let Some(item) = ["tokens", "samples", "steps", "ops"].into_iter().find(|i| per == *i) {
            return Ok((Dimension::ItemRate, 1.0, Some(item.to_string())));
        }
    }
    if let Some(s) = unit.strip_suffix("bps").and_then(decimal_prefix) {
        return Ok((Dimension::DataRate, s / 8.0, None));
    }
    if let Some(s) = unit.strip_suffix("FLOPS").and_then(decimal_prefix) {
        return Ok((Dimension::FlopRate, s, None));
    }
    if let Some(s) = unit.strip_suffix("IOPS").and_then(decimal_prefix) {
        return Ok((Dimension::ItemRate, s, Some("IO".to_string())));
    }
    if let Some(s) = unit.strip_suffix("Hz").and_then(decimal_prefix) {
        return Ok((Dimension::Frequency, s, None));
    }
    if let Some(p) = unit.strip_suffix('W') {
        let s = if p == "m" { Some(1e-3) } else { decimal_prefix(p) };
        if let Some(s) = s {
            return Ok((Dimension::Power, s, None));
        }
    }
    let time = match unit {
        "s" => Some(1.0),
        "ms" => Some(1e-3),
        "us" | "µs" => Some(1e-6),
        "ns" => Some(1e-9),
        "min" => Some(60.0),
        "h" => Some(3600.0),
        _ => None,
    };
    if let Some(s) = time {
        return Ok((Dimension::Time, s, None));
    }
    let hint = if unit.eq_ignore_ascii_case("gbps") || unit.eq_ignore_ascii_case("gb/s") {
        ": write Gb/s (bits) or GB/s (bytes)"
    } else if unit.ends_with("flops") || unit.ends_with("Flops") {
        ": write GFLOP/s or TFLOP/s"
    } else {
        ""
    };
    Err(hint.to_string())
}

impl Quantity {
    /// Parses `text` as a quantity of dimension `expected`.
    ///
    /// # Errors
    /// A missing, unknown or ambiguous unit, or one of another dimension.
    pub fn parse(text: &str, expected: Dimension) -> Result<Quantity, UnitError> {
        let t = text.trim();
        let err_nan = || UnitError::NotANumber { text: text.to_string() };
        match expected {
            Dimension::PcieGen => {
                let n: u32 = t
                    .strip_prefix("Gen")
                    .ok_or_else(|| wrong_or_missing(t, expected))?
                    .parse()
                    .map_err(|_| err_nan())?;
                if !(1..=7).contains(&n) {
                    return Err(UnitError::OutOfRange { text: text.to_string() });
                }
                return Ok(Quantity { value: f64::from(n), dimension: expected, item: None, text: t.to_string() });
            }
            Dimension::LinkWidth => {
                let n: u32 =
                    t.strip_prefix('x').ok_or_else(|| wrong_or_missing(t, expected))?.parse().map_err(|_| err_nan())?;
                if ![1, 2, 4, 8, 12, 16, 32].contains(&n) {
                    return Err(UnitError::OutOfRange { text: text.to_string() });
                }
                return Ok(Quantity { value: f64::from(n), dimension: expected, item: None, text: t.to_string() });
            }
            _ => {}
        }
        let (number, unit) = split_number(t);
        let number: f64 = number.replace(['_', ','], "").parse().map_err(|_| err_nan())?;
        if !number.is_finite() || number < 0.0 {
            return Err(UnitError::OutOfRange { text: text.to_string() });
        }
        if unit.is_empty() {
            return Err(UnitError::NoUnit { text: text.to_string(), expected });
        }
        let (found, scale, item) = unit_of(text, unit)?;
        if found != expected {
            return Err(UnitError::WrongDimension { text: text.to_string(), found, expected });
        }
        Ok(Quantity { value: number * scale, dimension: found, item, text: t.to_string() })
    }

    /// The value in units of `unit` (which must have this quantity's dimension).
    pub fn in_unit(&self, unit: &str) -> Option<f64> {
        let (d, scale, item) = parse_unit(unit).ok()?;
        (d == self.dimension && item == self.item).then(|| self.value / scale)
    }
}

/// "1,905,000 MB/s" → ("1,905,000", "MB/s"): the number (digits, `.`, `_`, `,`) and the trimmed unit.
fn split_number(t: &str) -> (&str, &str) {
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_' || c == ',')).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    (number, unit.trim())
}

/// [`parse_unit`] with the error said about `text`.
fn unit_of(text: &str, unit: &str) -> Result<(Dimension, f64, Option<String>), UnitError> {
    parse_unit(unit).map_err(|hint| UnitError::UnknownUnit { text: text.to_string(), unit: unit.to_string(), hint })
}

fn wrong_or_missing(t: &str, expected: Dimension) -> UnitError {
    if t.chars().all(|c| c.is_ascii_digit()) {
        UnitError::NoUnit { text: t.to_string(), expected }
    } else {
        UnitError::NotANumber { text: t.to_string() }
    }
}

/// A quantity a spec field declares with its dimension as a type parameter, so that serde
/// checks the unit while loading and the error carries the value's position.
macro_rules! typed_quantity {
    ($($name:ident => $dim:expr),* $(,)?) => {$(
        #[derive(Debug, Clone, PartialEq)]
        pub struct $name(pub Quantity);

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let v = toml::Value::deserialize(d)?;
                let text = match v {
                    toml::Value::String(s) => s,
                    toml::Value::Integer(i) => i.to_string(),
                    toml::Value::Float(f) => f.to_string(),
                    other => {
                        return Err(serde::de::Error::custom(format!(
                            "expected {}, found {}",
                            $dim.example(),
                            other.type_str()
                        )))
                    }
                };
                Quantity::parse(&text, $dim).map($name).map_err(serde::de::Error::custom)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0.text)
            }
        }

        impl $name {
            pub fn value(&self) -> f64 {
                self.0.value
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0.text)
            }
        }
    )*};
}

typed_quantity! {
    Bytes => Dimension::Bytes,
    DataRate => Dimension::DataRate,
    Power => Dimension::Power,
    TransferRate => Dimension::TransferRate,
    Fraction => Dimension::Fraction,
    PcieGen => Dimension::PcieGen,
    LinkWidth => Dimension::LinkWidth,
    Temperature => Dimension::Temperature,
}

/// Parses a quantity of any dimension ("1.9 TB/s").
///
/// # Errors
/// A missing or unknown unit.
pub fn parse_any(text: &str) -> Result<Quantity, UnitError> {
    let t = text.trim();
    if t.starts_with("Gen") {
        return Quantity::parse(t, Dimension::PcieGen);
    }
    let (_, unit) = split_number(t);
    if unit.is_empty() {
        return Err(UnitError::Bare { text: text.to_string() });
    }
    let (d, _, _) = unit_of(text, unit)?;
    Quantity::parse(t, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_table() {
        let ok = [
            ("80 GiB", Dimension::Bytes, 80.0 * 1024.0 * 1024.0 * 1024.0),
            ("3.84 TB", Dimension::Bytes, 3.84e12),
            ("1.9 TB/s", Dimension::DataRate, 1.9e12),
            ("400 Gb/s", Dimension::DataRate, 50e9),
            ("400 Gbit/s", Dimension::DataRate, 50e9),
            ("100 Gbps", Dimension::DataRate, 12.5e9),
            ("1,905,000 MB/s", Dimension::DataRate, 1.905e12),
            ("700 W", Dimension::Power, 700.0),
            ("4800 MT/s", Dimension::TransferRate, 4.8e9),
            ("29250 GFLOP/s", Dimension::FlopRate, 29.25e12),
            ("989 TFLOPS", Dimension::FlopRate, 989e12),
            ("900 GOP/s", Dimension::ItemRate, 900e9),
            ("5 %", Dimension::Fraction, 0.05),
            ("5%", Dimension::Fraction, 0.05),
            ("Gen5", Dimension::PcieGen, 5.0),
            ("x16", Dimension::LinkWidth, 16.0),
            ("150 us", Dimension::Time, 150e-6),
            ("85 °C", Dimension::Temperature, 85.0),
            ("42.5 degC", Dimension::Temperature, 42.5),
        ];
        for (text, dim, value) in ok {
            let q = Quantity::parse(text, dim).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert!((q.value - value).abs() <= value * 1e-12, "{text}: {} != {value}", q.value);
        }
        let bad = [
            ("2333", Dimension::DataRate, "\"2333\" has no unit: write a data rate like \"1.9 TB/s\" or \"400 Gb/s\""),
            (
                "80 GB",
                Dimension::DataRate,
                "\"80 GB\" is a size, not a data rate: write a data rate like \"1.9 TB/s\" or \"400 Gb/s\"",
            ),
            (
                "10 KB",
                Dimension::Bytes,
                "\"10 KB\": unknown unit \"KB\": \"K\" is ambiguous, write kB (1000) or KiB (1024)",
            ),
            ("400 gbps", Dimension::DataRate, "\"400 gbps\": unknown unit \"gbps\": write Gb/s (bits) or GB/s (bytes)"),
            ("Gen9", Dimension::PcieGen, "\"Gen9\": out of range"),
            ("16", Dimension::LinkWidth, "\"16\" has no unit: write a link width like \"x16\""),
            ("fast", Dimension::Power, "\"fast\": not a number followed by a unit"),
            ("85", Dimension::Temperature, "\"85\" has no unit: write a temperature like \"85 °C\""),
        ];
        for (text, dim, message) in bad {
            assert_eq!(Quantity::parse(text, dim).unwrap_err().to_string(), message, "{text}");
        }
    }

    #[test]
    fn in_unit_converts_within_a_dimension_only() {
        let q = Quantity::parse("400 Gb/s", Dimension::DataRate).unwrap();
        assert_eq!(q.in_unit("GB/s"), Some(50.0));
        assert_eq!(q.in_unit("Gb/s"), Some(400.0));
        assert_eq!(q.in_unit("GFLOP/s"), None);
        let t = parse_any("12000 tokens/s").unwrap();
        assert_eq!(t.in_unit("tokens/s"), Some(12000.0));
        assert_eq!(t.in_unit("samples/s"), None);
    }
}

/// Properties: any non-negative number written with any unit parses back to the same value in
/// that unit, and to the expected dimension.
#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    const UNITS: &[(&str, Dimension)] = &[
        ("B", Dimension::Bytes),
        ("kB", Dimension::Bytes),
        ("GiB", Dimension::Bytes),
        ("TB", Dimension::Bytes),
        ("MB/s", Dimension::DataRate),
        ("GB/s", Dimension::DataRate),
        ("Gb/s", Dimension::DataRate),
        ("Tbit/s", Dimension::DataRate),
        ("W", Dimension::Power),
        ("kW", Dimension::Power),
        ("MHz", Dimension::Frequency),
        ("MT/s", Dimension::TransferRate),
        ("GFLOP/s", Dimension::FlopRate),
        ("TFLOPS", Dimension::FlopRate),
        ("tokens/s", Dimension::ItemRate),
        ("GOP/s", Dimension::ItemRate),
        ("IOPS", Dimension::ItemRate),
        ("us", Dimension::Time),
        ("%", Dimension::Fraction),
        ("°C", Dimension::Temperature),
    ];

    proptest! {
        #[test]
        fn written_quantities_read_back(value in 0.0f64..1e9, unit in 0..UNITS.len(), space in any::<bool>()) {
            let (u, dim) = UNITS[unit];
            let text = format!("{value}{}{u}", if space { " " } else { "" });
            let q = Quantity::parse(&text, dim).unwrap();
            prop_assert_eq!(q.dimension, dim);
            let back = q.in_unit(u).unwrap();
            prop_assert!((back - value).abs() <= value * 1e-12, "{} -> {}", text, back);
            let any = parse_any(&text).unwrap();
            prop_assert_eq!(any.dimension, dim);
        }

        #[test]
        fn another_dimension_is_refused(value in 0.0f64..1e9, unit in 0..UNITS.len(), want in 0..UNITS.len()) {
            let (u, dim) = UNITS[unit];
            let expected = UNITS[want].1;
            let r = Quantity::parse(&format!("{value} {u}"), expected);
            prop_assert_eq!(r.is_ok(), dim == expected);
        }
    }
}

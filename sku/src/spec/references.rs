//! Published reference figures per SKU (`specs/references.toml`): what a healthy box of the SKU
//! measures, each figure with its source and the conditions it holds for. A spec's
//! `[[performance]]` floor may be a fraction of one (`of_reference = "90 %"`, with the band's
//! reason), and the verdict shows measured, reference, ratio and source side by side — the answer
//! to "what busbw should I expect?" that nccl-tests and nvbandwidth leave to their users.

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use super::units::parse_any;

/// The table as shipped, built into the binary.
pub const TABLE: &str = include_str!("../../../specs/references.toml");

/// How much a reference says: a measurement published by a vendor or a cloud, a maintainer's
/// statement, a health check's threshold, a model's figure (NCCL's own), a datasheet's peak, one
/// derived from a sibling SKU's, or one user's report. The spec's band is wider the weaker it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    Measured,
    Maintainer,
    HealthCheck,
    Model,
    Datasheet,
    Inferred,
    UserReport,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Measured => "measured",
            Kind::Maintainer => "maintainer",
            Kind::HealthCheck => "health check",
            Kind::Model => "model",
            Kind::Datasheet => "datasheet",
            Kind::Inferred => "inferred",
            Kind::UserReport => "user report",
        }
    }
}

/// One published figure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reference {
    /// The spec (SKU) it is for: "hgx-h100-sxm5-80gb-8x".
    pub sku: String,
    /// The metric as a spec names it ("gpu{n}.hbm_copy_gbps").
    pub metric: String,
    /// With its unit: "2900 GB/s".
    pub value: String,
    pub kind: Kind,
    /// What the figure holds for: tool, size, software, how many GPUs.
    pub conditions: String,
    /// Where it comes from, precisely enough to find again.
    pub source: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Table {
    #[serde(rename = "reference")]
    references: Vec<Reference>,
}

impl Reference {
    /// The figure in `unit` (the metric's), or `None` where its unit does not fit.
    pub fn in_unit(&self, unit: &str) -> Option<f64> {
        parse_any(&self.value).ok()?.in_unit(unit)
    }
}

/// Parses a references table; every problem in words, with the entry's number.
///
/// # Errors
/// Malformed TOML, an unknown key, an empty source or conditions, a metric no benchmark stores, a
/// value whose unit does not fit its metric, or a (sku, metric) given twice.
pub fn parse(text: &str) -> Result<Vec<Reference>, String> {
    let table: Table = toml::from_str(text).map_err(|e| e.to_string())?;
    let mut problems = Vec::new();
    for (i, r) in table.references.iter().enumerate() {
        let at = format!("reference {} ({} {})", i + 1, r.sku, r.metric);
        if r.source.trim().is_empty() || r.conditions.trim().is_empty() {
            problems.push(format!(
                "{at}: source and conditions must say where the figure comes from and what it holds for"
            ));
        }
        let unit = super::metric_unit(&r.metric.replace("{n}", "0"));
        match unit.filter(|_| super::metrics::spec_metric_is_stored(&r.metric)) {
            None => problems.push(format!("{at}: not a metric kiln stores")),
            Some(u) if r.in_unit(u).is_none() => problems.push(format!("{at}: \"{}\" is not in {u}", r.value)),
            Some(_) => {}
        }
        if table.references[..i].iter().any(|o| o.sku == r.sku && o.metric == r.metric) {
            problems.push(format!("{at}: given twice"));
        }
    }
    if problems.is_empty() {
        Ok(table.references)
    } else {
        Err(problems.join("; "))
    }
}

/// The shipped table.
pub fn all() -> &'static [Reference] {
    static TABLE_PARSED: OnceLock<Vec<Reference>> = OnceLock::new();
    // The shipped table is checked by a test; a broken one must not take the verdict down.
    TABLE_PARSED.get_or_init(|| parse(TABLE).unwrap_or_default())
}

/// The reference for `metric` of SKU `sku`.
pub fn find(sku: &str, metric: &str) -> Option<&'static Reference> {
    all().iter().find(|r| r.sku == sku && r.metric == metric)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_table_parses_and_every_figure_fits_its_metric() {
        let refs = parse(TABLE).unwrap();
        assert!(refs.len() >= 30, "{}", refs.len());
        for sku in ["hgx-h100-sxm5-80gb-8x", "hgx-h200-sxm-141gb-8x", "hgx-b200-180gb-8x", "hgx-a100-sxm4-80gb-8x"] {
            assert!(refs.iter().any(|r| r.sku == sku), "{sku} has no references");
        }
        let r = find("hgx-h100-sxm5-80gb-8x", "gpus.nccl.all_reduce.busbw_gbs_max").unwrap();
        assert!((r.in_unit("GB/s").unwrap() - 478.87).abs() < 1e-9);
    }

    #[test]
    fn a_bad_entry_is_named() {
        let entry = |metric: &str, value: &str, source: &str| {
            format!(
                "[[reference]]\nsku = \"x\"\nmetric = \"{metric}\"\nvalue = \"{value}\"\nkind = \"measured\"\nconditions = \"c\"\nsource = \"{source}\"\n"
            )
        };
        let e = parse(&entry("gpu{n}.hbm_copy_gbps", "2.9 TFLOP/s", "s")).unwrap_err();
        assert!(e.contains("reference 1 (x gpu{n}.hbm_copy_gbps): \"2.9 TFLOP/s\" is not in GB/s"), "{e}");
        let e = parse(&entry("gpu{n}.hbm_copy", "2900 GB/s", "s")).unwrap_err();
        assert!(e.contains("not a metric kiln stores"), "{e}");
        let e = parse(&entry("gpu{n}.hbm_copy_gbps", "2900 GB/s", " ")).unwrap_err();
        assert!(e.contains("source and conditions"), "{e}");
        let twice = entry("gpu{n}.hbm_copy_gbps", "2900 GB/s", "s").repeat(2);
        assert!(parse(&twice).unwrap_err().contains("reference 2 (x gpu{n}.hbm_copy_gbps): given twice"));
        assert!(parse(&entry("gpu{n}.hbm_copy_gbps", "2.9 TB/s", "s")).is_ok(), "any unit of the dimension");
    }
}

//! The named defaults every front end shares, so that `kiln outliers` and the fleet service's
//! `/api/outliers`, `kiln regressions` and the dashboard ask the same question when nobody says
//! otherwise.

pub use crate::fleet::{MIN_DEVIATION, NOISE};

/// A host is an outlier beyond this robust z-score (`kiln outliers --threshold`).
pub const OUTLIER_THRESHOLD: f64 = 3.5;

/// The window fleet questions look back over (`--since`): regressions, the dashboard, reports.
pub const WINDOW: &str = "30d";

//! kiln's benchmarks. For now: the statistics every benchmark reports (median with a bootstrap
//! confidence interval, spread, coefficient of variation, outliers by median absolute deviation).
//!
//! Invariant: this crate never touches the database or the CLI; it turns raw samples into numbers.

pub mod bf16;
pub mod blas;
pub mod ceilings;
pub mod cluster;
pub mod data;
pub mod disk;
pub mod fused;
pub mod gemm;
pub mod membw;
pub mod net;
pub mod peaks;
pub mod sdc;
pub mod stats;
pub mod train;

//! kiln's agent as a library: the hardware inventory, benchmark adapters, fleet analysis,
//! provisioning and their presentation, and the command line (`cli`) that the binary (`main.rs`)
//! runs; benchmarks and tests use this crate directly.

pub mod cli;
pub mod cluster;
pub mod exporter;
pub mod fleet;
pub mod fleet_view;
pub mod inventory;
pub mod linkwatch;
pub mod provisioning;
pub mod render;
pub mod report;
pub mod runs;
pub mod serve;
pub mod snapshot;
pub mod spec;
pub mod telemetry;
pub mod timefmt;
pub mod upload;
pub mod verdict;

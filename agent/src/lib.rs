//! kiln's agent as a library: the hardware inventory and its presentation. The binary (`main.rs`)
//! adds the command line, the database and exit codes; benchmarks and tests use this crate directly.

pub mod fleet;
pub mod fleet_view;
pub mod inventory;
pub mod provisioning;
pub mod render;
pub mod report;
pub mod runs;
pub mod telemetry;
pub mod timefmt;

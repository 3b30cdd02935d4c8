//! kiln's application layer, which belongs to neither front end: running benchmarks on this host
//! (`runs`), the commission and suite workflows (`commission`), fleet analysis and its text
//! (`fleet`, `fleet_view`), reports (`report`, `cluster_report`), provisioning (`provisioning`), and
//! the views both the command line and the fleet service answer with (`views`), with the named
//! defaults they share (`defaults`). The command line turns arguments into these calls and prints;
//! `kiln serve` turns HTTP into the same calls. Neither is known here.

pub mod act;
pub mod cluster_report;
pub mod commission;
pub mod defaults;
pub mod fleet;
pub mod fleet_view;
pub mod judging;
pub mod provisioning;
pub mod report;
pub mod runs;
pub mod stored;
pub mod views;

//! kiln's provisioning: image specs (`image`: `images/*.toml`, a pinned software stack each; kiln's
//! other "spec", what a server model must be, is `kiln_sku::spec`), the machine's state and the plan that would make it
//! match (`plan`), the actions and who carries them out (`exec`), applying a plan step by step with
//! a journal (`apply`), the consistency of NVIDIA stacks (`lint`), and the software fingerprint
//! (`software`, read from the dpkg database in `dpkg`).
//!
//! Invariants: reading state never changes the machine (probes are read-only); every change is an
//! `exec::Action` carried out by an `exec::Executor`; programs run from argument vectors, never
//! shell strings; every path is resolved below the `plan::Target` root.

pub mod apply;
pub mod dpkg;
pub mod exec;
pub mod image;
pub mod lint;
pub mod plan;
pub mod root;
pub mod software;

//! kiln's provisioning. For now: reading what software a root holds (the dpkg database and the
//! kernel), the raw material of the software fingerprint that every benchmark run records.
//!
//! Invariant: parsing is pure; this crate reads files under a root it is given and never runs
//! commands itself.

pub mod dpkg;

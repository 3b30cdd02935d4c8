//! Integration tests: every test drives the built `kiln` binary as a user would, on the live
//! machine or on real machines' snapshots from `tests/fixtures`.

mod util;

mod bad_input;
mod bench;
mod cli;
mod cluster;
mod deploy;
mod devices;
mod fleet;
mod fleet_gen;
mod ghw;
mod gpu;
mod gpu_bench;
mod gpu_check;
mod house;
mod hwloc;
mod kill;
mod lab;
mod patterns;
mod pg_cluster;
mod provision;
mod serve;
mod slurm;
mod synthetic;
mod tidy;
mod verdict;

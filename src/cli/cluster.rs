//! `kiln cluster …`: run as every rank of a job; each rank stores its part of the result under one
//! cluster-run id, and rank 0 prints the whole job's.

use anyhow::{Context, Result};
use kiln_bench::cluster::{Collective, Launch};
use kiln_db::RunStatus;
use serde::Serialize;

use super::args::{self, ClusterCmd};
use super::inventory::live_inventory;
use super::preflight;
use super::{Ctx, Exit, Output, View};
use kiln_app::commission::BenchRun;
use kiln_app::runs::{Outcome, Report};
use kiln_app::stored::{store_inventory, store_outcome};
use kiln_cluster::{self as cluster, CollectivesConfig, FabricConfig, Part, TrainConfig};
use kiln_text::timefmt::now_rfc3339;

/// `kiln cluster env`.
#[derive(Serialize)]
pub struct Placement {
    pub launch: Option<Launch>,
    pub mpi_built: bool,
    pub mpi_library: Option<String>,
    /// Under torchrun: where kiln's own rendezvous meets rank 0, or why it cannot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rendezvous: Option<String>,
}

impl View for Placement {
    fn render(&self) -> String {
        let mut out = match &self.launch {
            Some(l) => format!(
                "launched by {:?}: rank {} of {}{}{}\n",
                l.launcher,
                l.rank,
                l.world_size,
                l.local_rank.map(|r| format!(", local rank {r}")).unwrap_or_default(),
                l.node.map(|n| format!(", node {n}")).unwrap_or_default()
            ),
            None => "not started by a launcher (no SLURM_PROCID, OMPI_COMM_WORLD_RANK or RANK)\n".to_string(),
        };
        match (&self.mpi_built, &self.mpi_library) {
            (true, Some(lib)) => out.push_str(&format!("MPI: {}\n", lib.lines().next().unwrap_or(lib))),
            (true, None) => out.push_str("MPI: built in\n"),
            (false, _) => out.push_str(&format!("MPI: not built in — {}\n", cluster::NOT_BUILT)),
        }
        if let Some(r) = &self.rendezvous {
            out.push_str(&format!("kiln's rendezvous (the --nccl commands under torchrun): {r}\n"));
        }
        out
    }
}

/// Runs one `kiln cluster` command.
///
/// # Errors
/// No MPI in this build, a launcher that disagrees with MPI, a rank that cannot set up.
pub fn run(what: ClusterCmd, stall_timeout: f64, ctx: &Ctx) -> Result<Output> {
    anyhow::ensure!(stall_timeout > 0.0 && stall_timeout.is_finite(), "--stall-timeout must be positive");
    let stall = std::time::Duration::from_secs_f64(stall_timeout);
    match what {
        ClusterCmd::Env => {
            let launch = cluster::launch_from_env()?;
            let rendezvous = cluster::over_tcp(&launch).then(|| {
                match cluster::rendezvous::Tcp::address(|k| std::env::var(k).ok()) {
                    Ok((text, addr)) if text == addr.to_string() => format!("rank 0 at {addr}"),
                    Ok((text, addr)) => format!("rank 0 at {text} ({addr})"),
                    Err(e) => format!("none: {e:#}"),
                }
            });
            let view = Placement {
                launch,
                mpi_built: cluster::MPI_BUILT,
                mpi_library: cluster::library_version(),
                rendezvous,
            };
            ctx.output(&view)
        }
        ClusterCmd::Fabric { streams, seconds, repetitions, interfaces, netns, min_gbps, store } => {
            anyhow::ensure!(
                streams >= 1 && repetitions >= 1 && seconds > 0.0,
                "--streams, --repetitions and --seconds must be positive"
            );
            can_run(true)?;
            preflight(ctx, store)?;
            let config = FabricConfig { streams, seconds, repetitions, interfaces, netns, floor_gbps: min_gbps };
            let started_at = now_rfc3339();
            let (report, job) = cluster::fabric(&config, stall)?;
            let slow = report.has_findings();
            let headline = format!(
                "fabric of {} nodes: {}",
                report.job.world_size,
                if slow { "slow node, NIC or link named" } else { "nothing slow" }
            );
            let nodes: Vec<String> = report.nodes.iter().map(|n| n.label.clone()).collect();
            let rails: Vec<String> = report.rails.iter().map(|r| r.interface.clone()).collect();
            let mut outcome =
                outcome(report, Report::Fabric, ("fabric", serde_json::json!(config)), started_at, headline);
            outcome.config["nodes"] = serde_json::json!(nodes);
            outcome.config["rails"] = serde_json::json!(rails);
            if let Some(why) = outcome.report.invalid_reason() {
                outcome.status = RunStatus::Invalid;
                outcome.status_reason = Some(why);
            }
            keep(ctx, outcome, store, slow, &job)
        }
        ClusterCmd::Train { size, steps, batch, nccl, dtype, store } => {
            let gpu = nccl.then(|| dtype.unwrap_or_else(|| "bf16".into()));
            train(size, (steps, batch), gpu, (store, stall), ctx)
        }
        ClusterCmd::Collectives { min_bytes, max_bytes, ops, iterations, warmup, seconds_per_size, nccl, store } => {
            anyhow::ensure!(min_bytes <= max_bytes, "--min-bytes is above --max-bytes");
            anyhow::ensure!(
                iterations >= 1 && seconds_per_size > 0.0,
                "--iterations and --seconds-per-size must be positive"
            );
            can_run(nccl)?;
            preflight(ctx, store)?;
            let all = if nccl { kiln_gpu::collectives::NCCL_COLLECTIVES.to_vec() } else { Collective::ALL.to_vec() };
            let collectives: Vec<Collective> =
                if ops.is_empty() { all } else { ops.into_iter().map(Into::into).collect() };
            anyhow::ensure!(
                !(nccl && collectives.contains(&Collective::AllToAll)),
                "--ops all-to-all: NCCL has no all-to-all call; with --nccl: all-reduce, all-gather or reduce-scatter"
            );
            let config =
                CollectivesConfig { min_bytes, max_bytes, collectives, iterations, warmup, seconds_per_size, nccl };
            let started_at = now_rfc3339();
            let (report, job) = cluster::collectives(&config, stall)?;
            let checked = report.checked;
            let headline = format!("collectives over {} ranks", report.job.world_size);
            let mut outcome =
                outcome(report, Report::Collectives, ("collectives", serde_json::json!(config)), started_at, headline);
            if !checked {
                outcome.status = RunStatus::Failed;
                outcome.status_reason = Some("a collective's result was wrong on some rank".to_string());
            }
            keep(ctx, outcome, store, false, &job)
        }
    }
}

/// Whether this kiln can run the command in this job, before anything starts: through kiln's own
/// rendezvous (torchrun) only what needs no MPI for its data (`without_mpi`: the fabric, the
/// `--nccl` commands), else MPI must be built in.
fn can_run(without_mpi: bool) -> Result<()> {
    if cluster::over_tcp(&cluster::launch_from_env()?) {
        anyhow::ensure!(without_mpi, cluster::TORCHRUN_CPU);
        return Ok(());
    }
    anyhow::ensure!(cluster::MPI_BUILT, cluster::NOT_BUILT);
    Ok(())
}

/// A rank's part as a run: its job in the configuration (beside what was asked, under `key`),
/// its text, metrics and raw samples.
fn outcome<P: Part>(
    part: P,
    wrap: fn(Box<P>) -> Report,
    (key, asked): (&str, serde_json::Value),
    started_at: String,
    headline: String,
) -> Outcome {
    let mut config = serde_json::to_value(part.job()).unwrap_or_default();
    config[key] = asked;
    Outcome {
        status: RunStatus::Ok,
        status_reason: None,
        started_at,
        config,
        headline,
        text: part.render(),
        metrics: part.metrics(),
        samples: part.samples(),
        telemetry: Vec::new(),
        report: wrap(Box::new(part)),
    }
}

/// Stores this rank's part (unless told not to), waits for every rank to have stored its own, and
/// then rank 0 prints the job's and carries the verdict: exit 1 there when something is slow or a
/// check failed (the job's exit status is its first non-zero one; the other ranks exit 0, so that
/// the launcher stops nobody before it has stored).
fn keep(ctx: &Ctx, outcome: Outcome, store: args::Store, slow: bool, job: &cluster::Job) -> Result<Output> {
    let run_id = if store.no_save {
        None
    } else {
        let inv = live_inventory()?;
        let saved = store_inventory(ctx, &inv)?;
        Some(store_outcome(ctx, &inv, &saved, &outcome)?)
    };
    job.barrier()?;
    if outcome.config["rank"].as_u64() != Some(0) {
        return Ok(Output::empty(Exit::Ok));
    }
    let exit = Exit::check(slow || outcome.failed_check());
    let view = BenchRun::of(&outcome, run_id);
    Ok(ctx.output(&view)?.with_exit(exit))
}

/// `kiln cluster train`: the weak-scaling curve, each rank storing its part; `gpu`: on the GPUs
/// through kiln-gpu and NCCL, the products in that precision.
fn train(
    size: args::Size,
    (steps, batch): (Option<usize>, Option<usize>),
    gpu: Option<String>,
    (store, stall): (args::Store, std::time::Duration),
    ctx: &Ctx,
) -> Result<Output> {
    can_run(gpu.is_some())?;
    preflight(ctx, store)?;
    let train = match &gpu {
        // kiln-gpu's own reading of the options, so that every rank refuses what it would.
        Some(dtype) => {
            use kiln_gpu::request::Check;
            let (size, dtype) = (size.name().to_string(), dtype.clone());
            kiln_gpu::request::TrainArgs { size, steps, batch, dtype, ..Default::default() }.check()?.config()?
        }
        None => {
            let mut train = kiln_bench::train::Config::preset(size.name()).context("a preset of every size")?;
            train.steps = steps.unwrap_or(train.steps);
            train.batch = batch.unwrap_or(train.batch);
            train.warmup_steps = (train.steps / 10).max(2).min(train.steps);
            train.validate()?;
            train
        }
    };
    let config = TrainConfig { train, nccl: gpu.is_some(), dtype: gpu };
    let started_at = now_rfc3339();
    let (report, job) = cluster::train(&config, stall)?;
    let learned = report.rows.iter().all(|r| r.learned);
    let stopped = report.stopped.clone();
    let reached = report.rows.last().map_or(0, |r| r.ranks);
    let headline = match &stopped {
        None => format!(
            "data-parallel training on {} ranks: {:.0} % weak-scaling efficiency",
            report.job.world_size,
            100.0 * report.rows.last().map_or(0.0, |r| r.efficiency)
        ),
        Some(_) => format!("data-parallel training stopped after {reached} of {} ranks", report.job.world_size),
    };
    let mut outcome = outcome(report, Report::Scaling, ("train", serde_json::json!(config)), started_at, headline);
    if let Some(why) = stopped {
        outcome.status = RunStatus::Failed;
        outcome.status_reason = Some(format!("the curve stopped after {reached} ranks: {why}"));
    } else if !learned {
        outcome.status = RunStatus::Failed;
        outcome.status_reason = Some("the model did not learn at some rank count".to_string());
    }
    keep(ctx, outcome, store, false, &job)
}

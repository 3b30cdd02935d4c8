//! The MPI side of `kiln cluster` (cargo feature `mpi`): MPI as the job's control plane
//! (`MpiControl`, its roll call), the CPU collectives and CPU data-parallel training, over the
//! system's MPI through the `mpi` crate; the fabric and the `--nccl` commands run over it here.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use kiln_bench::cluster::{bandwidths, sizes, Collective, Launch};
use kiln_bench::train::DataParallel;
use mpi::collective::SystemOperation;
use mpi::topology::Color;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use super::rendezvous::Control;
use super::{
    launch_from_env, CollectiveRow, CollectivesConfig, CollectivesReport, FabricConfig, FabricReport, Job, Rank,
    ScalingRow, TrainConfig, TrainScalingReport, Watchdog,
};
use kiln_text::Progress;

/// The message tag of [`roll_call`]'s arrivals.
const ARRIVED: mpi::Tag = 7731;

/// A barrier that knows who is missing: every rank reports to rank 0, which names in its watchdog
/// the ranks it has not heard from ("round 2/3: waiting for rank 2 (node7)"), then
/// releases all. `names` labels the ranks (a host, a namespace) where known.
pub(super) fn roll_call(world: &SimpleCommunicator, watchdog: &Watchdog, what: &str, names: Option<&[String]>) {
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let root = world.process_at_rank(0);
    if rank == 0 {
        let mut missing: BTreeSet<usize> = (1..size).collect();
        while !missing.is_empty() {
            let who: Vec<String> = missing
                .iter()
                .take(8)
                .map(|&r| names.map_or(format!("rank {r}"), |n| format!("rank {r} ({})", n[r])))
                .collect();
            let more = if missing.len() > 8 { format!(" and {} more", missing.len() - 8) } else { String::new() };
            watchdog.at(format!("{what}: waiting for {}{more}", who.join(", ")));
            let (_, status) = world.any_process().receive_with_tag::<u8>(ARRIVED);
            missing.remove(&(status.source_rank() as usize));
        }
        watchdog.at(format!("{what}: releasing every rank"));
    } else {
        root.send_with_tag(&1u8, ARRIVED);
        watchdog.behind(format!("{what}: waiting for rank 0 to hear from every rank"));
    }
    let mut go = 0u8;
    root.broadcast_into(&mut go);
}

/// The MPI library's own description (`MPI_Get_library_version`).
pub fn library_version() -> Option<String> {
    mpi::environment::library_version().ok().map(|s| s.trim_end_matches('\0').trim().to_string())
}

/// MPI's world, checked against what the launcher said.
fn world_of(
    universe: &mpi::environment::Universe,
    launch: &Option<Launch>,
) -> Result<(SimpleCommunicator, usize, usize)> {
    let world = universe.world();
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    if let Some(l) = launch {
        anyhow::ensure!(
            l.world_size == size,
            "{:?} started {} processes but MPI sees {size}: MPI cannot join processes it did not start — launch \
             with `mpirun`, or `srun --mpi=pmix` (Slurm built with PMIx)",
            l.launcher,
            l.world_size
        );
    }
    anyhow::ensure!(
        size >= 2,
        "one rank: `kiln cluster` runs as every rank of a job (`srun -N4 --ntasks-per-node=1 kiln cluster …`, \
         `mpirun -np 4 kiln cluster …`)"
    );
    Ok((world, rank, size))
}

/// MPI's communicator as the job's control plane (what `nccl.rs` and the shared checks speak).
pub(super) struct MpiControl<'a>(pub &'a SimpleCommunicator);

impl Control for MpiControl<'_> {
    fn rank(&self) -> usize {
        self.0.rank() as usize
    }
    fn size(&self) -> usize {
        self.0.size() as usize
    }
    /// Every rank's length, then every rank's bytes padded to the longest.
    fn all_gather(&self, mine: &[u8], watchdog: &Watchdog, what: &str) -> Result<Vec<Vec<u8>>> {
        watchdog.at_least(what, 1);
        let n = self.size();
        let mut lengths = vec![0u64; n];
        self.0.all_gather_into(&(mine.len() as u64), &mut lengths[..]);
        let width = lengths.iter().copied().max().unwrap_or(0).max(1) as usize;
        let mut padded = vec![0u8; width];
        padded[..mine.len()].copy_from_slice(mine);
        let mut all = vec![0u8; width * n];
        self.0.all_gather_into(&padded[..], &mut all[..]);
        Ok(all.chunks(width).zip(&lengths).map(|(c, &len)| c[..len as usize].to_vec()).collect())
    }

    fn roll_call(&self, watchdog: &Watchdog, what: &str, names: Option<&[String]>) -> Result<()> {
        roll_call(self.0, watchdog, what, names);
        Ok(())
    }
}

/// The whole fabric test, as one rank of an MPI job.
///
/// # Errors
/// MPI cannot start, the launcher and MPI disagree, or the test's own errors.
pub fn fabric(config: &FabricConfig, stall: Duration) -> Result<(FabricReport, Job)> {
    let launch = launch_from_env()?;
    let universe = mpi::initialize().context("MPI was already initialised in this process")?;
    let (world, rank, _) = world_of(&universe, &launch)?;
    // Waiting at a phase's barrier lasts as long as another pair's measurement.
    let watchdog = Watchdog::start(rank, stall + super::fabric::phase(config));
    // Before this rank's thread enters a namespace: the beats go through the host's network.
    super::heartbeat::start(&MpiControl(&world), &watchdog)?;
    let report = super::fabric::run(&MpiControl(&world), launch, &watchdog, config)?;
    drop(world);
    Ok((report, Job::over_mpi(universe, watchdog)))
}

/// A collective's buffers: what this rank sends, what it receives, and the check of the result.
struct Buffers {
    send: Vec<f32>,
    recv: Vec<f32>,
}

impl Buffers {
    /// `count` elements in nccl-tests' sense (the whole buffer); values that make the result checkable.
    fn new(c: Collective, count: usize, rank: usize, n: usize) -> Buffers {
        let chunk = count / n;
        let (send_len, recv_len) = match c {
            Collective::AllReduce | Collective::AllToAll => (count, count),
            Collective::AllGather => (chunk, count),
            Collective::ReduceScatter => (count, chunk),
        };
        let send = match c {
            Collective::AllToAll => (0..send_len).map(|i| (rank * n + i / chunk) as f32).collect(),
            Collective::AllGather => vec![rank as f32; send_len],
            _ => vec![(rank + 1) as f32; send_len],
        };
        Buffers { send, recv: vec![f32::NAN; recv_len] }
    }

    fn run(&mut self, c: Collective, world: &SimpleCommunicator) {
        match c {
            Collective::AllReduce => world.all_reduce_into(&self.send[..], &mut self.recv[..], SystemOperation::sum()),
            Collective::AllGather => world.all_gather_into(&self.send[..], &mut self.recv[..]),
            Collective::ReduceScatter => {
                world.reduce_scatter_block_into(&self.send[..], &mut self.recv[..], SystemOperation::sum())
            }
            Collective::AllToAll => world.all_to_all_into(&self.send[..], &mut self.recv[..]),
        }
    }

    /// Whether the received data is what the collective must produce.
    fn correct(&self, c: Collective, rank: usize, n: usize) -> bool {
        let sum = (n * (n + 1) / 2) as f32;
        let chunk = match c {
            Collective::AllGather => self.recv.len() / n,
            Collective::AllToAll => self.send.len() / n,
            _ => 1,
        };
        self.recv.iter().enumerate().all(|(i, &v)| match c {
            Collective::AllReduce | Collective::ReduceScatter => v == sum,
            Collective::AllGather => v == (i / chunk) as f32,
            Collective::AllToAll => v == ((i / chunk) * n + rank) as f32,
        })
    }
}

/// The collectives at every size, as one rank.
///
/// # Errors
/// MPI cannot start, or the launcher and MPI disagree.
pub fn collectives(config: &CollectivesConfig, stall: Duration) -> Result<(CollectivesReport, Job)> {
    let launch = launch_from_env()?;
    let universe = mpi::initialize().context("MPI was already initialised in this process")?;
    let (world, rank, n) = world_of(&universe, &launch)?;
    let watchdog = Watchdog::start(rank, stall);
    super::heartbeat::start(&MpiControl(&world), &watchdog)?;
    let id = super::rendezvous::cluster_id(&MpiControl(&world), &watchdog)?;
    if config.nccl {
        let (rows, checked, library) =
            super::nccl::collectives(&MpiControl(&world), &launch, &watchdog, config, stall)?;
        let report = CollectivesReport {
            job: Rank { cluster_id: id, rank, world_size: n, launcher: launch },
            library,
            rows,
            checked,
            config: config.clone(),
        };
        drop(world);
        return Ok((report, Job::over_mpi(universe, watchdog)));
    }
    let progress = Progress::new();
    let mut rows = Vec::new();
    let mut correct = true;
    for &c in &config.collectives {
        for bytes in sizes(config.min_bytes, config.max_bytes) {
            // Whole elements; divisible among the ranks where each rank has a share (nccl-tests
            // rounds the same way).
            let count = match c {
                Collective::AllReduce => (bytes / 4) as usize,
                _ => (bytes / 4) as usize / n * n,
            };
            if count == 0 {
                continue;
            }
            if rank == 0 {
                progress.update(&format!("{} {} B", c.name(), count * 4));
            }
            watchdog.at(format!("{} of {} B with every rank", c.name(), count * 4));
            let mut buffers = Buffers::new(c, count, rank, n);
            // One call to size the run: every rank then does the same number of iterations.
            world.barrier();
            let t0 = Instant::now();
            buffers.run(c, &world);
            let once = slowest(&world, t0.elapsed().as_secs_f64());
            correct &= buffers.correct(c, rank, n);
            let iterations = ((config.seconds_per_size / once.max(1e-9)) as usize).clamp(1, config.iterations.max(1));
            for _ in 0..config.warmup.min(iterations) {
                buffers.run(c, &world);
            }
            world.barrier();
            let t0 = Instant::now();
            for _ in 0..iterations {
                buffers.run(c, &world);
            }
            let seconds = slowest(&world, t0.elapsed().as_secs_f64()) / iterations as f64;
            correct &= buffers.correct(c, rank, n);
            let (algbw_gbs, busbw_gbs) = bandwidths(c, n, count as u64 * 4, seconds);
            rows.push(CollectiveRow {
                collective: c,
                bytes: count as u64 * 4,
                count: count as u64,
                iterations,
                time_us: seconds * 1e6,
                algbw_gbs,
                busbw_gbs,
            });
        }
    }
    progress.finish();
    watchdog.at("agreeing whether every result was right");
    let mut all_correct = 0u8;
    world.all_reduce_into(&u8::from(correct), &mut all_correct, SystemOperation::min());
    let report = CollectivesReport {
        job: Rank { cluster_id: id, rank, world_size: n, launcher: launch },
        library: library_version().unwrap_or_default(),
        rows,
        checked: all_correct == 1,
        config: config.clone(),
    };
    drop(world);
    Ok((report, Job::over_mpi(universe, watchdog)))
}

/// The largest of every rank's `seconds`.
fn slowest(world: &SimpleCommunicator, seconds: f64) -> f64 {
    let mut max = 0.0f64;
    world.all_reduce_into(&seconds, &mut max, SystemOperation::max());
    max
}

/// Gradients summed over a communicator's ranks.
struct Gradients<'a> {
    comm: &'a SimpleCommunicator,
    send: Vec<f32>,
}

impl DataParallel for Gradients<'_> {
    fn rank(&self) -> usize {
        self.comm.rank() as usize
    }
    fn ranks(&self) -> usize {
        self.comm.size() as usize
    }
    fn all_reduce_sum(&mut self, values: &mut [f32]) -> candle_core::Result<()> {
        self.send.clear();
        self.send.extend_from_slice(values);
        self.comm.all_reduce_into(&self.send[..], values, SystemOperation::sum());
        Ok(())
    }
}

/// The reference training run, data-parallel, on 1, 2, 4 … N ranks (the first k of the world; the
/// others wait), each with the same per-rank batch: on the CPUs with MPI summing the gradients, or
/// (`config.nccl`) on each rank's GPU through `kiln-gpu train`, NCCL summing them. The training
/// ranks' watchdog counts from each step; a waiting rank's allows what the training ranks' own
/// watchdogs allow them (setting up, every step and summing up, a limit each), so it stops too
/// where a training rank hangs and the launcher lets the others run on.
///
/// # Errors
/// MPI cannot start, the launcher and MPI disagree, or training fails.
pub fn train(config: &TrainConfig, stall: Duration) -> Result<(TrainScalingReport, Job)> {
    let launch = launch_from_env()?;
    let universe = mpi::initialize().context("MPI was already initialised in this process")?;
    let (world, rank, size) = world_of(&universe, &launch)?;
    let watchdog = Watchdog::start(rank, stall);
    super::heartbeat::start(&MpiControl(&world), &watchdog)?;
    config.train.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    let id = super::rendezvous::cluster_id(&MpiControl(&world), &watchdog)?;
    let (rows, last, gpu, stopped) = if config.nccl {
        super::nccl::train(&MpiControl(&world), &launch, &watchdog, config, stall)?
    } else {
        let (rows, last) = over_mpi(&world, &watchdog, config)?;
        (rows, Some(last.context("every rank trains at the full world size")?), None, None)
    };
    let library = match config.nccl {
        true => "NCCL".to_string(),
        false => library_version().unwrap_or_else(|| "MPI".into()),
    };
    let report = TrainScalingReport {
        job: Rank { cluster_id: id, rank, world_size: size, launcher: launch },
        rows,
        run: last,
        stopped,
        library,
        gpu,
        config: config.clone(),
    };
    drop(world);
    Ok((report, Job::over_mpi(universe, watchdog)))
}

/// The weak-scaling curve on the CPUs: for 1, 2, 4 … N ranks, [`mpi_group`] trains, and every
/// rank's figures make the point. The rows, and this rank's run at the full world size.
fn over_mpi(
    world: &SimpleCommunicator,
    watchdog: &Watchdog,
    config: &TrainConfig,
) -> Result<(Vec<ScalingRow>, Option<kiln_bench::train::Report>)> {
    let progress = Progress::new();
    let (mut rows, mut last) = (Vec::<ScalingRow>::new(), None);
    for k in super::scaling_steps(world.size() as usize) {
        let report = mpi_group(world, watchdog, config, k, &progress)?;
        let single = rows.first().map(|r| r.tokens_per_s_per_rank);
        rows.push(ScalingRow::gather(&MpiControl(world), watchdog, k, report.as_ref(), single)?);
        if (world.rank() as usize) < k {
            last = report;
        }
    }
    progress.finish();
    Ok((rows, last))
}

/// One point of the CPU curve: the first `k` ranks train over a communicator of their own, MPI
/// summing the gradients; the others wait. This rank's run, if it trained.
fn mpi_group(
    world: &SimpleCommunicator,
    watchdog: &Watchdog,
    config: &TrainConfig,
    k: usize,
    progress: &Progress,
) -> Result<Option<kiln_bench::train::Report>> {
    let rank = world.rank() as usize;
    let color = if rank < k { Color::with_value(0) } else { Color::undefined() };
    watchdog.at(format!("forming the {k}-rank group"));
    let Some(comm) = world.split_by_color(color) else {
        // The group's ranks stop by themselves after a limit without a step, so the whole
        // phase takes at most a limit per step plus setting up, summing up and the gather.
        let bound = u32::try_from(config.train.steps).unwrap_or(u32::MAX).saturating_add(3);
        watchdog.waiting(format!("ranks 0-{} train without this rank", k - 1), bound);
        return Ok(None);
    };
    let mut dp = Gradients { comm: &comm, send: Vec::new() };
    let report = kiln_bench::train::run_parallel(
        &config.train,
        None,
        |step, steps, loss| {
            watchdog.at(format!("training on {k} ranks, step {step}/{steps}"));
            if rank == 0 {
                progress.update(&format!("{k} ranks: step {step}/{steps}, loss {loss:.3}"));
            }
        },
        (k > 1).then_some(&mut dp as &mut dyn DataParallel),
    )
    .map_err(|e| anyhow::anyhow!("training on {k} ranks: {e}"))?;
    Ok(Some(report))
}

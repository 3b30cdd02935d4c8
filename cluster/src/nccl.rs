//! `kiln cluster collectives --nccl` and `kiln cluster train --nccl`: the work runs in kiln-gpu on
//! each rank's GPU (CUDA lives only there), NCCL carrying the data between GPUs; kiln carries only
//! what the ranks tell each other — rank 0's NCCL id, whether each run worked, every rank's figures
//! — over the job's control plane ([`Control`]: MPI, or kiln's TCP rendezvous under `torchrun`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use kiln_bench::cluster::{bandwidths, sizes, Launch};

use super::rendezvous::{self, agree_on, broadcast, reduce, Control};
use super::{
    CollectiveRow, CollectivesConfig, CollectivesReport, Job, Rank, ScalingRow, TrainConfig, TrainScalingReport,
    Watchdog,
};
use kiln_gpu::child::{interpret, locate, read_document, run_all_seeing, Visible};
use kiln_gpu::request::{CollectivesArgs, NcclIdArgs, NcclJob, RankArgs, Request, TrainArgs};
use kiln_text::Progress;

/// kiln-gpu, found on every rank before any runs it (a rank without it is named, and all stop).
///
/// # Errors
/// Some rank has no kiln-gpu, or the control plane failed.
pub fn program(c: &dyn Control, watchdog: &Watchdog) -> Result<PathBuf> {
    agree_on(c, watchdog, "find kiln-gpu", locate().map_err(|s| anyhow::anyhow!("{s}")))
}

/// Where rank 0 hosts NCCL's bootstrap: `KILN_NCCL_HOST` (an address or name the other ranks
/// reach rank 0 at) where set, else this machine's host name; a port free now.
fn rank0_root() -> Result<String> {
    let host = match std::env::var("KILN_NCCL_HOST").ok().filter(|h| !h.is_empty()) {
        Some(host) => host,
        None => nix::unistd::gethostname()?.to_string_lossy().into_owned(),
    };
    let any = std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);
    kiln_gpu::child::nccl_root(any, &host).context("a free port for NCCL's bootstrap")
}

/// NCCL's unique id for a job of `c`'s ranks, and where rank 0 hosts its bootstrap: rank 0 picks
/// the root and runs `kiln-gpu nccl-id --root` (whose id names it, so it outlives that process),
/// and the job (or rank 0's failure, with its reason) reaches every rank.
///
/// # Errors
/// Rank 0 could not make one, or the control plane failed.
pub fn shared_id(c: &dyn Control, program: &Path, watchdog: &Watchdog) -> Result<NcclJob> {
    watchdog.at("rank 0 making NCCL's unique id");
    let made: Result<String> = if c.rank() == 0 {
        let timeout = Duration::from_secs(120);
        let never = std::sync::atomic::AtomicBool::new(false);
        rank0_root().and_then(|root| {
            let asked = Request::NcclId(NcclIdArgs { root: root.clone() }).to_args();
            let ended = run_all_seeing(program, &[asked], timeout, &never, Visible::Launcher);
            let (doc, error) = read_document::<kiln_gpu::collectives::NcclId>(interpret(&ended[0], timeout), "nccl-id");
            match (doc, error) {
                (Some(d), _) if d.nccl_id.len() == 256 && d.nccl_id.bytes().all(|b| b.is_ascii_hexdigit()) => {
                    Ok(format!("{} {root}", d.nccl_id))
                }
                (_, e) => Err(anyhow::anyhow!(
                    "{}: nccl-id: {}",
                    program.display(),
                    e.unwrap_or_else(|| "not 256 hex digits".into())
                )),
            }
        })
    } else {
        Ok(String::new())
    };
    let made = agree_on(c, watchdog, "make NCCL's unique id", made)?;
    let job = broadcast(c, made.as_bytes(), watchdog, "hearing NCCL's unique id from rank 0")?;
    let job = String::from_utf8(job).unwrap_or_default();
    let (id, root) = job.split_once(' ').unwrap_or((&job, ""));
    anyhow::ensure!(id.len() == 256, "rank 0 sent an NCCL id of {} bytes, not 256 hex digits", id.len());
    anyhow::ensure!(!root.is_empty(), "rank 0 sent an NCCL id without its bootstrap's address");
    Ok(NcclJob { id: id.to_string(), root: root.to_string() })
}

/// This rank's GPU, as CUDA numbers what it sees: the one the launcher left it
/// (`CUDA_VISIBLE_DEVICES` of one GPU), else its local rank's.
pub fn rank_gpu(launch: &Option<Launch>) -> usize {
    let one_visible = std::env::var("CUDA_VISIBLE_DEVICES").is_ok_and(|v| !v.is_empty() && !v.contains(','));
    if one_visible {
        0
    } else {
        launch.as_ref().and_then(|l| l.local_rank).unwrap_or(0)
    }
}

/// The collectives through NCCL, one GPU per rank: rank 0's id reaches every rank, each rank runs
/// its part as `kiln-gpu collectives --nccl-id … --rank r --ranks n`, and a size's time is the
/// slowest rank's (as nccl-tests reports across processes). Returns the rows, whether every rank's
/// every result was right, and NCCL's version.
///
/// # Errors
/// kiln-gpu missing or failing on some rank (named), ranks that measured different sizes, or the
/// control plane failed.
pub fn collectives(
    c: &dyn Control,
    launch: &Option<Launch>,
    watchdog: &Watchdog,
    config: &CollectivesConfig,
    stall: Duration,
) -> Result<(Vec<CollectiveRow>, bool, String)> {
    use kiln_gpu::collectives::Report as Part;
    let (rank, n) = (c.rank(), c.size());
    let program = program(c, watchdog)?;
    let hex = shared_id(c, &program, watchdog)?;
    let device = rank_gpu(launch);
    let ops: Vec<&str> = config.collectives.iter().map(|c| c.name()).collect();
    let args = Request::Collectives(CollectivesArgs {
        devices: "all".into(),
        ops: ops.join(","),
        min_bytes: config.min_bytes.to_string(),
        max_bytes: config.max_bytes.to_string(),
        iterations: config.iterations,
        warmup: config.warmup,
        seconds_per_size: config.seconds_per_size,
        job: RankArgs::of(&hex, rank, n),
        device: Some(device),
    })
    .to_args();
    // A limit per size and a few more for NCCL's set-up: the child is killed first, and this
    // rank's watchdog allows one limit beyond it.
    let steps = u32::try_from(config.collectives.len() * sizes(config.min_bytes, config.max_bytes).len())
        .unwrap_or(u32::MAX)
        .saturating_add(4);
    watchdog.waiting(format!("NCCL collectives in kiln-gpu on GPU {device}"), steps.saturating_add(1));
    let timeout = stall.saturating_mul(steps);
    let never = std::sync::atomic::AtomicBool::new(false);
    let ended = run_all_seeing(&program, &[args], timeout, &never, Visible::Launcher);
    let (part, error) = read_document::<Part>(interpret(&ended[0], timeout), "collectives");
    let part = agree_on(
        c,
        watchdog,
        "run the NCCL collectives",
        part.ok_or_else(|| anyhow::anyhow!("{}: collectives: {}", program.display(), error.unwrap_or_default())),
    )?;
    // Every rank measured the same rows, in the same order; a size's time is the slowest rank's.
    watchdog.at("gathering every rank's times");
    let mut mine: Vec<f64> = part.rows.iter().map(|r| r.time_us).collect();
    mine.push(f64::from(u8::from(part.rows.iter().all(|r| r.correct))));
    let slowest = reduce(c, &mine, f64::max, watchdog, "gathering every rank's times")?;
    let right = reduce(c, &mine[mine.len() - 1..], f64::min, watchdog, "hearing whether every result was right")?;
    let rows = part
        .rows
        .iter()
        .zip(&slowest)
        .map(|(r, &time_us)| {
            let (algbw_gbs, busbw_gbs) = bandwidths(r.collective, n, r.bytes, time_us * 1e-6);
            CollectiveRow {
                collective: r.collective,
                bytes: r.bytes,
                count: r.count,
                iterations: r.iterations,
                time_us,
                algbw_gbs,
                busbw_gbs,
            }
        })
        .collect();
    let library = part
        .nccl_version
        .map_or_else(|| "NCCL".to_string(), |v| format!("NCCL {}.{}.{}", v / 10_000, v / 100 % 100, v % 100));
    Ok((rows, right[0] == 1.0, library))
}

/// The weak-scaling curve on the GPUs: for 1, 2, 4 … N ranks, [`group`] trains, and every rank's
/// figures make the point. A group whose run failed on some rank (every rank agrees on it) ends
/// the curve there: the points before it stand, and why it stopped is returned with them. Returns
/// the rows, this rank's run at the largest group it trained in, its GPU's name, and why the
/// curve stopped early.
///
/// # Errors
/// The single rank's run failed (no point at all), or the control plane failed.
pub fn train(
    c: &dyn Control,
    launch: &Option<Launch>,
    watchdog: &Watchdog,
    config: &TrainConfig,
    stall: Duration,
) -> Result<(Vec<ScalingRow>, Option<kiln_bench::train::Report>, Option<String>, Option<String>)> {
    let progress = Progress::new();
    let program = program(c, watchdog)?;
    let (mut rows, mut last, mut gpu, mut stopped) = (Vec::<ScalingRow>::new(), None, None, None);
    for k in super::scaling_steps(c.size()) {
        if c.rank() == 0 {
            progress.update(&format!("{k} ranks: training in kiln-gpu"));
        }
        let part = match group(c, (&program, launch), watchdog, config, (k, stall)) {
            Ok(part) => part,
            // Every rank has the same error (agreed): each stops the curve here alike.
            Err(e) if !rows.is_empty() && e.downcast_ref::<rendezvous::Agreed>().is_some() => {
                stopped = Some(format!("{e:#}"));
                break;
            }
            Err(e) => return Err(e),
        };
        let report = part.map(|p| {
            gpu.clone_from(&p.name);
            p.run
        });
        rows.push(ScalingRow::gather(c, watchdog, k, report.as_ref(), rows.first().map(|r| r.tokens_per_s_per_rank))?);
        if c.rank() < k {
            last = report;
        }
    }
    progress.finish();
    Ok((rows, last, gpu, stopped))
}

/// One point of the GPU curve: for more than one rank a fresh NCCL id from rank 0, then the first
/// `k` ranks each run `kiln-gpu train` on their GPU as rank r of `k` (the others wait), every rank
/// agreeing that each run worked — one that did not is named and every rank stops. kiln-gpu says
/// nothing until it ends, so its limit is a stall limit per step and four more for CUDA's and
/// NCCL's set-up and the GEMM ceiling it measures after the run. This rank's document, if it trained.
fn group(
    c: &dyn Control,
    (program, launch): (&Path, &Option<Launch>),
    watchdog: &Watchdog,
    config: &TrainConfig,
    (k, stall): (usize, Duration),
) -> Result<Option<kiln_gpu::train::Report>> {
    let rank = c.rank();
    let hex = if k > 1 { Some(shared_id(c, program, watchdog)?) } else { None };
    let limits = u32::try_from(config.train.steps).unwrap_or(u32::MAX).saturating_add(4);
    let part = if rank < k {
        let device = rank_gpu(launch);
        let t = &config.train;
        let args = Request::Train(TrainArgs {
            device,
            size: t.size.clone(),
            steps: Some(t.steps),
            batch: Some(t.batch),
            dtype: config.dtype.clone().unwrap_or_else(|| "bf16".into()),
            job: hex.as_ref().map(|job| RankArgs::of(job, rank, k)).unwrap_or_default(),
        })
        .to_args();
        watchdog.waiting(format!("training on {k} ranks in kiln-gpu on GPU {device}"), limits.saturating_add(1));
        let never = std::sync::atomic::AtomicBool::new(false);
        let timeout = stall.saturating_mul(limits);
        let ended = run_all_seeing(program, &[args], timeout, &never, Visible::Launcher);
        let (doc, error) = read_document::<kiln_gpu::train::Report>(interpret(&ended[0], timeout), "train");
        doc.map(Some).ok_or_else(|| anyhow::anyhow!("{}: train: {}", program.display(), error.unwrap_or_default()))
    } else {
        watchdog.waiting(format!("ranks 0-{} train without this rank", k - 1), limits.saturating_add(2));
        Ok(None)
    };
    agree_on(c, watchdog, &format!("train on {k} ranks"), part)
}

/// `cluster collectives --nccl` through kiln's rendezvous (torchrun, or `KILN_RENDEZVOUS`).
///
/// # Errors
/// As [`collectives`], or the rendezvous cannot form.
pub fn collectives_over_tcp(config: &CollectivesConfig, stall: Duration) -> Result<(CollectivesReport, Job)> {
    let (tcp, watchdog, launch) = super::tcp_job(stall)?;
    let id = rendezvous::cluster_id(&tcp, &watchdog)?;
    let launch = Some(launch);
    let (rows, checked, library) = collectives(&tcp, &launch, &watchdog, config, stall)?;
    let report = CollectivesReport {
        job: Rank { cluster_id: id, rank: tcp.rank(), world_size: tcp.size(), launcher: launch },
        library,
        rows,
        checked,
        config: config.clone(),
    };
    Ok((report, Job::over_tcp(tcp, watchdog)))
}

/// `cluster train --nccl` through kiln's rendezvous (torchrun, or `KILN_RENDEZVOUS`).
///
/// # Errors
/// As [`train`], or the rendezvous cannot form.
pub fn train_over_tcp(config: &TrainConfig, stall: Duration) -> Result<(TrainScalingReport, Job)> {
    let (tcp, watchdog, launch) = super::tcp_job(stall)?;
    let id = rendezvous::cluster_id(&tcp, &watchdog)?;
    let launch = Some(launch);
    let (rows, last, gpu, stopped) = train(&tcp, &launch, &watchdog, config, stall)?;
    let report = TrainScalingReport {
        job: Rank { cluster_id: id, rank: tcp.rank(), world_size: tcp.size(), launcher: launch },
        rows,
        run: last,
        stopped,
        library: "NCCL".into(),
        gpu,
        config: config.clone(),
    };
    Ok((report, Job::over_tcp(tcp, watchdog)))
}

//! What kiln asks of kiln-gpu, defined once for both sides: one [`Request`] variant per command,
//! each option a field with its flag, default and meaning. kiln-gpu reads its command line with
//! clap into a `Request` (a person types the same flags); kiln builds the `Request` value and
//! turns it into that command line with [`Request::to_args`], which writes every field as the flag
//! clap reads it back from — so no flag is spelled anywhere else, and a field added here reaches
//! both sides at once (`round_trip` below proves each command survives the trip). [`Request::check`]
//! turns a request into the checked options the measurements take, before a device is touched.

use anyhow::Context;
use clap::{Args, FromArgMatches, Parser, Subcommand};
use kiln_bench::cluster::parse_size;
use serde::{Deserialize, Serialize};

use crate::collectives::{as_rank, id_from_hex, NCCL_COLLECTIVES};
use crate::gemm::{Precision, Shape, DEFAULT_SWEEP};
use crate::{bandwidth, collectives, gemm, p2p, train};

/// One command of kiln-gpu with its options.
#[derive(Debug, Clone, PartialEq, Subcommand, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Request {
    /// The devices CUDA sees
    Devices,
    /// One product's rate on one device, checked
    Gemm(GemmArgs),
    /// One type's products at several shapes on one device: the best is the ceiling
    Sweep(SweepArgs),
    /// Products back to back for a while, each interval checked
    Burn(BurnArgs),
    /// HBM and host↔device copies on one device
    Bandwidth(BandwidthArgs),
    /// Copies between every pair of devices, each way and both at once
    P2p(P2pArgs),
    /// NCCL collectives over the box's devices, or as one rank of a job
    Collectives(CollectivesArgs),
    /// A new NCCL unique id for a job's ranks, naming where rank 0 will host NCCL's bootstrap
    NcclId(NcclIdArgs),
    /// The reference model's training steps on one device, or as one rank of a job
    Train(TrainArgs),
}

/// `kiln-gpu gemm`.
#[derive(Debug, Clone, PartialEq, Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GemmArgs {
    /// CUDA device ordinal
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// bf16, f16, f32, tf32 or fp8
    #[arg(long, default_value = "bf16")]
    pub dtype: String,
    /// N (a square) or MxNxK
    #[arg(long, visible_alias = "n", default_value = "8192")]
    pub shape: String,
    /// Timed repetitions
    #[arg(long, default_value_t = 20)]
    pub reps: usize,
    /// Rows and columns of C sampled for the check
    #[arg(long, default_value_t = 32)]
    pub samples: usize,
}

/// `kiln-gpu sweep`.
#[derive(Debug, Clone, PartialEq, Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepArgs {
    /// CUDA device ordinal
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// bf16, f16, f32, tf32 or fp8
    #[arg(long, default_value = "bf16")]
    pub dtype: String,
    /// Shapes, N or MxNxK, separated by commas
    #[arg(long, default_value = DEFAULT_SWEEP)]
    pub shapes: String,
    /// Timed repetitions per shape
    #[arg(long, default_value_t = 20)]
    pub reps: usize,
    /// Rows and columns of C sampled for each check
    #[arg(long, default_value_t = 32)]
    pub samples: usize,
}

/// `kiln-gpu burn`.
#[derive(Debug, Clone, PartialEq, Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BurnArgs {
    /// CUDA device ordinal
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// bf16, f16, f32, tf32 or fp8
    #[arg(long, default_value = "bf16")]
    pub dtype: String,
    /// N (a square) or MxNxK
    #[arg(long, visible_alias = "n", default_value = "8192")]
    pub shape: String,
    /// How long to burn
    #[arg(long, default_value_t = 60.0)]
    pub seconds: f64,
    /// Rows and columns of C sampled for each interval's check
    #[arg(long, default_value_t = 32)]
    pub samples: usize,
}

/// `kiln-gpu bandwidth`.
#[derive(Debug, Clone, PartialEq, Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BandwidthArgs {
    /// CUDA device ordinal
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// MiB per copy
    #[arg(long, default_value_t = 1024)]
    pub mib: usize,
    /// Timed repetitions
    #[arg(long, default_value_t = 20)]
    pub reps: usize,
    /// The CPUs to run on (kernel list syntax), and so where the host buffer lives
    #[arg(long)]
    pub cpus: Option<String>,
}

/// `kiln-gpu p2p`.
#[derive(Debug, Clone, PartialEq, Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct P2pArgs {
    /// all, or CUDA ordinals separated by commas
    #[arg(long, default_value = "all")]
    pub devices: String,
    /// MiB per copy
    #[arg(long, default_value_t = 256)]
    pub mib: usize,
    /// Timed repetitions
    #[arg(long, default_value_t = 20)]
    pub reps: usize,
}

/// `kiln-gpu collectives`.
#[derive(Debug, Clone, PartialEq, Args, Serialize, Deserialize)]
pub struct CollectivesArgs {
    /// all, or CUDA ordinals separated by commas (one process over the box's devices)
    #[arg(long, default_value = "all")]
    pub devices: String,
    /// Collectives separated by commas: all_reduce, all_gather, reduce_scatter
    #[arg(long, default_value = "all_reduce,all_gather,reduce_scatter")]
    pub ops: String,
    /// The smallest message (bytes, or with K, M or G)
    #[arg(long, default_value = "8")]
    pub min_bytes: String,
    /// The largest message
    #[arg(long, default_value = "1G")]
    pub max_bytes: String,
    /// Timed calls per size at most
    #[arg(long, default_value_t = 20)]
    pub iterations: usize,
    /// Untimed calls per size
    #[arg(long, default_value_t = 5)]
    pub warmup: usize,
    /// About how long one size's timed calls take
    #[arg(long, default_value_t = 0.5)]
    pub seconds_per_size: f64,
    #[command(flatten)]
    #[serde(flatten)]
    pub job: RankArgs,
    /// As one rank of a job: this rank's device
    #[arg(long)]
    pub device: Option<usize>,
}

/// `kiln-gpu nccl-id`.
#[derive(Debug, Clone, PartialEq, Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NcclIdArgs {
    /// HOST:PORT where rank 0's process will host NCCL's bootstrap (`NCCL_COMM_ID`): the id names
    /// it, so it outlives this process
    #[arg(long)]
    pub root: String,
}

/// `kiln-gpu train`.
#[derive(Debug, Clone, PartialEq, Args, Serialize, Deserialize)]
pub struct TrainArgs {
    /// CUDA device ordinal
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// The model: gpt2, 350m or 1b (tiny, anchor and small too)
    #[arg(long, default_value = "gpt2")]
    pub size: String,
    /// The products' precision: bf16, tf32 or f32
    #[arg(long, default_value = "bf16")]
    pub dtype: String,
    /// Steps (default: the size's own)
    #[arg(long)]
    pub steps: Option<usize>,
    /// Sequences per step (default: the size's own)
    #[arg(long)]
    pub batch: Option<usize>,
    /// As one rank of data-parallel training, its gradients summed through NCCL
    #[command(flatten)]
    #[serde(flatten)]
    pub job: RankArgs,
}

/// One rank of a job across processes or servers (all three, or none): NCCL joins the ranks
/// through the id rank 0 made.
#[derive(Debug, Clone, Default, PartialEq, Args, Serialize, Deserialize)]
pub struct RankArgs {
    /// As one rank of a job: the id rank 0 made (`kiln-gpu nccl-id`), 256 hex digits
    #[arg(long)]
    pub nccl_id: Option<String>,
    /// As one rank of a job: this rank
    #[arg(long)]
    pub rank: Option<usize>,
    /// As one rank of a job: the job's ranks
    #[arg(long)]
    pub ranks: Option<usize>,
    /// As one rank of a job: HOST:PORT where rank 0 hosts NCCL's bootstrap (the `--root` the id
    /// was made with)
    #[arg(long)]
    pub nccl_root: Option<String>,
}

impl RankArgs {
    /// Rank `rank` of `ranks` in the job that `nccl_id` names, whose bootstrap rank 0 hosts at
    /// `root`.
    pub fn of(job: &NcclJob, rank: usize, ranks: usize) -> RankArgs {
        RankArgs {
            nccl_id: Some(job.id.clone()),
            rank: Some(rank),
            ranks: Some(ranks),
            nccl_root: Some(job.root.clone()),
        }
    }

    /// The job this rank belongs to, if any, on `device`.
    ///
    /// # Errors
    /// Some of the three without the others, a rank outside the job, or an id that is not one.
    fn on(&self, device: usize) -> anyhow::Result<Option<collectives::AsRank>> {
        let id = self.nccl_id.as_deref().map(id_from_hex).transpose()?;
        as_rank(id, self.rank, self.ranks, self.nccl_root.clone(), device)
    }
}

/// One NCCL job: the id rank 0's `kiln-gpu nccl-id --root` made, and that root (HOST:PORT).
///
/// Why the root travels: `ncclGetUniqueId` without `NCCL_COMM_ID` starts NCCL's bootstrap root
/// inside the calling process, which `kiln-gpu nccl-id` is, and which exits before any rank joins.
/// With `NCCL_COMM_ID=HOST:PORT` the id only names the address, and rank 0's own
/// `ncclCommInitRank` hosts the root there; so every rank's process is given the same root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NcclJob {
    pub id: String,
    pub root: String,
}

/// A request checked: the options each measurement takes.
#[derive(Debug, Clone)]
pub enum Checked {
    Devices,
    Gemm(gemm::Options),
    Sweep(gemm::SweepOptions),
    Burn(gemm::BurnOptions),
    Bandwidth(bandwidth::Options),
    P2p(p2p::Options),
    Collectives(collectives::Options),
    /// Where rank 0 will host NCCL's bootstrap.
    NcclId(String),
    Train(train::Options),
}

/// kiln-gpu's command line.
#[derive(Parser)]
#[command(
    name = "kiln-gpu",
    disable_version_flag = true,
    about = "kiln's GPU benchmarks: one JSON document per command"
)]
struct Line {
    #[command(subcommand)]
    request: Request,
}

impl Request {
    /// A command line (without the program's name) read as a request.
    ///
    /// # Errors
    /// An unknown command or option, or a value of the wrong kind, in clap's words (the first
    /// line); `--help` is an error too, whose text is the usage.
    pub fn parse(args: &[String]) -> Result<Request, clap::Error> {
        Line::try_parse_from(std::iter::once("kiln-gpu".to_string()).chain(args.iter().cloned())).map(|l| l.request)
    }

    /// The command line that asks kiln-gpu for this request: the command's name, then every
    /// field that is set as the flag clap reads it from (`--field value`, in the order the fields
    /// are declared; lists and words as they are typed).
    pub fn to_args(&self) -> Vec<String> {
        use clap::CommandFactory;
        use serde_json::Value;
        let (command, fields) = match serde_json::to_value(self).expect("a request serialises") {
            Value::String(command) => (command, serde_json::Map::new()),
            Value::Object(map) => {
                let (command, fields) = map.into_iter().next().expect("one command");
                (command, fields.as_object().cloned().unwrap_or_default())
            }
            other => unreachable!("a request is a name or an object, not {other}"),
        };
        let line = Line::command();
        let sub = line.find_subcommand(&command).expect("every request is a subcommand");
        let mut args = vec![command.clone()];
        for arg in sub.get_arguments() {
            let (Some(long), Some(value)) = (arg.get_long(), fields.get(arg.get_id().as_str())) else { continue };
            match value {
                Value::Null => continue,
                Value::String(s) => args.extend([format!("--{long}"), s.clone()]),
                other => args.extend([format!("--{long}"), other.to_string()]),
            }
        }
        args
    }

    /// The options each measurement takes, every value checked before any device is touched.
    ///
    /// # Errors
    /// A value out of range or of the wrong form, named by its flag.
    pub fn check(&self) -> anyhow::Result<Checked> {
        Ok(match self {
            Request::Devices => Checked::Devices,
            Request::Gemm(a) => Checked::Gemm(a.check()?),
            Request::Sweep(a) => Checked::Sweep(a.check()?),
            Request::Burn(a) => Checked::Burn(a.check()?),
            Request::Bandwidth(a) => Checked::Bandwidth(a.check()?),
            Request::P2p(a) => Checked::P2p(a.check()?),
            Request::Collectives(a) => Checked::Collectives(a.check()?),
            Request::NcclId(a) => Checked::NcclId(root(&a.root)?.to_string()),
            Request::Train(a) => Checked::Train(a.check()?),
        })
    }
}

/// One command's options with every default, as kiln-gpu reads them when none is given.
fn defaults<T: Args + FromArgMatches>() -> T {
    let matches = T::augment_args(clap::Command::new("defaults"))
        .try_get_matches_from(["defaults"])
        .expect("every option has a default or is optional");
    T::from_arg_matches(&matches).expect("every option has a default or is optional")
}

/// One command's options from its flags alone (without the command's name), as
/// [`Request::parse`] reads them.
///
/// # Errors
/// What clap says of them (its first line).
pub fn from_flags<T: Args + FromArgMatches>(flags: &[String]) -> anyhow::Result<T> {
    let command = T::augment_args(clap::Command::new("kiln-gpu").no_binary_name(true));
    let matches = command.try_get_matches_from(flags).map_err(|e| anyhow::anyhow!(first_line(&e)))?;
    T::from_arg_matches(&matches).map_err(|e| anyhow::anyhow!(first_line(&e)))
}

/// clap's message without its `error: ` and usage lines.
pub fn first_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let line = text.lines().find(|l| !l.trim().is_empty()).unwrap_or_default();
    line.trim_start_matches("error: ").to_string()
}

/// A command's options, checked into what its measurement takes.
pub trait Check {
    type Options;
    /// # Errors
    /// A value out of range, named by its flag.
    fn check(&self) -> anyhow::Result<Self::Options>;
}

/// One command's flags (without its name), read and checked as kiln-gpu reads them.
///
/// # Errors
/// What clap or the check says of them.
pub fn checked<A: Args + FromArgMatches + Check>(flags: &[String]) -> anyhow::Result<A::Options> {
    from_flags::<A>(flags)?.check()
}

macro_rules! defaults {
    ($($t:ty),*) => {
        $(impl Default for $t {
            fn default() -> Self {
                defaults()
            }
        })*
    };
}
defaults!(GemmArgs, SweepArgs, BurnArgs, BandwidthArgs, P2pArgs, CollectivesArgs, TrainArgs);

/// `--root`/`--nccl-root`: HOST:PORT, as `NCCL_COMM_ID` takes it.
fn root(text: &str) -> anyhow::Result<&str> {
    let ok =
        text.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
    anyhow::ensure!(ok, "--root {text:?}: HOST:PORT where rank 0 hosts NCCL's bootstrap");
    Ok(text)
}

/// A product's shape, `--shape`/`--n`'s value.
fn shape(flag: &str, text: &str) -> anyhow::Result<Shape> {
    Shape::parse(text).with_context(|| format!("--{flag}"))
}

/// `--devices all|0,1,…`: `None` for every device.
fn device_list(text: &str, least: usize, what: &str) -> anyhow::Result<Option<Vec<usize>>> {
    if text == "all" {
        return Ok(None);
    }
    let mut list = Vec::new();
    for d in text.split(',') {
        let d: usize = d.trim().parse().with_context(|| format!("--devices {text:?}: all, or 0,1,…"))?;
        anyhow::ensure!(!list.contains(&d), "--devices {text:?}: device {d} twice");
        list.push(d);
    }
    anyhow::ensure!(list.len() >= least, "--devices: {what} needs two devices or more");
    Ok(Some(list))
}

/// `--mib N` as bytes, within `1..=max_mib` MiB.
fn mib_bytes(mib: usize, max_mib: usize) -> anyhow::Result<usize> {
    anyhow::ensure!((1..=max_mib).contains(&mib), "--mib {mib}: between 1 and {max_mib}");
    Ok(mib << 20)
}

impl Check for GemmArgs {
    type Options = gemm::Options;

    /// The checked options.
    ///
    /// # Errors
    /// A value out of range, named by its flag.
    fn check(&self) -> anyhow::Result<gemm::Options> {
        let o = gemm::Options {
            device: self.device,
            dtype: Precision::parse(&self.dtype)?,
            shape: shape("shape", &self.shape)?,
            reps: self.reps,
            samples: self.samples,
        };
        anyhow::ensure!((1..=100_000).contains(&o.reps), "--reps {}: between 1 and 100000", o.reps);
        let least = o.shape.m.min(o.shape.n);
        anyhow::ensure!((1..=least).contains(&o.samples), "--samples {}: between 1 and the shape's m and n", o.samples);
        Ok(o)
    }
}

impl Check for SweepArgs {
    type Options = gemm::SweepOptions;

    /// The checked options. `--samples` is capped by each shape as it is measured, so a sweep
    /// that holds small shapes may ask for more rows than they have.
    ///
    /// # Errors
    /// A value out of range, named by its flag.
    fn check(&self) -> anyhow::Result<gemm::SweepOptions> {
        let shapes: Vec<Shape> = self.shapes.split(',').map(|s| shape("shapes", s)).collect::<anyhow::Result<_>>()?;
        anyhow::ensure!(!shapes.is_empty(), "--shapes: at least one");
        anyhow::ensure!((1..=100_000).contains(&self.reps), "--reps {}: between 1 and 100000", self.reps);
        anyhow::ensure!((1..=65_536).contains(&self.samples), "--samples {}: between 1 and 65536", self.samples);
        let dtype = Precision::parse(&self.dtype)?;
        Ok(gemm::SweepOptions { device: self.device, dtype, shapes, reps: self.reps, samples: self.samples })
    }
}

impl Check for BurnArgs {
    type Options = gemm::BurnOptions;

    /// The checked options.
    ///
    /// # Errors
    /// A value out of range, named by its flag.
    fn check(&self) -> anyhow::Result<gemm::BurnOptions> {
        let seconds = self.seconds;
        anyhow::ensure!(seconds > 0.0 && seconds <= 7.0 * 86_400.0, "--seconds {seconds}: above 0, at most a week");
        let product = GemmArgs {
            device: self.device,
            dtype: self.dtype.clone(),
            shape: self.shape.clone(),
            reps: 1,
            samples: self.samples,
        }
        .check()?;
        Ok(gemm::BurnOptions {
            device: product.device,
            dtype: product.dtype,
            shape: product.shape,
            seconds,
            samples: product.samples,
        })
    }
}

impl Check for BandwidthArgs {
    type Options = bandwidth::Options;

    /// The checked options.
    ///
    /// # Errors
    /// A value out of range, named by its flag.
    fn check(&self) -> anyhow::Result<bandwidth::Options> {
        anyhow::ensure!((1..=10_000).contains(&self.reps), "--reps {}: between 1 and 10000", self.reps);
        if let Some(list) = &self.cpus {
            bandwidth::parse_cpus(list)?;
        }
        Ok(bandwidth::Options {
            device: self.device,
            bytes: mib_bytes(self.mib, 65_536)?,
            reps: self.reps,
            cpus: self.cpus.clone(),
        })
    }
}

impl Check for P2pArgs {
    type Options = p2p::Options;

    /// The checked options.
    ///
    /// # Errors
    /// A value out of range, named by its flag.
    fn check(&self) -> anyhow::Result<p2p::Options> {
        anyhow::ensure!((1..=10_000).contains(&self.reps), "--reps {}: between 1 and 10000", self.reps);
        Ok(p2p::Options {
            devices: device_list(&self.devices, 2, "peer to peer")?,
            bytes: mib_bytes(self.mib, 16_384)?,
            reps: self.reps,
        })
    }
}

impl Check for CollectivesArgs {
    type Options = collectives::Options;

    /// The checked options.
    ///
    /// # Errors
    /// A value out of range, named by its flag, or a rank's options without the others.
    fn check(&self) -> anyhow::Result<collectives::Options> {
        let mut chosen = Vec::new();
        for name in self.ops.split(',') {
            let c = NCCL_COLLECTIVES
                .into_iter()
                .find(|c| c.name() == name.trim())
                .with_context(|| format!("--ops {name:?}: all_reduce, all_gather or reduce_scatter"))?;
            chosen.push(c);
        }
        let min_bytes = parse_size(&self.min_bytes).map_err(anyhow::Error::msg).context("--min-bytes")?;
        let max_bytes = parse_size(&self.max_bytes).map_err(anyhow::Error::msg).context("--max-bytes")?;
        anyhow::ensure!(min_bytes >= 4 && min_bytes <= max_bytes, "--min-bytes: 4 or more, and not above --max-bytes");
        anyhow::ensure!(max_bytes <= 16 << 30, "--max-bytes: 16G at most");
        anyhow::ensure!((1..=10_000).contains(&self.iterations), "--iterations: between 1 and 10000");
        let s = self.seconds_per_size;
        anyhow::ensure!(s > 0.0 && s <= 60.0, "--seconds-per-size: above 0, 60 at most");
        let devices = device_list(&self.devices, 2, "collectives")?;
        let as_rank = self.job.on(self.device.unwrap_or(0))?;
        match &as_rank {
            Some(_) => anyhow::ensure!(devices.is_none(), "--devices: a rank (--nccl-id) uses one --device"),
            None => anyhow::ensure!(self.device.is_none(), "--device: for a rank of a job (--nccl-id); else --devices"),
        }
        Ok(collectives::Options {
            devices,
            as_rank,
            collectives: chosen,
            min_bytes,
            max_bytes,
            iterations: self.iterations,
            warmup: self.warmup,
            seconds_per_size: s,
        })
    }
}

impl Check for TrainArgs {
    type Options = train::Options;

    /// The checked options, the run's configuration among them.
    ///
    /// # Errors
    /// A value out of range, named by its flag; a size, type or step count training cannot run.
    fn check(&self) -> anyhow::Result<train::Options> {
        let o = train::Options {
            device: self.device,
            size: self.size.clone(),
            steps: self.steps,
            batch: self.batch,
            precision: Precision::parse(&self.dtype)?,
            as_rank: self.job.on(self.device)?,
        };
        o.config()?;
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        line.split_whitespace().map(String::from).collect()
    }

    /// Every command survives the trip kiln makes: the value, its command line, and the value
    /// kiln-gpu reads back from it.
    #[test]
    fn round_trip() {
        let hex = "ab".repeat(128);
        let requests = [
            Request::Devices,
            Request::NcclId(NcclIdArgs { root: "10.0.0.1:29500".into() }),
            Request::Gemm(GemmArgs {
                device: 3,
                dtype: "fp8".into(),
                shape: "256x512x128".into(),
                reps: 5,
                samples: 8,
            }),
            Request::Sweep(SweepArgs { shapes: "64,64x96x48".into(), ..SweepArgs::default() }),
            Request::Burn(BurnArgs { seconds: 2.5, ..BurnArgs::default() }),
            Request::Bandwidth(BandwidthArgs { cpus: Some("0-3,8".into()), ..BandwidthArgs::default() }),
            Request::Bandwidth(BandwidthArgs::default()),
            Request::P2p(P2pArgs { devices: "0,2,3".into(), mib: 64, reps: 5 }),
            Request::Collectives(CollectivesArgs {
                job: RankArgs::of(&NcclJob { id: hex.clone(), root: "node0:29500".into() }, 3, 4),
                device: Some(1),
                ops: "all_reduce".into(),
                max_bytes: "8G".into(),
                seconds_per_size: 0.25,
                ..CollectivesArgs::default()
            }),
            Request::Train(TrainArgs {
                steps: Some(30),
                job: RankArgs::of(&NcclJob { id: hex, root: "127.0.0.1:41000".into() }, 0, 1),
                ..TrainArgs::default()
            }),
        ];
        for request in requests {
            let args = request.to_args();
            assert_eq!(Request::parse(&args).unwrap(), request, "{args:?}");
            request.check().unwrap_or_else(|e| panic!("{args:?}: {e}"));
            let json = serde_json::to_string(&request).unwrap();
            assert_eq!(serde_json::from_str::<Request>(&json).unwrap(), request, "{json}");
        }
    }

    /// kiln's line reads as a person would type it: the fields in their order, the job last.
    #[test]
    fn a_line_reads_as_typed() {
        let job = NcclJob { id: "ab".into(), root: "node0:29500".into() };
        let train =
            TrainArgs { size: "tiny".into(), steps: Some(20), job: RankArgs::of(&job, 1, 2), ..TrainArgs::default() };
        assert_eq!(
            Request::Train(train).to_args().join(" "),
            "train --device 0 --size tiny --dtype bf16 --steps 20 --nccl-id ab --rank 1 --ranks 2 --nccl-root node0:29500"
        );
        let id = Request::NcclId(NcclIdArgs { root: "node0:29500".into() });
        assert_eq!(id.to_args(), ["nccl-id", "--root", "node0:29500"]);
    }

    /// A command with no options is the defaults, which `Default` gives kiln too.
    #[test]
    fn defaults_are_one_set() {
        assert_eq!(Request::parse(&words("gemm")).unwrap(), Request::Gemm(GemmArgs::default()));
        assert_eq!(Request::parse(&words("train")).unwrap(), Request::Train(TrainArgs::default()));
        assert_eq!(GemmArgs::default().check().unwrap().shape, Shape::square(8192));
        assert_eq!(SweepArgs::default().check().unwrap().shapes.len(), 12);
        assert_eq!(CollectivesArgs::default().check().unwrap().collectives, NCCL_COLLECTIVES);
        // `--n` is `--shape`'s other name, as people have typed it.
        assert_eq!(Request::parse(&words("gemm --n 64")).unwrap(), Request::parse(&words("gemm --shape 64")).unwrap());
    }

    /// A job's id without its root cannot join: the root is asked for with the others, and must
    /// be an address.
    #[test]
    fn a_rank_needs_its_root() {
        let hex = "ab".repeat(128);
        let half = Request::parse(&words(&format!("train --nccl-id {hex} --rank 0 --ranks 1"))).unwrap();
        assert!(half.check().unwrap_err().to_string().contains("go together"));
        assert!(Request::parse(&words("nccl-id")).is_err(), "--root is required");
        let bad = Request::parse(&words("nccl-id --root node0")).unwrap();
        assert!(bad.check().unwrap_err().to_string().contains("HOST:PORT"));
    }

    #[test]
    fn bad_lines_are_refused_in_words() {
        let e = Request::parse(&words("melt")).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::InvalidSubcommand);
        let e = Request::parse(&words("gemm --reps x")).unwrap_err();
        assert!(first_line(&e).contains("--reps"), "{}", first_line(&e));
        let e = Request::parse(&words("gemm --colour red")).unwrap_err();
        assert!(first_line(&e).contains("--colour"), "{}", first_line(&e));
    }
}

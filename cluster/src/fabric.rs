//! `kiln cluster fabric`: the pair matrix, per rail, over whatever carries the job's control plane
//! ([`Control`]: MPI under `mpirun`/`srun`, kiln's rendezvous under `torchrun`); the measured
//! traffic is kiln's TCP benchmark between the ranks' NIC addresses, one pair per node at a time.

use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use kiln_bench::cluster::{judge_fabric, tournament, Launch, Link};

use super::rendezvous::{self, agree_on, Control};
use super::{
    above_ceiling, enter_netns, netns_path, pin_thread, rails, unpin_thread, FabricConfig, FabricReport, Job, Node,
    Rail, RailReport, Rank, Watchdog,
};
use kiln_text::Progress;

/// Every rank's `text`, at most `width` bytes each.
fn gather_strings(c: &dyn Control, watchdog: &Watchdog, text: &str, width: usize) -> Result<Vec<String>> {
    let all = c.all_gather(rendezvous::cut(text, width).as_bytes(), watchdog, "hearing from every rank")?;
    Ok(all.into_iter().map(|b| String::from_utf8_lossy(&b).into_owned()).collect())
}

fn hostname() -> String {
    nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_else(|| "?".into())
}

/// Labels: host names, with the namespace where one is used, and the rank where they still repeat.
fn labels(hosts: &[String], netns: &[Option<String>]) -> Vec<String> {
    let base: Vec<String> = hosts
        .iter()
        .zip(netns)
        .map(|(h, ns)| match ns {
            Some(ns) => format!("{h}/{}", Path::new(ns).file_name().map_or(ns.clone(), |f| f.to_string_lossy().into())),
            None => h.clone(),
        })
        .collect();
    base.iter()
        .enumerate()
        .map(|(r, l)| if base.iter().filter(|o| *o == l).count() > 1 { format!("{l}#{r}") } else { l.clone() })
        .collect()
}

/// How long one phase of a round lasts at most beyond the stall limit: one pair's measuring.
pub fn phase(config: &FabricConfig) -> Duration {
    Duration::from_secs_f64(config.seconds * config.repetitions as f64)
}

/// The whole fabric test, as one rank, over the job's control plane (MPI or kiln's rendezvous):
/// setup agreed by every rank, the rails' endpoints gathered, the tournament in step, every rank's
/// links gathered, the verdict. The heartbeats must have started before: this thread may enter a
/// network namespace here.
///
/// # Errors
/// A rank cannot set up (all ranks stop, naming it), ranks that test different numbers of rails,
/// or the control plane failed.
// Long: the test's steps in order — setup agreed, rendezvous, the tournament, the gather, the verdict.
pub fn run(
    c: &dyn Control,
    launch: Option<Launch>,
    watchdog: &Watchdog,
    config: &FabricConfig,
) -> Result<FabricReport> {
    let (rank, size) = (c.rank(), c.size());
    watchdog.at("setting up and hearing from every rank");
    let started = Instant::now();
    let local_rank = launch.as_ref().and_then(|l| l.local_rank).unwrap_or(0);
    let netns = config.netns.as_ref().map(|p| netns_path(p, rank, local_rank));

    let setup = (|| -> Result<(Vec<Rail>, Vec<TcpListener>)> {
        if let Some(ns) = &netns {
            enter_netns(Path::new(ns))?;
        }
        let rails = rails(&config.interfaces)?;
        let listeners = rails
            .iter()
            .map(|r| {
                TcpListener::bind((r.address, 0))
                    .with_context(|| format!("listening on {} ({})", r.address, r.interface))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((rails, listeners))
    })();
    let (rails, listeners) = agree_on(c, watchdog, "set up", setup)?;

    let hosts = gather_strings(c, watchdog, &hostname(), 128)?;
    let all_netns: Vec<Option<String>> = gather_strings(c, watchdog, netns.as_deref().unwrap_or(""), 256)?
        .into_iter()
        .map(|s| (!s.is_empty()).then_some(s))
        .collect();
    let labels = labels(&hosts, &all_netns);
    let nodes: Vec<Node> =
        (0..size).map(|r| Node { rank: r, host: hosts[r].clone(), label: labels[r].clone() }).collect();
    let counts = gather_strings(c, watchdog, &rails.len().to_string(), 8)?;
    anyhow::ensure!(
        counts.iter().all(|c| *c == counts[0]),
        "the ranks test different numbers of rails ({}): give every rank the same --iface list",
        counts.join(", ")
    );
    // Per rail: every rank's "address:port speed".
    let mut endpoints: Vec<Vec<(String, Option<u64>)>> = Vec::new();
    for (rail, listener) in rails.iter().zip(&listeners) {
        let me = format!("{} {}", listener.local_addr()?, rail.speed_mbps.unwrap_or(0));
        endpoints.push(
            gather_strings(c, watchdog, &me, 64)?
                .into_iter()
                .map(|s| {
                    let (addr, speed) = s.split_once(' ').unwrap_or((&s, "0"));
                    (addr.to_string(), speed.parse().ok().filter(|&v: &u64| v > 0))
                })
                .collect(),
        );
    }
    let id = rendezvous::cluster_id(c, watchdog)?;

    // Every rail serves for as long as the test can take; the threads end with the process.
    for (rail, listener) in rails.iter().zip(listeners) {
        let cpus = rail.local_cpus.clone();
        std::thread::spawn(move || {
            pin_thread(cpus.as_deref());
            kiln_bench::net::serve(listener, Duration::from_secs(24 * 3600))
        });
    }

    let rounds = tournament(size);
    let progress = Progress::new();
    // This rank's links out: per rail, per peer, (Gb/s, µs); NaN where not measured.
    let mut mine = vec![f64::NAN; rails.len() * size * 2];
    let addr_of = |k: usize, peer: usize| -> std::io::Result<std::net::SocketAddr> {
        endpoints[k][peer].0.parse().map_err(|e| std::io::Error::other(format!("{}: {e}", endpoints[k][peer].0)))
    };
    let warn = |peer: usize, rail: &Rail, what: &str, e: &std::io::Error| {
        eprintln!(
            "kiln: rank {rank} ({}) -> rank {peer} ({}) on rail {}: {what}: {e}",
            labels[rank], labels[peer], rail.interface
        );
    };
    for (i, round) in rounds.iter().enumerate() {
        if rank == 0 {
            progress.update(&format!("fabric round {}/{}", i + 1, rounds.len()));
        }
        let pair = round.iter().find(|(a, b)| *a == rank || *b == rank).copied();
        for (k, rail) in rails.iter().enumerate() {
            // Three phases, every pair of the round in step: the lower rank sends, the higher rank
            // sends, then round trips — so that no round trip is timed beside another pair's bulk
            // traffic (through a shared switch, or on one host's CPUs).
            for phase in 0..3 {
                if let Some((a, b)) = pair {
                    let peer = if a == rank { b } else { a };
                    let mine_now = match phase {
                        0 => rank == a,
                        1 => rank == b,
                        _ => rank == a,
                    };
                    if mine_now {
                        let what = ["sending to", "sending to", "timing round trips with"][phase];
                        watchdog.at(format!(
                            "round {}/{}: {what} rank {peer} ({}) on {}",
                            i + 1,
                            rounds.len(),
                            labels[peer],
                            rail.interface
                        ));
                        let pinned = pin_thread(rail.local_cpus.as_deref());
                        let at = (k * size + peer) * 2;
                        if phase < 2 {
                            let mut gbps = Vec::new();
                            for _ in 0..config.repetitions {
                                match addr_of(k, peer).and_then(|addr| {
                                    kiln_bench::net::throughput_once(&addr, config.streams, config.seconds)
                                }) {
                                    Ok(g) => gbps.push(g),
                                    Err(e) => {
                                        warn(peer, rail, "throughput, counted as 0 Gb/s", &e);
                                        gbps.push(0.0);
                                        break;
                                    }
                                }
                            }
                            mine[at] = kiln_bench::stats::median(&gbps);
                        } else {
                            let rtt = match addr_of(k, peer).and_then(|addr| kiln_bench::net::round_trips(&addr, 1000))
                            {
                                Ok(rtt) => kiln_bench::stats::median(&rtt),
                                Err(e) => {
                                    warn(peer, rail, "round trips", &e);
                                    f64::NAN
                                }
                            };
                            // A round trip is both directions': the higher rank's row gets it below.
                            mine[at + 1] = rtt;
                        }
                        unpin_thread(pinned);
                    }
                }
                c.roll_call(watchdog, &format!("round {}/{}", i + 1, rounds.len()), Some(&labels))?;
            }
        }
    }
    progress.finish();

    watchdog.at("gathering every rank's links");
    let all = rendezvous::gather_f64s(c, &mine, watchdog, "gathering every rank's links")?.concat();
    let per_rank = mine.len();
    let rail_reports = rails
        .iter()
        .enumerate()
        .map(|(k, rail)| {
            let mut links = Vec::new();
            for from in 0..size {
                for to in (0..size).filter(|&t| t != from) {
                    let at = from * per_rank + (k * size + to) * 2;
                    if !all[at].is_nan() {
                        // The lower rank timed the pair's round trips.
                        let (lo, hi) = (from.min(to), from.max(to));
                        let rtt_us = all[lo * per_rank + (k * size + hi) * 2 + 1];
                        links.push(Link { from, to, gbps: all[at], rtt_us });
                    }
                }
            }
            let speeds: Vec<Option<u64>> = endpoints[k].iter().map(|e| e.1).collect();
            RailReport {
                interface: rail.interface.clone(),
                invalid: above_ceiling(&links, &speeds),
                verdict: judge_fabric(size, &links, config.floor_gbps),
                links,
            }
        })
        .collect();
    let report = FabricReport {
        job: Rank { cluster_id: id, rank, world_size: size, launcher: launch },
        nodes,
        rails: rail_reports,
        rounds: rounds.len(),
        seconds: started.elapsed().as_secs_f64(),
        config: config.clone(),
    };
    Ok(report)
}

/// The fabric test as one rank of a job that meets through kiln's rendezvous (torchrun, or
/// `KILN_RENDEZVOUS`): no MPI needed.
///
/// # Errors
/// As [`run`], or the rendezvous cannot form.
pub fn over_tcp(config: &FabricConfig, stall: Duration) -> Result<(FabricReport, Job)> {
    let (tcp, watchdog, launch) = super::tcp_job(stall + phase(config))?;
    let report = run(&tcp, Some(launch), &watchdog, config)?;
    Ok((report, Job::over_tcp(tcp, watchdog)))
}

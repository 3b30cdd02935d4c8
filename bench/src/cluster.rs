//! Tests across servers, the parts that need no launcher and no network: where this process sits in
//! a job (the launcher's environment), which pairs meet in which round (a round-robin tournament,
//! so that each node is in one pair at a time and N nodes take N−1 rounds), what a pair matrix says
//! (which node, link and direction is slow, against the matrix's own robust baseline and a spec's
//! floor), and the bus bandwidth of a collective as nccl-tests computes it.
//!
//! Invariant: pure functions of their inputs; the measuring lives in `net` and in the agent.

use serde::{Deserialize, Serialize};

use crate::stats::median;

/// The launcher that started this process, read from its environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Launcher {
    /// `srun` (`SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, `SLURM_NODEID`).
    Slurm,
    /// Open MPI's `mpirun` (`OMPI_COMM_WORLD_RANK`, `_SIZE`, `_LOCAL_RANK`, `OMPI_COMM_WORLD_NODE_RANK`).
    OpenMpi,
    /// `torchrun` and the environments that copy it (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
    /// `GROUP_RANK`, `MASTER_ADDR`).
    Torchrun,
}

/// This process's place in a job, as its launcher describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launch {
    pub launcher: Launcher,
    pub rank: usize,
    pub world_size: usize,
    /// The rank among the processes on this node.
    pub local_rank: Option<usize>,
    /// The node's index in the job (Slurm's node id, torchrun's group rank).
    pub node: Option<usize>,
    /// torchrun's rendezvous host.
    pub master_addr: Option<String>,
}

/// Reads the launcher's variables through `get` (the process environment in use, a map in tests).
/// `Ok(None)`: no launcher started this process. Open MPI's variables win over Slurm's (an
/// `mpirun` inside an allocation), Slurm's over torchrun's.
///
/// # Errors
/// A variable that is there but is not a number, or a rank outside the world: named.
pub fn detect_launch(get: impl Fn(&str) -> Option<String>) -> Result<Option<Launch>, String> {
    let number = |name: &str| -> Result<Option<usize>, String> {
        match get(name) {
            None => Ok(None),
            Some(v) => v
                .trim()
                .parse()
                .map(Some)
                .map_err(|_| format!("{name}={v:?} is not a whole number (set by the launcher, or by hand?)")),
        }
    };
    let schemes: [(Launcher, &str, &str, &str, &str); 3] = [
        (Launcher::OpenMpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", ""),
        (Launcher::Slurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID"),
        (Launcher::Torchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK"),
    ];
    for (launcher, rank, size, local, node) in schemes {
        let (Some(r), Some(n)) = (number(rank)?, number(size)?) else { continue };
        if n == 0 || r >= n {
            return Err(format!("{rank}={r} with {size}={n}: the rank must be below the world size"));
        }
        let node = if node.is_empty() { None } else { number(node)? };
        let master_addr = (launcher == Launcher::Torchrun).then(|| get("MASTER_ADDR")).flatten();
        return Ok(Some(Launch { launcher, rank: r, world_size: n, local_rank: number(local)?, node, master_addr }));
    }
    Ok(None)
}

/// The rounds of a round-robin tournament of `n` players (the circle method): every unordered pair
/// meets exactly once, nobody plays twice in a round; `n − 1` rounds for even `n`, `n` for odd `n`
/// (each round one player rests). Pairs are `(lower, higher)`.
pub fn tournament(n: usize) -> Vec<Vec<(usize, usize)>> {
    if n < 2 {
        return Vec::new();
    }
    let m = n + n % 2; // a resting "player" m−1 when n is odd
    let mut rounds = Vec::with_capacity(m - 1);
    for r in 0..m - 1 {
        // Player m−1 stays put; the others turn one place a round.
        let at = |i: usize| if i == m - 1 { m - 1 } else { (i + r) % (m - 1) };
        let mut pairs = Vec::with_capacity(m / 2);
        for i in 0..m / 2 {
            let (a, b) = (at(i), at(m - 1 - i));
            if a < n && b < n {
                pairs.push((a.min(b), a.max(b)));
            }
        }
        pairs.sort_unstable();
        rounds.push(pairs);
    }
    rounds
}

/// One direction of one pair: `from` sends, `to` receives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Link {
    pub from: usize,
    pub to: usize,
    /// Gb/s counted by the receiver (median of the repetitions).
    pub gbps: f64,
    /// 64-byte round trip, microseconds (median).
    pub rtt_us: f64,
}

/// Which way the slow traffic goes, seen from the subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Slow when the node sends (its transmit side, or the path away from it).
    Send,
    /// Slow when the node receives.
    Receive,
    /// Both ways.
    Both,
}

/// What a finding names: a node (every or most of its links slow, so the fault is on its side), or
/// one link between two nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Subject {
    Node {
        node: usize,
    },
    /// `a < b`; the direction is seen from `a`: `Send` is a→b.
    Link {
        a: usize,
        b: usize,
    },
}

/// Bandwidth or latency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Quantity {
    Bandwidth,
    Latency,
}

/// One thing the matrix says is wrong, with its evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    pub subject: Subject,
    pub quantity: Quantity,
    pub direction: Direction,
    /// The median of the evidence (Gb/s or µs).
    pub measured: f64,
    /// What the matrix's baseline is (its median).
    pub baseline: f64,
    /// The directed links this finding rests on.
    pub evidence: Vec<Link>,
}

/// The baseline a matrix is judged against, and its cut-offs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Baseline {
    /// The typical link: the median over nodes of each node's median link (both directions), so that
    /// one bad node — half of a 4-node matrix — does not drag the baseline down with it.
    pub median_gbps: f64,
    /// The links' spread around the baseline (σ from the median absolute deviation), for the reader.
    pub mad_gbps: f64,
    /// A link below this is slow: `SLOW_SHARE` × the baseline, or the spec's floor where higher.
    pub slow_below_gbps: f64,
    pub floor_gbps: Option<f64>,
    pub median_rtt_us: f64,
    pub mad_rtt_us: f64,
    /// A round trip above this is slow: the higher of `SLOW_RTT_FACTOR` × the baseline and the
    /// baseline + `RTT_SIGMAS` σ.
    pub slow_above_us: f64,
}

/// A link below this share of the baseline bandwidth is slow (a link at half rate is named; the
/// jitter of a loaded host is not).
pub const SLOW_SHARE: f64 = 0.75;
/// A round trip above this multiple of the baseline is slow: a link that drops and retransmits
/// costs multiples, while a busy host's scheduling jitter was seen to reach 2.2× on a 2-CPU VM.
pub const SLOW_RTT_FACTOR: f64 = 3.0;
/// ... and this many σ (from the round trips' MAD around the baseline) above it.
pub const RTT_SIGMAS: f64 = 4.0;

/// The verdict on a pair matrix.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FabricVerdict {
    pub nodes: usize,
    pub baseline: Baseline,
    /// Empty when nothing is slow.
    pub findings: Vec<Finding>,
}

/// The median over nodes of each node's median value, and the values' MAD around it.
fn node_baseline(n: usize, links: &[Link], value: impl Fn(&Link) -> f64) -> (f64, f64) {
    let per_node: Vec<f64> = (0..n)
        .filter_map(|node| {
            let mine: Vec<f64> =
                links.iter().filter(|l| l.from == node || l.to == node).map(&value).filter(|v| v.is_finite()).collect();
            (!mine.is_empty()).then(|| median(&mine))
        })
        .collect();
    let baseline = median(&per_node);
    let deviations: Vec<f64> = links.iter().map(|l| (value(l) - baseline).abs()).filter(|v| v.is_finite()).collect();
    (baseline, 1.4826 * median(&deviations))
}

/// Judges a matrix of directed links between `n` nodes. A node is named when more than half of its
/// links in one direction (and at least two) are slow — the fault is on its side, not on its peers';
/// the slow links no node explains are named one by one. `floor_gbps`: the spec's floor for one link.
pub fn judge_fabric(n: usize, links: &[Link], floor_gbps: Option<f64>) -> FabricVerdict {
    let (median_gbps, mad_gbps) = node_baseline(n, links, |l| l.gbps);
    let (median_rtt_us, mad_rtt_us) = node_baseline(n, links, |l| l.rtt_us);
    let slow_below_gbps = (SLOW_SHARE * median_gbps).max(floor_gbps.unwrap_or(f64::NEG_INFINITY));
    let slow_above_us = (SLOW_RTT_FACTOR * median_rtt_us).max(median_rtt_us + RTT_SIGMAS * mad_rtt_us);
    let baseline =
        Baseline { median_gbps, mad_gbps, slow_below_gbps, floor_gbps, median_rtt_us, mad_rtt_us, slow_above_us };
    let mut findings = attribute(n, links, Quantity::Bandwidth, |l| l.gbps < slow_below_gbps, |l| l.gbps, median_gbps);
    findings.extend(attribute(n, links, Quantity::Latency, |l| l.rtt_us > slow_above_us, |l| l.rtt_us, median_rtt_us));
    FabricVerdict { nodes: n, baseline, findings }
}

/// Names nodes, then the links left over, for one quantity.
fn attribute(
    n: usize,
    links: &[Link],
    quantity: Quantity,
    slow: impl Fn(&Link) -> bool,
    value: impl Fn(&Link) -> f64,
    baseline: f64,
) -> Vec<Finding> {
    let slow_links: Vec<&Link> = links.iter().filter(|l| slow(l)).collect();
    let mut explained = vec![false; slow_links.len()];
    let mut findings = Vec::new();
    let evidence_median = |ev: &[Link]| median(&ev.iter().map(&value).collect::<Vec<_>>());
    let most = |slow: usize, of: usize| slow >= 2 && 2 * slow > of;
    // Candidates: a node's side (sending, receiving) where most of its links are slow.
    struct Candidate {
        node: usize,
        send: bool,
        slow: Vec<usize>,
        measured: usize,
    }
    let mut candidates = Vec::new();
    for node in 0..n {
        for send in [true, false] {
            let on_side = |l: &Link| if send { l.from == node } else { l.to == node };
            let slow: Vec<usize> = (0..slow_links.len()).filter(|&i| on_side(slow_links[i])).collect();
            let measured = links.iter().filter(|l| on_side(l)).count();
            if most(slow.len(), measured) {
                candidates.push(Candidate { node, send, slow, measured });
            }
        }
    }
    // Strongest first (the larger share of slow links); a candidate whose slow links are mostly
    // another, strictly stronger candidate's (node 0 receives slowly only from the node that sends
    // slowly to everyone) is that one's shadow, not a fault of its own.
    let share = |c: &Candidate| c.slow.len() as f64 / c.measured as f64;
    candidates.sort_by(|a, b| share(b).total_cmp(&share(a)));
    let mut claimed: Vec<(usize, f64)> = Vec::new(); // (slow link, share of the claimer)
    let mut accepted: Vec<(usize, bool, Vec<usize>)> = Vec::new();
    for c in &candidates {
        let own = c.slow.iter().filter(|&&i| !claimed.iter().any(|&(j, by)| j == i && by > share(c) + 1e-12)).count();
        if most(own, c.measured) {
            claimed.extend(c.slow.iter().map(|&i| (i, share(c))));
            accepted.push((c.node, c.send, c.slow.clone()));
        }
    }
    for node in 0..n {
        let sides: Vec<&(usize, bool, Vec<usize>)> = accepted.iter().filter(|a| a.0 == node).collect();
        let direction = match (sides.iter().any(|a| a.1), sides.iter().any(|a| !a.1)) {
            (true, true) => Direction::Both,
            (true, false) => Direction::Send,
            (false, true) => Direction::Receive,
            (false, false) => continue,
        };
        let mut mine: Vec<usize> = sides.iter().flat_map(|a| a.2.iter().copied()).collect();
        mine.sort_unstable();
        mine.dedup();
        let evidence: Vec<Link> = mine.iter().map(|&i| slow_links[i].clone()).collect();
        for &i in &mine {
            explained[i] = true;
        }
        findings.push(Finding {
            subject: Subject::Node { node },
            quantity,
            direction,
            measured: evidence_median(&evidence),
            baseline,
            evidence,
        });
    }
    // The slow links no node explains, a pair at a time.
    let mut pairs: Vec<(usize, usize)> = slow_links
        .iter()
        .zip(&explained)
        .filter(|(_, e)| !**e)
        .map(|(l, _)| (l.from.min(l.to), l.from.max(l.to)))
        .collect();
    pairs.sort_unstable();
    pairs.dedup();
    for (a, b) in pairs {
        let evidence: Vec<Link> = slow_links
            .iter()
            .zip(&explained)
            .filter(|(l, e)| !**e && l.from.min(l.to) == a && l.from.max(l.to) == b)
            .map(|(l, _)| (*l).clone())
            .collect();
        let forward = evidence.iter().any(|l| l.from == a);
        let backward = evidence.iter().any(|l| l.from == b);
        let direction = match (forward, backward) {
            (true, true) => Direction::Both,
            (true, false) => Direction::Send,
            _ => Direction::Receive,
        };
        findings.push(Finding {
            subject: Subject::Link { a, b },
            quantity,
            direction,
            measured: evidence_median(&evidence),
            baseline,
            evidence,
        });
    }
    findings
}

/// The collectives kiln times, as nccl-tests names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Collective {
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
}

impl Collective {
    pub const ALL: [Collective; 4] =
        [Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter, Collective::AllToAll];

    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::AllToAll => "all_to_all",
        }
    }

    /// nccl-tests' bus-bandwidth factor for `n` ranks: the share of the data each rank's link
    /// carries in the optimal algorithm, so that bus bandwidth compares with the link's peak
    /// whatever the rank count. All-reduce 2(n−1)/n; all-gather, reduce-scatter, all-to-all (n−1)/n.
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n.max(1) as f64;
        match self {
            Collective::AllReduce => 2.0 * (n - 1.0) / n,
            Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => (n - 1.0) / n,
        }
    }
}

/// (algorithm bandwidth, bus bandwidth) in GB/s (10⁹ bytes) for `bytes` moved in `seconds`, where
/// `bytes` is nccl-tests' size: the whole buffer (all-gather's output, reduce-scatter's input).
pub fn bandwidths(collective: Collective, ranks: usize, bytes: u64, seconds: f64) -> (f64, f64) {
    let algbw = bytes as f64 / seconds / 1e9;
    (algbw, algbw * collective.bus_factor(ranks))
}

/// Sizes like nccl-tests takes them: bytes, or with K, M, G (binary).
///
/// # Errors
/// Anything else.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (digits, shift) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    let n: u64 = digits.trim().parse().map_err(|_| format!("{s:?}: a size is bytes, or a number with K, M or G"))?;
    n.checked_shl(shift).filter(|v| v >> shift == n).ok_or_else(|| format!("{s:?}: too large"))
}

/// Message sizes from `min` to `max` bytes, doubling (nccl-tests' `-b min -e max -f 2`); both
/// included.
pub fn sizes(min: u64, max: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut s = min.max(1);
    while s <= max {
        out.push(s);
        match s.checked_mul(2) {
            Some(next) => s = next,
            None => break,
        }
    }
    if out.last() != Some(&max) && max >= min {
        out.push(max);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeSet, HashMap};

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn sizes_parse_like_nccl_tests() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("128K"), Ok(128 << 10));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert!(parse_size("1T").is_err());
        assert!(parse_size("99999999999999G").is_err());
    }

    #[test]
    fn launchers_are_read_from_their_environments() {
        assert_eq!(detect_launch(env(&[])).unwrap(), None);
        let slurm = detect_launch(env(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NODEID", "2"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            (slurm.launcher, slurm.rank, slurm.world_size, slurm.local_rank, slurm.node),
            (Launcher::Slurm, 5, 16, Some(1), Some(2))
        );
        // mpirun inside a Slurm allocation: Open MPI's numbering is the job's.
        let both = detect_launch(env(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "3"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!((both.launcher, both.rank, both.world_size), (Launcher::OpenMpi, 3, 4));
        let torch = detect_launch(env(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("GROUP_RANK", "0"),
            ("MASTER_ADDR", "node0"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(torch.launcher, Launcher::Torchrun);
        assert_eq!(torch.master_addr.as_deref(), Some("node0"));
    }

    #[test]
    fn a_malformed_launcher_variable_is_named() {
        let e = detect_launch(env(&[("SLURM_PROCID", "x"), ("SLURM_NTASKS", "4")])).unwrap_err();
        assert!(e.contains("SLURM_PROCID"), "{e}");
        let e = detect_launch(env(&[("RANK", "4"), ("WORLD_SIZE", "4")])).unwrap_err();
        assert!(e.contains("RANK=4") && e.contains("WORLD_SIZE=4"), "{e}");
    }

    #[test]
    fn a_tournament_meets_every_pair_once_one_pair_per_node_a_round() {
        for n in 0..=33 {
            let rounds = tournament(n);
            let expected_rounds = if n < 2 { 0 } else { n - 1 + n % 2 };
            assert_eq!(rounds.len(), expected_rounds, "n={n}");
            let mut seen = BTreeSet::new();
            for round in &rounds {
                let mut busy = BTreeSet::new();
                for &(a, b) in round {
                    assert!(a < b && b < n, "n={n} pair ({a},{b})");
                    assert!(busy.insert(a) && busy.insert(b), "n={n}: a node twice in one round");
                    assert!(seen.insert((a, b)), "n={n}: ({a},{b}) twice");
                }
                assert_eq!(round.len(), n / 2, "n={n}: every round as full as it can be");
            }
            assert_eq!(seen.len(), n * n.saturating_sub(1) / 2, "n={n}: every pair");
        }
    }

    /// A full matrix of `n` nodes at `base` Gb/s with a little spread, then `slow` applied.
    fn matrix(n: usize, base: f64, slow: impl Fn(usize, usize) -> f64) -> Vec<Link> {
        let mut links = Vec::new();
        for from in 0..n {
            for to in 0..n {
                if from != to {
                    let jitter = 1.0 + 0.01 * ((from * 7 + to * 3) % 5) as f64;
                    links.push(Link { from, to, gbps: base * jitter * slow(from, to), rtt_us: 20.0 * jitter });
                }
            }
        }
        links
    }

    #[test]
    fn a_symmetric_fabric_names_nothing() {
        for n in 2..10 {
            let v = judge_fabric(n, &matrix(n, 100.0, |_, _| 1.0), None);
            assert!(v.findings.is_empty(), "n={n}: {:?}", v.findings);
        }
    }

    #[test]
    fn a_node_sending_at_half_rate_is_named_with_its_direction() {
        let v = judge_fabric(8, &matrix(8, 100.0, |from, _| if from == 5 { 0.5 } else { 1.0 }), None);
        assert_eq!(v.findings.len(), 1, "{:?}", v.findings);
        let f = &v.findings[0];
        assert_eq!(
            (&f.subject, f.direction, f.quantity),
            (&Subject::Node { node: 5 }, Direction::Send, Quantity::Bandwidth)
        );
        assert_eq!(f.evidence.len(), 7);
        assert!((f.measured / f.baseline - 0.5).abs() < 0.05, "{f:?}");
        let v = judge_fabric(4, &matrix(4, 100.0, |f, t| if f == 2 || t == 2 { 0.3 } else { 1.0 }), None);
        assert_eq!(v.findings.len(), 1, "{:?}", v.findings);
        assert_eq!((&v.findings[0].subject, v.findings[0].direction), (&Subject::Node { node: 2 }, Direction::Both));
        let v = judge_fabric(4, &matrix(4, 100.0, |_, t| if t == 0 { 0.4 } else { 1.0 }), None);
        assert_eq!((&v.findings[0].subject, v.findings[0].direction), (&Subject::Node { node: 0 }, Direction::Receive));
    }

    #[test]
    fn a_slow_sender_does_not_make_a_receiver_with_one_noisy_link_slow() {
        // Node 2 sends at 3 %; the link 1→0 dips to 70 % (noise): node 0 receives slowly from two
        // of its three peers, but one of them is node 2's fault. Node 2, and the one link.
        let v = judge_fabric(
            4,
            &matrix(4, 100.0, |f, t| match (f, t) {
                (2, _) => 0.03,
                (1, 0) => 0.7,
                _ => 1.0,
            }),
            None,
        );
        let subjects: Vec<&Subject> = v.findings.iter().map(|f| &f.subject).collect();
        assert_eq!(subjects, [&Subject::Node { node: 2 }, &Subject::Link { a: 0, b: 1 }], "{:?}", v.findings);
    }

    #[test]
    fn one_bad_cable_is_named_as_a_link_not_a_node() {
        let v = judge_fabric(6, &matrix(6, 100.0, |f, t| if (f, t) == (4, 1) { 0.5 } else { 1.0 }), None);
        assert_eq!(v.findings.len(), 1, "{:?}", v.findings);
        let f = &v.findings[0];
        // Seen from the lower node: 1 receives the slow direction.
        assert_eq!((&f.subject, f.direction), (&Subject::Link { a: 1, b: 4 }, Direction::Receive));
        let v = judge_fabric(6, &matrix(6, 100.0, |f, t| if (f.min(t), f.max(t)) == (0, 3) { 0.5 } else { 1.0 }), None);
        assert_eq!((&v.findings[0].subject, v.findings[0].direction), (&Subject::Link { a: 0, b: 3 }, Direction::Both));
    }

    #[test]
    fn a_spec_floor_names_a_uniformly_slow_fabric() {
        let links = matrix(4, 100.0, |_, _| 1.0);
        assert!(judge_fabric(4, &links, Some(90.0)).findings.is_empty());
        let v = judge_fabric(4, &links, Some(200.0));
        // Every node is below the floor both ways: four node findings, no stray links.
        assert_eq!(v.findings.len(), 4, "{:?}", v.findings);
        assert!(v.findings.iter().all(|f| matches!(f.subject, Subject::Node { .. }) && f.direction == Direction::Both));
    }

    #[test]
    fn a_slow_round_trip_is_named() {
        let mut links = matrix(5, 100.0, |_, _| 1.0);
        for l in links.iter_mut().filter(|l| l.from == 3 || l.to == 3) {
            l.rtt_us *= 10.0;
        }
        let v = judge_fabric(5, &links, None);
        assert_eq!(v.findings.len(), 1, "{:?}", v.findings);
        assert_eq!((&v.findings[0].subject, v.findings[0].quantity), (&Subject::Node { node: 3 }, Quantity::Latency));
    }

    #[test]
    fn bus_bandwidth_is_nccl_tests() {
        // nccl-tests: 8 ranks, all-reduce busbw = algbw × 2·7/8.
        let (alg, bus) = bandwidths(Collective::AllReduce, 8, 1 << 30, 0.01);
        assert!((alg - 107.374_182_4).abs() < 1e-6);
        assert!((bus / alg - 1.75).abs() < 1e-12);
        assert_eq!(Collective::AllGather.bus_factor(4), 0.75);
        assert_eq!(Collective::AllToAll.bus_factor(1), 0.0);
        assert_eq!(sizes(8, 64), vec![8, 16, 32, 64]);
        assert_eq!(sizes(8, 100), vec![8, 16, 32, 64, 100]);
        assert_eq!(sizes(8, 1 << 30).len(), 28);
    }
}

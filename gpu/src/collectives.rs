//! Collectives over the box's own GPUs through NCCL (one process, one communicator per GPU,
//! each collective issued for every GPU inside one NCCL group): all-reduce, all-gather and
//! reduce-scatter of f32 at message sizes doubling from `--min-bytes` to `--max-bytes`, timed and
//! counted as nccl-tests counts them (`kiln_bench::cluster::bandwidths`: the size is the whole
//! buffer, bus bandwidth = algorithm bandwidth × the collective's bus factor), the same
//! arithmetic as `kiln cluster collectives` over MPI. Every result is **checked**: each GPU sends
//! values whose sum or gathering is known, and what each GPU received must equal it exactly.

use anyhow::Context;
use kiln_bench::cluster::Collective;
use serde::{Deserialize, Serialize};

/// One rank of a job across processes or servers: NCCL joins the ranks through the unique id
/// rank 0's `kiln-gpu nccl-id` made (kiln passes it on over MPI).
#[derive(Debug, Clone, PartialEq)]
pub struct AsRank {
    /// `ncclUniqueId`'s 128 bytes, as 256 hex digits.
    pub id: [u8; 128],
    pub rank: usize,
    pub ranks: usize,
    /// This rank's CUDA device.
    pub device: usize,
    /// HOST:PORT where rank 0 hosts NCCL's bootstrap (`NCCL_COMM_ID` for `ncclCommInitRank`).
    pub root: String,
}

/// One rank of a job from `--nccl-id`, `--rank`, `--ranks`, `--nccl-root` (all or none) and
/// `--device`.
///
/// # Errors
/// Some of the four without the others, or a rank outside the job.
pub fn as_rank(
    id: Option<[u8; 128]>,
    rank: Option<usize>,
    ranks: Option<usize>,
    root: Option<String>,
    device: usize,
) -> anyhow::Result<Option<AsRank>> {
    match (id, rank, ranks, root) {
        (Some(id), Some(rank), Some(ranks), Some(root)) => {
            // One rank is a job too: NCCL's calls then run alone, which is how one GPU tests the
            // data-parallel path (scripts/gpu-check.sh).
            anyhow::ensure!(rank < ranks, "--rank {rank} of --ranks {ranks}: the rank must be below the ranks");
            Ok(Some(AsRank { id, rank, ranks, device, root }))
        }
        (None, None, None, None) => Ok(None),
        _ => anyhow::bail!("--nccl-id, --rank, --ranks and --nccl-root go together"),
    }
}

/// The 128 bytes of an NCCL unique id from its 256 hex digits.
pub fn id_from_hex(hex: &str) -> anyhow::Result<[u8; 128]> {
    anyhow::ensure!(hex.len() == 256 && hex.is_ascii(), "--nccl-id: 256 hex digits (what `kiln-gpu nccl-id` prints)");
    let mut id = [0u8; 128];
    for (i, byte) in id.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).context("--nccl-id: hex digits only")?;
    }
    Ok(id)
}

/// An NCCL unique id as 256 hex digits.
pub fn id_to_hex(id: &[u8; 128]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// `kiln-gpu nccl-id`'s document.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NcclId {
    pub nccl_id: String,
}

/// What `kiln-gpu collectives` measures.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// CUDA ordinals; `None`: every device.
    pub devices: Option<Vec<usize>>,
    /// Set: this process is one rank of a job, on one device.
    pub as_rank: Option<AsRank>,
    pub collectives: Vec<Collective>,
    pub min_bytes: u64,
    pub max_bytes: u64,
    /// Timed calls per size at most (fewer where a call is slow: see `seconds_per_size`).
    pub iterations: usize,
    pub warmup: usize,
    /// About how long the timed calls of one size take.
    pub seconds_per_size: f64,
}

/// The collectives NCCL has as calls (all-to-all is point-to-point sends in NCCL, not measured here).
pub const NCCL_COLLECTIVES: [Collective; 3] = [Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter];

/// One collective at one size.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    pub collective: Collective,
    /// nccl-tests' size: the whole buffer (all-gather's output, reduce-scatter's input).
    pub bytes: u64,
    /// f32 elements of that buffer.
    pub count: u64,
    pub iterations: usize,
    /// Per call, the slowest GPU's.
    pub time_us: f64,
    pub algbw_gbs: f64,
    pub busbw_gbs: f64,
    /// Every GPU received exactly what the collective must produce.
    pub correct: bool,
}

/// `kiln-gpu collectives`' document.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// This process's devices (one, as a rank of a job).
    pub devices: Vec<usize>,
    /// As a rank of a job: its rank; the rows' times are then this rank's own.
    #[serde(default)]
    pub rank: Option<usize>,
    /// The ranks (GPUs) every collective ran over.
    #[serde(default)]
    pub ranks: usize,
    pub names: Vec<String>,
    /// NCCL's version, as `ncclGetVersion` gives it (2.30.7 is 23007).
    pub nccl_version: Option<i64>,
    pub rows: Vec<Row>,
}

/// The element count of a collective over `n` GPUs at nccl-tests' size `bytes`: whole f32
/// elements, divisible among the GPUs where each has a share (nccl-tests rounds the same way).
pub fn count(c: Collective, bytes: u64, n: usize) -> u64 {
    let elements = bytes / 4;
    match c {
        Collective::AllReduce => elements,
        _ => elements / n as u64 * n as u64,
    }
}

/// What GPU `rank` of `n` sends and how long its receive buffer is, for `count` elements.
pub fn send_values(c: Collective, count: usize, rank: usize, n: usize) -> (Vec<f32>, usize) {
    let chunk = count / n;
    match c {
        Collective::AllGather => (vec![rank as f32; chunk], count),
        Collective::ReduceScatter => (vec![(rank + 1) as f32; count], chunk),
        _ => (vec![(rank + 1) as f32; count], count),
    }
}

/// Whether what GPU `rank` of `n` received is what the collective must produce.
pub fn received_right(c: Collective, received: &[f32], n: usize) -> bool {
    let sum = (n * (n + 1) / 2) as f32;
    match c {
        Collective::AllGather => {
            let chunk = (received.len() / n).max(1);
            received.iter().enumerate().all(|(i, &v)| v == (i / chunk) as f32)
        }
        _ => received.iter().all(|&v| v == sum),
    }
}

/// How many timed calls a size gets: enough for `seconds` at the measured `once`, within 1..=`most`.
pub fn iterations_for(once: f64, seconds: f64, most: usize) -> usize {
    ((seconds / once.max(1e-9)) as usize).clamp(1, most.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_and_sizes_are_checked() {
        let args = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        let o = crate::request::checked::<crate::request::CollectivesArgs>(&args(
            "--devices 0,1 --ops all_reduce --min-bytes 1K --max-bytes 8G --iterations 5",
        ))
        .unwrap();
        assert_eq!((o.min_bytes, o.max_bytes, o.iterations), (1024, 8 << 30, 5));
        assert_eq!(o.collectives, [Collective::AllReduce]);
        assert_eq!(
            crate::request::checked::<crate::request::CollectivesArgs>(&[]).unwrap().collectives,
            NCCL_COLLECTIVES
        );
        let id: [u8; 128] = std::array::from_fn(|i| (i * 7) as u8);
        let hex = id_to_hex(&id);
        let o = crate::request::checked::<crate::request::CollectivesArgs>(&args(&format!(
            "--nccl-id {hex} --rank 3 --ranks 4 --nccl-root node0:29500 --device 1"
        )))
        .unwrap();
        assert_eq!(o.as_rank, Some(AsRank { id, rank: 3, ranks: 4, device: 1, root: "node0:29500".into() }));
        for bad in [
            format!("--nccl-id {hex} --rank 4 --ranks 4 --nccl-root node0:29500"),
            format!("--nccl-id {hex} --rank 0 --ranks 4"),
            format!("--nccl-id {hex} --rank 0"),
            format!("--nccl-id {hex} --rank 0 --ranks 2 --devices 0,1"),
            format!("--nccl-id {} --rank 0 --ranks 2", &hex[..254]),
            "--device 1".to_string(),
        ] {
            assert!(crate::request::checked::<crate::request::CollectivesArgs>(&args(&bad)).is_err(), "{bad}");
        }
        for bad in [
            "--devices 3",
            "--ops all_to_all",
            "--min-bytes 2",
            "--min-bytes 1M --max-bytes 1K",
            "--max-bytes 32G",
            "--max-bytes 1X",
            "--iterations 0",
            "--seconds-per-size 0",
            "--what 1",
        ] {
            assert!(crate::request::checked::<crate::request::CollectivesArgs>(&args(bad)).is_err(), "{bad}");
        }
    }

    /// The check against a host simulation of each collective over four GPUs: right results pass,
    /// and one wrong value anywhere fails.
    #[test]
    fn what_each_gpu_must_receive() {
        let n = 4;
        for c in NCCL_COLLECTIVES {
            let count = count(c, 1 << 10, n) as usize;
            let sent: Vec<(Vec<f32>, usize)> = (0..n).map(|r| send_values(c, count, r, n)).collect();
            for rank in 0..n {
                let received: Vec<f32> = match c {
                    Collective::AllReduce => (0..count).map(|i| sent.iter().map(|s| s.0[i]).sum()).collect(),
                    Collective::AllGather => sent.iter().flat_map(|s| s.0.clone()).collect(),
                    _ => {
                        let chunk = count / n;
                        (rank * chunk..(rank + 1) * chunk).map(|i| sent.iter().map(|s| s.0[i]).sum()).collect()
                    }
                };
                assert_eq!(received.len(), sent[rank].1, "{c:?}");
                assert!(received_right(c, &received, n), "{c:?} rank {rank}");
                let mut wrong = received.clone();
                wrong[received.len() / 2] += 1.0;
                assert!(!received_right(c, &wrong, n), "{c:?} rank {rank}: a wrong value passed");
            }
        }
        assert_eq!(count(Collective::AllGather, 100, 3), 24);
        assert_eq!(iterations_for(0.1, 0.5, 20), 5);
        assert_eq!(iterations_for(2.0, 0.5, 20), 1);
    }
}

//! Peer to peer: the GPU × GPU copy matrix, as NVLink (or PCIe) carries it. For every ordered pair
//! (row sends, column receives) a device-to-device copy from one GPU's memory into the other's,
//! each repetition timed by CUDA events on the receiver's stream around the copy alone, then both
//! directions of every pair at once (timed on the host around both, since events of two devices
//! cannot be compared), and a small copy's time (what a collective's latency rests on). Peer access
//! is enabled wherever the driver says the pair has it; without it the driver stages the copy
//! through host memory, which the document says (`peer_access`) so that kiln can tell a missing
//! NVLink path from a slow one. Every copy is **checked**: the sender's buffer carries a pattern
//! from the host, and what arrives must equal it.

use serde::{Deserialize, Serialize};

use crate::bandwidth::Copies;

/// What `kiln-gpu p2p` measures.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// CUDA ordinals; `None`: every device.
    pub devices: Option<Vec<usize>>,
    /// Bytes per copy.
    pub bytes: usize,
    pub reps: usize,
}

/// Bytes of the small copy whose time is the pair's latency.
pub const SMALL_COPY: usize = 4096;

/// One direction of one pair: `from`'s memory copied into `to`'s.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Pair {
    pub from: usize,
    pub to: usize,
    /// The driver let `to` reach `from`'s memory directly (NVLink or PCIe peer to peer); without
    /// it the copy went through host memory.
    pub peer_access: bool,
    /// The large copies, bytes moved counted once.
    pub copies: Copies,
    /// The small copy's time, microseconds (median), and every repetition.
    pub small_copy_us: f64,
    pub small_copy_samples_us: Vec<f64>,
}

/// Both directions of a pair at once.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Both {
    pub a: usize,
    pub b: usize,
    /// Both copies, bytes counted in both directions together.
    pub copies: Copies,
}

/// `kiln-gpu p2p`'s document.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// The devices measured (CUDA ordinals, in kiln's order: PCI bus order) and their names.
    pub devices: Vec<usize>,
    pub names: Vec<String>,
    /// Bytes per copy.
    pub bytes: usize,
    pub reps: usize,
    /// Every ordered pair.
    pub one_way: Vec<Pair>,
    /// Every unordered pair, both directions at once.
    pub both_ways: Vec<Both>,
}

/// The small copy's time per repetition (seconds) as its median and samples in microseconds.
pub fn small_copy(seconds: &[f64]) -> (f64, Vec<f64>) {
    let us: Vec<f64> = seconds.iter().map(|s| s * 1e6).collect();
    let mut sorted = us.clone();
    sorted.sort_by(f64::total_cmp);
    let median = match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    };
    (median, us)
}

/// Every ordered pair of `devices`, row by row.
pub fn ordered_pairs(devices: &[usize]) -> Vec<(usize, usize)> {
    devices.iter().flat_map(|&a| devices.iter().filter(move |&&b| b != a).map(move |&b| (a, b))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_checked() {
        let args = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        let o = crate::request::checked::<crate::request::P2pArgs>(&args("--devices 0,2,3 --mib 64 --reps 5")).unwrap();
        assert_eq!(o, Options { devices: Some(vec![0, 2, 3]), bytes: 64 << 20, reps: 5 });
        assert_eq!(crate::request::checked::<crate::request::P2pArgs>(&args("--devices all")).unwrap().devices, None);
        for bad in ["--devices 1", "--devices 0,0", "--devices x", "--mib 0", "--reps 0", "--size 3", "--mib"] {
            assert!(crate::request::checked::<crate::request::P2pArgs>(&args(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn pairs_and_small_copies() {
        assert_eq!(ordered_pairs(&[0, 1, 3]), [(0, 1), (0, 3), (1, 0), (1, 3), (3, 0), (3, 1)]);
        let (median, samples) = small_copy(&[3e-6, 1e-6, 2e-6, 10e-6]);
        assert!((median - 2.5).abs() < 1e-9 && samples.len() == 4, "{median}");
    }
}

//! The metrics kiln's benchmarks store, as name patterns: `{n}` is a number, `{w}` a word (letters,
//! digits, `_`, `-`). A spec's `[[performance]]` metric must be one of them, so that a renamed
//! metric cannot leave every box INCONCLUSIVE for want of a figure no benchmark stores anymore;
//! and every run kiln stores is checked against them in debug builds (`kiln_app`'s `to_run`), so
//! that a benchmark cannot store a name this list does not know.

/// Every metric name a benchmark stores.
pub const STORED: &[&str] = &[
    // kiln bench membw: per scope ("all", "node0") and kernel.
    "membw.{w}.{w}_gbps",
    // kiln bench gemm: the measured peaks, the clock, and each size through candle or a library.
    "cpu.fma_peak_gflops",
    "cpu.{w}_peak_gflops",
    "cpu.{w}_peak_gops",
    "cpu.clock_mhz",
    "gemm.{w}.{n}.gflops",
    "gemm.{w}.{n}.gops",
    "gemm.{w}.{w}.{n}.gflops",
    "gemm.{w}.{w}.{n}.gops",
    // kiln bench train.
    "train.{w}.tokens_per_s",
    "train.{w}.step_p50_s",
    "train.{w}.step_p95_s",
    "train.{w}.achieved_gflops",
    "train.{w}.loss_start",
    "train.{w}.loss_end",
    "train.{w}.mfu",
    "train.{w}.input_wait_share",
    // kiln bench disk.
    "disk.{w}_{n}k_qd{n}.mb_per_s",
    "disk.{w}_{n}k_qd{n}.iops",
    "disk.{w}_{n}k_qd{n}.p99_us",
    // kiln bench data.
    "data.{w}_gbps",
    "data.dir{n}.{w}_gbps",
    "data.{w}_us",
    "data.dir{n}.{w}_us",
    "data.au",
    "data.max_samples_per_s",
    "data.reader_cpu_cores",
    "data.from_storage",
    // kiln bench net.
    "net.tcp_throughput_gbps",
    "net.tcp_rtt_p50_us",
    "net.tcp_rtt_p99_us",
    // kiln bench sdc.
    "sdc.cpus",
    "sdc.cpus_wrong",
    "sdc.rounds_compared",
    "sdc.cpu{n}.wrong",
    // The suite's error counters (`kiln_inventory::counters`) and harness faults.
    "rdma.{w}.port{n}.{w}",
    "gpu{n}.pcie_replays",
    "counters.seconds",
    "harness.faults",
    // kiln bench gpu gemm / burn / memory / p2p / collectives / train.
    "gpu{n}.gemm.{w}.best_tflops",
    "gpu{n}.gemm.{w}.{n}.tflops",
    "gpu{n}.gemm.{w}.{n}.all_tflops",
    "gpus.gemm.{w}.{n}.tflops",
    "gpu{n}.burn.{w}.tflops",
    "gpu{n}.burn.{w}.min_tflops",
    "gpu{n}.{w}_gbps",
    "gpus.{w}_gbps",
    "gpus.p2p_small_median_us",
    "gpu{n}.p2p_to_gpu{n}_gbps",
    "gpu{n}.p2p_to_gpu{n}_small_us",
    "gpu{n}.p2p_both_gpu{n}_gbps",
    "gpus.nccl.{w}.busbw_gbs_max",
    "gpus.nccl.{w}.time_us_smallest",
    "gpu{n}.{w}.{w}.{w}",
    "gpus.{w}.{w}.tokens_per_s",
    // kiln cluster: the fabric test (per rail when there are several), collectives, training.
    "fabric.{w}",
    "fabric.{w}.{w}",
    "coll.{w}.busbw_gbs_max",
    "coll.{w}.time_us_smallest",
    "coll.nccl.{w}.busbw_gbs_max",
    "coll.nccl.{w}.time_us_smallest",
    "cluster.train.{w}",
    "cluster.train.nccl.{w}",
];

fn word(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// Whether `name` matches `pattern`. A `{w}` takes as few characters as lets the rest match.
pub fn matches(pattern: &str, name: &str) -> bool {
    if let Some(rest) = pattern.strip_prefix("{n}") {
        let digits = name.chars().take_while(char::is_ascii_digit).count();
        return (1..=digits).any(|k| matches(rest, &name[k..]));
    }
    if let Some(rest) = pattern.strip_prefix("{w}") {
        let len = name.chars().take_while(|&c| word(c)).count();
        return (1..=len).any(|k| matches(rest, &name[k..]));
    }
    match (pattern.chars().next(), name.chars().next()) {
        (None, None) => true,
        (Some(p), Some(c)) if p == c => matches(&pattern[p.len_utf8()..], &name[c.len_utf8()..]),
        _ => false,
    }
}

/// Whether a benchmark stores `name`.
pub fn is_stored(name: &str) -> bool {
    STORED.iter().any(|p| matches(p, name))
}

/// Whether a spec's metric (where `{n}` stands for any number) names what a benchmark stores.
pub fn spec_metric_is_stored(metric: &str) -> bool {
    is_stored(&metric.replace("{n}", "0"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_whole_names_only() {
        assert!(is_stored("membw.node1.triad_gbps"));
        assert!(is_stored("gemm.f32.1024.gflops"));
        assert!(is_stored("gemm.mkl.bf16.4096.gflops"));
        assert!(is_stored("disk.randread_4k_qd32.iops"));
        assert!(is_stored("gpu3.p2p_to_gpu5_gbps"));
        assert!(is_stored("rdma.mlx5_0.port1.symbol_error"));
        assert!(!is_stored("membw.all.triad"), "a name cut short");
        assert!(!is_stored("gemm.f32.big.gflops"), "a number where a number belongs");
        assert!(!is_stored("train.tiny.tokens_per_second"), "a renamed metric");
        assert!(!is_stored("membw.all.triad_gbps.extra"));
        assert!(spec_metric_is_stored("membw.node{n}.triad_gbps"));
        assert!(!spec_metric_is_stored("membw.node{n}.triad"));
    }

    /// Every `[[performance]]` metric of the shipped specs is one a benchmark stores.
    #[test]
    fn every_shipped_spec_metric_is_stored_by_a_benchmark() {
        for (file, text) in crate::spec::BUILT_IN {
            let spec: crate::spec::SkuSpec = toml::from_str(text).unwrap();
            for p in &spec.performance {
                let metric = &p.get_ref().metric;
                assert!(spec_metric_is_stored(metric), "{file}: {metric} is none that a benchmark stores");
            }
        }
    }
}

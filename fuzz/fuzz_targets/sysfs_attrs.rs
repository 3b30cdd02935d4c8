//! The one-line sysfs and procfs attributes (and a PCI function's uevent): link speeds, AER counters, NUMA nodes, CPU lists and
//! masks, distances, os-release. A CPU list that parses must format back to the same set.
#![no_main]
use libfuzzer_sys::fuzz_target;

use kiln_inventory::{cpulist, numa, os, pci};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    std::hint::black_box(pci::parse_link_speed(&text).and_then(pci::pcie_gen));
    std::hint::black_box(pci::parse_aer_total(&text));
    std::hint::black_box(pci::parse_uevent(&text));
    std::hint::black_box(pci::parse_numa_node(&text));
    std::hint::black_box(numa::parse_distances(&text));
    std::hint::black_box(os::parse_os_release(&text));
    std::hint::black_box(cpulist::parse_mask(&text));
    if let Some(ids) = cpulist::parse_list(&text) {
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(cpulist::parse_list(&cpulist::format_list(&sorted)).unwrap_or_default(), sorted);
    }
});

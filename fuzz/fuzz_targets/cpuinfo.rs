//! `/proc/cpuinfo` of any architecture: never panics, whatever the bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let info = kiln_inventory::cpu::parse_cpuinfo(&text);
    std::hint::black_box(info);
});

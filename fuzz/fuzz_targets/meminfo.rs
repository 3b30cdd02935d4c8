//! `/proc/meminfo` and the bracketed sysfs choices (`always [madvise] never`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    std::hint::black_box(kiln_inventory::memory::parse_meminfo(&text));
    std::hint::black_box(kiln_inventory::memory::parse_bracketed(&text));
});

//! The kernel log, for XID events.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    std::hint::black_box(kiln_inventory::kmsg::parse_xids(&text));
});

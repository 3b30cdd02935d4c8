//! A `kiln export` file as `kiln import` checks it before writing anything.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = std::hint::black_box(kiln_db::check_export("fuzz.jsonl", text));
});

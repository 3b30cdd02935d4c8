//! A SKU spec (`specs/*.toml`) and the quantities in it: errors with a position, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = std::hint::black_box(kiln_sku::spec::parse("fuzz.toml", text.to_string()));
    let _ = std::hint::black_box(kiln_sku::spec::units::parse_any(text));
});

//! An image spec (`images/*.toml`): errors, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = std::hint::black_box(kiln_provision::image::parse(std::path::Path::new("/nonexistent/fuzz/image.toml"), text.to_string()));
});

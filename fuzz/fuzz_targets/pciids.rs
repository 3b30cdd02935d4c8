//! A pci.ids database (the system's copy wins over the shipped one, so it is outside input).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data).into_owned();
    let ids = kiln_inventory::pciids::PciIds::parse(std::borrow::Cow::Owned(text), "fuzz".into());
    std::hint::black_box(ids.vendor(0x10de));
    std::hint::black_box(ids.device(0x10de, 0x2330));
    std::hint::black_box(ids.subsystem(0x10de, 0x2330, 0x10de, 0x16c1));
    std::hint::black_box(ids.class(3, 2, 0));
});

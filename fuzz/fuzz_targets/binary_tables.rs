//! Binary tables read from the machine: SMBIOS type 17 (DIMMs), the NVMe SMART page, PCI config
//! space (ACS).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    std::hint::black_box(kiln_inventory::smbios::parse_memory_devices(data));
    std::hint::black_box(kiln_inventory::nvme::parse_smart(data));
    std::hint::black_box(kiln_inventory::pci::parse_acs(data));
});

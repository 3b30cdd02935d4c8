//! What a server model must be, and whether this box is it: SKU specs (`spec`: `specs/*.toml`,
//! strictly loaded, a typed unit on every quantity) and the verdict (`verdict`: a pure judgement of
//! one box's stored evidence against a spec). "Spec" in kiln means this; the provisioning images
//! (`images/*.toml`) are `kiln_provision::image`.

pub mod spec;
pub mod verdict;

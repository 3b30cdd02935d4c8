//! The candle-kernels entry points kiln-gpu's CUDA paths ask candle for, checked by name against
//! the PTX that candle-kernels ships (the test runs with the CUDA build: `.ci/run` runs it against
//! the toolkit's libraries and the driver stub, no GPU needed). candle looks a kernel up by name
//! when it first launches it, so a name candle asks for and the PTX lacks fails only on a GPU,
//! with CUDA_ERROR_NOT_FOUND: this is where a candle upgrade that renames one is caught first.

#[cfg(all(test, feature = "cuda"))]
mod tests {
    /// Every entry point of candle's PTX modules, as `.entry name(` declares it.
    fn entries() -> std::collections::BTreeSet<String> {
        use candle_kernels as k;
        let modules = [k::AFFINE, k::BINARY, k::CAST, k::FILL, k::INDEXING, k::REDUCE, k::TERNARY, k::UNARY];
        modules
            .iter()
            .flat_map(|m| m.ptx().lines())
            .filter_map(|l| l.split(".entry ").nth(1))
            .map(|rest| rest.split('(').next().unwrap_or_default().trim().to_string())
            .collect()
    }

    /// The kernels kiln-gpu's measurements reach through candle on a GPU: the GEMM's check
    /// (sampled rows and columns, widened to f32), a sweep's inputs (drawn in f32, cast to the
    /// type), contiguous copies, and the training loop's elementwise work, reductions, casts for
    /// bf16 products and embedding lookups.
    const USED: &[&str] = &[
        "is_u32_f32",
        "is_u32_bf16",
        "is_u32_f16",
        "cast_f32_bf16",
        "cast_bf16_f32",
        "cast_f32_f16",
        "cast_f16_f32",
        "ucopy_f32",
        "ucopy_bf16",
        "ucopy_f16",
        "copy2d_f32",
        "affine_f32",
        "badd_f32",
        "bsub_f32",
        "bmul_f32",
        "bdiv_f32",
        "bmaximum_f32",
        "uexp_f32",
        "usqrt_f32",
        "usqr_f32",
        "uneg_f32",
        "ugelu_f32",
        "fast_sum_f32",
        "fast_max_f32",
        "where_u8_f32",
        "fill_f32",
        "const_set_f32",
    ];

    #[test]
    fn every_kernel_kiln_asks_candle_for_is_in_its_ptx() {
        let have = entries();
        assert!(have.len() > 500, "only {} entry points: is the PTX read right?", have.len());
        let missing: Vec<&&str> = USED.iter().filter(|n| !have.contains(**n)).collect();
        assert!(missing.is_empty(), "candle-kernels lacks {missing:?}");
    }

    /// candle-core 0.11.1 asks for fp8 kernels by `DType::as_str()` (`f8e4m3`) while the PTX names
    /// them `f8_e4m3` (upstream issue 3886): so kiln-gpu casts and lays out fp8 operands on the
    /// host (`fp8::transposed`, `gemm::check`, `gemm::sweep`). When this fails, candle has
    /// aligned the names: the host detours can go.
    #[test]
    fn fp8_kernels_are_still_named_apart_from_what_candle_asks() {
        let have = entries();
        for (asked, shipped) in [
            ("ucopy_f8e4m3", "ucopy_f8_e4m3"),
            ("cast_f32_f8e4m3", "cast_f32_f8_e4m3"),
            ("cast_f8e4m3_bf16", "cast_f8_e4m3_bf16"),
        ] {
            assert!(!have.contains(asked) && have.contains(shipped), "{asked} / {shipped}");
        }
    }
}

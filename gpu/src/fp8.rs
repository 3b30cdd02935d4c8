//! fp8 products: C (bf16, m×n) = A (m×k) · B (k×n) with A and B stored as e4m3, the products
//! summed in f32 — the tensor cores' fp8 path (compute capability 8.9 and newer: Ada, Hopper,
//! Blackwell), which candle's matmul does not reach.
//!
//! On CUDA, through cuBLASLt: its fp8 kernels take only the "TN" layout (the first operand
//! transposed, in cuBLAS's column-major terms). Row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ, so
//! cuBLAS's first operand is B, read transposed from a row-major Bᵀ (n×k), and its second is A as
//! stored: [`transposed`] lays Bᵀ out once, before anything is timed. The plan (descriptors,
//! layouts, the heuristic's algorithm) is made once per shape and reused, so a timed product is
//! one `cublasLtMatmul`.
//!
//! On the CPU (the tests) the same product is emulated — the e4m3 values decoded, multiplied and
//! summed in f32, the sum rounded to bf16 — so that the benchmark's timing and checking of fp8 run
//! everywhere; only the cuBLASLt call needs a GPU.

use candle_core::{backend::BackendStorage, CpuStorage, CustomOp2, DType, Layout, Shape, Tensor};

/// The first compute capability with fp8 tensor cores: Ada (8.9); Hopper is 9.0, Blackwell 10.0.
pub const FIRST_CAPABILITY: (u32, u32) = (8, 9);

/// Whether a GPU of this compute capability ("9.0") multiplies fp8 on its tensor cores.
pub fn has_fp8(compute_capability: &str) -> bool {
    let mut parts = compute_capability.split('.').map(|p| p.trim().parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor) >= FIRST_CAPABILITY,
        _ => false,
    }
}

/// Bᵀ (n×k, contiguous) from B (k×n): the layout the fp8 product reads its second operand in.
/// An fp8 operand on a GPU is laid out on the host and copied back: candle-core 0.11.1 asks the
/// GPU for `ucopy_f8e4m3`, which candle-kernels 0.11.1 exports as `ucopy_f8_e4m3` (upstream issue
/// 3886), so a strided fp8 copy on CUDA fails with CUDA_ERROR_NOT_FOUND; whole-buffer copies
/// between host and device are plain memcpys and work. (`kernels::tests` holds the names.)
pub fn transposed(b: &Tensor) -> candle_core::Result<Tensor> {
    if b.dtype() == DType::F8E4M3 && !b.device().is_cpu() {
        return b.to_device(&candle_core::Device::Cpu)?.t()?.contiguous()?.to_device(b.device());
    }
    b.t()?.contiguous()
}

/// The fp8 product, holding (on CUDA) its cuBLASLt handle, workspace and per-shape plans.
#[derive(Default)]
pub struct Fp8Product {
    #[cfg(feature = "cuda")]
    lt: std::cell::RefCell<Option<lt::Lt>>,
}

impl Fp8Product {
    pub fn new() -> Fp8Product {
        Fp8Product::default()
    }

    /// C = A·B from A (m×k) and Bᵀ (n×k, see [`transposed`]), both e4m3.
    pub fn product(&self, a: &Tensor, bt: &Tensor) -> candle_core::Result<Tensor> {
        a.apply_op2_no_bwd(bt, self)
    }
}

/// The two operands' m, n and k, each contiguous, or why not.
fn dims(l1: &Layout, l2: &Layout) -> candle_core::Result<(usize, usize, usize)> {
    let (m, k) = l1.shape().dims2()?;
    let (n, k2) = l2.shape().dims2()?;
    if k != k2 {
        candle_core::bail!("fp8 product: A is {m}×{k} but Bᵀ is {n}×{k2}");
    }
    if !l1.is_contiguous() || !l2.is_contiguous() {
        candle_core::bail!("fp8 product: both operands must be contiguous (lay Bᵀ out with fp8::transposed)");
    }
    Ok((m, n, k))
}

impl CustomOp2 for Fp8Product {
    fn name(&self) -> &'static str {
        "fp8-gemm"
    }

    /// The emulation: e4m3 decoded to f32 (exactly), products summed in f32, rounded to bf16.
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (m, n, k) = dims(l1, l2)?;
        if s1.dtype() != DType::F8E4M3 || s2.dtype() != DType::F8E4M3 {
            candle_core::bail!("fp8 product: operands are {:?} and {:?}, not e4m3", s1.dtype(), s2.dtype());
        }
        let decoded = |s: &CpuStorage, l: &Layout| -> candle_core::Result<Vec<f32>> {
            match s.to_dtype(l, DType::F32)? {
                // The layout's elements, in order, from the first.
                CpuStorage::F32(v) => Ok(v),
                _ => candle_core::bail!("fp8 product: decoding to f32 gave another type"),
            }
        };
        let (a, bt) = (decoded(s1, l1)?, decoded(s2, l2)?);
        let mut c = Vec::with_capacity(m * n);
        for row in a.chunks_exact(k) {
            for col in bt.chunks_exact(k) {
                c.push(row.iter().zip(col).map(|(x, y)| x * y).sum::<f32>());
            }
        }
        let shape = Shape::from((m, n));
        Ok((CpuStorage::F32(c).to_dtype(&Layout::contiguous(&shape), DType::BF16)?, shape))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let (m, n, k) = dims(l1, l2)?;
        let mut lt = self.lt.borrow_mut();
        if lt.is_none() {
            *lt = Some(lt::Lt::new(s1.device.cuda_stream()).map_err(lt::failed)?);
        }
        let lt = lt.as_mut().expect("made above");
        let c = lt.product(s1, l1, s2, l2, (m, n, k)).map_err(lt::failed)?;
        Ok((candle_core::CudaStorage::wrap_cuda_slice(c, s1.device.clone()), Shape::from((m, n))))
    }
}

#[cfg(feature = "cuda")]
mod lt {
    //! cuBLASLt's fp8 matmul through cudarc's raw bindings (its safe API covers f32, f16 and
    //! bf16): the handle, a workspace, and one plan per shape, each freed when dropped.

    use std::collections::HashMap;
    use std::ffi::c_void;
    use std::sync::Arc;

    use candle_core::cuda_backend::cudarc::cublaslt::{result, sys};
    use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
    use candle_core::Layout;
    use half::bf16;

    /// Hopper's recommended cuBLASLt workspace (cudarc sizes it the same).
    const WORKSPACE: usize = 32 << 20;

    pub(super) fn failed(e: impl std::fmt::Display) -> candle_core::Error {
        candle_core::Error::Msg(format!("fp8 product (cuBLASLt): {e}"))
    }

    pub(super) struct Lt {
        stream: Arc<CudaStream>,
        handle: sys::cublasLtHandle_t,
        workspace: CudaSlice<u8>,
        plans: HashMap<(usize, usize, usize), Plan>,
    }

    impl Lt {
        pub(super) fn new(stream: Arc<CudaStream>) -> anyhow::Result<Lt> {
            let handle = result::create_handle()?;
            // SAFETY: a byte buffer cuBLASLt only writes scratch into; never read by kiln.
            let workspace = unsafe { stream.alloc::<u8>(WORKSPACE) }?;
            Ok(Lt { stream, handle, workspace, plans: HashMap::new() })
        }

        /// C (m×n row-major, bf16) = A·B with A (m×k) and Bᵀ (n×k) in e4m3.
        pub(super) fn product(
            &mut self,
            s1: &candle_core::CudaStorage,
            l1: &Layout,
            s2: &candle_core::CudaStorage,
            l2: &Layout,
            (m, n, k): (usize, usize, usize),
        ) -> anyhow::Result<CudaSlice<bf16>> {
            if !self.plans.contains_key(&(m, n, k)) {
                let plan = Plan::new(self.handle, (m, n, k))?;
                self.plans.insert((m, n, k), plan);
            }
            let plan = &self.plans[&(m, n, k)];
            let a = s1.as_cuda_slice::<float8::F8E4M3>()?.slice(l1.start_offset()..l1.start_offset() + m * k);
            let bt = s2.as_cuda_slice::<float8::F8E4M3>()?.slice(l2.start_offset()..l2.start_offset() + n * k);
            // SAFETY: every element is written by the product (beta = 0: C is not read).
            let mut c = unsafe { self.stream.alloc::<bf16>(m * n) }?;
            let (alpha, beta) = (1.0f32, 0.0f32);
            {
                // The guards record the product on each buffer's stream when they drop.
                let (a_ptr, _a) = a.device_ptr(&self.stream);
                let (bt_ptr, _bt) = bt.device_ptr(&self.stream);
                let (c_ptr, _c) = c.device_ptr_mut(&self.stream);
                let (w_ptr, _w) = self.workspace.device_ptr_mut(&self.stream);
                // SAFETY: the pointers are live device buffers of the sizes the plan's layouts
                // describe (Bᵀ: k×n column-major, A: k×m column-major, C: n×m column-major), on the
                // stream the product is queued on; the guards above keep them until it is queued.
                unsafe {
                    result::matmul(
                        self.handle,
                        plan.desc.0,
                        (&alpha) as *const f32 as *const c_void,
                        (&beta) as *const f32 as *const c_void,
                        bt_ptr as *const c_void,
                        plan.first.0,
                        a_ptr as *const c_void,
                        plan.second.0,
                        c_ptr as *const c_void,
                        plan.out.0,
                        c_ptr as *mut c_void,
                        plan.out.0,
                        &plan.algo,
                        w_ptr as *mut c_void,
                        WORKSPACE,
                        self.stream.cu_stream() as sys::cudaStream_t,
                    )?;
                }
            }
            Ok(c)
        }
    }

    impl Drop for Lt {
        fn drop(&mut self) {
            self.plans.clear();
            // SAFETY: made by create_handle, dropped once; its plans were freed just above.
            let _ = unsafe { result::destroy_handle(self.handle) };
        }
    }

    struct Desc(sys::cublasLtMatmulDesc_t);
    impl Drop for Desc {
        fn drop(&mut self) {
            // SAFETY: made by create_matmul_desc, dropped once.
            let _ = unsafe { result::destroy_matmul_desc(self.0) };
        }
    }
    struct MatrixLayout(sys::cublasLtMatrixLayout_t);
    impl Drop for MatrixLayout {
        fn drop(&mut self) {
            // SAFETY: made by create_matrix_layout, dropped once.
            let _ = unsafe { result::destroy_matrix_layout(self.0) };
        }
    }
    struct Pref(sys::cublasLtMatmulPreference_t);
    impl Drop for Pref {
        fn drop(&mut self) {
            // SAFETY: made by create_matmul_pref, dropped once.
            let _ = unsafe { result::destroy_matmul_pref(self.0) };
        }
    }

    /// One shape's descriptors and the algorithm cuBLASLt's heuristic chose for it.
    struct Plan {
        desc: Desc,
        first: MatrixLayout,
        second: MatrixLayout,
        out: MatrixLayout,
        algo: sys::cublasLtMatmulAlgo_t,
    }

    impl Plan {
        fn new(handle: sys::cublasLtHandle_t, (m, n, k): (usize, usize, usize)) -> anyhow::Result<Plan> {
            let e4m3 = sys::cudaDataType_t::CUDA_R_8F_E4M3;
            let desc = Desc(result::create_matmul_desc(
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cudaDataType_t::CUDA_R_32F,
            )?);
            let set = |attr: sys::cublasLtMatmulDescAttributes_t, value: i32| {
                // SAFETY: a 4-byte attribute (cublasOperation_t) read during the call.
                unsafe {
                    result::set_matmul_desc_attribute(
                        desc.0,
                        attr,
                        (&value) as *const i32 as *const c_void,
                        std::mem::size_of::<i32>(),
                    )
                }
            };
            // cuBLAS's first operand (B, stored as Bᵀ) transposed, its second (A) not: TN.
            set(sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA, 1)?;
            set(sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB, 0)?;
            let (m, n, k) = (m as u64, n as u64, k as u64);
            let first = MatrixLayout(result::create_matrix_layout(e4m3, k, n, k as i64)?);
            let second = MatrixLayout(result::create_matrix_layout(e4m3, k, m, k as i64)?);
            let out = MatrixLayout(result::create_matrix_layout(sys::cudaDataType_t::CUDA_R_16BF, n, m, n as i64)?);
            let pref = Pref(result::create_matmul_pref()?);
            // SAFETY: an 8-byte attribute (size_t) read during the call.
            unsafe {
                result::set_matmul_pref_attribute(
                    pref.0,
                    sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                    (&WORKSPACE) as *const usize as *const c_void,
                    std::mem::size_of::<usize>(),
                )?;
            }
            // SAFETY: every descriptor is live; the heuristic only reads them.
            let heuristic =
                unsafe { result::get_matmul_algo_heuristic(handle, desc.0, first.0, second.0, out.0, out.0, pref.0) }
                    .map_err(|e| {
                    anyhow::anyhow!("no fp8 algorithm for {m}×{n}×{k} (dimensions must be multiples of 16): {e}")
                })?;
            Ok(Plan { desc, first, second, out, algo: heuristic.algo })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn capabilities_with_fp8_tensor_cores() {
        assert!(has_fp8("9.0") && has_fp8("8.9") && has_fp8("10.0") && has_fp8("12.0"));
        assert!(!has_fp8("8.0") && !has_fp8("8.6") && !has_fp8("7.5") && !has_fp8("") && !has_fp8("nine"));
    }

    /// The CPU emulation is the product of the e4m3 values, rounded to bf16.
    #[test]
    fn the_emulated_product_is_the_product_of_the_stored_values() {
        let a = Tensor::new(&[[1.0f32, 2.0, 0.5], [-1.5, 0.25, 4.0]], &Device::Cpu)
            .unwrap()
            .to_dtype(DType::F8E4M3)
            .unwrap();
        let b = Tensor::new(&[[1.0f32, -2.0], [0.5, 3.0], [2.0, 0.125]], &Device::Cpu)
            .unwrap()
            .to_dtype(DType::F8E4M3)
            .unwrap();
        let c = Fp8Product::new().product(&a, &transposed(&b).unwrap()).unwrap();
        assert_eq!(c.dtype(), DType::BF16);
        let got: Vec<Vec<f32>> = c.to_dtype(DType::F32).unwrap().to_vec2().unwrap();
        assert_eq!(got, vec![vec![3.0, 4.0625], vec![6.625, 4.25]]);
        // Not transposed first: shapes that do not fit are refused, not multiplied.
        assert!(Fp8Product::new().product(&a, &b).is_err());
        assert!(Fp8Product::new().product(&a.to_dtype(DType::F32).unwrap(), &transposed(&b).unwrap()).is_err());
    }
}

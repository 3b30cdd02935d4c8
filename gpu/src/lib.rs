//! `kiln-gpu`: kiln's GPU benchmarks, in an executable of their own (this library is its
//! measurements and their documents, which kiln reads back typed). A binary built with candle's
//! CUDA backend links `libcuda.so.1` and cannot even start where no NVIDIA driver is installed,
//! and commissioning installs that driver: so `kiln` itself never links CUDA, and is to run this
//! program, shipped beside it, when NVML finds GPUs (`kiln bench gpu …`, in `app/src/runs/gpu/`,
//! launched through [`child`]). It answers one JSON document on stdout per command, `{"error": …}` with exit status 2
//! when it cannot measure.
//!
//! Built without the `cuda` feature (the default, so that the workspace builds anywhere) it says
//! what to build. `deploy/cuda/cuda-root.sh` assembles the CUDA toolkit the `cuda` build needs.

pub mod bandwidth;
pub mod child;
pub mod collectives;
pub mod fp8;
pub mod gemm;
pub mod kernels;
pub mod p2p;
pub mod request;
pub mod train;

use serde::{Deserialize, Serialize};

/// The version of every document `kiln-gpu` prints.
pub const SCHEMA_VERSION: u32 = 1;

/// A CUDA device as the driver describes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    /// "9.0" for H100/H200, "10.0" for B200.
    pub compute_capability: String,
    pub memory_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Devices {
    pub devices: Vec<DeviceInfo>,
}

/// The CUDA release the GPU build is compiled with (deploy/cuda/cuda-root.sh pins 13.0), as the
/// driver API numbers releases (1000 × major + 10 × minor). Its kernels are PTX of that release,
/// which no older driver can compile, so the driver must support at least this.
pub const BUILT_FOR_CUDA: i32 = 13_000;

/// The driver floor of the GPU build: `driver_cuda` is what `cuDriverGetVersion` reports (the
/// newest CUDA release the installed driver supports). A driver below it would fail later and
/// obscurely (PTX it cannot compile, cuBLAS that will not start); this says why, first.
pub fn driver_supports_build(driver_cuda: i32) -> anyhow::Result<()> {
    if driver_cuda < BUILT_FOR_CUDA {
        anyhow::bail!(
            "the NVIDIA driver supports CUDA {}.{} at most, and kiln-gpu is built with CUDA {}.{}, which needs \
             driver 580.65.06 or newer: provision a newer driver (images/nvidia-cuda13.0-*.toml)",
            driver_cuda / 1000,
            driver_cuda % 1000 / 10,
            BUILT_FOR_CUDA / 1000,
            BUILT_FOR_CUDA % 1000 / 10
        );
    }
    Ok(())
}

/// The compute capability candle's kernels were built for (`CUDA_COMPUTE_CAP` at build time, as
/// "90"); empty where the build did not say.
pub const BUILT_FOR_CAPABILITY: &str = env!("KILN_GPU_COMPUTE_CAP");

/// Whether a GPU of compute capability `device` (major, minor) can load candle's kernels built for
/// `built` ("90"): they are compiled for that one architecture (sm_90a's code runs on 9.0 only),
/// so any other GPU would fail at its first kernel with CUDA_ERROR_NO_BINARY_FOR_GPU or an
/// invalid PTX; this says so before any work, with what to build.
///
/// # Errors
/// Another capability than the build's.
pub fn capability_in_build(ordinal: usize, device: (i32, i32), built: &str) -> anyhow::Result<()> {
    let Ok(cap) = built.trim().parse::<i32>() else { return Ok(()) };
    let (major, minor) = device;
    if (major, minor) != (cap / 10, cap % 10) {
        anyhow::bail!(
            "GPU {ordinal} is of compute capability {major}.{minor}, and this kiln-gpu's kernels are built for {}.{} only \
             (CUDA_COMPUTE_CAP={cap}): build kiln-gpu for this GPU with CUDA_COMPUTE_CAP={major}{minor} \
             (deploy/cuda/cuda-root.sh), or use the package built for it",
            cap / 10,
            cap % 10
        );
    }
    Ok(())
}

#[cfg(feature = "cuda")]
pub mod backend {
    use crate::{bandwidth, gemm, p2p, DeviceInfo, Devices};
    use anyhow::Context;
    use candle_core::cuda_backend::cudarc::driver::{sys, sys::CUdevice_attribute, CudaContext};

    /// The installed driver is new enough for this build ([`crate::driver_supports_build`]),
    /// asked before any command touches a device.
    pub fn check_driver() -> anyhow::Result<()> {
        let mut version: std::ffi::c_int = 0;
        // SAFETY: cuDriverGetVersion writes one int through the pointer it is given, which lives
        // for the call; it needs no cuInit.
        let status = unsafe { sys::cuDriverGetVersion(&mut version) };
        if status != sys::CUresult::CUDA_SUCCESS {
            anyhow::bail!("the NVIDIA driver does not say which CUDA it supports (cuDriverGetVersion: {status:?})");
        }
        crate::driver_supports_build(version)
    }

    /// One CUDA device as candle uses it, and its name. Only this device is touched: a context
    /// on every GPU (as [`devices`] makes for `kiln-gpu devices`) would disturb runs measuring the
    /// others at the same time, and fails outright where a GPU is in EXCLUSIVE_PROCESS mode. Its
    /// cuBLAS handle sums partial products in f32 ([`exact_reductions`]).
    fn open(ordinal: usize) -> anyhow::Result<(candle_core::Device, Option<String>)> {
        let device = candle_core::Device::new_cuda(ordinal)
            .with_context(|| format!("opening CUDA device {ordinal} (is the NVIDIA driver loaded?)"))?;
        let candle_core::Device::Cuda(cuda) = &device else { unreachable!("new_cuda makes a CUDA device") };
        let context = cuda.cuda_stream().context().clone();
        let capability = context.compute_capability().with_context(|| format!("CUDA device {ordinal}"))?;
        crate::capability_in_build(ordinal, capability, crate::BUILT_FOR_CAPABILITY)?;
        let name = context.name().ok();
        exact_reductions(cuda)?;
        Ok((device, name))
    }

    /// cuBLAS may sum a split-K product's partial results in its output type (bf16, f16) unless
    /// the handle forbids it (`CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION`), and candle never
    /// does: a bf16 reduction of a small m·n, large k product can fail kiln's accuracy check on a
    /// healthy GPU. Every product kiln-gpu checks is therefore reduced in f32, as the check's bound
    /// assumes (TF32 stays a compute type candle chooses per call). No CPU test can show this: it
    /// is cuBLAS's choice of kernel on a GPU.
    fn exact_reductions(cuda: &candle_core::CudaDevice) -> anyhow::Result<()> {
        use candle_core::cuda_backend::cudarc::cublas::sys;
        let blas = cuda.cublas_handle();
        // SAFETY: the handle is candle's live cuBLAS handle of this device, kept alive by `blas`
        // for the call; the math mode is a host-side setting read by later calls on the handle.
        let status = unsafe {
            sys::cublasSetMathMode(*blas.handle(), sys::cublasMath_t::CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)
        };
        anyhow::ensure!(
            status == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS,
            "cuBLAS refused its math mode: {status:?}"
        );
        Ok(())
    }

    /// Every CUDA device the driver sees.
    pub fn devices() -> anyhow::Result<Devices> {
        let count = CudaContext::device_count().context("the CUDA driver cannot count its devices")?;
        let mut devices = Vec::new();
        for ordinal in 0..count as usize {
            let ctx = CudaContext::new(ordinal).with_context(|| format!("opening CUDA device {ordinal}"))?;
            let major = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
            let minor = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
            devices.push(DeviceInfo {
                ordinal,
                name: ctx.name()?,
                compute_capability: format!("{major}.{minor}"),
                memory_bytes: ctx.total_mem()? as u64,
            });
        }
        Ok(Devices { devices })
    }

    pub fn gemm(options: &gemm::Options) -> anyhow::Result<gemm::Report> {
        let (device, name) = open(options.device)?;
        gemm::measure(&device, options, name)
    }

    pub fn burn(options: &gemm::BurnOptions) -> anyhow::Result<gemm::Burn> {
        let (device, name) = open(options.device)?;
        gemm::burn(&device, options, name)
    }

    /// The reference training run on one GPU.
    pub fn train(options: &crate::train::Options) -> anyhow::Result<crate::train::Report> {
        let (device, name) = open(options.device)?;
        match &options.as_rank {
            None => crate::train::measure(&device, options, name, |_, _, _| {}, None),
            Some(rank) => {
                let mut dp = nccl_gradients(&device, rank)?;
                crate::train::measure(&device, options, name, |_, _, _| {}, Some(&mut *dp))
            }
        }
    }

    /// Gradients summed over the job's ranks through NCCL where they lie, in the GPU's memory (one
    /// all-reduce of every gradient a step, on candle's own stream, so it runs in order with the
    /// step's kernels); `all_reduce_sum` (host slices, staged through the GPU) stays for callers
    /// with host data.
    #[cfg(feature = "nccl")]
    fn nccl_gradients(
        device: &candle_core::Device,
        r: &crate::collectives::AsRank,
    ) -> anyhow::Result<Box<dyn kiln_bench::train::DataParallel>> {
        use candle_core::cuda_backend::cudarc::driver::CudaStream;
        use candle_core::cuda_backend::cudarc::nccl::{Comm, Id, ReduceOp};
        struct Nccl {
            comm: Comm,
            stream: std::sync::Arc<CudaStream>,
        }
        impl kiln_bench::train::DataParallel for Nccl {
            fn rank(&self) -> usize {
                self.comm.rank()
            }
            fn ranks(&self) -> usize {
                self.comm.world_size()
            }
            fn all_reduce_sum(&mut self, values: &mut [f32]) -> candle_core::Result<()> {
                let failed = |what: &str, e: String| candle_core::Error::Msg(format!("NCCL all-reduce: {what}: {e}"));
                let mut buffer = self.stream.clone_htod(values).map_err(|e| failed("to the GPU", e.to_string()))?;
                self.comm
                    .all_reduce_in_place(&mut buffer, &ReduceOp::Sum)
                    .map_err(|e| failed("the reduction", format!("{e:?}")))?;
                self.stream.memcpy_dtoh(&buffer, values).map_err(|e| failed("back from the GPU", e.to_string()))?;
                self.stream.synchronize().map_err(|e| failed("waiting", e.to_string()))
            }
            fn all_reduce_tensor(&mut self, flat: &candle_core::Tensor) -> candle_core::Result<candle_core::Tensor> {
                flat.inplace_op1(&DeviceSum(&self.comm))?;
                Ok(flat.clone())
            }
        }
        /// The in-place NCCL sum of a tensor in GPU memory.
        struct DeviceSum<'a>(&'a Comm);
        impl candle_core::InplaceOp1 for DeviceSum<'_> {
            fn name(&self) -> &'static str {
                "nccl-all-reduce"
            }
            fn cpu_fwd(&self, _: &mut candle_core::CpuStorage, _: &candle_core::Layout) -> candle_core::Result<()> {
                candle_core::bail!("NCCL sums tensors in GPU memory, not on the CPU")
            }
            fn cuda_fwd(&self, s: &mut candle_core::CudaStorage, l: &candle_core::Layout) -> candle_core::Result<()> {
                let Some((start, end)) = l.contiguous_offsets() else {
                    candle_core::bail!("NCCL all-reduce: the gradients' buffer is not contiguous")
                };
                let mut view = s.as_cuda_slice_mut::<f32>()?.slice_mut(start..end);
                self.0
                    .all_reduce_in_place(&mut view, &ReduceOp::Sum)
                    .map_err(|e| candle_core::Error::Msg(format!("NCCL all-reduce of the gradients: {e:?}")))?;
                Ok(())
            }
        }
        let candle_core::Device::Cuda(cuda) = device else { anyhow::bail!("NCCL needs a CUDA device") };
        let stream = cuda.cuda_stream();
        // NCCL joins on the calling thread's current device, and cudarc leaves current whichever
        // context was made or dropped last (any other GPU this process touched): bind this rank's
        // own first, or every rank's communicator lands on one GPU. No CPU test can show it.
        stream.context().bind_to_thread().context("making the rank's own GPU current")?;
        nccl_root(&r.root);
        let internal: [std::ffi::c_char; 128] = r.id.map(|b| b as std::ffi::c_char);
        let comm = Comm::from_rank(stream.clone(), r.rank, r.ranks, Id::uninit(internal))
            .map_err(|e| anyhow::anyhow!("rank {} of {}: NCCL cannot join the job: {e:?}", r.rank, r.ranks))?;
        Ok(Box::new(Nccl { comm, stream }))
    }

    #[cfg(not(feature = "nccl"))]
    fn nccl_gradients(
        _: &candle_core::Device,
        _: &crate::collectives::AsRank,
    ) -> anyhow::Result<Box<dyn kiln_bench::train::DataParallel>> {
        anyhow::bail!("kiln-gpu was built without NCCL: build it with `--features cuda,nccl`")
    }

    pub fn sweep(options: &gemm::SweepOptions) -> anyhow::Result<gemm::Sweep> {
        let (device, name) = open(options.device)?;
        gemm::sweep(&device, options, name)
    }

    /// Device copy, host to device and device to host on one GPU, each copy checked.
    pub fn bandwidth(o: &bandwidth::Options) -> anyhow::Result<bandwidth::Report> {
        use crate::bandwidth::{pattern, Copies};
        use candle_core::cuda_backend::cudarc::driver::{sys::CUevent_flags, DriverError};
        if let Some(cpus) = &o.cpus {
            // Before any host buffer: page-locked memory lands on these CPUs' node.
            crate::bandwidth::pin_to(cpus)?;
        }
        let ctx = CudaContext::new(o.device).with_context(|| format!("opening CUDA device {}", o.device))?;
        let stream = ctx.default_stream();
        let n = o.bytes;
        // SAFETY: filled with the pattern below before anything reads it.
        let mut host = unsafe { ctx.alloc_pinned_with_flags::<u8>(n, 0) }
            .with_context(|| format!("{} MiB of page-locked host memory", n >> 20))?;
        host.as_mut_slice()?.iter_mut().enumerate().for_each(|(i, b)| *b = pattern(i));
        let mut a = stream.alloc_zeros::<u8>(n).context("device memory")?;
        let mut b = stream.alloc_zeros::<u8>(n).context("device memory")?;
        let start = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let end = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        // Three untimed copies, then each timed by events around it alone.
        let timed = |copy: &mut dyn FnMut() -> Result<(), DriverError>| -> anyhow::Result<Vec<f64>> {
            for _ in 0..3 {
                copy()?;
            }
            stream.synchronize()?;
            let mut seconds = Vec::with_capacity(o.reps);
            for _ in 0..o.reps {
                start.record(&stream)?;
                copy()?;
                end.record(&stream)?;
                seconds.push(f64::from(start.elapsed_ms(&end)?) / 1e3);
            }
            Ok(seconds)
        };
        let intact = |bytes: &[u8]| bytes.iter().enumerate().all(|(i, &x)| x == pattern(i));
        let h2d = timed(&mut || stream.memcpy_htod(&host, &mut a))?;
        let h2d_intact = intact(&stream.clone_dtoh(&a)?);
        let d2d = timed(&mut || stream.memcpy_dtod(&a, &mut b))?;
        let d2d_intact = intact(&stream.clone_dtoh(&b)?);
        // The triad: a = b + 3·c over f32 values small enough that every result is exact. Its
        // failure (a driver too old for the PTX) is reported beside the copies, not instead of them.
        let triad = (|| -> anyhow::Result<Copies> {
            use candle_core::cuda_backend::cudarc::driver::{sys::CUdevice_attribute, LaunchConfig, PushKernelArg};
            use candle_core::cuda_backend::cudarc::nvrtc::Ptx;
            let ptx = include_str!(concat!(env!("OUT_DIR"), "/triad.ptx"));
            let kernel = ctx.load_module(Ptx::from_src(ptx))?.load_function("kiln_triad")?;
            let floats = n / 4;
            let bh: Vec<f32> = (0..floats).map(|i| (i % 1024) as f32).collect();
            let ch: Vec<f32> = (0..floats).map(|i| (i * 7 % 1024) as f32).collect();
            let (tb, tc) = (stream.clone_htod(&bh)?, stream.clone_htod(&ch)?);
            let mut ta = stream.alloc_zeros::<f32>(floats).context("device memory")?;
            let sms = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
            let cfg =
                LaunchConfig { grid_dim: (sms.max(1) as u32 * 8, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            let (s, n4) = (3.0f32, (floats / 4) as u64);
            let seconds = timed(&mut || {
                let mut launch = stream.launch_builder(&kernel);
                launch.arg(&mut ta).arg(&tb).arg(&tc).arg(&s).arg(&n4);
                // SAFETY: the arguments are kiln_triad's, in its order; each array holds n4 float4s.
                unsafe { launch.launch(cfg) }.map(|_| ())
            })?;
            let got = stream.clone_dtoh(&ta)?;
            let right = got.iter().zip(bh.iter().zip(&ch)).all(|(&a, (&b, &c))| a == b + s * c);
            Ok(Copies::new(3.0 * n as f64, seconds, right))
        })();
        host.as_mut_slice()?.fill(0);
        let d2h = timed(&mut || stream.memcpy_dtoh(&b, &mut host))?;
        stream.synchronize()?;
        let d2h_intact = intact(host.as_slice()?);
        let bytes = n as f64;
        Ok(bandwidth::Report {
            device: o.device,
            name: ctx.name().ok(),
            bytes: n,
            cpus: o.cpus.clone(),
            device_copy: Copies::new(2.0 * bytes, d2d, d2d_intact),
            triad_error: triad.as_ref().err().map(|e| format!("{e:#}")),
            triad: triad.ok(),
            host_to_device: Copies::new(bytes, h2d, h2d_intact),
            device_to_host: Copies::new(bytes, d2h, d2h_intact),
        })
    }
    /// Device memory from `cuMemAlloc` in one context, freed on drop. Peer copies use these rather
    /// than cudarc's buffers: cudarc allocates from the stream-ordered pool, which
    /// `cuCtxEnablePeerAccess` does not open to peers, and its copies between contexts make the
    /// destination's stream wait on the source's, which turns "both ways at once" into one way
    /// after the other.
    struct PeerBuffer {
        ctx: std::sync::Arc<CudaContext>,
        ptr: sys::CUdeviceptr,
        bytes: usize,
    }

    impl PeerBuffer {
        fn new(ctx: &std::sync::Arc<CudaContext>, bytes: usize) -> anyhow::Result<PeerBuffer> {
            use candle_core::cuda_backend::cudarc::driver::result;
            ctx.bind_to_thread()?;
            // SAFETY: the context is current; the pointer is freed once, on drop.
            let ptr = unsafe { result::malloc_sync(bytes) }?;
            Ok(PeerBuffer { ctx: ctx.clone(), ptr, bytes })
        }

        fn fill(&self, data: Option<&[u8]>) -> anyhow::Result<()> {
            use candle_core::cuda_backend::cudarc::driver::result;
            self.ctx.bind_to_thread()?;
            match data {
                Some(d) => {
                    anyhow::ensure!(d.len() == self.bytes, "{} bytes for a buffer of {}", d.len(), self.bytes);
                    // SAFETY: the buffer is live and as long as `d`, in the current context.
                    unsafe { result::memcpy_htod_sync(self.ptr, d) }?
                }
                // SAFETY: the buffer is live and `bytes` long, in the current context.
                None => unsafe { result::memset_d8_sync(self.ptr, 0, self.bytes) }?,
            }
            Ok(())
        }

        fn read(&self) -> anyhow::Result<Vec<u8>> {
            use candle_core::cuda_backend::cudarc::driver::result;
            self.ctx.bind_to_thread()?;
            self.ctx.synchronize()?;
            let mut out = vec![0u8; self.bytes];
            // SAFETY: the buffer is live and as long as `out`; the context's work is done.
            unsafe { result::memcpy_dtoh_sync(&mut out, self.ptr) }?;
            Ok(out)
        }
    }

    impl Drop for PeerBuffer {
        fn drop(&mut self) {
            use candle_core::cuda_backend::cudarc::driver::result;
            if self.ctx.bind_to_thread().is_ok() {
                // SAFETY: allocated by `new` in this context, freed only here.
                let _ = unsafe { result::free_sync(self.ptr) };
            }
        }
    }

    /// Queues `bytes` from `src` to `dst` on `stream` (`cuMemcpyPeerAsync`): nothing else is
    /// queued with it. The stream's context must be current.
    fn peer_copy(
        dst: &PeerBuffer,
        src: &PeerBuffer,
        bytes: usize,
        stream: &candle_core::cuda_backend::cudarc::driver::CudaStream,
    ) -> anyhow::Result<()> {
        use candle_core::cuda_backend::cudarc::driver::result;
        anyhow::ensure!(bytes <= dst.bytes && bytes <= src.bytes, "a copy of {bytes} bytes past a buffer's end");
        // SAFETY: both buffers are live for the call and hold `bytes`; the stream is live.
        unsafe {
            result::memcpy_peer_async(dst.ctx.cu_ctx(), dst.ptr, src.ctx.cu_ctx(), src.ptr, bytes, stream.cu_stream())
        }?;
        Ok(())
    }

    /// Peer access wherever the driver offers it, both ways: `[i][j]`, whether device `i` reaches
    /// device `j`'s memory directly.
    fn enable_peer_access(ctxs: &[std::sync::Arc<CudaContext>], devices: &[usize]) -> anyhow::Result<Vec<Vec<bool>>> {
        let n = ctxs.len();
        let mut access = vec![vec![false; n]; n];
        for i in 0..n {
            for j in (0..n).filter(|&j| j != i) {
                let mut can = 0;
                // SAFETY: `can` outlives the call; both handles come from live contexts.
                unsafe { sys::cuDeviceCanAccessPeer(&mut can, ctxs[i].cu_device(), ctxs[j].cu_device()) }
                    .result()
                    .with_context(|| format!("asking whether device {} reaches device {}", devices[i], devices[j]))?;
                if can == 1 {
                    ctxs[i].bind_to_thread()?;
                    // SAFETY: the peer is a live context; enabling twice is reported, not harmful.
                    match unsafe { sys::cuCtxEnablePeerAccess(ctxs[j].cu_ctx(), 0) } {
                        sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
                            access[i][j] = true
                        }
                        other => other.result().with_context(|| {
                            format!("enabling peer access from device {} to device {}", devices[i], devices[j])
                        })?,
                    }
                }
            }
        }
        Ok(access)
    }

    /// The GPU × GPU copy matrix: every ordered pair one way, then every pair both ways at once,
    /// each copy checked. Each device has a copy stream of its own, and every copy goes on the
    /// receiving device's (`cuMemcpyPeerAsync` between `cuMemAlloc` buffers): the two directions
    /// of a pair run on two streams at once, and a one-way copy's timed region (two events on its
    /// stream, created before) holds the copy alone.
    pub fn p2p(o: &p2p::Options) -> anyhow::Result<p2p::Report> {
        use crate::bandwidth::{pattern, Copies};
        use candle_core::cuda_backend::cudarc::driver::{result, sys::CUevent_flags};
        use std::time::Instant;
        let count = CudaContext::device_count().context("the CUDA driver cannot count its devices")? as usize;
        let devices = o.devices.clone().unwrap_or_else(|| (0..count).collect());
        if let Some(&d) = devices.iter().find(|&&d| d >= count) {
            anyhow::bail!("device {d}: CUDA sees {count} device(s)");
        }
        anyhow::ensure!(devices.len() >= 2, "peer to peer needs two devices; CUDA sees {count}");
        let ctxs = devices
            .iter()
            .map(|&d| CudaContext::new(d).with_context(|| format!("opening CUDA device {d}")))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let n = devices.len();
        let access = enable_peer_access(&ctxs, &devices)?;
        let streams = ctxs.iter().map(|c| c.new_stream()).collect::<Result<Vec<_>, _>>()?;
        let expected: Vec<u8> = (0..o.bytes).map(pattern).collect();
        let mut src = Vec::with_capacity(n);
        let mut dst = Vec::with_capacity(n);
        for (k, ctx) in ctxs.iter().enumerate() {
            let what = || format!("{} MiB on device {}", o.bytes >> 20, devices[k]);
            let s = PeerBuffer::new(ctx, o.bytes).with_context(what)?;
            s.fill(Some(&expected)).with_context(what)?;
            src.push(s);
            dst.push(PeerBuffer::new(ctx, o.bytes).with_context(what)?);
        }
        let mut one_way = Vec::new();
        for (i, j) in p2p::ordered_pairs(&(0..n).collect::<Vec<_>>()) {
            let stream = &streams[j];
            dst[j].fill(None)?;
            let (start, end) = (
                ctxs[j].new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?,
                ctxs[j].new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?,
            );
            let time = |bytes: usize, reps: usize| -> anyhow::Result<Vec<f64>> {
                ctxs[j].bind_to_thread()?;
                for _ in 0..2 {
                    peer_copy(&dst[j], &src[i], bytes, stream)?;
                }
                stream.synchronize()?;
                let mut seconds = Vec::with_capacity(reps);
                for _ in 0..reps {
                    ctxs[j].bind_to_thread()?;
                    // SAFETY: both events and the stream are live, in the current context.
                    unsafe { result::event::record(start.cu_event(), stream.cu_stream()) }?;
                    peer_copy(&dst[j], &src[i], bytes, stream)?;
                    // SAFETY: as above.
                    unsafe { result::event::record(end.cu_event(), stream.cu_stream()) }?;
                    seconds.push(f64::from(start.elapsed_ms(&end)?) / 1e3);
                }
                Ok(seconds)
            };
            let seconds = time(o.bytes, o.reps)?;
            let small = time(p2p::SMALL_COPY.min(o.bytes), o.reps.max(20))?;
            let intact = dst[j].read()? == expected;
            let (small_copy_us, small_copy_samples_us) = p2p::small_copy(&small);
            one_way.push(p2p::Pair {
                from: devices[i],
                to: devices[j],
                peer_access: access[i][j] && access[j][i],
                copies: Copies::new(o.bytes as f64, seconds, intact),
                small_copy_us,
                small_copy_samples_us,
            });
        }
        let mut both_ways = Vec::new();
        for a in 0..n {
            for b in a + 1..n {
                dst[a].fill(None)?;
                dst[b].fill(None)?;
                // a → b on b's copy stream, b → a on a's, queued back to back; the pair's time is
                // until both are done.
                let both = || -> anyhow::Result<f64> {
                    streams[a].synchronize()?;
                    streams[b].synchronize()?;
                    let t0 = Instant::now();
                    ctxs[b].bind_to_thread()?;
                    peer_copy(&dst[b], &src[a], o.bytes, &streams[b])?;
                    ctxs[a].bind_to_thread()?;
                    peer_copy(&dst[a], &src[b], o.bytes, &streams[a])?;
                    streams[a].synchronize()?;
                    streams[b].synchronize()?;
                    Ok(t0.elapsed().as_secs_f64())
                };
                for _ in 0..2 {
                    both()?;
                }
                let seconds = (0..o.reps).map(|_| both()).collect::<anyhow::Result<Vec<f64>>>()?;
                let intact = dst[a].read()? == expected && dst[b].read()? == expected;
                both_ways.push(p2p::Both {
                    a: devices[a],
                    b: devices[b],
                    copies: Copies::new(2.0 * o.bytes as f64, seconds, intact),
                });
            }
        }
        // The buffers go before the streams and contexts they were used with.
        drop((src, dst));
        Ok(p2p::Report {
            names: ctxs.iter().map(|c| c.name().unwrap_or_default()).collect(),
            devices,
            bytes: o.bytes,
            reps: o.reps,
            one_way,
            both_ways,
        })
    }
    /// The collectives through NCCL, each size timed and checked: over the chosen GPUs of this
    /// process (one communicator each, every call issued for all of them in one NCCL group), or
    /// as one rank of a job on one GPU (`--nccl-id`), each rank timing itself.
    #[cfg(feature = "nccl")]
    pub fn collectives(o: &crate::collectives::Options) -> anyhow::Result<crate::collectives::Report> {
        use crate::collectives::{count, iterations_for, received_right, send_values, Report, Row};
        use candle_core::cuda_backend::cudarc::driver::CudaSlice;
        use candle_core::cuda_backend::cudarc::nccl::{self, Comm, Id, ReduceOp};
        use kiln_bench::cluster::{bandwidths, sizes, Collective};
        use std::time::Instant;
        let nccl_error = |e: nccl::result::NcclError| anyhow::anyhow!("NCCL: {e:?}");
        let n_cuda = CudaContext::device_count().context("the CUDA driver cannot count its devices")? as usize;
        let devices = match (&o.as_rank, &o.devices) {
            (Some(r), _) => vec![r.device],
            (None, Some(d)) => d.clone(),
            (None, None) => (0..n_cuda).collect(),
        };
        if let Some(&d) = devices.iter().find(|&&d| d >= n_cuda) {
            anyhow::bail!("device {d}: CUDA sees {n_cuda} device(s)");
        }
        anyhow::ensure!(o.as_rank.is_some() || devices.len() >= 2, "collectives need two devices; CUDA sees {n_cuda}");
        let ctxs = devices
            .iter()
            .map(|&d| CudaContext::new(d).with_context(|| format!("opening CUDA device {d}")))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let streams: Vec<_> = ctxs.iter().map(|c| c.default_stream()).collect();
        let comms = match &o.as_rank {
            Some(r) => {
                // The id's bytes back as the c_char array NCCL made them from.
                let internal: [std::ffi::c_char; 128] = r.id.map(|b| b as std::ffi::c_char);
                // NCCL joins on the current device: this rank's own (see `nccl_gradients`).
                ctxs[0].bind_to_thread().context("making the rank's own GPU current")?;
                nccl_root(&r.root);
                let comm = Comm::from_rank(streams[0].clone(), r.rank, r.ranks, Id::uninit(internal))
                    .map_err(nccl_error)
                    .with_context(|| format!("rank {} of {}: NCCL cannot join the job", r.rank, r.ranks))?;
                vec![comm]
            }
            None => Comm::from_devices(streams.clone()).map_err(nccl_error).context("NCCL cannot join the devices")?,
        };
        let n = comms[0].world_size();
        let sync = || -> anyhow::Result<()> {
            for s in &streams {
                s.synchronize()?;
            }
            Ok(())
        };
        let mut rows = Vec::new();
        for &c in &o.collectives {
            for bytes in sizes(o.min_bytes, o.max_bytes) {
                let elements = count(c, bytes, n) as usize;
                if elements == 0 {
                    continue;
                }
                let mut send: Vec<CudaSlice<f32>> = Vec::with_capacity(comms.len());
                let mut recv: Vec<CudaSlice<f32>> = Vec::with_capacity(comms.len());
                for (comm, stream) in comms.iter().zip(&streams) {
                    let (values, recv_len) = send_values(c, elements, comm.rank(), n);
                    let what = || format!("{} of {bytes} B on device {}", c.name(), comm.ordinal());
                    send.push(stream.clone_htod(&values).with_context(what)?);
                    recv.push(stream.alloc_zeros::<f32>(recv_len).with_context(what)?);
                }
                // One call on every local GPU, inside one NCCL group (one thread drives them all).
                let mut call = || -> anyhow::Result<()> {
                    nccl::result::group_start().map_err(nccl_error)?;
                    for ((comm, s), r) in comms.iter().zip(&send).zip(recv.iter_mut()) {
                        match c {
                            Collective::AllReduce => comm.all_reduce(s, r, &ReduceOp::Sum),
                            Collective::AllGather => comm.all_gather(s, r),
                            Collective::ReduceScatter => comm.reduce_scatter(s, r, &ReduceOp::Sum),
                            Collective::AllToAll => anyhow::bail!("all_to_all is not an NCCL call"),
                        }
                        .map_err(nccl_error)?;
                    }
                    nccl::result::group_end().map_err(nccl_error)?;
                    Ok(())
                };
                sync()?;
                let t0 = Instant::now();
                call()?;
                sync()?;
                let iterations = iterations_for(t0.elapsed().as_secs_f64(), o.seconds_per_size, o.iterations);
                for _ in 0..o.warmup.min(iterations) {
                    call()?;
                }
                sync()?;
                let t0 = Instant::now();
                for _ in 0..iterations {
                    call()?;
                }
                sync()?;
                let seconds = t0.elapsed().as_secs_f64() / iterations as f64;
                let mut correct = true;
                for (stream, r) in streams.iter().zip(&recv) {
                    correct &= received_right(c, &stream.clone_dtoh(r)?, n);
                }
                let (algbw_gbs, busbw_gbs) = bandwidths(c, n, elements as u64 * 4, seconds);
                rows.push(Row {
                    collective: c,
                    bytes: elements as u64 * 4,
                    count: elements as u64,
                    iterations,
                    time_us: seconds * 1e6,
                    algbw_gbs,
                    busbw_gbs,
                    correct,
                });
            }
        }
        Ok(Report {
            names: ctxs.iter().map(|c| c.name().unwrap_or_default()).collect(),
            devices,
            rank: o.as_rank.as_ref().map(|r| r.rank),
            ranks: n,
            nccl_version: nccl::result::get_nccl_version().ok().map(i64::from),
            rows,
        })
    }

    /// A new NCCL unique id, for rank 0 of a job to hand to every rank.
    #[cfg(feature = "nccl")]
    /// NCCL's unique id naming `root` (HOST:PORT) as the job's bootstrap: with `NCCL_COMM_ID`
    /// set, `ncclGetUniqueId` starts no bootstrap root in this process (which exits at once), and
    /// rank 0's `ncclCommInitRank`, given the same variable, hosts it there.
    pub fn nccl_id(root: &str) -> anyhow::Result<crate::collectives::NcclId> {
        use candle_core::cuda_backend::cudarc::nccl::Id;
        nccl_root(root);
        let id = Id::new().map_err(|e| anyhow::anyhow!("NCCL cannot make a unique id: {e:?}"))?;
        let bytes: [u8; 128] = id.internal().map(|c| c as u8);
        Ok(crate::collectives::NcclId { nccl_id: crate::collectives::id_to_hex(&bytes) })
    }

    /// Points NCCL's bootstrap at `root` (`NCCL_COMM_ID`), read by NCCL when it first
    /// initialises: called before any NCCL call, while this process runs one thread.
    #[cfg(feature = "nccl")]
    fn nccl_root(root: &str) {
        std::env::set_var("NCCL_COMM_ID", root);
    }

    #[cfg(not(feature = "nccl"))]
    pub fn nccl_id(_: &str) -> anyhow::Result<crate::collectives::NcclId> {
        anyhow::bail!("kiln-gpu was built without NCCL: build it with `--features cuda,nccl`")
    }

    #[cfg(not(feature = "nccl"))]
    pub fn collectives(_: &crate::collectives::Options) -> anyhow::Result<crate::collectives::Report> {
        anyhow::bail!("kiln-gpu was built without NCCL: build it with `--features cuda,nccl`")
    }
}

#[cfg(not(feature = "cuda"))]
pub mod backend {
    use crate::{bandwidth, gemm, p2p, Devices};

    const NOT_BUILT: &str = "kiln-gpu was built without CUDA: run `eval \"$(deploy/cuda/cuda-root.sh)\"` \
         and `cargo build --release -p kiln-gpu --features cuda,nccl` (no GPU needed to build)";

    /// No driver to ask: every command of this build says what to build instead.
    pub fn check_driver() -> anyhow::Result<()> {
        Ok(())
    }

    pub fn devices() -> anyhow::Result<Devices> {
        anyhow::bail!(NOT_BUILT)
    }

    pub fn gemm(_: &gemm::Options) -> anyhow::Result<gemm::Report> {
        anyhow::bail!(NOT_BUILT)
    }

    pub fn bandwidth(_: &bandwidth::Options) -> anyhow::Result<bandwidth::Report> {
        anyhow::bail!(NOT_BUILT)
    }

    pub fn sweep(_: &gemm::SweepOptions) -> anyhow::Result<gemm::Sweep> {
        anyhow::bail!(NOT_BUILT)
    }

    pub fn burn(_: &gemm::BurnOptions) -> anyhow::Result<gemm::Burn> {
        anyhow::bail!(NOT_BUILT)
    }

    pub fn p2p(_: &p2p::Options) -> anyhow::Result<p2p::Report> {
        anyhow::bail!(NOT_BUILT)
    }

    pub fn collectives(_: &crate::collectives::Options) -> anyhow::Result<crate::collectives::Report> {
        anyhow::bail!(NOT_BUILT)
    }

    pub fn train(_: &crate::train::Options) -> anyhow::Result<crate::train::Report> {
        anyhow::bail!(NOT_BUILT)
    }

    pub fn nccl_id(_: &str) -> anyhow::Result<crate::collectives::NcclId> {
        anyhow::bail!(NOT_BUILT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_the_kernels_were_not_built_for_is_refused_with_what_to_build() {
        assert!(capability_in_build(0, (9, 0), "90").is_ok());
        let e = capability_in_build(3, (8, 0), "90").unwrap_err().to_string();
        assert!(
            e.starts_with("GPU 3 is of compute capability 8.0, and this kiln-gpu's kernels are built for 9.0 only"),
            "{e}"
        );
        assert!(e.contains("CUDA_COMPUTE_CAP=80"), "{e}");
        // sm_90a's code does not run on a B200 either.
        assert!(capability_in_build(0, (10, 0), "90").is_err());
        // A build that did not say (no CUDA build) refuses nothing.
        assert!(capability_in_build(0, (8, 0), "").is_ok());
    }

    #[test]
    fn a_driver_older_than_the_build_is_refused_with_what_to_do() {
        // 570's drivers report CUDA 12.8; 580's, 13.0; 590's, 13.1.
        let e = driver_supports_build(12_080).unwrap_err().to_string();
        assert!(
            e.starts_with("the NVIDIA driver supports CUDA 12.8 at most, and kiln-gpu is built with CUDA 13.0"),
            "{e}"
        );
        assert!(e.contains("580.65.06") && e.contains("images/nvidia-cuda13.0-"), "{e}");
        assert!(driver_supports_build(13_000).is_ok());
        assert!(driver_supports_build(13_010).is_ok());
    }
}

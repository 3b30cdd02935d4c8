//! Matrix multiplies through the maintained libraries a machine has, found at run time: OpenBLAS
//! and BLIS (`cblas_sgemm`) for f32, oneDNN for f32 (`dnnl_sgemm`), bf16 (its matmul primitive,
//! which runs `vdpbf16ps` or AMX where the CPU has them) and int8 (`dnnl_gemm_u8s8s32`, VNNI). None is needed to build or
//! run kiln: a library that is absent, of an interface kiln does not speak, or that computes a
//! wrong product in the check every library passes before it is measured, is reported and skipped.
//!
//! Each is opened by its soname through the dynamic loader's search path (`KILN_GEMM_LIBRARIES`,
//! a `:`-separated list of paths or sonames, replaces the list; empty disables them all).
//! Not supported yet: MKL (`libmkl_rt`), oneDNN 3.x (its C API changed).

use std::ffi::{c_char, c_int, c_void, CStr};

use libloading::Library as Dl;

/// Which interface a library speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    OpenBlas,
    Blis,
    OneDnn,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::OpenBlas, Kind::Blis, Kind::OneDnn];

    /// The short name used on the command line and in metric names.
    pub fn key(self) -> &'static str {
        match self {
            Kind::OpenBlas => "openblas",
            Kind::Blis => "blis",
            Kind::OneDnn => "onednn",
        }
    }
}

/// The sonames searched by default, in order, with what they are.
const DEFAULT: &[(&str, Kind)] =
    &[("libopenblas.so.0", Kind::OpenBlas), ("libblis.so.4", Kind::Blis), ("libdnnl.so.2", Kind::OneDnn)];

/// A library found and opened.
pub struct Library {
    pub kind: Kind,
    /// What it is, for people and the stored config: "OpenBLAS 0.3.21 (Cooperlake)".
    pub version: String,
    dl: Dl,
}

impl std::fmt::Debug for Library {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Library").field("kind", &self.kind).field("version", &self.version).finish()
    }
}

/// The libraries found, and for each one not usable the reason.
pub fn find() -> (Vec<Library>, Vec<String>) {
    let wanted: Vec<(String, Option<Kind>)> = match std::env::var("KILN_GEMM_LIBRARIES") {
        Ok(list) => list.split(':').filter(|s| !s.is_empty()).map(|s| (s.to_string(), None)).collect(),
        Err(_) => DEFAULT.iter().map(|(name, kind)| (name.to_string(), Some(*kind))).collect(),
    };
    let (mut found, mut skipped) = (Vec::new(), Vec::new());
    for (name, kind) in wanted {
        match open(&name, kind) {
            Ok(Some(lib)) => found.push(lib),
            Ok(None) => {}
            Err(why) => skipped.push(format!("{name}: {why}")),
        }
    }
    (found, skipped)
}

/// Opens one library; `Ok(None)` when a default soname is simply not installed.
fn open(name: &str, kind: Option<Kind>) -> Result<Option<Library>, String> {
    // SAFETY: loading a library runs its initialisers; these are the system's BLAS libraries,
    // named by the user or by their standard sonames.
    let dl = match unsafe { Dl::new(name) } {
        Ok(dl) => dl,
        Err(_) if kind.is_some() => return Ok(None),
        Err(e) => return Err(format!("cannot be loaded: {e}")),
    };
    let has = |symbol: &str| {
        // SAFETY: only the symbol's presence is checked; it is not called.
        unsafe { dl.get::<*const c_void>(symbol.as_bytes()) }.is_ok()
    };
    let kind = match kind {
        Some(k) => k,
        None if has("dnnl_version") => Kind::OneDnn,
        None if has("bli_info_get_version_str") => Kind::Blis,
        None if has("openblas_get_config") => Kind::OpenBlas,
        None => return Err("neither OpenBLAS, BLIS nor oneDNN".into()),
    };
    let version = describe(&dl, kind)?;
    let lib = Library { kind, version, dl };
    lib.check()?;
    Ok(Some(lib))
}

/// The version string, or why kiln cannot use this build.
fn describe(dl: &Dl, kind: Kind) -> Result<String, String> {
    let text = |p: *const c_char| {
        // SAFETY: the libraries return NUL-terminated static strings.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().trim().to_string())
    };
    // SAFETY: in all three arms the symbols are looked up with their documented C signatures.
    unsafe {
        match kind {
            Kind::OpenBlas => {
                let config = dl.get::<unsafe extern "C" fn() -> *const c_char>(b"openblas_get_config").map_err(err)?;
                let core = dl.get::<unsafe extern "C" fn() -> *const c_char>(b"openblas_get_corename").ok();
                let config = text(config()).unwrap_or_default();
                let version = config.split_whitespace().take(2).collect::<Vec<_>>().join(" ");
                Ok(match core.and_then(|c| text(c())) {
                    Some(core) => format!("{version} ({core})"),
                    None => version,
                })
            }
            Kind::Blis => {
                let int_size =
                    dl.get::<unsafe extern "C" fn() -> c_int>(b"bli_info_get_blas_int_type_size").map_err(err)?;
                if int_size() != 32 {
                    return Err(format!("BLIS built with {}-bit BLAS integers; kiln calls it with 32", int_size()));
                }
                let version =
                    dl.get::<unsafe extern "C" fn() -> *const c_char>(b"bli_info_get_version_str").map_err(err)?;
                let arch = dl.get::<unsafe extern "C" fn() -> c_int>(b"bli_arch_query_id").ok();
                let name = dl.get::<unsafe extern "C" fn(c_int) -> *const c_char>(b"bli_arch_string").ok();
                let version = format!("BLIS {}", text(version()).unwrap_or_default());
                Ok(match (arch, name) {
                    (Some(a), Some(n)) => format!("{version} ({})", text(n(a())).unwrap_or_default()),
                    _ => version,
                })
            }
            Kind::OneDnn => {
                #[repr(C)]
                struct Version {
                    major: c_int,
                    minor: c_int,
                    patch: c_int,
                    hash: *const c_char,
                    cpu_runtime: u32,
                    gpu_runtime: u32,
                }
                let version = dl.get::<unsafe extern "C" fn() -> *const Version>(b"dnnl_version").map_err(err)?;
                let v = &*version();
                if v.major != 2 {
                    return Err(format!("oneDNN {}.{}.{}: kiln speaks the 2.x C API only", v.major, v.minor, v.patch));
                }
                Ok(format!("oneDNN {}.{}.{}", v.major, v.minor, v.patch))
            }
        }
    }
}

fn err(e: libloading::Error) -> String {
    e.to_string()
}

/// `C = A × B`, row-major, no transposes, C overwritten.
type Cblas = unsafe extern "C" fn(
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    f32,
    *const f32,
    c_int,
    *const f32,
    c_int,
    f32,
    *mut f32,
    c_int,
);
const CBLAS_ROW_MAJOR: c_int = 101;
const CBLAS_NO_TRANS: c_int = 111;
const CBLAS_TRANS: c_int = 112;

/// `dnnl_sgemm`: row-major, transposes as 'N'/'T'.
type DnnlSgemm = unsafe extern "C" fn(
    c_char,
    c_char,
    i64,
    i64,
    i64,
    f32,
    *const f32,
    i64,
    *const f32,
    i64,
    f32,
    *mut f32,
    i64,
) -> c_int;

impl Library {
    /// Whether this library multiplies `dtype` ("f32", "bf16", "int8").
    pub fn supports(&self, dtype: &str) -> bool {
        dtype == "f32" || (matches!(dtype, "bf16" | "int8") && self.kind == Kind::OneDnn)
    }

    /// `c (i32) = a (u8, m×k) × b (i8, k×n)`, row-major, no offsets (oneDNN only).
    pub fn gemm_u8s8s32(&self, m: usize, n: usize, k: usize, a: &[u8], b: &[i8], c: &mut [i32]) -> Result<(), String> {
        assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n, "matrix sizes");
        if self.kind != Kind::OneDnn {
            return Err(format!("{} has no int8 GEMM", self.version));
        }
        type U8s8s32 = unsafe extern "C" fn(
            c_char,
            c_char,
            c_char,
            i64,
            i64,
            i64,
            f32,
            *const u8,
            i64,
            u8,
            *const i8,
            i64,
            i8,
            f32,
            *mut i32,
            i64,
            *const i32,
        ) -> c_int;
        let zero = 0i32;
        // SAFETY: the slices hold the matrices the dimensions describe (asserted above); the
        // symbol is called with its documented signature; `offsetc` 'F' reads one offset.
        unsafe {
            let f = self.dl.get::<U8s8s32>(b"dnnl_gemm_u8s8s32").map_err(err)?;
            let status = f(
                b'N' as c_char,
                b'N' as c_char,
                b'F' as c_char,
                m as i64,
                n as i64,
                k as i64,
                1.0,
                a.as_ptr(),
                k as i64,
                0,
                b.as_ptr(),
                n as i64,
                0,
                0.0,
                c.as_mut_ptr(),
                n as i64,
                &zero,
            );
            dnnl_ok(status, "dnnl_gemm_u8s8s32")
        }
    }

    /// Limits the library's own threads to `n` where it has a call for it (OpenBLAS, BLIS;
    /// oneDNN's OpenMP threads follow the process's CPU mask).
    pub fn set_threads(&self, n: usize) {
        let n = c_int::try_from(n.max(1)).unwrap_or(c_int::MAX);
        let symbol: &[u8] = match self.kind {
            Kind::OpenBlas => b"openblas_set_num_threads",
            Kind::Blis => b"bli_thread_set_num_threads",
            Kind::OneDnn => return,
        };
        // SAFETY: both take one int and return nothing.
        unsafe {
            if let Ok(f) = self.dl.get::<unsafe extern "C" fn(c_int)>(symbol) {
                f(n);
            }
        }
    }

    /// `c = a × b` for row-major `m×k` and `k×n` f32 matrices.
    pub fn sgemm(&self, m: usize, n: usize, k: usize, a: &[f32], b: &[f32], c: &mut [f32]) -> Result<(), String> {
        self.sgemm_t(false, false, m, n, k, a, b, c)
    }

    /// `c = op(a) × op(b)`, row-major, `c` `m×n`: `op(a)` is `m×k` (stored `k×m` when
    /// `trans_a`), `op(b)` is `k×n` (stored `n×k` when `trans_b`).
    #[allow(clippy::too_many_arguments)]
    pub fn sgemm_t(
        &self,
        trans_a: bool,
        trans_b: bool,
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        b: &[f32],
        c: &mut [f32],
    ) -> Result<(), String> {
        assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n, "matrix sizes");
        let (lda, ldb, ldc) = (if trans_a { m } else { k }, if trans_b { k } else { n }, n);
        let int = |x: usize| c_int::try_from(x).map_err(|_| format!("{x} is too large for a BLAS int"));
        // SAFETY: the slices hold the matrices the dimensions describe (asserted above), and the
        // symbols are called with their documented C signatures.
        unsafe {
            match self.kind {
                Kind::OpenBlas | Kind::Blis => {
                    let f = self.dl.get::<Cblas>(b"cblas_sgemm").map_err(err)?;
                    let trans = |t: bool| if t { CBLAS_TRANS } else { CBLAS_NO_TRANS };
                    f(
                        CBLAS_ROW_MAJOR,
                        trans(trans_a),
                        trans(trans_b),
                        int(m)?,
                        int(n)?,
                        int(k)?,
                        1.0,
                        a.as_ptr(),
                        int(lda)?,
                        b.as_ptr(),
                        int(ldb)?,
                        0.0,
                        c.as_mut_ptr(),
                        int(ldc)?,
                    );
                    Ok(())
                }
                Kind::OneDnn => {
                    let f = self.dl.get::<DnnlSgemm>(b"dnnl_sgemm").map_err(err)?;
                    let trans = |t: bool| (if t { b'T' } else { b'N' }) as c_char;
                    let status = f(
                        trans(trans_a),
                        trans(trans_b),
                        m as i64,
                        n as i64,
                        k as i64,
                        1.0,
                        a.as_ptr(),
                        lda as i64,
                        b.as_ptr(),
                        ldb as i64,
                        0.0,
                        c.as_mut_ptr(),
                        ldc as i64,
                    );
                    dnnl_ok(status, "dnnl_sgemm")
                }
            }
        }
    }

    /// A bf16 × bf16 → f32 matrix multiply of fixed shape, set up once and run many times
    /// (oneDNN only).
    pub fn bf16_matmul(&self, m: usize, n: usize, k: usize) -> Result<Bf16Matmul<'_>, String> {
        if self.kind != Kind::OneDnn {
            return Err(format!("{} has no bf16 GEMM", self.version));
        }
        Bf16Matmul::new(&self.dl, m, n, k)
    }

    /// Multiplies a small pair of matrices and compares with the plain product: a library that
    /// is called wrongly (an integer width, a row/column-major mix-up) fails here, not in a
    /// stored figure.
    fn check(&self) -> Result<(), String> {
        let (m, n, k) = (5, 7, 3);
        let a: Vec<f32> = (0..m * k).map(|i| (i % 4) as f32 - 1.5).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.5).collect();
        let mut c = vec![f32::NAN; m * n];
        self.sgemm(m, n, k, &a, &b, &mut c)?;
        let want = reference(m, n, k, &a, &b);
        if c.iter().zip(&want).any(|(x, y)| (x - y).abs() > 1e-4) {
            return Err(format!("{} computed a wrong 5x3 by 3x7 product: {c:?}, not {want:?}", self.version));
        }
        Ok(())
    }
}

/// [`find`]'s answer for this process, found (opened and checked) once: the libraries, each with
/// as many threads as the process may use, and why the others are unusable. The GEMM benchmark
/// and the training run share it.
pub fn found() -> &'static (Vec<Library>, Vec<String>) {
    static FOUND: std::sync::OnceLock<(Vec<Library>, Vec<String>)> = std::sync::OnceLock::new();
    FOUND.get_or_init(|| {
        let found = find();
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        found.0.iter().for_each(|l| l.set_threads(threads));
        found
    })
}

/// The library of this kind, if the process found it.
pub fn for_training(kind: Kind) -> Option<&'static Library> {
    found().0.iter().find(|l| l.kind == kind)
}

/// The plain triple loop, row-major.
pub fn reference(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    c
}

fn dnnl_ok(status: c_int, call: &str) -> Result<(), String> {
    match status {
        0 => Ok(()),
        // dnnl_unimplemented: no kernel of this oneDNN for this CPU (2.x's bf16 matmul needs
        // AVX-512), which is an answer about the CPU, not a failure.
        3 => Err(format!("{call}: oneDNN has no kernel for it on this CPU (status 3, unimplemented)")),
        _ => Err(format!("{call} failed with oneDNN status {status}")),
    }
}

// oneDNN 2.x constants (dnnl_types.h).
const DNNL_CPU: c_int = 1;
const DNNL_STREAM_DEFAULT_FLAGS: u32 = 1;
const DNNL_BF16: c_int = 2;
const DNNL_F32: c_int = 3;
const DNNL_FORMAT_AB: c_int = 3;
const DNNL_ARG_SRC: c_int = 1;
const DNNL_ARG_DST: c_int = 17;
const DNNL_ARG_WEIGHTS: c_int = 33;
const DNNL_QUERY_IMPL_INFO_STR: c_int = 8;

/// Room for one of oneDNN 2.x's descriptor structs (696 bytes for a memory descriptor and 2,800
/// for a matmul descriptor in 2.6), 8-byte aligned.
type Opaque = [u64; 1024];

type Handle = *mut c_void;

#[repr(C)]
struct ExecArg {
    arg: c_int,
    memory: Handle,
}

/// A bf16 matmul primitive with its buffers: `c (f32) = a (bf16) × b (bf16)`.
pub struct Bf16Matmul<'a> {
    dl: &'a Dl,
    engine: Handle,
    stream: Handle,
    primitive_desc: Handle,
    primitive: Handle,
    memories: [Handle; 3],
    // The buffers oneDNN's memories wrap: never resized.
    a: Vec<u16>,
    b: Vec<u16>,
    c: Vec<f32>,
    /// oneDNN's name of the implementation it chose ("brg:avx512_core_bf16").
    pub implementation: String,
}

impl<'a> Bf16Matmul<'a> {
    fn new(dl: &'a Dl, m: usize, n: usize, k: usize) -> Result<Bf16Matmul<'a>, String> {
        let mut mm = Bf16Matmul {
            dl,
            engine: std::ptr::null_mut(),
            stream: std::ptr::null_mut(),
            primitive_desc: std::ptr::null_mut(),
            primitive: std::ptr::null_mut(),
            memories: [std::ptr::null_mut(); 3],
            a: vec![0; m * k],
            b: vec![0; k * n],
            c: vec![0.0; m * n],
            implementation: String::new(),
        };
        // SAFETY: oneDNN 2.x's C API with its documented signatures; the descriptors live in
        // buffers larger than the structs, every handle is destroyed in `drop` (null ones are
        // skipped), and the memories wrap the vectors, which live as long as the primitive.
        unsafe {
            let sym = |name: &[u8]| dl.get::<*const c_void>(name).map(|s| *s).map_err(err);
            let engine_create: unsafe extern "C" fn(*mut Handle, c_int, usize) -> c_int =
                std::mem::transmute(sym(b"dnnl_engine_create")?);
            let stream_create: unsafe extern "C" fn(*mut Handle, Handle, u32) -> c_int =
                std::mem::transmute(sym(b"dnnl_stream_create")?);
            let md_init: unsafe extern "C" fn(*mut Opaque, c_int, *const i64, c_int, c_int) -> c_int =
                std::mem::transmute(sym(b"dnnl_memory_desc_init_by_tag")?);
            let matmul_init: unsafe extern "C" fn(
                *mut Opaque,
                *const Opaque,
                *const Opaque,
                *const Opaque,
                *const Opaque,
            ) -> c_int = std::mem::transmute(sym(b"dnnl_matmul_desc_init")?);
            let pd_create: unsafe extern "C" fn(*mut Handle, *const Opaque, Handle, Handle, Handle) -> c_int =
                std::mem::transmute(sym(b"dnnl_primitive_desc_create")?);
            let pd_query: unsafe extern "C" fn(Handle, c_int, c_int, *mut c_void) -> c_int =
                std::mem::transmute(sym(b"dnnl_primitive_desc_query")?);
            let primitive_create: unsafe extern "C" fn(*mut Handle, Handle) -> c_int =
                std::mem::transmute(sym(b"dnnl_primitive_create")?);
            let memory_create: unsafe extern "C" fn(*mut Handle, *const Opaque, Handle, *mut c_void) -> c_int =
                std::mem::transmute(sym(b"dnnl_memory_create")?);

            dnnl_ok(engine_create(&mut mm.engine, DNNL_CPU, 0), "dnnl_engine_create")?;
            dnnl_ok(stream_create(&mut mm.stream, mm.engine, DNNL_STREAM_DEFAULT_FLAGS), "dnnl_stream_create")?;
            let (mut a_md, mut b_md, mut c_md) =
                (Box::new([0u64; 1024]), Box::new([0u64; 1024]), Box::new([0u64; 1024]));
            let mut dims = [0i64; 12];
            dims[..2].copy_from_slice(&[m as i64, k as i64]);
            dnnl_ok(md_init(&mut *a_md, 2, dims.as_ptr(), DNNL_BF16, DNNL_FORMAT_AB), "dnnl_memory_desc_init_by_tag")?;
            dims[..2].copy_from_slice(&[k as i64, n as i64]);
            dnnl_ok(md_init(&mut *b_md, 2, dims.as_ptr(), DNNL_BF16, DNNL_FORMAT_AB), "dnnl_memory_desc_init_by_tag")?;
            dims[..2].copy_from_slice(&[m as i64, n as i64]);
            dnnl_ok(md_init(&mut *c_md, 2, dims.as_ptr(), DNNL_F32, DNNL_FORMAT_AB), "dnnl_memory_desc_init_by_tag")?;
            let mut desc = Box::new([0u64; 1024]);
            dnnl_ok(matmul_init(&mut *desc, &*a_md, &*b_md, std::ptr::null(), &*c_md), "dnnl_matmul_desc_init")?;
            dnnl_ok(
                pd_create(&mut mm.primitive_desc, &*desc, std::ptr::null_mut(), mm.engine, std::ptr::null_mut()),
                "dnnl_primitive_desc_create (bf16 matmul)",
            )?;
            let mut name: *const c_char = std::ptr::null();
            if pd_query(mm.primitive_desc, DNNL_QUERY_IMPL_INFO_STR, 0, (&mut name as *mut *const c_char).cast()) == 0
                && !name.is_null()
            {
                mm.implementation = CStr::from_ptr(name).to_string_lossy().into_owned();
            }
            dnnl_ok(primitive_create(&mut mm.primitive, mm.primitive_desc), "dnnl_primitive_create")?;
            let buffers: [(&Opaque, *mut c_void); 3] = [
                (&*a_md, mm.a.as_mut_ptr().cast()),
                (&*b_md, mm.b.as_mut_ptr().cast()),
                (&*c_md, mm.c.as_mut_ptr().cast()),
            ];
            for (slot, (md, ptr)) in mm.memories.iter_mut().zip(buffers) {
                dnnl_ok(memory_create(slot, md, mm.engine, ptr), "dnnl_memory_create")?;
            }
        }
        Ok(mm)
    }

    /// The left factor, `m×k` row-major bf16 bits.
    pub fn a_mut(&mut self) -> &mut [u16] {
        &mut self.a
    }

    /// The right factor, `k×n` row-major bf16 bits.
    pub fn b_mut(&mut self) -> &mut [u16] {
        &mut self.b
    }

    /// The product of the last run, `m×n` row-major.
    pub fn c(&self) -> &[f32] {
        &self.c
    }

    /// Runs the multiply once and waits for it.
    pub fn run(&mut self) -> Result<(), String> {
        let args = [
            ExecArg { arg: DNNL_ARG_SRC, memory: self.memories[0] },
            ExecArg { arg: DNNL_ARG_WEIGHTS, memory: self.memories[1] },
            ExecArg { arg: DNNL_ARG_DST, memory: self.memories[2] },
        ];
        // SAFETY: documented signatures; the primitive and memories are alive (owned by self).
        unsafe {
            let execute = self
                .dl
                .get::<unsafe extern "C" fn(Handle, Handle, c_int, *const ExecArg) -> c_int>(b"dnnl_primitive_execute")
                .map_err(err)?;
            let wait = self.dl.get::<unsafe extern "C" fn(Handle) -> c_int>(b"dnnl_stream_wait").map_err(err)?;
            dnnl_ok(execute(self.primitive, self.stream, 3, args.as_ptr()), "dnnl_primitive_execute")?;
            dnnl_ok(wait(self.stream), "dnnl_stream_wait")
        }
    }
}

impl Drop for Bf16Matmul<'_> {
    fn drop(&mut self) {
        let destroy = |name: &[u8], handle: Handle| {
            if handle.is_null() {
                return;
            }
            // SAFETY: each destroy function takes the handle its create function made.
            unsafe {
                if let Ok(f) = self.dl.get::<unsafe extern "C" fn(Handle) -> c_int>(name) {
                    f(handle);
                }
            }
        };
        for m in self.memories {
            destroy(b"dnnl_memory_destroy", m);
        }
        destroy(b"dnnl_primitive_destroy", self.primitive);
        destroy(b"dnnl_primitive_desc_destroy", self.primitive_desc);
        destroy(b"dnnl_stream_destroy", self.stream);
        destroy(b"dnnl_engine_destroy", self.engine);
    }
}

/// f32 → bf16, rounding to nearest even (NaN stays NaN).
pub fn to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

/// bf16 → f32.
pub fn from_bf16(x: u16) -> f32 {
    f32::from_bits(u32::from(x) << 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding() {
        assert_eq!(to_bf16(1.0), 0x3f80);
        assert_eq!(from_bf16(to_bf16(-2.5)), -2.5);
        // 1 + 2^-8 is halfway between two bf16 values: ties go to the even one (1.0).
        assert_eq!(to_bf16(1.0 + 1.0 / 256.0), 0x3f80);
        assert_eq!(to_bf16(1.0 + 3.0 / 256.0), 0x3f82);
        assert!(from_bf16(to_bf16(f32::NAN)).is_nan());
    }

    #[test]
    fn reference_product() {
        assert_eq!(reference(2, 2, 2, &[1., 2., 3., 4.], &[1., 2., 3., 4.]), [7., 10., 15., 22.]);
    }

    /// Transposed operands, as the training's backward pass uses them.
    #[test]
    fn transposed_products() {
        let (found, _) = find();
        let (m, n, k) = (6, 5, 4);
        let a: Vec<f32> = (0..m * k).map(|i| i as f32 * 0.25 - 2.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 7) as f32 - 3.0).collect();
        let want = reference(m, n, k, &a, &b);
        let transpose = |x: &[f32], rows: usize, cols: usize| -> Vec<f32> {
            (0..cols * rows).map(|i| x[(i % rows) * cols + i / rows]).collect()
        };
        let (at, bt) = (transpose(&a, m, k), transpose(&b, k, n));
        for lib in &found {
            for (ta, tb) in [(false, true), (true, false), (true, true)] {
                let mut c = vec![0.0; m * n];
                let (a, b) = (if ta { &at } else { &a }, if tb { &bt } else { &b });
                lib.sgemm_t(ta, tb, m, n, k, a, b, &mut c).unwrap();
                assert_eq!(c, want, "{} trans_a {ta} trans_b {tb}", lib.version);
            }
        }
    }

    /// Whatever libraries this machine has multiply correctly through kiln's calls; the test
    /// says which it found.
    #[test]
    fn found_libraries_multiply_correctly() {
        let (found, skipped) = find();
        eprintln!("found {found:?}; skipped {skipped:?}");
        for lib in &found {
            let (m, n, k) = (33, 17, 65);
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 11) as f32 / 8.0 - 0.5).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 13) as f32 / 8.0 - 0.75).collect();
            let mut c = vec![0.0; m * n];
            lib.sgemm(m, n, k, &a, &b, &mut c).unwrap();
            let want = reference(m, n, k, &a, &b);
            assert!(c.iter().zip(&want).all(|(x, y)| (x - y).abs() < 1e-3), "{}", lib.version);
            if lib.supports("int8") {
                // Without VNNI, oneDNN multiplies u8×s8 with `vpmaddubsw`, which saturates each pair's
                // sum at 16 bits (as its documentation says: such CPUs want 7-bit activations), so
                // there the left operand stays below 128, where no pair can saturate.
                #[cfg(target_arch = "x86_64")]
                let top = if std::arch::is_x86_feature_detected!("avx512vnni") { 251 } else { 128 };
                #[cfg(not(target_arch = "x86_64"))]
                let top = 251;
                let a: Vec<u8> = (0..m * k).map(|i| (i * 37 % top) as u8).collect();
                let b: Vec<i8> = (0..k * n).map(|i| (i * 11 % 255) as i8).collect();
                let mut c = vec![0i32; m * n];
                lib.gemm_u8s8s32(m, n, k, &a, &b, &mut c).unwrap();
                let want: Vec<i32> = (0..m * n)
                    .map(|ij| (0..k).map(|p| i32::from(a[ij / n * k + p]) * i32::from(b[p * n + ij % n])).sum())
                    .collect();
                assert_eq!(c, want, "{} int8", lib.version);
            }
            if lib.supports("bf16") {
                // Values exact in bf16, so the product is exact in f32. oneDNN 2.x has no bf16 kernel
                // for a CPU without AVX-512, and says so (status 3): an answer, not a failure.
                #[cfg(target_arch = "x86_64")]
                let avx512 = std::arch::is_x86_feature_detected!("avx512bw");
                #[cfg(not(target_arch = "x86_64"))]
                let avx512 = true;
                let mut mm = match lib.bf16_matmul(m, n, k) {
                    Err(e) if !avx512 && e.contains("no kernel for it on this CPU") => continue,
                    made => made.unwrap(),
                };
                mm.a_mut().iter_mut().zip(&a).for_each(|(d, s)| *d = to_bf16(*s));
                mm.b_mut().iter_mut().zip(&b).for_each(|(d, s)| *d = to_bf16(*s));
                mm.run().unwrap();
                assert!(mm.c().iter().zip(&want).all(|(x, y)| (x - y).abs() < 1e-3), "{} bf16", lib.version);
                assert!(!mm.implementation.is_empty());
            }
        }
    }
}

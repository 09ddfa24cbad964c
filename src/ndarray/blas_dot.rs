//! `cblas_sdot` / `cblas_ddot` (unit strides) summed in the order the
//! OpenBLAS inside MXNet 1.9.1's pip wheel sums them, bit for bit.
//!
//! MXNet 1.9.1 computes the norm of a row_sparse or csr array
//! (`L2NormComputeSparseImpl`, src/operator/tensor/broadcast_reduce_op.h) as
//! `L2NormComputeImpl` of its stored values: mshadow's `VectorDot(out, in,
//! in)`, i.e. `cblas_sdot(n, x, 1, x, 1)` / `cblas_ddot` (3rdparty/mshadow/
//! mshadow/dot_engine-inl.h), then `sqrt`. The wheel's libopenblas.so.0 is
//! OpenBLAS 0.3.13 built with `DYNAMIC_ARCH NO_AFFINITY USE_OPENMP` and
//! without AVX-512 kernels (`openblas_get_config()`; forcing
//! `OPENBLAS_CORETYPE=SkylakeX` reports `Haswell`). At load time it picks a
//! kernel table from the CPU (driver/others/dynamic.c, `get_coretype`), and
//! the tables it has sum a dot product in five different orders:
//!
//! * [`Kernel::Haswell`] (tables Haswell and Zen: Intel Haswell to Ice Lake
//!   and Skylake-X / Cascade Lake / Cooper Lake with AVX2, AMD Zen 1 to 4 and
//!   Hygon): kernel/x86_64/sdot.c + sdot_microk_haswell-2.c and ddot.c +
//!   ddot_microk_haswell-2.c: four accumulators of 8 floats (4 doubles),
//!   fused multiply-adds;
//! * [`Kernel::Sandy`] (Sandy/Ivy Bridge, and the AVX-without-AVX2 fallbacks):
//!   the same shape with separate multiplies and adds;
//! * [`Kernel::Nehalem`] (Nehalem, Westmere, Atom, Nano, Goldmont, and the
//!   no-AVX fallbacks of later Intel cores): four 128-bit accumulators;
//! * [`Kernel::Generic`] (tables Prescott, Core2 and Barcelona: Core 2 and
//!   older, AMD K8/K10, Bobcat, every CPU the 0.3.13 table does not know, which
//!   includes Intel Tiger Lake, Alder/Raptor Lake, Sapphire Rapids and AMD
//!   Zen 5): sdot from kernel/generic/dot.c (4-float SSE lanes), ddot from
//!   kernel/x86_64/dot_sse2.S;
//! * the FMA4 kernels of AMD Bulldozer, Piledriver, Steamroller and Excavator
//!   ([`Kernel::Fma4`]) are not reproduced (this machine cannot run them to
//!   check): those cores get the Haswell order, which may differ from MXNet's
//!   in the last bits.
//!
//! Each order was checked against MXNet's own `norm` on an AMD EPYC (Zen 4)
//! with `OPENBLAS_CORETYPE` forcing each table the wheel has and this CPU can
//! run (tests/python/test_blas_dot.py). As OpenBLAS does, [`mxnet_kernel`]
//! honours `OPENBLAS_CORETYPE` when it is set (read once), so a process that
//! forces a table for MXNet gets the same one here. Off x86-64 the generic
//! order is used (the wheel is x86-64 only).
//!
//! Which of several NaN operands a sum passes on is not reproduced (a dot
//! with one NaN gives that NaN, quieted); everything else is bit for bit,
//! infinities and signed zeros included.

/// A summation order of the OpenBLAS 0.3.13 dot kernels (see the module).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    Generic,
    Nehalem,
    Sandy,
    Haswell,
    Fma4,
}

/// One of the kernel tables of MXNet 1.9.1's OpenBLAS, named as its
/// `openblas_get_corename()` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Core {
    Prescott,
    Core2,
    Nehalem,
    Barcelona,
    Sandybridge,
    Bulldozer,
    Piledriver,
    Steamroller,
    Excavator,
    Haswell,
    Zen,
}

impl Core {
    /// The name, as `openblas_get_corename()` gives it.
    pub fn name(self) -> &'static str {
        self.c_name().to_str().unwrap_or("Unknown")
    }

    /// The same, NUL-terminated (for the C API).
    pub fn c_name(self) -> &'static std::ffi::CStr {
        match self {
            Core::Prescott => c"Prescott",
            Core::Core2 => c"Core2",
            Core::Nehalem => c"Nehalem",
            Core::Barcelona => c"Barcelona",
            Core::Sandybridge => c"Sandybridge",
            Core::Bulldozer => c"Bulldozer",
            Core::Piledriver => c"Piledriver",
            Core::Steamroller => c"Steamroller",
            Core::Excavator => c"Excavator",
            Core::Haswell => c"Haswell",
            Core::Zen => c"Zen",
        }
    }

    pub fn kernel(self) -> Kernel {
        match self {
            Core::Prescott | Core::Core2 | Core::Barcelona => Kernel::Generic,
            Core::Nehalem => Kernel::Nehalem,
            Core::Sandybridge => Kernel::Sandy,
            Core::Haswell | Core::Zen => Kernel::Haswell,
            Core::Bulldozer | Core::Piledriver | Core::Steamroller | Core::Excavator => {
                Kernel::Fma4
            }
        }
    }

    /// The table `OPENBLAS_CORETYPE=name` makes the wheel's OpenBLAS use
    /// (dynamic.c `force_coretype`: the first 24 core names, any case, then
    /// the wheel's aliases; an unknown name leaves Prescott, as there).
    pub fn forced(name: &str) -> Core {
        // strncasecmp(coretype, corename[i], 20): every name is shorter, so
        // this is equality regardless of case
        match name.to_ascii_lowercase().as_str() {
            "atom" | "nehalem" | "nano" => Core::Nehalem,
            "core2" | "penryn" | "dunnington" | "opteron" | "opteron_sse3" | "bobcat" => {
                Core::Core2
            }
            "barcelona" => Core::Barcelona,
            "sandybridge" => Core::Sandybridge,
            "bulldozer" => Core::Bulldozer,
            "piledriver" => Core::Piledriver,
            "steamroller" => Core::Steamroller,
            "excavator" => Core::Excavator,
            "haswell" | "skylakex" => Core::Haswell,
            "zen" => Core::Zen,
            // katmai, coppermine, northwood, prescott, banias, athlon,
            // cooperlake (not in the searched list), unknown names
            _ => Core::Prescott,
        }
    }
}

/// What dynamic.c's `get_coretype` reads of the CPU.
#[derive(Clone, Copy, Debug)]
pub struct CpuId {
    /// cpuid(0): ebx, edx, ecx as the 12-byte vendor string
    pub vendor: [u8; 12],
    /// cpuid(0).eax
    pub max_leaf: u32,
    /// cpuid(1).eax and .ecx
    pub eax1: u32,
    pub ecx1: u32,
    /// cpuid(0x80000000).eax and cpuid(0x80000001).edx
    pub ext_max: u32,
    pub ext_edx1: u32,
    /// support_avx() / support_avx2(): the CPU has them and the OS saves
    /// the ymm registers
    pub avx: bool,
    pub avx2: bool,
}

impl CpuId {
    /// This machine's.
    #[cfg(target_arch = "x86_64")]
    pub fn current() -> CpuId {
        use std::arch::x86_64::__cpuid;
        let l0 = __cpuid(0);
        let mut vendor = [0u8; 12];
        vendor[..4].copy_from_slice(&l0.ebx.to_le_bytes());
        vendor[4..8].copy_from_slice(&l0.edx.to_le_bytes());
        vendor[8..].copy_from_slice(&l0.ecx.to_le_bytes());
        let l1 = __cpuid(1);
        let ext_max = __cpuid(0x8000_0000).eax;
        let ext_edx1 = if ext_max & 0xffff >= 1 {
            __cpuid(0x8000_0001).edx
        } else {
            0
        };
        CpuId {
            vendor,
            max_leaf: l0.eax,
            eax1: l1.eax,
            ecx1: l1.ecx,
            ext_max,
            ext_edx1,
            avx: std::arch::is_x86_feature_detected!("avx"),
            avx2: std::arch::is_x86_feature_detected!("avx2"),
        }
    }

    /// The table MXNet 1.9.1's OpenBLAS picks for this CPU: dynamic.c's
    /// `get_coretype` (OpenBLAS 0.3.13), through the wheel's aliases
    /// (Penryn, Dunnington, Opteron, Bobcat: Core2; Atom, Nano: Nehalem;
    /// Skylake-X, Cooper Lake: Haswell; Katmai to Athlon and unknown CPUs:
    /// Prescott).
    pub fn core(&self) -> Core {
        let bits = |v: u32, shift: u32, mask: u32| (v >> shift) & mask;
        let family = bits(self.eax1, 8, 0x0f);
        let exfamily = bits(self.eax1, 20, 0xff);
        let model = bits(self.eax1, 4, 0x0f);
        let exmodel = bits(self.eax1, 16, 0x0f);
        // the AVX2 -> AVX -> SSE fallbacks of the Intel cores
        let hsw = if self.avx2 {
            Core::Haswell
        } else if self.avx {
            Core::Sandybridge
        } else {
            Core::Nehalem
        };
        let snb = if self.avx {
            Core::Sandybridge
        } else {
            Core::Nehalem
        };
        let amd_avx = |c: Core| if self.avx { c } else { Core::Barcelona };
        let vendor = &self.vendor;
        let intel = vendor == b"GenuineIntel"
            || (vendor != b"AuthenticAMD"
                && vendor != b"CentaurHauls"
                && vendor != b"HygonGenuine"
                && (self.max_leaf == 0 || self.max_leaf & 0x500 != 0));
        let found = if intel {
            match family {
                6 => match (exmodel, model) {
                    (0, 15) => Some(Core::Core2),
                    (0, 0..=14) => Some(Core::Prescott), // Katmai .. Banias
                    (1, 6 | 7 | 13) => Some(Core::Core2),
                    (1, 10 | 11 | 12 | 14 | 15) => Some(Core::Nehalem),
                    (2, 5 | 12 | 14 | 15) => Some(Core::Nehalem),
                    (2, 10 | 13) | (3, 10 | 14) => Some(snb),
                    (3, 12 | 13 | 15) => Some(hsw),
                    (3, 7) => Some(Core::Nehalem), // Bay Trail (Atom)
                    (4, 5 | 6 | 7 | 14 | 15) => Some(hsw),
                    (4, 12 | 13) => Some(Core::Nehalem),
                    // model 5: Skylake-X / Cooper Lake, whose AVX-512 tables
                    // the wheel aliases to Haswell's
                    (5, 5 | 6 | 7 | 14) => Some(hsw),
                    (5, 12 | 15) => Some(Core::Nehalem),
                    (6, 6) => Some(hsw),
                    (7, 10) => Some(Core::Nehalem),
                    (7, 14) => Some(hsw),
                    (8 | 9, 14) => Some(hsw),
                    // case 8 and 9 fall through to case 10
                    (8..=10, 5 | 6) => Some(hsw),
                    (0..=10, _) => None,
                    // an exmodel without a case falls through to case 0xf
                    _ => Some(Core::Prescott),
                },
                0xf => Some(Core::Prescott), // Northwood, Prescott
                _ => None,
            }
        } else if vendor == b"AuthenticAMD" || vendor == b"HygonGenuine" {
            if family <= 0xe {
                None // Athlon or unknown: Prescott either way
            } else if family == 0xf {
                match exfamily {
                    0 | 2 | 5 | 7 => Some(Core::Core2), // Opteron, Bobcat
                    6 => match (model, exmodel) {
                        (1, _) => Some(amd_avx(Core::Bulldozer)),
                        (2 | 3, _) | (0 | 8, 1) => Some(amd_avx(Core::Piledriver)),
                        (5, _) | (0 | 8, 6) => Some(amd_avx(Core::Excavator)),
                        (0 | 8, 3) => Some(amd_avx(Core::Steamroller)),
                        _ => None,
                    },
                    8..=10 => Some(amd_avx(Core::Zen)),
                    _ => Some(Core::Barcelona),
                }
            } else {
                None
            }
        } else if vendor == b"CentaurHauls" && family == 6 {
            Some(Core::Nehalem) // Nano
        } else {
            None
        };
        // unused by the result (Athlon and "no table" both end as Prescott),
        // kept so the fields say what dynamic.c reads
        let _ = (self.ext_max, self.ext_edx1, self.ecx1);
        found.unwrap_or(Core::Prescott)
    }
}

/// The table MXNet 1.9.1's OpenBLAS uses in this process: the one
/// `OPENBLAS_CORETYPE` names if set (as OpenBLAS reads it, once), else the
/// one this CPU gets.
pub fn mxnet_core() -> Core {
    static CORE: std::sync::OnceLock<Core> = std::sync::OnceLock::new();
    *CORE.get_or_init(|| match std::env::var_os("OPENBLAS_CORETYPE") {
        Some(name) => Core::forced(&name.to_string_lossy()),
        None => current_core(),
    })
}

#[cfg(target_arch = "x86_64")]
fn current_core() -> Core {
    CpuId::current().core()
}

#[cfg(not(target_arch = "x86_64"))]
fn current_core() -> Core {
    Core::Prescott
}

/// The kernel of [`mxnet_core`].
pub fn mxnet_kernel() -> Kernel {
    mxnet_core().kernel()
}

// ---------------------------------------------------------------- float32

/// `lanes` accumulators of 4 (SSE) or 8 (AVX) floats, as the microkernels
/// hold them, and the reduction they end with.
fn sdot_micro(x: &[f32], y: &[f32], kernel: Kernel) -> f32 {
    debug_assert!(x.len() % 32 == 0 && x.len() == y.len());
    match kernel {
        Kernel::Nehalem => {
            // sdot_microk_nehalem-2.c: 16 per step into xmm4..7, mulps + addps
            let mut acc = [[0f32; 4]; 4];
            for (xb, yb) in x.chunks_exact(16).zip(y.chunks_exact(16)) {
                for (k, a) in acc.iter_mut().enumerate() {
                    for (l, s) in a.iter_mut().enumerate() {
                        let p = xb[4 * k + l] * yb[4 * k + l];
                        *s += p; // addps %xmm12, %xmm4: acc + prod
                    }
                }
            }
            // addps xmm5,xmm4; addps xmm7,xmm6; addps xmm6,xmm4
            let s: [f32; 4] =
                std::array::from_fn(|l| (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]));
            hadd4(s)
        }
        _ => {
            // sdot_microk_haswell-2.c (vfmadd231ps) / sandy-2.c (vmulps,
            // vaddps): 32 per step into ymm4..7
            let fused = kernel != Kernel::Sandy;
            let mut acc = [[0f32; 8]; 4];
            for (xb, yb) in x.chunks_exact(32).zip(y.chunks_exact(32)) {
                for (k, a) in acc.iter_mut().enumerate() {
                    for (l, s) in a.iter_mut().enumerate() {
                        let (xi, yi) = (xb[8 * k + l], yb[8 * k + l]);
                        *s = if fused {
                            xi.mul_add(yi, *s)
                        } else {
                            xi * yi + *s // vaddps %ymm4, %ymm12, %ymm4
                        };
                    }
                }
            }
            // vextractf128 + vaddps: upper half + lower half of each
            let h: [[f32; 4]; 4] =
                std::array::from_fn(|k| std::array::from_fn(|l| acc[k][l + 4] + acc[k][l]));
            // xmm4 = xmm5 + xmm4; xmm6 = xmm7 + xmm6; xmm4 = xmm6 + xmm4
            let s: [f32; 4] = std::array::from_fn(|l| (h[3][l] + h[2][l]) + (h[1][l] + h[0][l]));
            hadd4(s)
        }
    }
}

/// Two `haddps` of a register with itself: lane 0 is `(s0 + s1) + (s2 + s3)`.
fn hadd4(s: [f32; 4]) -> f32 {
    (s[0] + s[1]) + (s[2] + s[3])
}

/// kernel/generic/dot.c as the Prescott, Core2 and Barcelona tables run it
/// (OpenBLAS's universal intrinsics on SSE3: `v_muladd_f32` is a multiply
/// then an add, `v_sum_f32` two `haddps`), then the scalar tail in float.
fn sdot_generic(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len();
    let (unroll4, unroll) = (n & !15, n & !3);
    let mut v = [[0f32; 4]; 4];
    for (xb, yb) in x[..unroll4]
        .chunks_exact(16)
        .zip(y[..unroll4].chunks_exact(16))
    {
        for (k, a) in v.iter_mut().enumerate() {
            for (l, s) in a.iter_mut().enumerate() {
                *s += xb[4 * k + l] * yb[4 * k + l]; // _mm_add_ps(mul, c)
            }
        }
    }
    // v_add_f32(v_add_f32(vsum0, vsum1), v_add_f32(vsum2, vsum3))
    let mut s: [f32; 4] = std::array::from_fn(|l| (v[0][l] + v[1][l]) + (v[2][l] + v[3][l]));
    for (xb, yb) in x[unroll4..unroll]
        .chunks_exact(4)
        .zip(y[unroll4..unroll].chunks_exact(4))
    {
        for (l, a) in s.iter_mut().enumerate() {
            *a += xb[l] * yb[l];
        }
    }
    let mut dot = hadd4(s);
    for (xi, yi) in x[unroll..].iter().zip(&y[unroll..]) {
        dot += yi * xi;
    }
    dot
}

/// `cblas_sdot(n, x, 1, y, 1)` of MXNet 1.9.1's OpenBLAS running `kernel`.
/// kernel/x86_64/sdot.c (every kernel but the generic one): the
/// microkernel sums the first `n & -32` products; the rest are added, each a
/// float product, to a double that starts at 0 and gets the microkernel's
/// float sum last; the double is rounded to float.
pub fn sdot(x: &[f32], y: &[f32], kernel: Kernel) -> f32 {
    assert_eq!(x.len(), y.len(), "sdot of vectors of different lengths");
    if kernel == Kernel::Generic {
        return sdot_generic(x, y);
    }
    let n1 = x.len() & !31;
    let mydot = if n1 > 0 {
        sdot_micro(&x[..n1], &y[..n1], kernel)
    } else {
        0.0
    };
    let mut dot = 0f64;
    for (xi, yi) in x[n1..].iter().zip(&y[n1..]) {
        dot += f64::from(yi * xi);
    }
    dot += f64::from(mydot);
    dot as f32
}

// ---------------------------------------------------------------- float64

fn ddot_micro(x: &[f64], y: &[f64], kernel: Kernel) -> f64 {
    debug_assert!(x.len() % 16 == 0 && x.len() == y.len());
    match kernel {
        Kernel::Nehalem => {
            // ddot_microk_nehalem-2.c: 8 per step into xmm4..7 (2 doubles)
            let mut acc = [[0f64; 2]; 4];
            for (xb, yb) in x.chunks_exact(8).zip(y.chunks_exact(8)) {
                for (k, a) in acc.iter_mut().enumerate() {
                    for (l, s) in a.iter_mut().enumerate() {
                        let p = xb[2 * k + l] * yb[2 * k + l];
                        *s += p;
                    }
                }
            }
            let s: [f64; 2] =
                std::array::from_fn(|l| (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]));
            s[0] + s[1] // haddpd
        }
        _ => {
            // ddot_microk_haswell-2.c / sandy-2.c: 16 per step into ymm4..7
            let fused = kernel != Kernel::Sandy;
            let mut acc = [[0f64; 4]; 4];
            for (xb, yb) in x.chunks_exact(16).zip(y.chunks_exact(16)) {
                for (k, a) in acc.iter_mut().enumerate() {
                    for (l, s) in a.iter_mut().enumerate() {
                        let (xi, yi) = (xb[4 * k + l], yb[4 * k + l]);
                        *s = if fused {
                            xi.mul_add(yi, *s)
                        } else {
                            xi * yi + *s
                        };
                    }
                }
            }
            let h: [[f64; 2]; 4] =
                std::array::from_fn(|k| std::array::from_fn(|l| acc[k][l + 2] + acc[k][l]));
            let s: [f64; 2] = std::array::from_fn(|l| (h[3][l] + h[2][l]) + (h[1][l] + h[0][l]));
            s[0] + s[1]
        }
    }
}

/// kernel/x86_64/dot_sse2.S (the Prescott, Core2 and Barcelona tables' ddot)
/// with x and y on a 16-byte boundary: 16 per step into 4 accumulators of 2
/// lanes, the 8-, 4-, 2- and 1-element remainders into accumulators 0..3,
/// 0..1, 0 and lane 0 of 0; the end adds (a0 + a1) + (a2 + a3) and its two
/// lanes. (An x 8 bytes past a boundary would start with its first product
/// in lane 0 of accumulator 0; MXNet's arrays never are.)
fn ddot_sse2(x: &[f64], y: &[f64]) -> f64 {
    let mut acc = [[0f64; 2]; 4];
    let full = x.len() & !15;
    for (xb, yb) in x[..full].chunks_exact(16).zip(y[..full].chunks_exact(16)) {
        for half in 0..2 {
            for (k, a) in acc.iter_mut().enumerate() {
                for (l, s) in a.iter_mut().enumerate() {
                    let i = 8 * half + 2 * k + l;
                    *s += xb[i] * yb[i]; // mulpd; addpd %xmm4, %xmm0
                }
            }
        }
    }
    let (mut i, n) = (full, x.len());
    for (width, pairs) in [(8, 4), (4, 2), (2, 1)] {
        if n & width != 0 {
            for k in 0..pairs {
                for l in 0..2 {
                    acc[k][l] += x[i + 2 * k + l] * y[i + 2 * k + l];
                }
            }
            i += width;
        }
    }
    if n & 1 != 0 {
        acc[0][0] += x[i] * y[i];
    }
    let s: [f64; 2] = std::array::from_fn(|l| (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]));
    s[0] + s[1]
}

/// kernel/x86_64/ddot.c's `dot_compute` with unit strides: the microkernel
/// sums the first `n & -16` products, the rest are added one by one, with
/// fused multiply-adds in the Haswell and Zen tables (the wheel compiled
/// them for FMA: measured, a separate multiply and add differ at n = 5, 7),
/// a multiply and an add in the Sandybridge and Nehalem tables.
fn ddot_compute(x: &[f64], y: &[f64], kernel: Kernel) -> f64 {
    let n1 = x.len() & !15;
    let mut dot = if n1 > 0 {
        ddot_micro(&x[..n1], &y[..n1], kernel)
    } else {
        0.0
    };
    for (xi, yi) in x[n1..].iter().zip(&y[n1..]) {
        dot = if kernel == Kernel::Sandy || kernel == Kernel::Nehalem {
            dot + yi * xi
        } else {
            yi.mul_add(*xi, dot)
        };
    }
    dot
}

/// `cblas_ddot(n, x, 1, y, 1)` of MXNet 1.9.1's OpenBLAS running `kernel`,
/// `x` and `y` starting on a 16-byte boundary (as MXNet's arrays do).
///
/// `threads`: what OpenBLAS's `num_cpu_avail` gives in the calling thread
/// (`omp_get_max_threads()` there, at most 72). ddot.c (every kernel but
/// the generic one) splits more than 10,000 elements into that many ranges
/// (`blas_level1_thread_with_return_value`: each the ceiling of what is left
/// over the threads left), sums each as above and adds the partial sums in
/// order to 0. The generic kernel (dot_sse2.S) never splits.
pub fn ddot(x: &[f64], y: &[f64], kernel: Kernel, threads: usize) -> f64 {
    assert_eq!(x.len(), y.len(), "ddot of vectors of different lengths");
    let n = x.len();
    if kernel == Kernel::Generic {
        return ddot_sse2(x, y);
    }
    let threads = threads.clamp(1, 72);
    if n <= 10_000 || threads == 1 {
        return ddot_compute(x, y, kernel);
    }
    let mut dot = 0f64;
    let (mut start, mut left) = (0, n);
    for t in 0..threads {
        let width = left.div_ceil(threads - t).min(left);
        dot += ddot_compute(&x[start..start + width], &y[start..start + width], kernel);
        start += width;
        left -= width;
    }
    dot
}

#[cfg(test)]
mod tests {
    use super::*;

    const F32: bool = false;
    const F64: bool = true;

    /// The vectors of tests/python/blas_dot_capture.py: n doubles from
    /// x <- x * 6364136223846793005 + 1442695040888963407 (mod 2^64), each
    /// ((x >> 40) / 2^24 - 0.5) * 2^(((x >> 20) & 15) - 8).
    fn lcg_vector(n: usize, seed: u64) -> Vec<f64> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let exp = ((x >> 20) & 15) as i32 - 8;
                ((x >> 40) as f64 / (1u64 << 24) as f64 - 0.5) * 2f64.powi(exp)
            })
            .collect()
    }

    /// (kernel, float64?, n, threads, bits of cblas_sdot/ddot(v, v)) for
    /// v = lcg_vector(n, n + 1) (as float32 for sdot), captured from the
    /// OpenBLAS 0.3.13 in MXNet 1.9.1's wheel (mxnet/libopenblas.so.0) on an
    /// AMD EPYC (Zen 4), 2026-12-04, each table forced with OPENBLAS_CORETYPE
    /// (Zen, Sandybridge, Nehalem, Prescott) and the threads set with
    /// openblas_set_num_threads: tests/python/blas_dot_capture.py.
    const MXNET_DOTS: &[(Kernel, bool, usize, usize, u64)] = &[
        (Kernel::Haswell, F32, 0, 1, 0x0),
        (Kernel::Haswell, F64, 0, 1, 0x0),
        (Kernel::Haswell, F32, 1, 1, 0x3e935365),
        (Kernel::Haswell, F64, 1, 1, 0x3fd26a6cabdc4900),
        (Kernel::Haswell, F32, 5, 1, 0x4409e5c0),
        (Kernel::Haswell, F64, 5, 1, 0x40813cb80aed5312),
        (Kernel::Haswell, F32, 7, 1, 0x440ea26c),
        (Kernel::Haswell, F64, 7, 1, 0x4081d44d878d886f),
        (Kernel::Haswell, F32, 15, 1, 0x44207527),
        (Kernel::Haswell, F64, 15, 1, 0x40840ea4c9996e8d),
        (Kernel::Haswell, F32, 16, 1, 0x43825d01),
        (Kernel::Haswell, F64, 16, 1, 0x40704ba01de832a8),
        (Kernel::Haswell, F32, 17, 1, 0x45603564),
        (Kernel::Haswell, F64, 17, 1, 0x40ac06ac8d06dd9b),
        (Kernel::Haswell, F32, 31, 1, 0x443db912),
        (Kernel::Haswell, F64, 31, 1, 0x4087b72247b5ca76),
        (Kernel::Haswell, F32, 32, 1, 0x449ef3b0),
        (Kernel::Haswell, F64, 32, 1, 0x4093de75eca05b67),
        (Kernel::Haswell, F32, 33, 1, 0x439a8e3d),
        (Kernel::Haswell, F64, 33, 1, 0x407351c7b3d74809),
        (Kernel::Haswell, F32, 63, 1, 0x45fb59d2),
        (Kernel::Haswell, F64, 63, 1, 0x40bf6b3a37b329ef),
        (Kernel::Haswell, F32, 64, 1, 0x4607a8aa),
        (Kernel::Haswell, F64, 64, 1, 0x40c0f51558595973),
        (Kernel::Haswell, F32, 65, 1, 0x4616a655),
        (Kernel::Haswell, F64, 65, 1, 0x40c2d4ca8165f823),
        (Kernel::Haswell, F32, 127, 1, 0x4662532c),
        (Kernel::Haswell, F64, 127, 1, 0x40cc4a6584c38dbe),
        (Kernel::Haswell, F32, 128, 1, 0x46599258),
        (Kernel::Haswell, F64, 128, 1, 0x40cb324b0f10400e),
        (Kernel::Haswell, F32, 129, 1, 0x460afe7b),
        (Kernel::Haswell, F64, 129, 1, 0x40c15fcf757e58a0),
        (Kernel::Haswell, F32, 1000, 1, 0x47d3dbb9),
        (Kernel::Haswell, F64, 1000, 1, 0x40fa7b7737a3442a),
        (Kernel::Haswell, F32, 4097, 1, 0x48dc7a00),
        (Kernel::Haswell, F64, 4097, 1, 0x411b8f3fff453df5),
        (Kernel::Haswell, F64, 10001, 2, 0x413140a34acbc454),
        (Kernel::Haswell, F64, 20003, 2, 0x41413e79a6c5c110),
        (Kernel::Haswell, F64, 10001, 3, 0x413140a34acbc454),
        (Kernel::Haswell, F64, 20003, 3, 0x41413e79a6c5c110),
        (Kernel::Sandy, F32, 0, 1, 0x0),
        (Kernel::Sandy, F64, 0, 1, 0x0),
        (Kernel::Sandy, F32, 1, 1, 0x3e935365),
        (Kernel::Sandy, F64, 1, 1, 0x3fd26a6cabdc4900),
        (Kernel::Sandy, F32, 5, 1, 0x4409e5c0),
        (Kernel::Sandy, F64, 5, 1, 0x40813cb80aed5312),
        (Kernel::Sandy, F32, 7, 1, 0x440ea26c),
        (Kernel::Sandy, F64, 7, 1, 0x4081d44d878d886f),
        (Kernel::Sandy, F32, 15, 1, 0x44207527),
        (Kernel::Sandy, F64, 15, 1, 0x40840ea4c9996e8d),
        (Kernel::Sandy, F32, 16, 1, 0x43825d01),
        (Kernel::Sandy, F64, 16, 1, 0x40704ba01de832a8),
        (Kernel::Sandy, F32, 17, 1, 0x45603564),
        (Kernel::Sandy, F64, 17, 1, 0x40ac06ac8d06dd9b),
        (Kernel::Sandy, F32, 31, 1, 0x443db912),
        (Kernel::Sandy, F64, 31, 1, 0x4087b72247b5ca76),
        (Kernel::Sandy, F32, 32, 1, 0x449ef3b0),
        (Kernel::Sandy, F64, 32, 1, 0x4093de75eca05b67),
        (Kernel::Sandy, F32, 33, 1, 0x439a8e3d),
        (Kernel::Sandy, F64, 33, 1, 0x407351c7b3d74809),
        (Kernel::Sandy, F32, 63, 1, 0x45fb59d2),
        (Kernel::Sandy, F64, 63, 1, 0x40bf6b3a37b329ef),
        (Kernel::Sandy, F32, 64, 1, 0x4607a8aa),
        (Kernel::Sandy, F64, 64, 1, 0x40c0f51558595973),
        (Kernel::Sandy, F32, 65, 1, 0x4616a653),
        (Kernel::Sandy, F64, 65, 1, 0x40c2d4ca8165f823),
        (Kernel::Sandy, F32, 127, 1, 0x4662532c),
        (Kernel::Sandy, F64, 127, 1, 0x40cc4a6584c38dbe),
        (Kernel::Sandy, F32, 128, 1, 0x46599258),
        (Kernel::Sandy, F64, 128, 1, 0x40cb324b0f10400e),
        (Kernel::Sandy, F32, 129, 1, 0x460afe7b),
        (Kernel::Sandy, F64, 129, 1, 0x40c15fcf757e58a0),
        (Kernel::Sandy, F32, 1000, 1, 0x47d3dbb9),
        (Kernel::Sandy, F64, 1000, 1, 0x40fa7b7737a3442a),
        (Kernel::Sandy, F32, 4097, 1, 0x48dc79ff),
        (Kernel::Sandy, F64, 4097, 1, 0x411b8f3fff453df5),
        (Kernel::Sandy, F64, 10001, 2, 0x413140a34acbc454),
        (Kernel::Sandy, F64, 20003, 2, 0x41413e79a6c5c110),
        (Kernel::Sandy, F64, 10001, 3, 0x413140a34acbc454),
        (Kernel::Sandy, F64, 20003, 3, 0x41413e79a6c5c110),
        (Kernel::Nehalem, F32, 0, 1, 0x0),
        (Kernel::Nehalem, F64, 0, 1, 0x0),
        (Kernel::Nehalem, F32, 1, 1, 0x3e935365),
        (Kernel::Nehalem, F64, 1, 1, 0x3fd26a6cabdc4900),
        (Kernel::Nehalem, F32, 5, 1, 0x4409e5c0),
        (Kernel::Nehalem, F64, 5, 1, 0x40813cb80aed5312),
        (Kernel::Nehalem, F32, 7, 1, 0x440ea26c),
        (Kernel::Nehalem, F64, 7, 1, 0x4081d44d878d886f),
        (Kernel::Nehalem, F32, 15, 1, 0x44207527),
        (Kernel::Nehalem, F64, 15, 1, 0x40840ea4c9996e8d),
        (Kernel::Nehalem, F32, 16, 1, 0x43825d01),
        (Kernel::Nehalem, F64, 16, 1, 0x40704ba01de832a9),
        (Kernel::Nehalem, F32, 17, 1, 0x45603564),
        (Kernel::Nehalem, F64, 17, 1, 0x40ac06ac8d06dd9b),
        (Kernel::Nehalem, F32, 31, 1, 0x443db912),
        (Kernel::Nehalem, F64, 31, 1, 0x4087b72247b5ca76),
        (Kernel::Nehalem, F32, 32, 1, 0x449ef3af),
        (Kernel::Nehalem, F64, 32, 1, 0x4093de75eca05b67),
        (Kernel::Nehalem, F32, 33, 1, 0x439a8e3d),
        (Kernel::Nehalem, F64, 33, 1, 0x407351c7b3d74809),
        (Kernel::Nehalem, F32, 63, 1, 0x45fb59d2),
        (Kernel::Nehalem, F64, 63, 1, 0x40bf6b3a37b329ef),
        (Kernel::Nehalem, F32, 64, 1, 0x4607a8ab),
        (Kernel::Nehalem, F64, 64, 1, 0x40c0f51558595973),
        (Kernel::Nehalem, F32, 65, 1, 0x4616a653),
        (Kernel::Nehalem, F64, 65, 1, 0x40c2d4ca8165f823),
        (Kernel::Nehalem, F32, 127, 1, 0x4662532c),
        (Kernel::Nehalem, F64, 127, 1, 0x40cc4a6584c38dbd),
        (Kernel::Nehalem, F32, 128, 1, 0x46599259),
        (Kernel::Nehalem, F64, 128, 1, 0x40cb324b0f10400e),
        (Kernel::Nehalem, F32, 129, 1, 0x460afe7c),
        (Kernel::Nehalem, F64, 129, 1, 0x40c15fcf757e58a0),
        (Kernel::Nehalem, F32, 1000, 1, 0x47d3dbb9),
        (Kernel::Nehalem, F64, 1000, 1, 0x40fa7b7737a3442a),
        (Kernel::Nehalem, F32, 4097, 1, 0x48dc79fe),
        (Kernel::Nehalem, F64, 4097, 1, 0x411b8f3fff453df6),
        (Kernel::Nehalem, F64, 10001, 2, 0x413140a34acbc452),
        (Kernel::Nehalem, F64, 20003, 2, 0x41413e79a6c5c10f),
        (Kernel::Nehalem, F64, 10001, 3, 0x413140a34acbc452),
        (Kernel::Nehalem, F64, 20003, 3, 0x41413e79a6c5c10f),
        (Kernel::Generic, F32, 0, 1, 0x0),
        (Kernel::Generic, F64, 0, 1, 0x0),
        (Kernel::Generic, F32, 1, 1, 0x3e935365),
        (Kernel::Generic, F64, 1, 1, 0x3fd26a6cabdc4900),
        (Kernel::Generic, F32, 5, 1, 0x4409e5c0),
        (Kernel::Generic, F64, 5, 1, 0x40813cb80aed5313),
        (Kernel::Generic, F32, 7, 1, 0x440ea26c),
        (Kernel::Generic, F64, 7, 1, 0x4081d44d878d886f),
        (Kernel::Generic, F32, 15, 1, 0x44207526),
        (Kernel::Generic, F64, 15, 1, 0x40840ea4c9996e8d),
        (Kernel::Generic, F32, 16, 1, 0x43825d02),
        (Kernel::Generic, F64, 16, 1, 0x40704ba01de832a9),
        (Kernel::Generic, F32, 17, 1, 0x45603564),
        (Kernel::Generic, F64, 17, 1, 0x40ac06ac8d06dd9b),
        (Kernel::Generic, F32, 31, 1, 0x443db912),
        (Kernel::Generic, F64, 31, 1, 0x4087b72247b5ca77),
        (Kernel::Generic, F32, 32, 1, 0x449ef3af),
        (Kernel::Generic, F64, 32, 1, 0x4093de75eca05b67),
        (Kernel::Generic, F32, 33, 1, 0x439a8e3d),
        (Kernel::Generic, F64, 33, 1, 0x407351c7b3d74808),
        (Kernel::Generic, F32, 63, 1, 0x45fb59d1),
        (Kernel::Generic, F64, 63, 1, 0x40bf6b3a37b329f0),
        (Kernel::Generic, F32, 64, 1, 0x4607a8ab),
        (Kernel::Generic, F64, 64, 1, 0x40c0f51558595973),
        (Kernel::Generic, F32, 65, 1, 0x4616a653),
        (Kernel::Generic, F64, 65, 1, 0x40c2d4ca8165f823),
        (Kernel::Generic, F32, 127, 1, 0x4662532d),
        (Kernel::Generic, F64, 127, 1, 0x40cc4a6584c38dbe),
        (Kernel::Generic, F32, 128, 1, 0x46599259),
        (Kernel::Generic, F64, 128, 1, 0x40cb324b0f10400e),
        (Kernel::Generic, F32, 129, 1, 0x460afe7c),
        (Kernel::Generic, F64, 129, 1, 0x40c15fcf757e58a0),
        (Kernel::Generic, F32, 1000, 1, 0x47d3dbb9),
        (Kernel::Generic, F64, 1000, 1, 0x40fa7b7737a34429),
        (Kernel::Generic, F32, 4097, 1, 0x48dc79fe),
        (Kernel::Generic, F64, 4097, 1, 0x411b8f3fff453df6),
        (Kernel::Generic, F64, 10001, 2, 0x413140a34acbc454),
        (Kernel::Generic, F64, 20003, 2, 0x41413e79a6c5c10d),
    ];

    #[test]
    fn dots_match_mxnets_openblas_for_each_kernel() {
        let mut checked = 0;
        for &(kernel, double, n, threads, bits) in MXNET_DOTS {
            let v = lcg_vector(n, n as u64 + 1);
            let got = if double {
                ddot(&v, &v, kernel, threads).to_bits()
            } else {
                let v: Vec<f32> = v.iter().map(|&x| x as f32).collect();
                u64::from(sdot(&v, &v, kernel).to_bits())
            };
            assert_eq!(
                got,
                bits,
                "{kernel:?} {} n={n} threads={threads}: {got:#x}, MXNet's OpenBLAS {bits:#x}",
                if double { "ddot" } else { "sdot" }
            );
            checked += 1;
        }
        assert_eq!(checked, MXNET_DOTS.len());
    }

    #[test]
    fn the_kernels_differ_where_their_orders_do() {
        // the table would pass with one order for all if the vectors were too
        // tame: every two kernels disagree on one of its float32 vectors
        let kernels = [
            Kernel::Generic,
            Kernel::Nehalem,
            Kernel::Sandy,
            Kernel::Haswell,
        ];
        for (a, &ka) in kernels.iter().enumerate() {
            for &kb in &kernels[a + 1..] {
                let differ = [65, 127, 128, 129, 1000, 4097].iter().any(|&n| {
                    let v: Vec<f32> = lcg_vector(n, n as u64 + 1)
                        .iter()
                        .map(|&x| x as f32)
                        .collect();
                    sdot(&v, &v, ka).to_bits() != sdot(&v, &v, kb).to_bits()
                });
                assert!(differ, "{ka:?} and {kb:?} agree on every vector");
            }
        }
    }

    #[test]
    fn ddot_splits_over_threads_above_10000_only() {
        let v = lcg_vector(10_001, 7);
        let by_hand = ddot_compute(&v[..5001], &v[..5001], Kernel::Haswell)
            + ddot_compute(&v[5001..], &v[5001..], Kernel::Haswell);
        assert_eq!(
            ddot(&v, &v, Kernel::Haswell, 2).to_bits(),
            by_hand.to_bits()
        );
        let w = &v[..10_000];
        assert_eq!(
            ddot(w, w, Kernel::Haswell, 2).to_bits(),
            ddot(w, w, Kernel::Haswell, 1).to_bits()
        );
        // the generic kernel (dot_sse2.S) never splits
        assert_eq!(
            ddot(&v, &v, Kernel::Generic, 3).to_bits(),
            ddot(&v, &v, Kernel::Generic, 1).to_bits()
        );
    }

    #[test]
    fn empty_and_special_values() {
        for k in [
            Kernel::Generic,
            Kernel::Nehalem,
            Kernel::Sandy,
            Kernel::Haswell,
        ] {
            assert_eq!(sdot(&[], &[], k).to_bits(), 0);
            assert_eq!(ddot(&[], &[], k, 4).to_bits(), 0);
            let mut v = vec![1f32; 70];
            v[40] = f32::INFINITY;
            assert_eq!(sdot(&v, &v, k), f32::INFINITY);
            v[3] = f32::NAN;
            assert!(sdot(&v, &v, k).is_nan());
            // float32 products summed past float32's range in sdot.c's double
            // tail still round to inf at the end
            let big = vec![3e19f32; 3];
            assert_eq!(sdot(&big, &big, k), f32::INFINITY);
        }
    }

    #[test]
    fn core_tables_as_openblas_0_3_13_picks_them() {
        let cpu = |vendor: &[u8; 12], family: u32, exfamily: u32, model: u32, exmodel: u32| CpuId {
            vendor: *vendor,
            max_leaf: 0x10,
            eax1: (exfamily << 20) | (exmodel << 16) | (family << 8) | (model << 4),
            ecx1: 0,
            ext_max: 0,
            ext_edx1: 0,
            avx: true,
            avx2: true,
        };
        let intel = |m: u32| cpu(b"GenuineIntel", 6, 0, m & 15, m >> 4);
        let amd = |f: u32, m: u32| cpu(b"AuthenticAMD", 15, f - 15, m & 15, m >> 4);
        assert_eq!(amd(0x19, 0x11).core(), Core::Zen); // EPYC Genoa (this machine)
        assert_eq!(amd(0x17, 0x31).core(), Core::Zen);
        assert_eq!(amd(0x1a, 0x02).core(), Core::Barcelona); // Zen 5: unknown to 0.3.13
        assert_eq!(intel(0x55).core(), Core::Haswell); // Skylake-X: aliased
        assert_eq!(intel(0x3f).core(), Core::Haswell);
        assert_eq!(intel(0x2a).core(), Core::Sandybridge);
        assert_eq!(intel(0x1a).core(), Core::Nehalem);
        assert_eq!(intel(0x17).core(), Core::Core2);
        assert_eq!(intel(0x8f).core(), Core::Prescott); // Sapphire Rapids
        assert_eq!(intel(0x97).core(), Core::Prescott); // Alder Lake
        assert_eq!(intel(0x8e).core(), Core::Haswell); // Kaby Lake
        let mut old = intel(0x3f);
        old.avx2 = false;
        assert_eq!(old.core(), Core::Sandybridge);
        old.avx = false;
        assert_eq!(old.core(), Core::Nehalem);
        assert_eq!(Core::forced("SKYLAKEX"), Core::Haswell);
        assert_eq!(Core::forced("cooperlake"), Core::Prescott);
        assert_eq!(Core::forced("atom"), Core::Nehalem);
        assert_eq!(Core::forced("Zen"), Core::Zen);
        assert_eq!(Core::forced("zenith"), Core::Prescott);
        assert_eq!(
            Core::forced(&format!("a{}", "\u{e9}".repeat(10))),
            Core::Prescott
        );
    }
}

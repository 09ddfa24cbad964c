//! NDArrays as the store sees them: a shape, an element type, a CPU context
//! and a buffer behind a lock. Handles share one array through `Arc`, the way
//! MXNet's NDArray handles share a chunk.
#![forbid(unsafe_code)]

pub mod blas_dot;
pub mod dtype;
pub mod kahan;
pub mod kernels;
pub mod params;
pub mod pool;
pub mod sparse;

use crate::error::{Error, Result};
use crate::{bail, ensure};
use dtype::DType;
use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::fmt;
use std::sync::Arc;

/// Device type codes of MXNet's `Context`.
pub const DEV_CPU: i32 = 1;
pub const DEV_GPU: i32 = 2;
pub const DEV_CPU_PINNED: i32 = 3;
pub const DEV_CPU_SHARED: i32 = 5;

/// Where an array lives. Only CPU kinds exist in this build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Context {
    pub dev_type: i32,
    pub dev_id: i32,
}

impl Context {
    pub const CPU0: Context = Context {
        dev_type: DEV_CPU,
        dev_id: 0,
    };
    pub const PINNED0: Context = Context {
        dev_type: DEV_CPU_PINNED,
        dev_id: 0,
    };

    /// Checks a context given by a caller, refusing GPUs as MXNet's CPU build does.
    pub fn new(dev_type: i32, dev_id: i32) -> Result<Context> {
        match dev_type {
            DEV_CPU | DEV_CPU_PINNED | DEV_CPU_SHARED => {}
            DEV_GPU => bail!("Compile with USE_CUDA=1 to enable GPU usage"),
            _ => bail!("unknown device type {dev_type} (cpu 1, gpu 2, cpu_pinned 3, cpu_shared 5)"),
        }
        ensure!(dev_id >= 0, "invalid device id {dev_id}");
        Ok(Context { dev_type, dev_id })
    }

    /// The context of a new array as the C API's caller names it, as MXNet's
    /// `Context::Create`: a negative device id of a CPU context (`cpu`,
    /// `cpu_shared`) means device 0; anything else is checked by
    /// [`Context::new`].
    pub fn create(dev_type: i32, dev_id: i32) -> Result<Context> {
        match dev_type {
            DEV_CPU | DEV_CPU_SHARED if dev_id < 0 => Context::new(dev_type, 0),
            _ => Context::new(dev_type, dev_id),
        }
    }
}

impl fmt::Display for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.dev_type {
            DEV_CPU => "cpu",
            DEV_GPU => "gpu",
            DEV_CPU_PINNED => "cpu_pinned",
            _ => "cpu_shared",
        };
        write!(f, "{name}({})", self.dev_id)
    }
}

/// MXNet's storage type codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageType {
    Undefined = -1,
    Default = 0,
    RowSparse = 1,
    Csr = 2,
}

impl StorageType {
    pub fn code(self) -> i32 {
        self as i32
    }

    /// A sparse storage type by its code (row_sparse 1, csr 2).
    pub fn sparse_from_code(code: i32) -> Result<StorageType> {
        match code {
            1 => Ok(StorageType::RowSparse),
            2 => Ok(StorageType::Csr),
            s => bail!("storage type {s} is not sparse (row_sparse 1, csr 2)"),
        }
    }
}

/// A shape, printed the way MXNet prints `TShape`: `[2,3]`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Shape(pub Vec<i64>);

impl Shape {
    /// The number of elements, saturating at `usize::MAX`: a sparse array's
    /// logical shape may be larger than memory (`[6, 2^62]` holding no
    /// rows). Arrays with a buffer always fit.
    pub fn size(&self) -> usize {
        self.0
            .iter()
            .fold(1usize, |acc, &d| acc.saturating_mul(d as usize))
    }
    pub fn dims(&self) -> &[i64] {
        &self.0
    }
    pub fn ndim(&self) -> usize {
        self.0.len()
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// Largest array we agree to allocate (bytes): beyond this a caller's shape is
/// almost surely garbage, and allocation failure would abort the process.
pub const MAX_BYTES: usize = 1 << 40;

/// An aligned byte buffer (see [`PAGE_ALIGN_MIN`], [`MAP_MIN`]): zeroed when
/// made by [`Buffer::zeroed`], to be overwritten whole when made by
/// [`Buffer::for_overwrite`].
pub struct Buffer {
    storage: Storage,
    nbytes: usize,
    /// Set once the buffer's address was handed out ([`Buffer::as_mut_ptr`]):
    /// from then on its storage is never replaced (see [`NDArray::share`]).
    pinned: bool,
}

enum Storage {
    /// Words from the allocator; the buffer starts at word `start`, the first
    /// one aligned to [`Buffer::alignment`].
    Heap { words: Vec<u64>, start: usize },
    /// An anonymous mapping with transparent huge pages requested.
    Mapped(memmap2::MmapMut),
    /// Bytes adopted without a copy (a received frame; see
    /// [`Buffer::adopt`]), shared with whoever else holds them. Read in
    /// place; copied into storage of this buffer's own on the first write.
    Frame(bytes::Bytes),
    /// This buffer's own storage, lent out to be sent without a copy (see
    /// [`Buffer::share`]). Read in place; taken back on the first write when
    /// nobody else holds it any more, else the write goes to a copy.
    Lent(Arc<Buffer>),
}

/// Buffers of at least this many bytes are lent out to be sent without a
/// copy ([`NDArray::share`]); smaller ones cost less to copy.
pub const SHARE_MIN: usize = 64 << 10;

/// A lent buffer as the owner of `Bytes`.
struct LentBytes(Arc<Buffer>);

impl AsRef<[u8]> for LentBytes {
    fn as_ref(&self) -> &[u8] {
        self.0.bytes()
    }
}

impl Storage {
    const EMPTY: Storage = Storage::Heap {
        words: Vec::new(),
        start: 0,
    };
}

/// Buffers of at least this many bytes are anonymous mappings of their own,
/// kept in the [`pool`] once freed and reused by later buffers of about the
/// same size (see [`Buffer::mapped_len`]).
/// From the C library's allocator, such buffers came as fresh mappings or
/// from the top of its heap, which it hands back to the kernel when they are
/// freed: every array of a reloaded checkpoint was faulted in again, page by
/// page (200 arrays of 4 MiB: ~430 ms a load into new memory, ~100 ms into
/// pooled mappings; MXNet 1.9.1's storage pool keeps them too). Smaller
/// buffers stay with the allocator, which reuses them well, and a process
/// does not run into its limit on mappings (`vm.max_map_count`, 65530) before
/// it holds 64 GiB in mappings of this size. Huge pages are requested from
/// [`HUGE_MIN`] on only: on the reference VM, a fresh process's first load of
/// 200 x 4 MiB took 1.3–2.1 s with them instead of ~0.45 s.
const MAP_MIN: usize = 1 << 20;

/// Buffers of at least this many bytes are mapped in whole 2 MB pages (see
/// [`Buffer::mapped_len`]), with transparent huge pages requested. Row
/// lookups into a large row_sparse table are bound by TLB misses: with 2 MB
/// pages a pull of 100,000 rows of a 1,000,000 x 64 float32 table took 3.6 ms
/// instead of 6.5 ms on the reference machine. And a fresh array's first
/// touch costs one fault per 2 MB instead of per 4 KB: an init of 64 MB there
/// took 80 ms instead of 101 ms (calloc'd, 2 threads) when the VM's memory had
/// been handed back to the host, and 8 ms instead of 18 ms when not.
const HUGE_MIN: usize = 32 << 20;

/// Buffers of at least this many bytes start on a page boundary, smaller ones
/// on a 64-byte line. Copies between two buffers then keep the same offset in
/// their pages: on the reference machine glibc's memcpy of 256 KB ran at 112 GB/s
/// that way and at 72–92 GB/s when the destination's page offset was 48–700
/// bytes past the source's (as malloc's 16-byte alignment leaves it at random).
const PAGE_ALIGN_MIN: usize = 64 << 10;

impl Buffer {
    fn alignment(nbytes: usize) -> usize {
        match nbytes {
            0 => 8,
            n if n >= PAGE_ALIGN_MIN => 4096,
            _ => 64,
        }
    }

    /// The length to map for a buffer of `nbytes` ([`MAP_MIN`] or more), and
    /// the longest pooled mapping that may serve it instead. From
    /// [`HUGE_MIN`] on, whole 2 MB pages, so that arrays of nearby sizes
    /// share pooled mappings at a cost of under 2 MB each; below, whole 4 KB
    /// pages (2 MB would nearly double a 2.1 MB array), served by a mapping
    /// up to an eighth longer.
    fn mapped_len(nbytes: usize) -> (usize, usize) {
        if nbytes >= HUGE_MIN {
            let len = nbytes.next_multiple_of(2 << 20);
            (len, len)
        } else {
            let len = nbytes.next_multiple_of(4096);
            (len, len + len / 8)
        }
    }

    /// A buffer of no bytes (nothing allocated).
    fn empty() -> Buffer {
        Buffer {
            storage: Storage::EMPTY,
            nbytes: 0,
            pinned: false,
        }
    }

    /// A buffer of zeros.
    pub fn zeroed(nbytes: usize) -> Result<Buffer> {
        Buffer::alloc(nbytes, true)
    }

    /// A buffer whose every byte the caller writes before anyone reads it: a
    /// pooled mapping is then handed over without zeroing it first.
    pub fn for_overwrite(nbytes: usize) -> Result<Buffer> {
        Buffer::alloc(nbytes, false)
    }

    fn alloc(nbytes: usize, zero: bool) -> Result<Buffer> {
        ensure!(
            nbytes <= MAX_BYTES,
            "array of {nbytes} bytes is larger than this library allocates ({MAX_BYTES})"
        );
        let oom = |e: String| Error::new(format!("out of memory allocating {nbytes} bytes{e}"));
        let mapped = if nbytes >= MAP_MIN {
            let (len, longest) = Buffer::mapped_len(nbytes);
            match pool::take(len, longest) {
                Some(mut map) => {
                    if zero {
                        kernels::zero_bytes(&mut map[..nbytes]);
                    }
                    Some(map)
                }
                // A buffer to be overwritten whole gets its pages at once
                // (MAP_POPULATE) rather than one fault per 4 KB page as it is
                // written: a fresh process's first load of 200 x 4 MiB took
                // 300-480 ms instead of 440-570 ms.
                None => match if !zero && nbytes < HUGE_MIN {
                    memmap2::MmapOptions::new().len(len).populate().map_anon()
                } else {
                    memmap2::MmapMut::map_anon(len)
                } {
                    Ok(map) => {
                        // Only advice: where huge pages are unavailable, small pages serve.
                        if nbytes >= HUGE_MIN {
                            let _ = map.advise(memmap2::Advice::HugePage);
                        }
                        Some(map)
                    }
                    // Under HUGE_MIN the allocator may still serve (the
                    // process's limit on mappings reached, say).
                    Err(_) if nbytes < HUGE_MIN => None,
                    Err(e) => return Err(oom(format!(": {e}"))),
                },
            }
        } else {
            None
        };
        let storage = if let Some(map) = mapped {
            Storage::Mapped(map)
        } else {
            // Room to move the start to the alignment (the allocator's own is 16).
            let align_words = Buffer::alignment(nbytes) / 8;
            let nwords = nbytes.div_ceil(8) + align_words - 1;
            // calloc: large buffers come as untouched zero pages, so no memset
            // pass before the first real write (and under MAP_MIN bytes, a
            // failure here is not a realistic concern).
            let words = vec![0u64; nwords];
            let start = words.as_ptr().align_offset(align_words * 8);
            // align_offset may decline (usize::MAX); a buffer is then just unaligned.
            let start = if start < align_words { start } else { 0 };
            Storage::Heap { words, start }
        };
        Ok(Buffer {
            storage,
            nbytes,
            pinned: false,
        })
    }

    /// The bytes as `Bytes` without a copy, to be sent while the buffer goes
    /// on: an adopted frame's, or the buffer's own storage lent out (when it
    /// holds [`SHARE_MIN`] bytes or more and its address was never handed
    /// out). Its next write takes the storage back when the `Bytes` are gone
    /// by then, and else goes to other memory, so what was sent never
    /// changes. `None`: copy the bytes instead.
    pub fn share(&mut self) -> Option<bytes::Bytes> {
        if let Some(b) = self.shared_bytes() {
            return Some(b);
        }
        if self.pinned || self.nbytes < SHARE_MIN {
            return None;
        }
        let own = Arc::new(std::mem::replace(self, Buffer::empty()));
        let shared = bytes::Bytes::from_owner(LentBytes(own.clone()));
        self.nbytes = own.nbytes;
        self.storage = Storage::Lent(own);
        Some(shared)
    }

    /// Whether the buffer reads shared bytes (an adopted frame, or its own
    /// storage lent out).
    pub fn is_shared(&self) -> bool {
        matches!(self.storage, Storage::Frame(_) | Storage::Lent(_))
    }

    /// A buffer of `bytes` without a copy, when they are aligned for every
    /// dtype (8 bytes) and [`SHARE_MIN`] bytes or more; `Err(bytes)` when not. Writes go to a copy (see
    /// [`Storage::Frame`]), so whoever else holds `bytes` never sees them.
    pub fn adopt(bytes: bytes::Bytes) -> std::result::Result<Buffer, bytes::Bytes> {
        // Smaller frames may sit in a shared receive buffer of libzmq's,
        // which one adopted frame would keep alive whole: those are copied.
        if bytes.as_ptr().align_offset(8) != 0 || bytes.len() < SHARE_MIN || bytes.len() > MAX_BYTES
        {
            return Err(bytes);
        }
        Ok(Buffer {
            nbytes: bytes.len(),
            storage: Storage::Frame(bytes),
            pinned: false,
        })
    }

    /// Makes a shared buffer one of its own before a write: a lent one taken
    /// back, or else a copy of the bytes.
    fn own(&mut self) {
        if self.take_back() {
            return;
        }
        if let Some(shared) = self.shared_bytes() {
            kernels::copy_bytes(&shared, self.overwrite());
        }
    }

    /// A shared buffer's bytes (an adopted frame, or the lent storage) as
    /// `Bytes`, without a copy; None for storage of its own.
    fn shared_bytes(&self) -> Option<bytes::Bytes> {
        match &self.storage {
            Storage::Frame(b) => Some(b.clone()),
            Storage::Lent(a) => Some(bytes::Bytes::from_owner(LentBytes(a.clone()))),
            Storage::Heap { .. } | Storage::Mapped(_) => None,
        }
    }

    /// Takes a lent buffer back when nobody else holds it (true); false when
    /// the buffer is not lent or still held.
    pub fn take_back(&mut self) -> bool {
        let Storage::Lent(a) = &mut self.storage else {
            return false;
        };
        let Some(back) = Arc::get_mut(a) else {
            return false;
        };
        let back = std::mem::replace(back, Buffer::empty());
        *self = back;
        true
    }

    /// The bytes, to be overwritten whole: a shared buffer is taken back
    /// (lent, no longer held) or replaced by one of its own, without copying
    /// what it held.
    pub fn overwrite(&mut self) -> &mut [u8] {
        if self.is_shared() && !self.take_back() {
            // Infallible here: past mmap failures the allocator aborts, as
            // any allocation does.
            let n = self.nbytes;
            *self = Buffer::for_overwrite(n).unwrap_or_else(|_| Buffer {
                storage: Storage::Heap {
                    words: vec![0u64; n.div_ceil(8)],
                    start: 0,
                },
                nbytes: n,
                pinned: false,
            });
        }
        self.bytes_mut()
    }

    pub fn len(&self) -> usize {
        self.nbytes
    }

    pub fn is_empty(&self) -> bool {
        self.nbytes == 0
    }

    pub fn bytes(&self) -> &[u8] {
        match &self.storage {
            Storage::Heap { words, start } => {
                &bytemuck::cast_slice(&words[*start..])[..self.nbytes]
            }
            Storage::Mapped(m) => &m[..self.nbytes],
            Storage::Frame(b) => &b[..self.nbytes],
            Storage::Lent(a) => a.bytes(),
        }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.own();
        match &mut self.storage {
            Storage::Heap { words, start } => {
                &mut bytemuck::cast_slice_mut(&mut words[*start..])[..self.nbytes]
            }
            Storage::Mapped(m) => &mut m[..self.nbytes],
            Storage::Frame(_) | Storage::Lent(_) => unreachable!("owned above"),
        }
    }

    pub fn typed<T: bytemuck::Pod>(&self) -> &[T] {
        bytemuck::cast_slice(self.bytes())
    }

    pub fn typed_mut<T: bytemuck::Pod>(&mut self) -> &mut [T] {
        bytemuck::cast_slice_mut(self.bytes_mut())
    }

    /// The buffer's address, for `MXNDArrayGetData`. It stays valid for the
    /// array's lifetime: a pinned buffer's storage is never replaced (a
    /// shared one, see [`Buffer::share`] and [`Buffer::adopt`], is made the
    /// buffer's own here first, and then pinned).
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.own();
        self.pinned = true;
        match &mut self.storage {
            Storage::Heap { words, start } => words[*start..].as_mut_ptr().cast(),
            Storage::Mapped(m) => m.as_mut_ptr(),
            Storage::Frame(_) | Storage::Lent(_) => unreachable!("owned above"),
        }
    }
}

impl AsRef<[u8]> for Buffer {
    fn as_ref(&self) -> &[u8] {
        self.bytes()
    }
}

impl Drop for Buffer {
    /// Mappings go back to the pool (see [`pool`]).
    fn drop(&mut self) {
        if let Storage::Mapped(map) = std::mem::replace(&mut self.storage, Storage::EMPTY) {
            pool::give(map);
        }
    }
}

struct Inner {
    shape: Shape,
    dtype: DType,
    ctx: Context,
    stype: StorageType,
    /// Dense storage (empty for sparse arrays).
    data: RwLock<Buffer>,
    /// Sparse storage: the data and aux arrays, replaced as a whole when the
    /// number of stored rows changes.
    parts: Option<RwLock<sparse::Parts>>,
    /// Set on the parts of a row_sparse value a store adopted without a
    /// copy: from then on they are never written in place (see
    /// `sparse::share_row_sparse`).
    frozen: std::sync::atomic::AtomicBool,
}

/// A shared handle to one array. Cloning shares the storage.
#[derive(Clone)]
pub struct NDArray {
    inner: Arc<Inner>,
}

impl fmt::Debug for NDArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "NDArray({} {} {})",
            self.inner.shape,
            self.inner.dtype.name(),
            self.inner.ctx
        )
    }
}

impl NDArray {
    /// A dense array of zeros.
    pub fn zeros(shape: Shape, dtype: DType, ctx: Context) -> Result<NDArray> {
        for &d in shape.dims() {
            ensure!(d >= 0, "negative dimension {d} in shape {shape}");
        }
        let nbytes = shape
            .dims()
            .iter()
            .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d as usize))
            .ok_or_else(|| Error::new(format!("shape {shape} is too large")))?;
        Ok(NDArray::from_parts(
            shape,
            dtype,
            ctx,
            StorageType::Default,
            Buffer::zeroed(nbytes)?,
        ))
    }

    /// A dense array holding `bytes` (length must match).
    pub fn from_bytes(shape: Shape, dtype: DType, ctx: Context, bytes: &[u8]) -> Result<NDArray> {
        let a = NDArray::zeros(shape, dtype, ctx)?;
        a.copy_from_bytes(bytes)?;
        Ok(a)
    }

    /// An array with no shape and no storage (`MXNDArrayCreateNone`).
    pub fn none() -> NDArray {
        NDArray::from_parts(
            Shape::default(),
            DType::F32,
            Context::CPU0,
            StorageType::Undefined,
            Buffer::empty(),
        )
    }

    fn from_parts(
        shape: Shape,
        dtype: DType,
        ctx: Context,
        stype: StorageType,
        buf: Buffer,
    ) -> NDArray {
        NDArray::build(shape, dtype, ctx, stype, buf, None)
    }

    fn build(
        shape: Shape,
        dtype: DType,
        ctx: Context,
        stype: StorageType,
        buf: Buffer,
        parts: Option<sparse::Parts>,
    ) -> NDArray {
        NDArray {
            inner: Arc::new(Inner {
                shape,
                dtype,
                ctx,
                stype,
                data: RwLock::new(buf),
                parts: parts.map(RwLock::new),
                frozen: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }

    pub fn shape(&self) -> &Shape {
        &self.inner.shape
    }
    pub fn size(&self) -> usize {
        self.inner.shape.size()
    }
    pub fn dtype(&self) -> DType {
        self.inner.dtype
    }
    pub fn ctx(&self) -> Context {
        self.inner.ctx
    }
    pub fn stype(&self) -> StorageType {
        self.inner.stype
    }
    pub fn is_none(&self) -> bool {
        self.inner.stype == StorageType::Undefined
    }
    pub fn is_sparse(&self) -> bool {
        matches!(self.inner.stype, StorageType::RowSparse | StorageType::Csr)
    }

    /// True when both handles share one array.
    pub fn same(&self, other: &NDArray) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// A stable address used to order lock acquisition.
    pub(crate) fn addr(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    pub fn read(&self) -> RwLockReadGuard<'_, Buffer> {
        self.inner.data.read_recursive()
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, Buffer> {
        self.inner.data.write()
    }

    /// A new array on `ctx` with the same shape and type and a copy of the data.
    pub fn copy_to_ctx(&self, ctx: Context) -> Result<NDArray> {
        if self.is_sparse() {
            return self.sparse_copy_to_ctx(ctx);
        }
        self.ensure_dense("copy")?;
        let guard = self.read();
        let mut buf = Buffer::for_overwrite(guard.len())?;
        kernels::copy_bytes(guard.bytes(), buf.bytes_mut());
        Ok(NDArray::from_parts(
            self.shape().clone(),
            self.dtype(),
            ctx,
            StorageType::Default,
            buf,
        ))
    }

    pub fn ensure_dense(&self, what: &str) -> Result<()> {
        match self.stype() {
            StorageType::Default => Ok(()),
            StorageType::Undefined => {
                bail!("cannot {what} an empty NDArray (created with MXNDArrayCreateNone)")
            }
            StorageType::RowSparse => {
                bail!("cannot {what} a row_sparse array: this function takes dense arrays only")
            }
            StorageType::Csr => {
                bail!("cannot {what} a csr array: this function takes dense arrays only")
            }
        }
    }

    /// The byte count of a copy of `elements` elements to or from the dense
    /// array (`MXNDArraySyncCopyFromCPU`/`ToCPU`, `what` naming the
    /// direction): the count must be the array's, as MXNet checks it.
    pub fn bytes_for_copy(&self, what: &str, elements: usize) -> Result<usize> {
        self.ensure_dense(what)?;
        ensure!(
            elements == self.size(),
            "Check failed: dshape.Size() == size ({} vs. {elements}) : Memory size do not match",
            self.size()
        );
        Ok(elements * self.dtype().size())
    }

    /// `MXNDArraySyncCopyFromNDArray`: part `i` of a sparse array (-1 the
    /// data, ≥0 aux `i`: [`NDArray::set_part`]), or a dense array's data
    /// (`i` must be -1: [`NDArray::sync_copy_from`]) from `src`.
    pub fn sync_copy_from_part(&self, i: i32, src: &NDArray) -> Result<()> {
        if self.is_sparse() {
            return self.set_part(i, src);
        }
        ensure!(
            i == -1,
            "aux index {i} given for a dense array (only -1, the data, applies)"
        );
        self.sync_copy_from(src)
    }

    /// MXNet's dtype code of the array; -1 for an empty array
    /// (`MXNDArrayCreateNone`), as in MXNet.
    pub fn dtype_code(&self) -> i32 {
        if self.is_none() {
            -1
        } else {
            self.dtype().code()
        }
    }

    /// The context as (device type, device id); `(0, 0)` for an empty array,
    /// as in MXNet.
    pub fn context_codes(&self) -> (i32, i32) {
        if self.is_none() {
            (0, 0)
        } else {
            (self.ctx().dev_type, self.ctx().dev_id)
        }
    }

    /// The array sharing the data (`MXNDArrayGetDataNDArray`): a sparse
    /// array's data part (made its own first where a store shares it), or
    /// the dense array itself.
    pub fn data_ndarray(&self) -> Result<NDArray> {
        if self.is_sparse() {
            return Ok(self.private_parts()?.data);
        }
        self.ensure_dense("get the data of")?;
        Ok(self.clone())
    }

    /// Aux array `i` of a sparse array, sharing its storage
    /// (`MXNDArrayGetAuxNDArray`; made the array's own first where a store
    /// shares it).
    pub fn aux_ndarray(&self, i: usize) -> Result<NDArray> {
        let parts = self.private_parts()?;
        match parts.aux.get(i) {
            Some(a) => Ok(a.clone()),
            None => bail!(
                "aux index {i} out of range: the array has {} aux arrays",
                parts.aux.len()
            ),
        }
    }

    /// The dense array's buffer, to be written whole with `len` bytes.
    fn whole(&self, len: usize) -> Result<RwLockWriteGuard<'_, Buffer>> {
        self.ensure_dense("copy into")?;
        let guard = self.write();
        ensure!(
            guard.len() == len,
            "Memory size do not match: the array holds {} bytes, the source {len}",
            guard.len(),
        );
        Ok(guard)
    }

    /// `MXNDArraySyncCopyFromCPU`: `bytes` must hold exactly the array.
    pub fn copy_from_bytes(&self, bytes: &[u8]) -> Result<()> {
        kernels::copy_bytes(bytes, self.whole(bytes.len())?.overwrite());
        Ok(())
    }

    /// As [`NDArray::copy_from_bytes`], but `bytes` become the contents
    /// without a copy when they can (aligned for every dtype, and the
    /// array's address never handed out by `MXNDArrayGetData`): the array
    /// then reads them in place and copies them on its first write (or
    /// takes fresh memory on a whole overwrite), so whoever else holds
    /// `bytes` never sees a change.
    pub fn assign_bytes(&self, bytes: bytes::Bytes) -> Result<()> {
        let mut guard = self.whole(bytes.len())?;
        let adopted = if guard.pinned {
            Err(bytes)
        } else {
            Buffer::adopt(bytes)
        };
        match adopted {
            Ok(b) => *guard = b,
            Err(bytes) => kernels::copy_bytes(&bytes, guard.overwrite()),
        }
        Ok(())
    }

    /// The contents as `Bytes` without a copy, to be sent while the array
    /// goes on: its next write takes the memory back if the `Bytes` are gone
    /// by then and else writes elsewhere, so what was sent never changes.
    /// For dense arrays of [`SHARE_MIN`] bytes or more whose address no C
    /// caller holds (`MXNDArrayGetData`), or that hold adopted bytes; else
    /// `None` (copy them).
    pub fn share(&self) -> Option<bytes::Bytes> {
        if self.is_sparse() || self.is_none() {
            return None;
        }
        {
            // most arrays are not shareable: say so without the write lock
            let g = self.read();
            if !g.is_shared() && (g.pinned || g.len() < SHARE_MIN) {
                return None;
            }
        }
        self.write().share()
    }

    /// `MXNDArraySyncCopyToCPU`.
    pub fn copy_to_bytes(&self, out: &mut [u8]) -> Result<()> {
        self.ensure_dense("copy from")?;
        let guard = self.read();
        ensure!(
            guard.len() == out.len(),
            "Memory size do not match: the array holds {} bytes, the destination {}",
            guard.len(),
            out.len()
        );
        kernels::copy_bytes(guard.bytes(), out);
        Ok(())
    }

    /// Copies `src` into `self`, converting the element type; shapes must be
    /// equal (MXNet's `CopyFromTo` check and wording).
    pub fn copy_from(&self, src: &NDArray) -> Result<()> {
        if self.is_sparse() || src.is_sparse() {
            return sparse::copy_any(src, self);
        }
        self.ensure_dense("copy into")?;
        src.ensure_dense("copy from")?;
        ensure!(
            src.shape() == self.shape(),
            "operands shape mismatch from.shape = {} to.shape={}",
            src.shape(),
            self.shape()
        );
        if self.same(src) {
            return Ok(());
        }
        let (sg, mut dg) = lock_read_write(src, self);
        kernels::convert_bytes(src.dtype(), sg.bytes(), self.dtype(), dg.overwrite());
        Ok(())
    }

    /// Reads the elements as f64 (tests and diagnostics).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        let g = self.read();
        crate::with_dtype!(self.dtype(), T => g
            .typed::<T>()
            .iter()
            .map(|v| match dtype::Elem::to_wide(*v) {
                dtype::Wide::I(i) => i as f64,
                dtype::Wide::U(u) => u as f64,
                dtype::Wide::F(f) => f,
            })
            .collect())
    }
}

/// Copies `src` into every array of `outs` (dense, each of `src`'s shape;
/// any dtype), reading `src` once. Locks are taken in address order.
pub fn copy_to_many(src: &NDArray, outs: &[&NDArray]) -> Result<()> {
    if src.is_sparse() || outs.iter().any(|o| o.is_sparse() || o.same(src)) || outs.len() < 2 {
        for o in outs {
            o.copy_from(src)?;
        }
        return Ok(());
    }
    src.ensure_dense("copy from")?;
    for o in outs {
        o.ensure_dense("copy into")?;
        ensure!(
            src.shape() == o.shape(),
            "operands shape mismatch from.shape = {} to.shape={}",
            src.shape(),
            o.shape()
        );
    }
    let mut uniq: Vec<&NDArray> = outs.to_vec();
    uniq.sort_by_key(|a| a.addr());
    uniq.dedup_by(|a, b| a.same(b));
    let mut src_guard = None;
    let mut writes = Vec::with_capacity(uniq.len());
    for o in &uniq {
        if src_guard.is_none() && src.addr() < o.addr() {
            src_guard = Some(src.read());
        }
        writes.push((o.dtype(), o.write()));
    }
    let src_guard = src_guard.unwrap_or_else(|| src.read());
    let mut targets: Vec<(DType, &mut [u8])> = writes
        .iter_mut()
        .map(|(d, g)| (*d, g.overwrite()))
        .collect();
    kernels::broadcast_bytes(src.dtype(), src_guard.bytes(), &mut targets);
    Ok(())
}

/// Locks `src` for reading and `dst` for writing, always in address order so
/// that two threads copying in opposite directions cannot deadlock.
pub fn lock_read_write<'a>(
    src: &'a NDArray,
    dst: &'a NDArray,
) -> (RwLockReadGuard<'a, Buffer>, RwLockWriteGuard<'a, Buffer>) {
    debug_assert!(!src.same(dst));
    if src.addr() < dst.addr() {
        let s = src.read();
        (s, dst.write())
    } else {
        let d = dst.write();
        (src.read(), d)
    }
}

/// Sums `inputs` (each of `out`'s shape and dtype) into `out` in `order`.
/// Locks are taken once each, in address order; an input that is `out`
/// itself is read from a private copy.
pub fn sum_into(inputs: &[NDArray], out: &NDArray, order: kernels::SumOrder) -> Result<()> {
    check_summands(inputs, out)?;
    let owned: Vec<NDArray>;
    let inputs = if inputs.iter().any(|a| a.same(out)) {
        owned = inputs
            .iter()
            .map(|a| {
                if a.same(out) {
                    a.copy_to_ctx(a.ctx())
                } else {
                    Ok(a.clone())
                }
            })
            .collect::<Result<_>>()?;
        &owned[..]
    } else {
        inputs
    };
    let (reads, mut writes) = lock_many(inputs, &[out]);
    let slices = input_slices(inputs, &reads);
    kernels::sum_bytes(out.dtype(), &slices, writes[0].1.overwrite(), order);
    Ok(())
}

/// [`sum_into`] that also copies the sum into `copies` in the same pass (the
/// outputs of a PushPull). Returns `false`, doing nothing, unless every copy
/// is a distinct dense array of `out`'s shape and dtype that is neither `out`
/// nor an input; the caller then sums and copies separately.
pub fn sum_into_and_copy(
    inputs: &[NDArray],
    out: &NDArray,
    copies: &[&NDArray],
    order: kernels::SumOrder,
) -> Result<bool> {
    check_summands(inputs, out)?;
    let mut writes: Vec<&NDArray> = [out].into_iter().chain(copies.iter().copied()).collect();
    writes.sort_by_key(|a| a.addr());
    let distinct = writes.windows(2).all(|w| !w[0].same(w[1]))
        && !inputs.iter().any(|a| writes.iter().any(|w| w.same(a)));
    let fits = copies.iter().all(|c| {
        c.stype() == StorageType::Default && c.shape() == out.shape() && c.dtype() == out.dtype()
    });
    if !distinct || !fits {
        return Ok(false);
    }
    let writes: Vec<&NDArray> = [out].into_iter().chain(copies.iter().copied()).collect();
    let (reads, mut guards) = lock_many(inputs, &writes);
    let slices = input_slices(inputs, &reads);
    // `guards` is in `writes` order: the stored value first.
    let (first, rest) = guards.split_first_mut().expect("out is locked");
    let mut targets: Vec<&mut [u8]> = rest.iter_mut().map(|(_, g)| g.overwrite()).collect();
    kernels::sum_copy_bytes(
        out.dtype(),
        &slices,
        first.1.overwrite(),
        &mut targets,
        order,
    );
    Ok(true)
}

fn check_summands(inputs: &[NDArray], out: &NDArray) -> Result<()> {
    ensure!(!inputs.is_empty(), "nothing to sum");
    for a in inputs {
        a.ensure_dense("sum")?;
        ensure!(
            a.shape() == out.shape() && a.dtype() == out.dtype(),
            "operands shape mismatch from.shape = {} to.shape={}",
            a.shape(),
            out.shape()
        );
    }
    Ok(())
}

type ReadGuards<'a> = Vec<(usize, RwLockReadGuard<'a, Buffer>)>;
type WriteGuards<'a> = Vec<(usize, RwLockWriteGuard<'a, Buffer>)>;

/// Read-locks `reads` (deduplicated, sorted by address) and write-locks
/// `writes` (distinct, none of them in `reads`; returned in `writes` order),
/// all in address order so that concurrent callers cannot deadlock.
fn lock_many<'a>(
    reads: &'a [NDArray],
    writes: &[&'a NDArray],
) -> (ReadGuards<'a>, WriteGuards<'a>) {
    let mut order: Vec<(&NDArray, Option<usize>)> = reads
        .iter()
        .map(|a| (a, None))
        .chain(writes.iter().enumerate().map(|(i, a)| (*a, Some(i))))
        .collect();
    order.sort_by_key(|(a, _)| a.addr());
    order.dedup_by(|a, b| a.0.same(b.0));
    let mut rg = Vec::with_capacity(reads.len());
    let mut wg: Vec<Option<(usize, RwLockWriteGuard<'a, Buffer>)>> =
        (0..writes.len()).map(|_| None).collect();
    for (a, w) in order {
        match w {
            Some(i) => wg[i] = Some((a.addr(), a.write())),
            None => rg.push((a.addr(), a.read())),
        }
    }
    (
        rg,
        wg.into_iter()
            .map(|g| g.expect("every output is locked"))
            .collect(),
    )
}

/// The locked bytes of each input, in `inputs` order.
fn input_slices<'g>(inputs: &[NDArray], reads: &'g ReadGuards<'_>) -> Vec<&'g [u8]> {
    inputs
        .iter()
        .map(|a| {
            let i = reads
                .binary_search_by_key(&a.addr(), |(addr, _)| *addr)
                .expect("every input is locked");
            reads[i].1.bytes()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(a: &NDArray) -> Vec<f32> {
        a.read().typed::<f32>().to_vec()
    }

    #[test]
    fn sum_into_and_copy_refuses_aliases_and_other_dtypes() {
        let a = |v: f32| {
            NDArray::from_bytes(
                Shape(vec![2]),
                DType::F32,
                Context::CPU0,
                bytemuck::cast_slice(&[v, v]),
            )
            .unwrap()
        };
        let (x, y, out, c) = (a(1.0), a(2.0), a(0.0), a(0.0));
        let order = kernels::SumOrder::GroupsOfFour;
        let ins = [x.clone(), y.clone(), x.clone()];
        assert!(!sum_into_and_copy(&ins, &out, &[&x], order).unwrap());
        assert!(!sum_into_and_copy(&ins, &out, &[&out], order).unwrap());
        assert!(!sum_into_and_copy(&ins, &out, &[&c, &c], order).unwrap());
        let f64s = NDArray::zeros(Shape(vec![2]), DType::F64, Context::CPU0).unwrap();
        assert!(!sum_into_and_copy(&ins, &out, &[&f64s], order).unwrap());
        assert_eq!(
            (f32s(&out), f32s(&c), f32s(&x)),
            (vec![0.0; 2], vec![0.0; 2], vec![1.0; 2])
        );
        assert!(sum_into_and_copy(&ins, &out, &[&c], order).unwrap());
        assert_eq!((f32s(&out), f32s(&c)), (vec![4.0; 2], vec![4.0; 2]));
    }

    #[test]
    fn heap_buffers_start_aligned_and_zeroed() {
        for (n, align) in [
            (0, 8),
            (1, 64),
            (4096, 64),
            (PAGE_ALIGN_MIN, 4096),
            (1 << 20, 4096),
        ] {
            // several at once, so that not every one is the allocator's first
            let mut bufs: Vec<Buffer> = (0..4).map(|_| Buffer::zeroed(n).unwrap()).collect();
            for b in &mut bufs {
                assert_eq!(b.as_mut_ptr() as usize % align, 0, "{n} bytes");
                assert_eq!(b.bytes().len(), n);
                assert!(b.bytes().iter().all(|&x| x == 0));
            }
        }
    }

    #[test]
    fn freed_mappings_are_reused_and_zeroed_again() {
        // A size class (2 MB pages) no other test allocates.
        let n = HUGE_MIN + (6 << 20) + 5;
        let mut a = Buffer::zeroed(n).unwrap();
        a.bytes_mut().fill(7);
        let addr = a.as_mut_ptr() as usize;
        let Some(before) = pool::held() else {
            return; // MXKV_CPU_MEM_POOL_MB set below 256
        };
        drop(a);
        assert!(
            pool::held().unwrap() >= before + n,
            "the mapping went back to the pool"
        );
        let mut b = Buffer::zeroed(n + 100).unwrap();
        assert_eq!(
            b.as_mut_ptr() as usize,
            addr,
            "the same mapping serves again"
        );
        assert_eq!(b.len(), n + 100);
        assert!(b.bytes().iter().all(|&x| x == 0));
        b.bytes_mut().fill(9);
        drop(b);
        let mut c = Buffer::for_overwrite(n).unwrap();
        assert_eq!(c.as_mut_ptr() as usize, addr);
        assert_eq!(c.bytes().len(), n);
    }

    /// Buffers from 1 MiB to 32 MiB are pooled too (a reloaded checkpoint of
    /// 4 MiB arrays was faulted in afresh every time: they came from the C
    /// library's allocator, which hands them back to the kernel when freed).
    #[test]
    fn freed_mid_size_buffers_are_reused_from_the_pool() {
        // A length (in 4 KB pages) no other test allocates.
        let n = (29 << 20) + 5 * 4096 - 3;
        let mut a = Buffer::for_overwrite(n).unwrap();
        a.bytes_mut().fill(7);
        let addr = a.as_mut_ptr() as usize;
        let Some(before) = pool::held() else {
            return; // MXKV_CPU_MEM_POOL_MB set below 256
        };
        drop(a);
        assert!(
            pool::held().unwrap() >= before + n,
            "the mapping went back to the pool"
        );
        // a little shorter (up to an eighth): served by it, zeroed again
        let short = n - 2 * 4096;
        let mut b = Buffer::zeroed(short).unwrap();
        assert_eq!(b.as_mut_ptr() as usize, addr, "the same mapping serves");
        assert_eq!(b.len(), short);
        assert!(b.bytes().iter().all(|&x| x == 0));
        b.bytes_mut().fill(9);
        drop(b);
        // much shorter: a mapping of its own, the long one stays pooled
        let mut c = Buffer::zeroed(n / 2).unwrap();
        assert_ne!(c.as_mut_ptr() as usize, addr);
        assert!(c.bytes().iter().all(|&x| x == 0));
        let mut d = Buffer::for_overwrite(n).unwrap();
        assert_eq!(d.as_mut_ptr() as usize, addr);
        assert_eq!(d.bytes().len(), n);
        assert_eq!(d.bytes()[short - 1], 9);
    }

    /// Minor page faults of the calling thread so far.
    fn minor_faults() -> u64 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        // after the command name: state, ppid, pgrp, session, tty, tpgid, flags, minflt
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        rest.split(' ').nth(7).unwrap().parse().unwrap()
    }

    /// A new mid-size buffer to be overwritten whole comes with its pages:
    /// writing it takes no page faults (one per 4 KB page before).
    #[test]
    fn a_new_buffer_for_overwrite_is_populated() {
        // A length no other test allocates (so no pooled mapping serves it).
        let n = (7 << 20) + 3 * 4096 - 5;
        let mut b = Buffer::for_overwrite(n).unwrap();
        let before = minor_faults(); // (the kernel counts the populating too)
        b.bytes_mut().fill(3);
        let faults = minor_faults() - before;
        assert!(faults < 64, "{faults} page faults writing {n} new bytes");
        assert!(b.bytes().iter().all(|&x| x == 3));
    }

    #[test]
    fn large_buffers_are_mapped_zeroed_and_writable() {
        for (n, mapped) in [
            (HUGE_MIN + 12, true),
            (HUGE_MIN - 8, true),
            (MAP_MIN, true),
            (MAP_MIN - 8, false),
            (1000, false),
        ] {
            let b = Buffer::zeroed(n).unwrap();
            let mut b = b;
            assert_eq!(matches!(b.storage, Storage::Mapped(_)), mapped);
            assert_eq!(b.len(), b.bytes().len());
            assert!(b.bytes().iter().all(|&x| x == 0));
            let last = b.len() - 1;
            b.bytes_mut()[last] = 7;
            assert_eq!(b.typed::<u8>()[last], 7);
        }
        let rows = NDArray::zeros(Shape(vec![1 << 17, 64]), DType::F32, Context::CPU0).unwrap();
        let copy = rows.copy_to_ctx(Context::CPU0).unwrap();
        assert_eq!(copy.read().len(), (1 << 17) * 64 * 4);
    }

    #[test]
    fn zeros_and_copy_with_conversion() {
        let a = NDArray::from_bytes(
            Shape(vec![3]),
            DType::F32,
            Context::CPU0,
            bytemuck::cast_slice(&[1.7f32, -2.7, 3.5]),
        )
        .unwrap();
        let b = NDArray::zeros(Shape(vec![3]), DType::I32, Context::CPU0).unwrap();
        b.copy_from(&a).unwrap();
        assert_eq!(b.read().typed::<i32>(), &[1, -2, 3]);
        let c = NDArray::zeros(Shape(vec![2]), DType::F32, Context::CPU0).unwrap();
        let err = c.copy_from(&a).unwrap_err();
        assert_eq!(
            err.message(),
            "operands shape mismatch from.shape = [3] to.shape=[2]"
        );
        assert_eq!(f32s(&c), vec![0.0, 0.0]);
    }

    #[test]
    fn contexts() {
        assert!(Context::new(2, 0)
            .unwrap_err()
            .message()
            .contains("USE_CUDA"));
        assert_eq!(Context::new(3, 1).unwrap().to_string(), "cpu_pinned(1)");
        assert!(Context::new(1, -1).is_err());
    }

    #[test]
    fn what_the_c_api_asks_of_an_array() {
        let a = NDArray::zeros(Shape(vec![2, 3]), DType::F64, Context::CPU0).unwrap();
        assert_eq!(a.bytes_for_copy("copy into", 6).unwrap(), 48);
        assert_eq!(
            a.bytes_for_copy("copy into", 5).unwrap_err().message(),
            "Check failed: dshape.Size() == size (6 vs. 5) : Memory size do not match"
        );
        assert_eq!((a.dtype_code(), a.context_codes()), (1, (1, 0)));
        let none = NDArray::none();
        assert_eq!((none.dtype_code(), none.context_codes()), (-1, (0, 0)));
        assert!(none
            .bytes_for_copy("copy from", 0)
            .unwrap_err()
            .message()
            .starts_with("cannot copy from an empty NDArray"));
        assert!(a.data_ndarray().unwrap().same(&a));
        assert!(none.data_ndarray().is_err());
        let b = NDArray::zeros(Shape(vec![2, 3]), DType::F32, Context::CPU0).unwrap();
        assert_eq!(
            a.sync_copy_from_part(0, &b).unwrap_err().message(),
            "aux index 0 given for a dense array (only -1, the data, applies)"
        );
        a.sync_copy_from_part(-1, &b).unwrap();
        assert_eq!(
            StorageType::sparse_from_code(1).unwrap(),
            StorageType::RowSparse
        );
        assert_eq!(StorageType::sparse_from_code(2).unwrap(), StorageType::Csr);
        assert_eq!(
            StorageType::sparse_from_code(0).unwrap_err().message(),
            "storage type 0 is not sparse (row_sparse 1, csr 2)"
        );
    }

    #[test]
    fn contexts_as_the_c_api_names_them() {
        // a negative cpu or cpu_shared device id means device 0 (MXNet's Context::Create)
        assert_eq!(Context::create(DEV_CPU, -1).unwrap(), Context::CPU0);
        assert_eq!(
            Context::create(DEV_CPU_SHARED, -7).unwrap().to_string(),
            "cpu_shared(0)"
        );
        assert_eq!(Context::create(DEV_CPU, 3).unwrap().to_string(), "cpu(3)");
        assert_eq!(
            Context::create(DEV_CPU_PINNED, -1).unwrap_err().message(),
            "invalid device id -1"
        );
        assert_eq!(
            Context::create(DEV_GPU, -1).unwrap_err().message(),
            "Compile with USE_CUDA=1 to enable GPU usage"
        );
        assert_eq!(
            Context::create(4, 0).unwrap_err().message(),
            "unknown device type 4 (cpu 1, gpu 2, cpu_pinned 3, cpu_shared 5)"
        );
    }

    #[test]
    fn shape_checks() {
        assert!(NDArray::zeros(Shape(vec![-1]), DType::F32, Context::CPU0).is_err());
        assert!(NDArray::zeros(Shape(vec![1 << 40, 1 << 40]), DType::F32, Context::CPU0).is_err());
        assert_eq!(Shape(vec![2, 3]).to_string(), "[2,3]");
    }

    fn filled(n: usize, seed: f32) -> NDArray {
        let a = NDArray::zeros(Shape(vec![n as i64]), DType::F32, Context::CPU0).unwrap();
        let v: Vec<f32> = (0..n).map(|i| seed + i as f32).collect();
        a.copy_from_bytes(bytemuck::cast_slice(&v)).unwrap();
        a
    }

    fn addr(a: &NDArray) -> usize {
        a.read().bytes().as_ptr() as usize
    }

    #[test]
    fn a_shared_array_never_changes_what_was_sent_and_takes_its_memory_back() {
        for n in [SHARE_MIN / 4, HUGE_MIN / 4] {
            let a = filled(n, 1.0);
            let home = addr(&a);
            let sent = a.share().expect("large enough to share");
            assert_eq!(sent.as_ptr() as usize, home, "no copy");
            // writes while the bytes are held go elsewhere
            a.copy_from_bytes(bytemuck::cast_slice(&vec![7f32; n]))
                .unwrap();
            assert_ne!(addr(&a), home);
            let first: Vec<f32> = bytemuck::pod_collect_to_vec(&sent);
            assert_eq!(first[..3], [1.0, 2.0, 3.0]);
            assert_eq!(a.to_f64_vec()[..2], [7.0, 7.0]);
            // shared again, the bytes dropped: a partial write takes them back
            let home = addr(&a);
            drop(a.share().unwrap());
            a.write().typed_mut::<f32>()[0] = 8.0;
            assert_eq!(addr(&a), home, "taken back without a copy");
            assert_eq!(a.to_f64_vec()[..2], [8.0, 7.0]);
            // still held: a partial write copies, the sent bytes stay
            let sent = a.share().unwrap();
            a.write().typed_mut::<f32>()[1] = 9.0;
            assert_ne!(addr(&a), home);
            assert_eq!(a.to_f64_vec()[..3], [8.0, 9.0, 7.0]);
            assert_eq!(
                bytemuck::pod_collect_to_vec::<u8, f32>(&sent)[..2],
                [8.0, 7.0]
            );
        }
    }

    #[test]
    fn small_and_pinned_arrays_are_not_shared_and_keep_their_address() {
        assert!(filled(SHARE_MIN / 4 - 1, 0.0).share().is_none());
        let a = filled(SHARE_MIN / 4, 0.0);
        let p = a.write().as_mut_ptr() as usize; // MXNDArrayGetData
        assert!(a.share().is_none(), "its address is out");
        let v: Vec<f32> = vec![3.0; SHARE_MIN / 4];
        a.assign_bytes(bytes::Bytes::from(
            bytemuck::cast_slice::<f32, u8>(&v).to_vec(),
        ))
        .unwrap();
        assert_eq!(addr(&a), p, "copied into place, not adopted");
        assert_eq!(a.to_f64_vec()[0], 3.0);
    }

    #[test]
    fn assigned_bytes_are_read_in_place_and_copied_on_write() {
        let n = SHARE_MIN / 4;
        let a = filled(n, 0.0);
        let v: Vec<f32> = (0..n).map(|i| i as f32 * 2.0).collect();
        let frame = bytes::Bytes::from(bytemuck::cast_slice::<f32, u8>(&v).to_vec());
        a.assign_bytes(frame.clone()).unwrap();
        assert_eq!(addr(&a), frame.as_ptr() as usize, "adopted");
        assert_eq!(a.to_f64_vec()[..3], [0.0, 2.0, 4.0]);
        assert_eq!(a.share().unwrap().as_ptr(), frame.as_ptr(), "sent as it is");
        a.write().typed_mut::<f32>()[0] = 5.0;
        assert_ne!(addr(&a), frame.as_ptr() as usize);
        assert_eq!(a.to_f64_vec()[..2], [5.0, 2.0]);
        assert_eq!(
            bytemuck::pod_collect_to_vec::<u8, f32>(&frame)[0],
            0.0,
            "frame unchanged"
        );
        // MXNDArrayGetData on adopted bytes gives memory of the array's own
        let b = NDArray::zeros(Shape(vec![n as i64]), DType::F32, Context::CPU0).unwrap();
        b.assign_bytes(frame.clone()).unwrap();
        let p = b.write().as_mut_ptr() as usize;
        assert_ne!(p, frame.as_ptr() as usize);
        assert_eq!(b.to_f64_vec()[1], 2.0);
        // the wrong size is refused
        assert!(b.assign_bytes(frame.slice(4..)).is_err());
        // small frames are copied (libzmq may pack several into one buffer)
        let small = filled(16, 0.0);
        let frame = bytes::Bytes::from(vec![0u8; 64]);
        small.assign_bytes(frame.clone()).unwrap();
        assert_ne!(addr(&small), frame.as_ptr() as usize);
    }
}

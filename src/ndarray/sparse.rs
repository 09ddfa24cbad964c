//! Sparse arrays. A row_sparse array of logical shape `[R, d1, …]` stores
//! `nnz` rows: a dense data array `[nnz, d1, …]` and an int64 index array
//! `[nnz]` (aux 0). csr arrays (aux 0 indptr, aux 1 indices) can be created,
//! filled, saved and loaded, but no store operation accepts them.
//!
//! The parts are ordinary dense arrays: `MXNDArrayGetDataNDArray` and
//! `MXNDArrayGetAuxNDArray` hand out handles on them, and an operation that
//! changes the number of stored rows replaces them as a whole.

use super::dtype::{DType, Elem};
use super::kernels::convert_bytes;
use super::{Buffer, Context, NDArray, Shape, StorageType};
use crate::error::Result;
use crate::{bail, ensure};

/// The storage of a sparse array.
#[derive(Clone)]
pub struct Parts {
    pub data: NDArray,
    pub aux: Vec<NDArray>,
}

fn rows_shape(nnz: usize, shape: &Shape) -> Shape {
    let mut d = vec![nnz as i64];
    d.extend_from_slice(&shape.dims()[1..]);
    Shape(d)
}

/// A copy of the data part `src` as `dtype` on `ctx`, in a row buffer.
fn rows_copy(src: &NDArray, dtype: DType, ctx: Context) -> Result<NDArray> {
    let c = NDArray::zeros(src.shape().clone(), dtype, ctx)?;
    c.copy_from(src)?;
    Ok(c)
}

fn index_array(ctx: Context, idx: &[i64]) -> Result<NDArray> {
    NDArray::from_bytes(
        Shape(vec![idx.len() as i64]),
        DType::I64,
        ctx,
        bytemuck::cast_slice(idx),
    )
}

impl NDArray {
    /// A sparse array holding zeros in parts of the given shapes
    /// (`MXNDArrayCreateSparseEx`).
    pub fn sparse_zeros(
        stype: StorageType,
        shape: Shape,
        dtype: DType,
        ctx: Context,
        aux_types: &[DType],
        aux_shapes: &[Shape],
    ) -> Result<NDArray> {
        NDArray::sparse_alloc(stype, shape, dtype, ctx, aux_types, aux_shapes, true)
    }

    /// [`NDArray::sparse_zeros`], with parts whose every byte the caller
    /// writes before the array is used (see [`Buffer::for_overwrite`]): a
    /// load reading the parts from a file.
    pub(super) fn sparse_for_overwrite(
        stype: StorageType,
        shape: Shape,
        dtype: DType,
        ctx: Context,
        aux_types: &[DType],
        aux_shapes: &[Shape],
    ) -> Result<NDArray> {
        NDArray::sparse_alloc(stype, shape, dtype, ctx, aux_types, aux_shapes, false)
    }

    fn sparse_alloc(
        stype: StorageType,
        shape: Shape,
        dtype: DType,
        ctx: Context,
        aux_types: &[DType],
        aux_shapes: &[Shape],
        zero: bool,
    ) -> Result<NDArray> {
        ensure!(
            aux_types.len() == aux_shapes.len(),
            "{} aux types for {} aux shapes",
            aux_types.len(),
            aux_shapes.len()
        );
        for &d in shape.dims() {
            ensure!(d >= 0, "negative dimension {d} in shape {shape}");
        }
        let (data_shape, want) = match stype {
            StorageType::RowSparse => {
                ensure!(
                    shape.ndim() >= 1,
                    "a row_sparse array needs at least one dimension"
                );
                ensure!(
                    aux_types.len() == 1 && aux_shapes[0].ndim() == 1,
                    "a row_sparse array has one aux array (the row indices, 1-d); got {}",
                    aux_types.len()
                );
                let nnz = aux_shapes[0].dims()[0];
                ensure!(
                    nnz >= 0 && nnz <= shape.dims()[0],
                    "{nnz} stored rows for an array of {} rows",
                    shape.dims()[0]
                );
                (rows_shape(nnz as usize, &shape), 1)
            }
            StorageType::Csr => {
                ensure!(shape.ndim() == 2, "a csr array must be 2-d, not {shape}");
                ensure!(
                    aux_types.len() == 2 && aux_shapes.iter().all(|s| s.ndim() == 1),
                    "a csr array has two 1-d aux arrays (indptr, indices); got {}",
                    aux_types.len()
                );
                (aux_shapes[1].clone(), 2)
            }
            other => bail!("storage type {} is not sparse", other.code()),
        };
        debug_assert_eq!(want, aux_types.len());
        for t in aux_types {
            ensure!(
                *t == DType::I64,
                "aux arrays must be int64 (type 6), not {} (type {})",
                t.name(),
                t.code()
            );
        }
        let part = |shape: Shape, dtype| match zero {
            true => NDArray::zeros(shape, dtype, ctx),
            false => NDArray::for_overwrite(shape, dtype, ctx),
        };
        let data = part(data_shape, dtype)?;
        let aux = aux_shapes
            .iter()
            .map(|s| part(s.clone(), DType::I64))
            .collect::<Result<Vec<_>>>()?;
        Ok(NDArray::build(
            shape,
            dtype,
            ctx,
            stype,
            Buffer::zeroed(0)?,
            Some(Parts { data, aux }),
        ))
    }

    /// A dense array whose every byte the caller writes before the array is
    /// used ([`Buffer::for_overwrite`]: a pooled mapping is not zeroed
    /// first). Only for a reader that fills it whole or drops it.
    pub(super) fn for_overwrite(shape: Shape, dtype: DType, ctx: Context) -> Result<NDArray> {
        for &d in shape.dims() {
            ensure!(d >= 0, "negative dimension {d} in shape {shape}");
        }
        let nbytes = shape
            .dims()
            .iter()
            .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d as usize))
            .ok_or_else(|| crate::error::Error::new(format!("shape {shape} is too large")))?;
        Ok(NDArray::from_parts(
            shape,
            dtype,
            ctx,
            StorageType::Default,
            Buffer::for_overwrite(nbytes)?,
        ))
    }

    /// A row_sparse array from its stored rows and their indices.
    pub fn row_sparse(
        shape: Shape,
        ctx: Context,
        data: NDArray,
        indices: &[i64],
    ) -> Result<NDArray> {
        ensure!(
            data.shape() == &rows_shape(indices.len(), &shape),
            "row_sparse data of shape {} does not hold {} rows of an array of shape {shape}",
            data.shape(),
            indices.len()
        );
        let dtype = data.dtype();
        let aux = vec![index_array(ctx, indices)?];
        Ok(NDArray::build(
            shape,
            dtype,
            ctx,
            StorageType::RowSparse,
            Buffer::zeroed(0)?,
            Some(Parts { data, aux }),
        ))
    }

    /// The current parts of a sparse array.
    pub fn parts(&self) -> Result<Parts> {
        match &self.inner.parts {
            Some(p) => Ok(p.read().clone()),
            None => bail!(
                "the array is not sparse (storage type {})",
                self.stype().code()
            ),
        }
    }

    /// Puts back parts taken with [`NDArray::parts`] (a store undoing an
    /// update that left the value invalid).
    pub fn restore_parts(&self, parts: Parts) {
        self.replace_parts(parts);
    }

    fn replace_parts(&self, parts: Parts) {
        if let Some(p) = &self.inner.parts {
            *p.write() = parts;
        }
    }

    /// Replaces the parts, returning the old ones.
    fn swap_parts(&self, parts: Parts) -> Option<Parts> {
        self.inner
            .parts
            .as_ref()
            .map(|p| std::mem::replace(&mut *p.write(), parts))
    }

    /// How many values refer to the array.
    fn holders(&self) -> usize {
        std::sync::Arc::strong_count(&self.inner)
    }

    /// Nothing but this value refers to the array.
    fn is_unique(&self) -> bool {
        self.holders() == 1
    }

    fn is_frozen(&self) -> bool {
        self.inner.frozen.load(std::sync::atomic::Ordering::Acquire)
    }

    fn set_frozen(&self, frozen: bool) {
        self.inner
            .frozen
            .store(frozen, std::sync::atomic::Ordering::Release);
    }

    /// The parts, made private to this array first where they are frozen
    /// and shared (a store adopted them): for handing out handles on them,
    /// through which the caller may write in place.
    pub fn private_parts(&self) -> Result<Parts> {
        let Some(lock) = &self.inner.parts else {
            return self.parts();
        };
        let mut g = lock.write();
        // `copy` makes the private copy of a part still shared.
        let unshare = |a: &NDArray, copy: &dyn Fn(&NDArray) -> Result<NDArray>| {
            if !a.is_frozen() {
                return Ok(a.clone());
            }
            if a.holders() == 1 {
                // Only this array holds it any more: it can be written again.
                a.set_frozen(false);
                return Ok(a.clone());
            }
            copy(a)
        };
        let data = unshare(&g.data, &|a| rows_copy(a, a.dtype(), a.ctx()))?;
        let aux = g
            .aux
            .iter()
            .map(|a| unshare(a, &|a| a.copy_to_ctx(a.ctx())))
            .collect::<Result<Vec<_>>>()?;
        *g = Parts { data, aux };
        Ok(g.clone())
    }

    /// The dtype of aux array `i`.
    pub fn aux_type(&self, i: usize) -> Result<DType> {
        let p = self.parts()?;
        match p.aux.get(i) {
            Some(a) => Ok(a.dtype()),
            None => bail!(
                "aux index {i} out of range: the array has {} aux arrays",
                p.aux.len()
            ),
        }
    }

    /// Replaces part `i` (-1: the data, ≥0: aux `i`) with a copy of `src`,
    /// taking `src`'s shape and converting to the part's dtype
    /// (`MXNDArraySyncCopyFromNDArray`). row_sparse: the data holds whole
    /// rows (`[nnz, d1, …]`), the indices are 1-d. csr: the data and the
    /// column indices (aux 1) are 1-d, indptr (aux 0) holds `rows + 1`
    /// offsets. Parts are set one at a time, so whether the data and the
    /// indices agree in length is checked where the array is used (save,
    /// `MXNDArraySyncCheckFormat`, a store).
    pub fn set_part(&self, i: i32, src: &NDArray) -> Result<()> {
        src.ensure_dense("copy from")?;
        let Some(lock) = &self.inner.parts else {
            bail!(
                "the array is not sparse (storage type {})",
                self.stype().code()
            );
        };
        let naux = lock.read().aux.len();
        let slot = match usize::try_from(i) {
            Ok(a) if a < naux => Some(a),
            _ if i == -1 => None,
            _ => bail!("aux index {i} out of range: the array has {naux} aux arrays"),
        };
        let (shape, ndim) = (src.shape(), src.shape().ndim());
        match (self.stype(), slot) {
            (StorageType::RowSparse, None) => ensure!(
                ndim == self.shape().ndim() && shape.dims()[1..] == self.shape().dims()[1..],
                "data of shape {shape} does not fit an array of shape {}",
                self.shape()
            ),
            (StorageType::Csr, None) => ensure!(
                ndim == 1,
                "the data of a csr array is 1-d (one value per stored element), not {shape}"
            ),
            (StorageType::Csr, Some(0)) => {
                let rows = self.shape().dims()[0];
                ensure!(
                    ndim == 1 && rows.checked_add(1) == Some(shape.dims()[0]),
                    "the indptr of a csr array of shape {} holds rows + 1 = {} offsets, not {shape}",
                    self.shape(),
                    rows.saturating_add(1)
                );
            }
            (StorageType::Csr, Some(_)) => ensure!(
                ndim == 1,
                "the column indices of a csr array are 1-d, not {shape}"
            ),
            _ => ensure!(ndim == 1, "aux arrays are 1-d, not {shape}"),
        }
        let dtype = {
            let p = lock.read();
            slot.map_or(p.data.dtype(), |a| p.aux[a].dtype())
        };
        // A new array: `src` may be one of the parts (or a handle on one).
        let copy = NDArray::zeros(shape.clone(), dtype, self.ctx())?;
        copy.copy_from(src)?;
        // Under the parts lock: another part set at the same time is kept.
        let mut p = lock.write();
        match slot {
            None => p.data = copy,
            Some(a) => p.aux[a] = copy,
        }
        Ok(())
    }

    /// `MXNDArraySyncCopyFromNDArray(self, src, -1)` for a dense `self`.
    /// MXNet copies `src.data()`, which for a sparse `src` is its data part
    /// (the stored values). Here a `self` of `src`'s shape gets `src`
    /// densified, as every copy in this library does (MXNet would reshape
    /// `self` to the stored rows); a `self` of the data part's shape gets the
    /// data part, as in MXNet (e.g. a handle from `MXNDArrayGetDataNDArray`
    /// refreshed from its array; that handle shares the part here, so the
    /// copy leaves it as it is).
    pub fn sync_copy_from(&self, src: &NDArray) -> Result<()> {
        if !self.is_sparse() && src.is_sparse() && self.shape() != src.shape() {
            let data = src.parts()?.data;
            if data.shape() == self.shape() {
                return self.copy_from(&data);
            }
        }
        self.copy_from(src)
    }

    /// Elements per row (product of the dims after the first), saturating
    /// at `usize::MAX` (a logical shape may be larger than memory when no
    /// rows are stored): use [`row_bytes`] for byte offsets.
    pub fn row_len(&self) -> usize {
        self.shape().dims()[1..]
            .iter()
            .fold(1usize, |acc, &d| acc.saturating_mul(d as usize))
    }

    /// The row indices of a row_sparse array.
    pub fn rsp_indices(&self) -> Result<Vec<i64>> {
        let p = self.parts()?;
        let idx = p.aux[0].read().typed::<i64>().to_vec();
        Ok(idx)
    }

    /// Checks that a csr array can be cast to dense as [`copy_any`] casts it
    /// (the store checks a csr init value with it, so that its pulls fail
    /// for no value it holds): no stored value, or at least rows + 1
    /// offsets, the first rows + 1 of them non-negative, non-decreasing and
    /// within the values, and every column they cover in range.
    pub fn check_csr_densifiable(&self) -> Result<()> {
        ensure!(self.stype() == StorageType::Csr, "not a csr array");
        csr_dense_layout(self.shape(), &self.parts()?).map(|_| ())
    }

    /// Checks a row_sparse value before the store uses it: data and indices
    /// agree, and indices are ascending, unique and in `[0, R)`.
    pub fn check_row_sparse(&self) -> Result<()> {
        ensure!(
            self.stype() == StorageType::RowSparse,
            "not a row_sparse array"
        );
        let p = self.parts()?;
        let idx = p.aux[0].read();
        let idx = idx.typed::<i64>();
        ensure!(
            p.data.shape() == &rows_shape(idx.len(), self.shape()),
            "row_sparse value is inconsistent: {} indices for data of shape {} (array shape {})",
            idx.len(),
            p.data.shape(),
            self.shape()
        );
        let rows = self.shape().dims()[0];
        for (k, &r) in idx.iter().enumerate() {
            ensure!(
                (0..rows).contains(&r),
                "row index {r} is out of range [0, {rows}) in a row_sparse value"
            );
            ensure!(
                k == 0 || idx[k - 1] < r,
                "row_sparse indices must be sorted ascending without duplicates; found {} before {r}",
                idx[k - 1]
            );
        }
        Ok(())
    }

    /// `MXNDArraySyncCheckFormat`: the parts' shapes always; with
    /// `full_check`, the index values too.
    pub fn check_format(&self, full_check: bool) -> Result<()> {
        match self.stype() {
            StorageType::RowSparse => {
                let p = self.parts()?;
                ensure!(
                    p.data.shape() == &rows_shape(p.aux[0].size(), self.shape()),
                    "Check failed: err != kRSPShapeErr: Shape mismatch of this row_sparse NDArray: {} indices for data of shape {} (array shape {})",
                    p.aux[0].size(),
                    p.data.shape(),
                    self.shape()
                );
                if full_check {
                    self.check_row_sparse().map_err(|e| crate::error::Error::new(format!(
                        "Check failed: err != kRSPIdxErr (5 vs. 5) : Indices of row_sparse NDArray should be non-negative, less than the size of first dimension and in ascending order ({e})"
                    )))?;
                }
                Ok(())
            }
            StorageType::Csr => {
                let p = self.parts()?;
                let rows = self.shape().dims()[0];
                ensure!(
                    Some(p.aux[0].size() as i64) == rows.checked_add(1)
                        && p.aux[1].size() == p.data.size(),
                    "Check failed: err != kCSRShapeErr: Shape mismatch of this csr NDArray: indptr of {} for {rows} rows, {} indices for {} values",
                    p.aux[0].size(),
                    p.aux[1].size(),
                    p.data.size()
                );
                if full_check {
                    let indptr = p.aux[0].read().typed::<i64>().to_vec();
                    let idx = p.aux[1].read().typed::<i64>().to_vec();
                    let cols = self.shape().dims()[1];
                    let ok_ptr = indptr.first() == Some(&0)
                        && indptr.last() == Some(&(idx.len() as i64))
                        && indptr.windows(2).all(|w| w[0] <= w[1]);
                    ensure!(ok_ptr, "Check failed: err != kCSRIndPtrErr: IndPtr of csr NDArray should be non-negative, in non-decreasing order, start with 0 and end with value equal with size of indices.");
                    let ok_idx = indptr.windows(2).all(|w| {
                        let row = &idx[w[0] as usize..w[1] as usize];
                        row.iter().all(|c| (0..cols).contains(c))
                            && row.windows(2).all(|c| c[0] < c[1])
                    });
                    ensure!(ok_idx, "Check failed: err != kCSRIdxErr: Indices of csr NDArray should be non-negative, in ascending order per row and less than the number of columns.");
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    pub(super) fn sparse_copy_to_ctx(&self, ctx: Context) -> Result<NDArray> {
        let p = self.parts()?;
        let data = rows_copy(&p.data, p.data.dtype(), ctx)?;
        let aux = p
            .aux
            .iter()
            .map(|a| a.copy_to_ctx(ctx))
            .collect::<Result<Vec<_>>>()?;
        Ok(NDArray::build(
            self.shape().clone(),
            self.dtype(),
            ctx,
            self.stype(),
            Buffer::zeroed(0)?,
            Some(Parts { data, aux }),
        ))
    }
}

/// Why [`copy_any`] refuses a csr array (with a row_sparse one).
const NO_CSR_COPY: &str =
    "(csr arrays are copied to and from dense and csr arrays only, as in MXNet)";

/// Copies between any dense/row_sparse pair, and any dense/csr pair, of equal
/// shapes, converting the dtype: dense → row_sparse stores every row holding
/// a nonzero element, dense → csr every nonzero element (MXNet's
/// cast_storage); row_sparse or csr → dense writes the stored values over
/// zeros (a csr with stored values needs rows + 1 offsets and columns in
/// range: MXNet reads and writes outside its buffers otherwise). Work is
/// proportional to the bytes and stored rows involved, never to the number
/// of rows alone (rows of no elements are never visited).
///
/// Locks: each part is locked on its own (copies between two arrays lock
/// them in address order), and `dst` is never locked for writing while this
/// thread holds a read lock on it: when `dst` is one of `src`'s parts (a
/// handle from `MXNDArrayGetDataNDArray`), the parts are read from a copy.
pub fn copy_any(src: &NDArray, dst: &NDArray) -> Result<()> {
    ensure!(
        src.shape() == dst.shape(),
        "operands shape mismatch from.shape = {} to.shape={}",
        src.shape(),
        dst.shape()
    );
    if src.same(dst) {
        return Ok(());
    }
    match (src.stype(), dst.stype()) {
        (StorageType::RowSparse, StorageType::RowSparse) => {
            let p = src.parts()?;
            let d = dst.parts()?;
            let writable = !d.data.is_frozen() && !d.aux[0].is_frozen();
            if writable && d.data.shape() == p.data.shape() && d.aux[0].shape() == p.aux[0].shape()
            {
                // Same number of rows: overwrite the parts in place (each
                // `copy_from` locks two distinct arrays, or none).
                d.data.copy_from(&p.data)?;
                return d.aux[0].copy_from(&p.aux[0]);
            }
            let data = rows_copy(&p.data, dst.dtype(), dst.ctx())?;
            let aux = vec![p.aux[0].copy_to_ctx(dst.ctx())?];
            dst.replace_parts(Parts { data, aux });
            Ok(())
        }
        (StorageType::Default, StorageType::RowSparse) => {
            // MXNet's cast_storage: keep the rows with an element != 0
            // (-0.0 counts as zero). Rows of no elements hold no nonzero:
            // with `rl == 0` nothing is scanned, however many rows.
            let rl = src.row_len();
            let idx: Vec<i64> = if rl == 0 {
                Vec::new()
            } else {
                let g = src.read();
                crate::with_dtype!(src.dtype(), T => {
                    let v: &[T] = g.typed();
                    v.chunks_exact(rl)
                        .enumerate()
                        .filter(|(_, row)| row.iter().any(|x| !is_zero(*x)))
                        .map(|(r, _)| r as i64)
                        .collect()
                })
            };
            let data = NDArray::zeros(rows_shape(idx.len(), dst.shape()), dst.dtype(), dst.ctx())?;
            if !idx.is_empty() {
                // A row holding a nonzero exists, so both buffers are
                // nonempty and these row sizes fit in memory.
                let (srow, drow) = (rl * src.dtype().size(), rl * dst.dtype().size());
                // `data` is new: locking it cannot wait on `src`'s lock.
                let s = src.read();
                let mut d = data.write();
                for (&r, out) in idx.iter().zip(d.bytes_mut().chunks_exact_mut(drow)) {
                    let r = r as usize;
                    convert_bytes(
                        src.dtype(),
                        &s.bytes()[r * srow..(r + 1) * srow],
                        dst.dtype(),
                        out,
                    );
                }
            }
            let aux = vec![index_array(dst.ctx(), &idx)?];
            dst.replace_parts(Parts { data, aux });
            Ok(())
        }
        (StorageType::RowSparse, StorageType::Default) => {
            let mut p = src.parts()?;
            if p.data.same(dst) || p.aux.iter().any(|a| a.same(dst)) {
                // `dst` is a part of `src`: read the parts from a copy (MXNet
                // hands out copies of parts, so there the copy reads the
                // value as it was before the call too).
                p = Parts {
                    data: p.data.copy_to_ctx(p.data.ctx())?,
                    aux: p
                        .aux
                        .iter()
                        .map(|a| a.copy_to_ctx(a.ctx()))
                        .collect::<Result<_>>()?,
                };
            }
            let idx = p.aux[0].read().typed::<i64>().to_vec();
            let rows = src.shape().dims()[0];
            ensure!(
                p.data.shape() == &rows_shape(idx.len(), src.shape()),
                "row_sparse value is inconsistent: {} indices for data of shape {}",
                idx.len(),
                p.data.shape()
            );
            if let Some(r) = idx.iter().find(|r| !(0..rows).contains(*r)) {
                bail!("row index {r} is out of range [0, {rows}) in a row_sparse array");
            }
            let data = p.data.read();
            let mut out = dst.write();
            out.overwrite().fill(0);
            if !out.is_empty() && !idx.is_empty() {
                // Row sizes from the buffers (a row of `[0, 2^62]` is 2^64
                // bytes: computed from the shape, it wrapped to 0).
                let (srow, drow) = (data.len() / idx.len(), out.len() / rows as usize);
                for (&r, row) in idx.iter().zip(data.bytes().chunks_exact(srow)) {
                    let r = r as usize;
                    convert_bytes(
                        src.dtype(),
                        row,
                        dst.dtype(),
                        &mut out.bytes_mut()[r * drow..(r + 1) * drow],
                    );
                }
            }
            Ok(())
        }
        (StorageType::Default, StorageType::Csr) => {
            // MXNet's cast_storage dense -> csr: per row the elements != 0
            // (-0.0 counts as zero, NaN does not), in column order.
            let cols = src.shape().dims()[1] as usize;
            let (mut indptr, mut cols_of, mut at) = (vec![0i64], Vec::new(), Vec::new());
            if cols > 0 {
                let g = src.read();
                crate::with_dtype!(src.dtype(), T => {
                    let v: &[T] = g.typed();
                    for row in v.chunks_exact(cols) {
                        for (c, x) in row.iter().enumerate() {
                            if !is_zero(*x) {
                                cols_of.push(c as i64);
                                at.push(indptr.len() - 1);
                            }
                        }
                        indptr.push(cols_of.len() as i64);
                    }
                });
            } else {
                indptr.resize(src.shape().dims()[0] as usize + 1, 0);
            }
            // the positions of the stored elements, row by row
            let mut flat = Vec::with_capacity(cols_of.len());
            flat.extend(
                at.iter()
                    .zip(&cols_of)
                    .map(|(&r, &c)| r * cols + c as usize),
            );
            let data = gather_elements(src, &flat, dst.dtype(), dst.ctx())?;
            let aux = vec![
                index_array(dst.ctx(), &indptr)?,
                index_array(dst.ctx(), &cols_of)?,
            ];
            dst.replace_parts(Parts { data, aux });
            Ok(())
        }
        (StorageType::Csr, StorageType::Default) => {
            let p = src.parts()?;
            let (ptr, idx) = csr_dense_layout(src.shape(), &p)?;
            let cols = src.shape().dims()[1] as usize;
            let mut out_positions = Vec::new();
            let mut from = Vec::new();
            for (r, w) in ptr.windows(2).enumerate() {
                let (a, b) = (w[0] as usize, w[1] as usize);
                for (k, &c) in (a..b).zip(&idx[a..b]) {
                    out_positions.push(r * cols + c as usize);
                    from.push(k);
                }
            }
            let data = p.data.read();
            let mut out = dst.write();
            out.overwrite().fill(0);
            let (ssize, dsize) = (src.dtype().size(), dst.dtype().size());
            let out = out.bytes_mut();
            for (&o, &k) in out_positions.iter().zip(&from) {
                convert_bytes(
                    src.dtype(),
                    &data.bytes()[k * ssize..(k + 1) * ssize],
                    dst.dtype(),
                    &mut out[o * dsize..(o + 1) * dsize],
                );
            }
            Ok(())
        }
        (StorageType::Csr, StorageType::Csr) => {
            let p = src.parts()?;
            if p.aux[1].size() == 0 {
                // MXNet's CopyFromToCsrImpl: a source with no column index
                // stored (not storage_initialized) gives FillZerosCsrImpl's
                // rows + 1 zero offsets, whatever its indptr (`[]` after
                // e.g. abs of an all-zero csr).
                let rows = src.shape().dims()[0] as usize;
                let data = NDArray::zeros(Shape(vec![0]), dst.dtype(), dst.ctx())?;
                let aux = vec![
                    index_array(dst.ctx(), &vec![0; rows + 1])?,
                    index_array(dst.ctx(), &[])?,
                ];
                dst.replace_parts(Parts { data, aux });
                return Ok(());
            }
            let all: Vec<usize> = (0..p.data.size()).collect();
            let data = gather_elements(&p.data, &all, dst.dtype(), dst.ctx())?;
            let aux = p
                .aux
                .iter()
                .map(|a| a.copy_to_ctx(dst.ctx()))
                .collect::<Result<Vec<_>>>()?;
            dst.replace_parts(Parts { data, aux });
            Ok(())
        }
        (s, d) => bail!(
            "copying storage type {} into storage type {} is not supported {NO_CSR_COPY}",
            s.code(),
            d.code()
        ),
    }
}

/// The checks a csr -> dense cast makes ([`copy_any`],
/// [`NDArray::check_csr_densifiable`]), on one snapshot `p` of the parts of a
/// csr array of `shape`. MXNet reads the first rows + 1 offsets; outside
/// them, or outside the values or the columns, it reads or writes out of its
/// buffers. Returns those rows + 1 offsets (empty when no value is stored:
/// then nothing is read, whatever the indptr) and the column indices.
fn csr_dense_layout(shape: &Shape, p: &Parts) -> Result<(Vec<i64>, Vec<i64>)> {
    let mut indptr = p.aux[0].read().typed::<i64>().to_vec();
    let idx = p.aux[1].read().typed::<i64>().to_vec();
    let (rows, cols) = (shape.dims()[0], shape.dims()[1]);
    if idx.is_empty() {
        return Ok((Vec::new(), idx));
    }
    ensure!(
        indptr.len() as i64 > rows,
        "csr array of shape {} has {} stored values and an indptr of {} offsets, \
         not rows + 1",
        shape,
        idx.len(),
        indptr.len()
    );
    indptr.truncate(rows as usize + 1);
    let nnz = idx.len().min(p.data.size()) as i64;
    ensure!(
        indptr[0] >= 0 && indptr.windows(2).all(|w| w[0] <= w[1]) && indptr[rows as usize] <= nnz,
        "csr array of shape {} has an invalid indptr",
        shape
    );
    if let Some(c) = idx[indptr[0] as usize..indptr[rows as usize] as usize]
        .iter()
        .find(|c| !(0..cols).contains(*c))
    {
        bail!("column index {c} is out of range [0, {cols}) in a csr array");
    }
    Ok((indptr, idx))
}

/// A new 1-d array of `dtype` holding the elements of dense `src` at the
/// flat positions `at`, converted as a copy converts them.
fn gather_elements(src: &NDArray, at: &[usize], dtype: DType, ctx: Context) -> Result<NDArray> {
    let out = NDArray::zeros(Shape(vec![at.len() as i64]), dtype, ctx)?;
    if !at.is_empty() {
        let (ssize, dsize) = (src.dtype().size(), dtype.size());
        let s = src.read();
        // `out` is new: locking it cannot wait on `src`'s lock.
        let mut d = out.write();
        for (&k, o) in at.iter().zip(d.bytes_mut().chunks_exact_mut(dsize)) {
            convert_bytes(
                src.dtype(),
                &s.bytes()[k * ssize..(k + 1) * ssize],
                dtype,
                o,
            );
        }
    }
    Ok(out)
}

/// `x == 0` in the element type's own comparison (so -0.0 is zero, NaN is not).
fn is_zero<T: Elem>(x: T) -> bool {
    match x.to_wide() {
        super::dtype::Wide::F(a) => a == 0.0,
        super::dtype::Wide::I(a) => a == 0,
        super::dtype::Wide::U(a) => a == 0,
    }
}

/// Sums row_sparse values (checked, each of `shape` and `dtype`) into a new
/// row_sparse array: indices are the sorted union; each row is zero plus the
/// matching rows, added in value order (MXNet's rule).
pub fn sum_row_sparse(
    values: &[NDArray],
    shape: &Shape,
    dtype: DType,
    ctx: Context,
) -> Result<NDArray> {
    let parts = values
        .iter()
        .map(|v| v.parts())
        .collect::<Result<Vec<_>>>()?;
    let union = union_of(&parts);
    let data = NDArray::zeros(rows_shape(union.len(), shape), dtype, ctx)?;
    accumulate(&parts, &union, &data)?;
    NDArray::row_sparse(shape.clone(), ctx, data, &union)
}

/// [`sum_row_sparse`] into the row_sparse `dst` (its rows become the union),
/// built in `spare`'s parts when they can be reused and published in one
/// step: a reader of `dst` sees the old rows or the new, never a mix.
pub fn sum_row_sparse_into(values: &[NDArray], dst: &NDArray, spare: &mut Spare) -> Result<()> {
    let parts = values
        .iter()
        .map(|v| v.parts())
        .collect::<Result<Vec<_>>>()?;
    let union = union_of(&parts);
    let out = spare.take(
        &rows_shape(union.len(), dst.shape()),
        dst.dtype(),
        dst.ctx(),
    )?;
    out.aux[0]
        .write()
        .typed_mut::<i64>()
        .copy_from_slice(&union);
    accumulate(&parts, &union, &out.data)?;
    spare.publish(dst, out);
    Ok(())
}

/// Copies the row_sparse `src` into the row_sparse `dst` (converting the
/// dtype) through `spare`, as [`sum_row_sparse_into`] does.
pub fn assign_row_sparse(src: &NDArray, dst: &NDArray, spare: &mut Spare) -> Result<()> {
    ensure!(
        src.shape() == dst.shape(),
        "operands shape mismatch from.shape = {} to.shape={}",
        src.shape(),
        dst.shape()
    );
    let p = src.parts()?;
    let out = spare.take(p.data.shape(), dst.dtype(), dst.ctx())?;
    out.data.copy_from(&p.data)?;
    out.aux[0].copy_from(&p.aux[0])?;
    spare.publish(dst, out);
    Ok(())
}

/// Makes the row_sparse `dst` hold `src`'s rows by adopting `src`'s parts
/// instead of copying them (what MXNet's store does with a single pushed
/// value), when nothing but `src` holds those parts and shape and dtype
/// agree. Adopted parts are frozen: no operation writes them in place any
/// more (writers replace parts; handing out a handle on one first gives the
/// array its own copy), so `dst` keeps exactly the pushed rows whatever the
/// caller does with `src` later: copy semantics without the copy. Returns
/// false, doing nothing, when the parts cannot be adopted.
pub fn share_row_sparse(src: &NDArray, dst: &NDArray, spare: &mut Spare) -> Result<bool> {
    let fits = src.stype() == StorageType::RowSparse
        && dst.stype() == StorageType::RowSparse
        && src.shape() == dst.shape()
        && src.dtype() == dst.dtype();
    if !fits {
        return Ok(false);
    }
    let (Some(lock), false) = (&src.inner.parts, src.same(dst)) else {
        return Ok(false);
    };
    // Held while checking and freezing: `private_parts` (the only way to a
    // new handle on a part) cannot hand one out in between.
    let g = lock.write();
    let p = g.clone();
    if p.aux.len() != 1 {
        return Ok(false);
    }
    let cur = dst.parts()?;
    if cur.data.same(&p.data) && cur.aux[0].same(&p.aux[0]) && p.data.is_frozen() {
        // Adopted before and frozen since: `dst` already holds these rows.
        return Ok(true);
    }
    drop(cur);
    // Held by `src` and by `p` only: no handle, no other array, no reader.
    if p.data.holders() != 2 || p.aux[0].holders() != 2 {
        return Ok(false);
    }
    p.data.set_frozen(true);
    p.aux[0].set_frozen(true);
    drop(g);
    spare.publish(dst, p);
    Ok(true)
}

/// The sorted union of the (sorted, unique) row indices of `parts`, merged
/// list by list.
fn union_of(parts: &[Parts]) -> Vec<i64> {
    let mut union: Vec<i64> = Vec::new();
    let mut merged: Vec<i64> = Vec::new();
    for p in parts {
        let idx = p.aux[0].read();
        let b = idx.typed::<i64>();
        merged.clear();
        merged.reserve(union.len() + b.len());
        let (mut i, mut j) = (0, 0);
        while i < union.len() && j < b.len() {
            let (x, y) = (union[i], b[j]);
            merged.push(x.min(y));
            i += usize::from(x <= y);
            j += usize::from(y <= x);
        }
        merged.extend_from_slice(&union[i..]);
        merged.extend_from_slice(&b[j..]);
        std::mem::swap(&mut union, &mut merged);
    }
    union
}

/// Writes into `data` (whose rows are `union`) zero plus the rows of every
/// part, added in part order; `data` need not be zeroed first. `data` is
/// none of the parts (new, or spare parts nothing else holds), so its write
/// lock never waits on a read lock this thread holds.
fn accumulate(parts: &[Parts], union: &[i64], data: &NDArray) -> Result<()> {
    let dtype = data.dtype();
    let rl = data.row_len();
    debug_assert!(parts
        .iter()
        .all(|p| !p.data.same(data) && !p.aux.iter().any(|a| a.same(data))));
    let mut out = data.write();
    let mut touched = vec![false; union.len()];
    crate::with_dtype!(dtype, T => {
        let out: &mut [T] = out.typed_mut();
        let zero = <T as bytemuck::Zeroable>::zeroed();
        for p in parts {
            let src = if p.data.dtype() == dtype {
                p.data.clone()
            } else {
                let c = NDArray::zeros(p.data.shape().clone(), dtype, data.ctx())?;
                c.copy_from(&p.data)?;
                c
            };
            let src = src.read();
            let src: &[T] = src.typed();
            let idx = p.aux[0].read();
            let idx = idx.typed::<i64>();
            // Checked values hold one row per index (shapes never change);
            // an index rewritten since `union_of` is an error, not a panic.
            ensure!(
                rl == 0 || src.len() / rl == idx.len(),
                "row_sparse value is inconsistent: {} indices for {} elements of rows of {rl}",
                idx.len(),
                src.len()
            );
            // Both index lists are sorted: walk the union alongside.
            let mut pos = 0;
            for (k, r) in idx.iter().enumerate() {
                while pos < union.len() && union[pos] != *r {
                    pos += 1;
                }
                ensure!(
                    pos < union.len(),
                    "row_sparse indices changed while they were summed (row {r})"
                );
                if rl == 0 {
                    continue;
                }
                let o = &mut out[pos * rl..(pos + 1) * rl];
                let x = &src[k * rl..(k + 1) * rl];
                if touched[pos] {
                    for (o, &x) in o.iter_mut().zip(x) {
                        *o = Elem::add(*o, x);
                    }
                } else {
                    touched[pos] = true;
                    for (o, &x) in o.iter_mut().zip(x) {
                        *o = Elem::add(zero, x);
                    }
                }
            }
        }
    });
    Ok(())
}

/// The parts a store entry keeps for its next row_sparse result. They are
/// reused only while nothing else holds them (no handle, no reader that
/// cloned them), so writing into them is invisible until published; the
/// steady state of repeated pushes allocates nothing.
#[derive(Default)]
pub struct Spare(Option<Parts>);

impl Spare {
    fn take(&mut self, data_shape: &Shape, dtype: DType, ctx: Context) -> Result<Parts> {
        if let Some(p) = self.0.take() {
            let fits = p.data.shape() == data_shape
                && p.data.dtype() == dtype
                && p.data.ctx() == ctx
                && p.aux.len() == 1;
            if fits && p.data.is_unique() && p.aux[0].is_unique() {
                // Nobody else holds them: writable again, even if frozen.
                p.data.set_frozen(false);
                p.aux[0].set_frozen(false);
                return Ok(p);
            }
        }
        let nnz = data_shape.dims()[0];
        Ok(Parts {
            data: NDArray::zeros(data_shape.clone(), dtype, ctx)?,
            aux: vec![NDArray::zeros(Shape(vec![nnz]), DType::I64, ctx)?],
        })
    }

    /// Makes `parts` `dst`'s parts in one step; the old ones become spare.
    fn publish(&mut self, dst: &NDArray, parts: Parts) {
        self.0 = dst.swap_parts(parts);
    }
}

/// Converts row ids of any numeric dtype to sorted, unique int64 ids in
/// `[0, rows)`.
pub fn row_ids(ids: &NDArray, rows: i64) -> Result<Vec<i64>> {
    ids.ensure_dense("read row ids from")?;
    let g = ids.read();
    let mut out: Vec<i64> = crate::with_dtype!(ids.dtype(), T => g
        .typed::<T>()
        .iter()
        .map(|v| <i64 as Elem>::from_wide(Elem::to_wide(*v)))
        .collect());
    out.sort_unstable();
    out.dedup();
    if let Some(r) = out.iter().find(|r| !(0..rows).contains(*r)) {
        bail!("row id {r} is out of range [0, {rows})");
    }
    Ok(out)
}

/// Fills the row_sparse `out` with the rows `ids` (sorted, unique, in range)
/// of the row_sparse `stored`: stored rows where present, zeros elsewhere.
/// Touches only the requested rows. `out`'s parts are written in place only
/// when none of them is one of `stored`'s (no write lock on an array this
/// thread reads).
pub fn retain_rows(stored: &NDArray, ids: &[i64], out: &NDArray) -> Result<()> {
    ensure!(
        stored.shape() == out.shape(),
        "operands shape mismatch from.shape = {} to.shape={}",
        stored.shape(),
        out.shape()
    );
    if stored.same(out) {
        return retain_rows(&stored.copy_to_ctx(stored.ctx())?, ids, out);
    }
    let p = stored.parts()?;
    ensure!(
        p.data.shape() == &rows_shape(p.aux[0].size(), stored.shape()),
        "row_sparse value is inconsistent: {} indices for data of shape {}",
        p.aux[0].size(),
        p.data.shape()
    );
    // A store holding no rows gives an empty result, whatever the ids (MXNet).
    let ids = if p.aux[0].size() == 0 { &[][..] } else { ids };
    // Reuse the output's parts when they already hold as many rows (the
    // steady state of repeated pulls): no allocation, no page faults.
    let old = out.parts()?;
    let shape = rows_shape(ids.len(), out.shape());
    let shares = |a: &NDArray| a.same(&p.data) || a.same(&p.aux[0]);
    let reuse = old.data.shape() == &shape
        && old.aux[0].size() == ids.len()
        && !old.data.is_frozen()
        && !old.aux[0].is_frozen()
        && !shares(&old.data)
        && !shares(&old.aux[0]);
    let data = if reuse {
        old.data.clone()
    } else {
        NDArray::zeros(shape, out.dtype(), out.ctx())?
    };
    {
        let idx = p.aux[0].read();
        let idx = idx.typed::<i64>();
        let full = idx.len() as i64 == stored.shape().dims()[0];
        let src = p.data.read();
        let mut dst = data.write();
        let (sdt, ddt) = (stored.dtype(), out.dtype());
        // Row sizes from the buffers themselves: nothing to overflow, and a
        // result of no rows (or rows of no elements) does no work at all.
        let n = dst.len();
        if n > 0 {
            let (srow, drow) = (src.len() / idx.len(), n / ids.len());
            let fill = |(j, row): (usize, &mut [u8])| {
                let id = ids[j];
                let k = if full {
                    Some(id as usize)
                } else {
                    idx.binary_search(&id).ok()
                };
                match k {
                    Some(k) => convert_bytes(sdt, &src.bytes()[k * srow..(k + 1) * srow], ddt, row),
                    None => row.fill(0),
                }
            };
            if n / ddt.size() >= 1 << 16 && super::kernels::parallel() {
                use rayon::prelude::*;
                dst.bytes_mut()
                    .par_chunks_mut(drow)
                    .enumerate()
                    .for_each(fill);
            } else {
                dst.bytes_mut().chunks_mut(drow).enumerate().for_each(fill);
            }
        }
    }
    if reuse {
        old.aux[0].write().typed_mut::<i64>().copy_from_slice(ids);
        return Ok(());
    }
    let aux = vec![index_array(out.ctx(), ids)?];
    out.replace_parts(Parts { data, aux });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dense(shape: &[i64], v: &[f32]) -> NDArray {
        NDArray::from_bytes(
            Shape(shape.to_vec()),
            DType::F32,
            Context::CPU0,
            bytemuck::cast_slice(v),
        )
        .unwrap()
    }

    fn rsp(rows: i64, idx: &[i64], v: &[f32]) -> NDArray {
        let data = dense(&[idx.len() as i64, 2], v);
        NDArray::row_sparse(Shape(vec![rows, 2]), Context::CPU0, data, idx).unwrap()
    }

    fn dense_of(a: &NDArray) -> Vec<f32> {
        let out = NDArray::zeros(a.shape().clone(), DType::F32, Context::CPU0).unwrap();
        out.copy_from(a).unwrap();
        let v = out.read().typed::<f32>().to_vec();
        v
    }

    #[test]
    fn sum_is_union_in_value_order() {
        let a = rsp(4, &[0, 2], &[1., 1., 2., 2.]);
        let b = rsp(4, &[2, 3], &[10., 10., 5., 5.]);
        let s = sum_row_sparse(&[a, b], &Shape(vec![4, 2]), DType::F32, Context::PINNED0).unwrap();
        assert_eq!(s.rsp_indices().unwrap(), vec![0, 2, 3]);
        assert_eq!(dense_of(&s), vec![1., 1., 0., 0., 12., 12., 5., 5.]);
        // A row present once is 0 + x: -0.0 becomes +0.0, as in MXNet.
        let c = rsp(4, &[1], &[-0.0, 1.0]);
        let s = sum_row_sparse(&[c], &Shape(vec![4, 2]), DType::F32, Context::CPU0).unwrap();
        assert_eq!(dense_of(&s)[2].to_bits(), 0);
    }

    #[test]
    fn sums_and_assigns_into_a_store_value_reuse_only_private_parts() {
        let stored = rsp(6, &[0], &[7., 7.]);
        let mut spare = Spare::default();
        let a = rsp(6, &[1, 4], &[1., -0.0, 2., 2.]);
        let b = rsp(6, &[0, 4, 5], &[3., 3., 10., 10., 1., 1.]);
        let round = |spare: &mut Spare| {
            sum_row_sparse_into(&[a.clone(), b.clone()], &stored, spare).unwrap();
            assert_eq!(stored.rsp_indices().unwrap(), vec![0, 1, 4, 5]);
            let d = dense_of(&stored);
            assert_eq!(d, vec![3., 3., 1., 0., 0., 0., 0., 0., 12., 12., 1., 1.]);
            assert_eq!(d[3].to_bits(), 0, "0 + -0.0 is +0.0");
        };
        round(&mut spare); // the first push allocates
        let before = stored.parts().unwrap(); // a reader holds these parts
        round(&mut spare); // the spare was the initial 1-row parts: new ones
        round(&mut spare); // the spare is `before`, still held: not reused
        assert_eq!(before.aux[0].read().typed::<i64>(), &[0, 1, 4, 5]);
        assert_eq!(before.data.read().typed::<f32>()[..2], [3., 3.]);
        drop(before);
        // The spare (round 2's parts) is private and of the right size:
        // reused, with the same result.
        let spare_data = spare.0.as_ref().unwrap().data.addr();
        round(&mut spare);
        assert_eq!(stored.parts().unwrap().data.addr(), spare_data);
        // Another row count, then an assignment of fewer rows (converted
        // from float64).
        sum_row_sparse_into(std::slice::from_ref(&a), &stored, &mut spare).unwrap();
        assert_eq!(dense_of(&stored)[..4], [0., 0., 1., 0.]);
        let f64_data = NDArray::zeros(Shape(vec![1, 2]), DType::F64, Context::CPU0).unwrap();
        f64_data
            .copy_from_bytes(bytemuck::cast_slice(&[0.5f64, 1.5]))
            .unwrap();
        let c = NDArray::row_sparse(Shape(vec![6, 2]), Context::CPU0, f64_data, &[3]).unwrap();
        assign_row_sparse(&c, &stored, &mut spare).unwrap();
        assert_eq!(stored.rsp_indices().unwrap(), vec![3]);
        assert_eq!(dense_of(&stored)[6..8], [0.5, 1.5]);
        assert!(assign_row_sparse(&rsp(5, &[0], &[1., 1.]), &stored, &mut spare).is_err());
    }

    #[test]
    fn adopted_parts_are_never_written_in_place() {
        let stored = rsp(5, &[0], &[7., 7.]);
        let mut spare = Spare::default();
        let v = rsp(5, &[1, 3], &[1., 2., 3., 4.]);
        assert!(share_row_sparse(&v, &stored, &mut spare).unwrap());
        assert!(stored.parts().unwrap().data.same(&v.parts().unwrap().data));
        let want = vec![0., 0., 1., 2., 0., 0., 3., 4., 0., 0.];
        assert_eq!(dense_of(&stored), want);
        // Adopting the same (frozen) parts again is a no-op.
        assert!(share_row_sparse(&v, &stored, &mut spare).unwrap());
        // A handle on the caller's data gets a private copy: writes through
        // it reach the caller's array, not the store.
        let d = v.private_parts().unwrap().data;
        d.copy_from_bytes(bytemuck::cast_slice(&[9f32; 4])).unwrap();
        assert_eq!(dense_of(&v)[2..4], [9., 9.]);
        assert_eq!(dense_of(&stored), want);
        // Now `v` holds other parts: adopting them again is allowed... but
        // not while a handle (`d`) holds them.
        assert!(!share_row_sparse(&v, &stored, &mut spare).unwrap());
        drop(d);
        assert!(share_row_sparse(&v, &stored, &mut spare).unwrap());
        assert_eq!(dense_of(&stored)[2..4], [9., 9.]);
        // Pulling into an array whose parts are adopted replaces them.
        let w = rsp(5, &[2, 4], &[5., 5., 6., 6.]);
        let other = rsp(5, &[2, 4], &[0., 0., 0., 0.]);
        assert!(share_row_sparse(&other, &stored, &mut spare).unwrap());
        retain_rows(&w, &[2, 4], &other).unwrap();
        assert_eq!(dense_of(&other)[4..6], [5., 5.]);
        assert_eq!(dense_of(&stored), vec![0.; 10]);
        // copy_any into it too.
        copy_any(&w, &other).unwrap();
        assert_eq!(dense_of(&stored), vec![0.; 10]);
        // Another dtype or shape: not adopted.
        assert!(!share_row_sparse(&rsp(6, &[0], &[1., 1.]), &stored, &mut spare).unwrap());
        // Once the store lets go, the caller's parts are thawed, not copied.
        let (v2, stored2, mut spare2) =
            (rsp(5, &[0], &[1., 1.]), rsp(5, &[], &[]), Spare::default());
        assert!(share_row_sparse(&v2, &stored2, &mut spare2).unwrap());
        let before = v2.parts().unwrap().data.addr();
        drop((stored2, spare2));
        let p = v2.private_parts().unwrap();
        assert_eq!(p.data.addr(), before);
        assert!(!p.data.is_frozen());
    }

    #[test]
    fn retain_sorts_dedups_and_zero_fills() {
        let stored = rsp(6, &[0, 2, 3], &[1., 1., 2., 2., 3., 3.5]);
        let ids = row_ids(&dense(&[3], &[3., 1., 3.]), 6).unwrap();
        assert_eq!(ids, vec![1, 3]);
        let out = NDArray::sparse_zeros(
            StorageType::RowSparse,
            Shape(vec![6, 2]),
            DType::F32,
            Context::CPU0,
            &[DType::I64],
            &[Shape(vec![0])],
        )
        .unwrap();
        retain_rows(&stored, &ids, &out).unwrap();
        assert_eq!(out.rsp_indices().unwrap(), vec![1, 3]);
        assert_eq!(
            out.parts().unwrap().data.read().typed::<f32>(),
            &[0., 0., 3., 3.5]
        );
        assert!(row_ids(&dense(&[1], &[6.0]), 6).is_err());
        assert_eq!(row_ids(&dense(&[2], &[2.7, 0.2]), 6).unwrap(), vec![0, 2]);
    }

    #[test]
    fn checks_reject_bad_indices() {
        assert!(rsp(4, &[2, 1], &[0.; 4]).check_row_sparse().is_err());
        assert!(rsp(4, &[1, 1], &[0.; 4]).check_row_sparse().is_err());
        assert!(rsp(4, &[1, 4], &[0.; 4]).check_row_sparse().is_err());
        assert!(rsp(4, &[0, 3], &[0.; 4]).check_row_sparse().is_ok());
    }

    #[test]
    fn dense_and_sparse_copies() {
        let d = dense(&[3, 2], &[1., 2., 3., 4., 5., 6.]);
        let r = NDArray::sparse_zeros(
            StorageType::RowSparse,
            Shape(vec![3, 2]),
            DType::F64,
            Context::CPU0,
            &[DType::I64],
            &[Shape(vec![0])],
        )
        .unwrap();
        r.copy_from(&d).unwrap();
        assert_eq!(r.rsp_indices().unwrap(), vec![0, 1, 2]);
        assert_eq!(dense_of(&r), vec![1., 2., 3., 4., 5., 6.]);
    }

    /// Runs `f` on another thread and waits at most `secs` for it: a test of
    /// a former deadlock fails instead of hanging the suite.
    fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(std::time::Duration::from_secs(secs))
            .expect("the operation did not return (deadlock, or O(rows) work)")
    }

    #[test]
    fn a_copy_into_a_part_of_its_source_returns() {
        // All rows stored: the data part has the array's shape, and copying
        // the array into it leaves it as it was (MXNet 1.9.1: rc 0, the same
        // values, the source unchanged).
        let r = rsp(3, &[0, 1, 2], &[1., 10., 2., 20., 3., 30.]);
        let d = r.private_parts().unwrap().data;
        let (r2, d2) = (r.clone(), d.clone());
        within(20, move || d2.copy_from(&r2)).unwrap();
        assert_eq!(d.read().typed::<f32>(), &[1., 10., 2., 20., 3., 30.]);
        assert_eq!(dense_of(&r), vec![1., 10., 2., 20., 3., 30.]);
        assert_eq!(r.rsp_indices().unwrap(), vec![0, 1, 2]);
        // ... and into its index part (a 1-d array of all rows stored).
        let data = dense(&[3], &[0., 1., 2.]);
        let v = NDArray::row_sparse(Shape(vec![3]), Context::CPU0, data, &[0, 1, 2]).unwrap();
        let aux = v.private_parts().unwrap().aux[0].clone();
        let (v2, aux2) = (v.clone(), aux.clone());
        within(20, move || aux2.copy_from(&v2)).unwrap();
        assert_eq!(aux.read().typed::<i64>(), &[0, 1, 2]);
        // Fewer rows stored: shapes differ, so a copy (CopyFromTo) is an
        // error (never a wait) ...
        let r = rsp(4, &[1, 3], &[1., 1., 2., 2.]);
        let d = r.private_parts().unwrap().data;
        let (r2, d2) = (r.clone(), d.clone());
        let e = within(20, move || d2.copy_from(&r2)).unwrap_err();
        assert!(e.message().contains("shape mismatch"), "{}", e.message());
        // ... and MXNDArraySyncCopyFromNDArray copies the stored values, as
        // MXNet 1.9.1 does (rc 0, the part unchanged), into the part itself
        // or into any array of its shape.
        let (r2, d2) = (r.clone(), d.clone());
        within(20, move || d2.sync_copy_from(&r2)).unwrap();
        assert_eq!(d.read().typed::<f32>(), &[1., 1., 2., 2.]);
        let other = NDArray::zeros(Shape(vec![2, 2]), DType::F64, Context::CPU0).unwrap();
        other.sync_copy_from(&r).unwrap();
        assert_eq!(other.to_f64_vec(), vec![1., 1., 2., 2.]);
        let full = NDArray::zeros(Shape(vec![4, 2]), DType::F32, Context::CPU0).unwrap();
        full.sync_copy_from(&r).unwrap();
        assert_eq!(dense_of(&full), vec![0., 0., 1., 1., 0., 0., 2., 2.]);
        let e = dense(&[3, 2], &[0.; 6]).sync_copy_from(&r).unwrap_err();
        assert!(e.message().contains("shape mismatch"), "{}", e.message());
    }

    #[test]
    fn rows_of_no_elements_cost_nothing() {
        // 2^40 rows of width 0: dense -> row_sparse stores no row, and the
        // other way writes nothing; both return at once (this scanned every
        // row: many minutes).
        let shape = Shape(vec![1 << 40, 0]);
        let (d, r) = within(20, move || {
            let d = NDArray::zeros(shape.clone(), DType::F32, Context::CPU0).unwrap();
            let r = NDArray::sparse_zeros(
                StorageType::RowSparse,
                shape,
                DType::F32,
                Context::CPU0,
                &[DType::I64],
                &[Shape(vec![0])],
            )
            .unwrap();
            r.copy_from(&d).unwrap();
            d.copy_from(&r).unwrap();
            (d, r)
        });
        assert_eq!(r.rsp_indices().unwrap(), Vec::<i64>::new());
        assert_eq!(r.parts().unwrap().data.shape(), &Shape(vec![0, 0]));
        assert_eq!(d.read().len(), 0);
        // Stored rows of width 0 (indices only) are kept, and pulled.
        let rows = NDArray::zeros(Shape(vec![2, 0]), DType::F32, Context::CPU0).unwrap();
        let v = NDArray::row_sparse(Shape(vec![1 << 40, 0]), Context::CPU0, rows, &[5, 1 << 39])
            .unwrap();
        v.check_row_sparse().unwrap();
        let out = NDArray::sparse_zeros(
            StorageType::RowSparse,
            Shape(vec![1 << 40, 0]),
            DType::F32,
            Context::CPU0,
            &[DType::I64],
            &[Shape(vec![0])],
        )
        .unwrap();
        let (v2, o2) = (v.clone(), out.clone());
        within(20, move || retain_rows(&v2, &[0, 5], &o2)).unwrap();
        assert_eq!(out.rsp_indices().unwrap(), vec![0, 5]);
        let s = sum_row_sparse(
            &[v.clone(), v],
            &Shape(vec![1 << 40, 0]),
            DType::F32,
            Context::CPU0,
        )
        .unwrap();
        assert_eq!(s.rsp_indices().unwrap(), vec![5, 1 << 39]);
    }

    #[test]
    fn huge_rows_with_nothing_stored_are_no_panic() {
        // [6, 2^62]: a row of 2^62 float32 is 2^64 bytes (a row size that
        // wrapped to 0 made `chunks_mut(0)` panic). Nothing stored, nothing
        // to copy.
        let shape = Shape(vec![6, 1 << 62]);
        let mk = || {
            NDArray::sparse_zeros(
                StorageType::RowSparse,
                shape.clone(),
                DType::F32,
                Context::CPU0,
                &[DType::I64],
                &[Shape(vec![0])],
            )
            .unwrap()
        };
        let (stored, out) = (mk(), mk());
        retain_rows(&stored, &[0, 5], &out).unwrap();
        assert_eq!(out.rsp_indices().unwrap(), Vec::<i64>::new());
        assert_eq!(shape.size(), usize::MAX, "saturates");
        copy_any(&stored, &out).unwrap();
        let s = sum_row_sparse(
            &[stored.clone(), out.clone()],
            &shape,
            DType::F32,
            Context::CPU0,
        )
        .unwrap();
        assert!(s.rsp_indices().unwrap().is_empty());
        stored.check_row_sparse().unwrap();
        stored.check_format(true).unwrap();
        // Dense arrays of that shape cannot exist; of no rows they can.
        assert!(NDArray::zeros(shape, DType::F32, Context::CPU0).is_err());
        let none = Shape(vec![0, 1 << 62]);
        let d = NDArray::zeros(none.clone(), DType::F32, Context::CPU0).unwrap();
        let r = NDArray::sparse_zeros(
            StorageType::RowSparse,
            none,
            DType::F64,
            Context::CPU0,
            &[DType::I64],
            &[Shape(vec![0])],
        )
        .unwrap();
        d.copy_from(&r).unwrap();
        r.copy_from(&d).unwrap();
        assert!(r.rsp_indices().unwrap().is_empty());
        let c = csr(i64::MAX, 1, 0, 0);
        assert!(c.check_format(false).is_err());
    }

    #[test]
    fn inconsistent_parts_are_errors_not_panics() {
        // Three indices for two stored rows (parts are set one at a time).
        let r = rsp(4, &[0, 2], &[1., 1., 2., 2.]);
        r.set_part(
            0,
            &NDArray::from_bytes(
                Shape(vec![3]),
                DType::I64,
                Context::CPU0,
                bytemuck::cast_slice(&[0i64, 1, 2]),
            )
            .unwrap(),
        )
        .unwrap();
        let out = rsp(4, &[], &[]);
        assert!(retain_rows(&r, &[0, 1, 2, 3], &out).is_err());
        let d = NDArray::zeros(Shape(vec![4, 2]), DType::F32, Context::CPU0).unwrap();
        assert!(d.copy_from(&r).is_err());
        assert!(r.check_row_sparse().is_err());
    }

    fn csr(rows: i64, cols: i64, indptr_len: i64, nnz: i64) -> NDArray {
        NDArray::sparse_zeros(
            StorageType::Csr,
            Shape(vec![rows, cols]),
            DType::F32,
            Context::CPU0,
            &[DType::I64, DType::I64],
            &[Shape(vec![indptr_len]), Shape(vec![nnz])],
        )
        .unwrap()
    }

    fn i64s(v: &[i64]) -> NDArray {
        NDArray::from_bytes(
            Shape(vec![v.len() as i64]),
            DType::I64,
            Context::CPU0,
            bytemuck::cast_slice(v),
        )
        .unwrap()
    }

    #[test]
    fn a_csr_copy_of_no_values_has_rows_plus_one_zero_offsets() {
        // MXNet's CopyFromToCsrImpl: a source with no column index stored
        // is copied as FillZerosCsrImpl's zeros, also when its indptr is []
        // (abs of an all-zero csr) or holds offsets
        for indptr in [&[][..], &[0, 0, 0, 0], &[0, 0, 0, 0, 0, 0]] {
            let src = csr(3, 4, 0, 0);
            if !indptr.is_empty() {
                src.set_part(0, &i64s(indptr)).ok();
            }
            let dst = csr(3, 4, 4, 2);
            dst.copy_from(&src).unwrap();
            let p = dst.parts().unwrap();
            assert_eq!(p.aux[0].read().typed::<i64>(), &[0, 0, 0, 0], "{indptr:?}");
            assert_eq!(p.aux[1].size(), 0);
            assert_eq!(p.data.shape(), &Shape(vec![0]));
            dst.check_format(true).unwrap();
        }
    }

    #[test]
    fn csr_parts_follow_csr_rules() {
        // [[0, 0, 1, 0], [0, 0, 0, 0], [2, 0, 0, 3]], as MXNet 1.9.1 builds it
        // (data, then indptr, then indices).
        let c = csr(3, 4, 4, 3);
        c.set_part(-1, &dense(&[3], &[1., 2., 3.])).unwrap();
        // indptr given as float32 is converted, as in MXNet
        c.set_part(0, &dense(&[4], &[0., 1., 1., 3.])).unwrap();
        c.set_part(1, &i64s(&[2, 0, 3])).unwrap();
        let p = c.parts().unwrap();
        assert_eq!(p.data.read().typed::<f32>(), &[1., 2., 3.]);
        assert_eq!(p.aux[0].read().typed::<i64>(), &[0, 1, 1, 3]);
        assert_eq!(p.aux[1].read().typed::<i64>(), &[2, 0, 3]);
        c.check_format(true).unwrap();
        // A csr created with no room (aux shapes 0) takes parts of any
        // length; the data and the indices must agree when it is used.
        let z = csr(3, 4, 0, 0);
        z.set_part(-1, &dense(&[2], &[5., 6.])).unwrap();
        assert!(z.check_format(false).is_err(), "no indptr yet");
        z.set_part(0, &i64s(&[0, 0, 2, 2])).unwrap();
        assert!(z.check_format(false).is_err(), "2 values, 0 indices");
        z.set_part(1, &i64s(&[1, 3])).unwrap();
        z.check_format(true).unwrap();
        // Refused: 2-d data or indices, an indptr of another length than
        // rows + 1, aux index 2 (and these leave the parts as they were).
        let msg = |r: Result<()>| r.unwrap_err().message().to_string();
        assert!(msg(c.set_part(-1, &dense(&[3, 1], &[1., 2., 3.]))).contains("1-d"));
        assert!(msg(c.set_part(1, &dense(&[3, 1], &[1., 2., 3.]))).contains("1-d"));
        assert!(msg(c.set_part(0, &i64s(&[0, 1, 3]))).contains("rows + 1 = 4"));
        assert!(msg(c.set_part(0, &i64s(&[0, 1, 1, 3, 3]))).contains("rows + 1 = 4"));
        assert!(msg(c.set_part(2, &i64s(&[0]))).contains("aux index 2 out of range"));
        assert!(msg(c.set_part(-2, &i64s(&[0]))).contains("aux index -2 out of range"));
        c.check_format(true).unwrap();
        assert_eq!(
            c.parts().unwrap().aux[0].read().typed::<i64>(),
            &[0, 1, 1, 3]
        );
        // row_sparse keeps its own rules: whole rows for the data.
        let r = rsp(4, &[], &[]);
        assert!(msg(r.set_part(-1, &dense(&[2], &[1., 2.]))).contains("does not fit"));
        r.set_part(-1, &dense(&[1, 2], &[1., 2.])).unwrap();
    }

    /// dense <-> csr as MXNet's cast_storage: the elements != 0 (NaN stored,
    /// -0.0 not) in row and column order, dtypes converted; csr -> csr copies
    /// the parts; row_sparse <-> csr stays refused (MXNet has no such cast).
    #[test]
    fn csr_copies_to_and_from_dense() {
        let nan = f32::NAN;
        let d = dense(&[3, 3], &[0., 1.5, -0., 0., 0., 0., nan, 0., 2.]);
        let c = csr(3, 3, 4, 0);
        c.copy_from(&d).unwrap();
        let p = c.parts().unwrap();
        assert_eq!(p.aux[0].read().typed::<i64>(), &[0, 1, 1, 3]);
        assert_eq!(p.aux[1].read().typed::<i64>(), &[1, 0, 2]);
        let vals = p.data.read().typed::<f32>().to_vec();
        assert!(vals[0] == 1.5 && vals[1].is_nan() && vals[2] == 2.);
        c.check_format(true).unwrap();
        let back = dense_of(&c);
        assert_eq!(back[..6], [0., 1.5, 0., 0., 0., 0.]);
        assert!(back[6].is_nan() && back[8] == 2.);
        // into another dtype, and csr -> csr
        let ints = NDArray::sparse_zeros(
            StorageType::Csr,
            Shape(vec![3, 3]),
            DType::I32,
            Context::CPU0,
            &[DType::I64, DType::I64],
            &[Shape(vec![0]), Shape(vec![0])],
        )
        .unwrap();
        ints.copy_from(&c).unwrap();
        assert_eq!(ints.parts().unwrap().data.read().typed::<i32>()[0], 1);
        assert_eq!(
            ints.parts().unwrap().aux[0].read().typed::<i64>(),
            &[0, 1, 1, 3]
        );
        // no rows, no columns
        let empty = csr(2, 0, 3, 0);
        empty
            .copy_from(&NDArray::zeros(Shape(vec![2, 0]), DType::F32, Context::CPU0).unwrap())
            .unwrap();
        assert_eq!(
            empty.parts().unwrap().aux[0].read().typed::<i64>(),
            &[0, 0, 0]
        );
        // stored values with a short indptr, a column out of range: refused
        let msg = |r: Result<()>| r.unwrap_err().message().to_string();
        let short = csr(3, 3, 2, 1);
        short.set_part(-1, &dense(&[1], &[4.])).unwrap();
        let out = NDArray::zeros(Shape(vec![3, 3]), DType::F32, Context::CPU0).unwrap();
        assert!(msg(out.copy_from(&short)).contains("not rows + 1"));
        let wide = csr(3, 3, 4, 1);
        wide.set_part(0, &i64s(&[0, 1, 1, 1])).unwrap();
        wide.set_part(1, &i64s(&[7])).unwrap();
        assert!(msg(out.copy_from(&wide)).contains("out of range"));
        assert!(rsp(3, &[], &[]).copy_from(&c).is_err());
        assert!(c.copy_from(&rsp(3, &[], &[])).is_err());
    }
}

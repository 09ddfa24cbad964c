//! MXNet's `.params` file format (`MXNDArraySave` / `MXNDArrayLoad`), dense
//! arrays. Little-endian throughout:
//! list magic `0x112` (u64), reserved (u64), count (u64), the arrays, then the
//! names (u64 count, each u64 length + bytes).
//! One array (V2): magic `0xF993FAC9` (u32), storage type (i32), shape (i32
//! ndim + i64 dims; none arrays stop here), context (i32 type, i32 id),
//! dtype (i32), raw data.

use super::dtype::DType;
use super::{Context, NDArray, Shape, StorageType};
use crate::error::{Error, Result};
use crate::{bail, ensure};

const LIST_MAGIC: u64 = 0x112;
const V1_MAGIC: u32 = 0xF993_FAC8;
const V2_MAGIC: u32 = 0xF993_FAC9;
const V3_MAGIC: u32 = 0xF993_FACA;

/// Serialises `arrays` (and their names, if any) into `.params` bytes.
pub fn save(arrays: &[NDArray], names: &[Vec<u8>]) -> Result<Vec<u8>> {
    ensure!(
        names.is_empty() || names.len() == arrays.len(),
        "{} names for {} arrays",
        names.len(),
        arrays.len()
    );
    let mut out = Vec::new();
    out.extend_from_slice(&LIST_MAGIC.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    out.extend_from_slice(&(arrays.len() as u64).to_le_bytes());
    for a in arrays {
        write_array(&mut out, a)?;
    }
    out.extend_from_slice(&(names.len() as u64).to_le_bytes());
    for n in names {
        out.extend_from_slice(&(n.len() as u64).to_le_bytes());
        out.extend_from_slice(n);
    }
    Ok(out)
}

fn write_shape(out: &mut Vec<u8>, shape: &Shape) {
    out.extend_from_slice(&(shape.ndim() as i32).to_le_bytes());
    for d in shape.dims() {
        out.extend_from_slice(&d.to_le_bytes());
    }
}

fn write_array(out: &mut Vec<u8>, a: &NDArray) -> Result<()> {
    out.extend_from_slice(&V2_MAGIC.to_le_bytes());
    out.extend_from_slice(&a.stype().code().to_le_bytes());
    match a.stype() {
        StorageType::Undefined => {
            bail!("Unknown storage type-1: cannot save an empty NDArray (MXNDArrayCreateNone)")
        }
        StorageType::Default => {}
        StorageType::RowSparse | StorageType::Csr => {
            a.check_format(false)?;
            let parts = a.parts()?;
            write_shape(out, parts.data.shape());
            write_shape(out, a.shape());
            out.extend_from_slice(&a.ctx().dev_type.to_le_bytes());
            out.extend_from_slice(&a.ctx().dev_id.to_le_bytes());
            out.extend_from_slice(&a.dtype().code().to_le_bytes());
            for aux in &parts.aux {
                out.extend_from_slice(&aux.dtype().code().to_le_bytes());
                write_shape(out, aux.shape());
            }
            out.extend_from_slice(parts.data.read().bytes());
            for aux in &parts.aux {
                out.extend_from_slice(aux.read().bytes());
            }
            return Ok(());
        }
    }
    write_shape(out, a.shape());
    out.extend_from_slice(&a.ctx().dev_type.to_le_bytes());
    out.extend_from_slice(&a.ctx().dev_id.to_le_bytes());
    out.extend_from_slice(&a.dtype().code().to_le_bytes());
    out.extend_from_slice(a.read().bytes());
    Ok(())
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let Some(end) = end else {
            bail!(
                "Invalid NDArray file format: truncated at byte {} (wanted {n} more bytes)",
                self.pos
            )
        };
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn i32(&mut self) -> Result<i32> {
        Ok(i32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn i64(&mut self) -> Result<i64> {
        Ok(i64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn shape(&mut self) -> Result<Shape> {
        let ndim = self.i32()?;
        ensure!(
            (-1..=32).contains(&ndim),
            "Invalid NDArray file format: ndim {ndim}"
        );
        let dims = (0..ndim.max(0))
            .map(|_| self.i64())
            .collect::<Result<Vec<_>>>()?;
        Ok(Shape(dims))
    }
    /// A count that must fit in the rest of the file (each item ≥ `min` bytes).
    fn count(&mut self, min: usize) -> Result<usize> {
        let n = self.u64()?;
        let left = (self.buf.len() - self.pos) as u64;
        ensure!(
            n.saturating_mul(min as u64) <= left,
            "Invalid NDArray file format: count {n} does not fit in the file"
        );
        Ok(n as usize)
    }
}

/// Parses `.params` bytes into arrays and names.
pub fn load(bytes: &[u8]) -> Result<(Vec<NDArray>, Vec<Vec<u8>>)> {
    let mut r = Reader { buf: bytes, pos: 0 };
    let header = r.u64().map_err(|_| invalid())?;
    ensure!(header == LIST_MAGIC, "{}", invalid().message());
    r.u64()?; // reserved
    let n = r.count(12)?;
    let mut arrays = Vec::with_capacity(n);
    for _ in 0..n {
        arrays.push(read_array(&mut r)?);
    }
    let nn = r.count(8)?;
    let mut names = Vec::with_capacity(nn);
    for _ in 0..nn {
        let len = r.u64()?;
        let len = usize::try_from(len).map_err(|_| invalid())?;
        names.push(r.take(len)?.to_vec());
    }
    ensure!(
        names.is_empty() || names.len() == arrays.len(),
        "Invalid NDArray file format: {} names for {} arrays",
        names.len(),
        arrays.len()
    );
    Ok((arrays, names))
}

fn invalid() -> Error {
    Error::new("Check failed: header == kMXAPINDArrayListMagic: Invalid NDArray file format")
}

fn read_array(r: &mut Reader<'_>) -> Result<NDArray> {
    let magic = r.u32()?;
    match magic {
        V2_MAGIC | V3_MAGIC => {}
        V1_MAGIC => {
            bail!("legacy NDArray format V1 is not supported; re-save the file with MXNet ≥ 1.0")
        }
        m => bail!("Invalid NDArray file format: array magic {m:#x}"),
    }
    let stype = r.i32()?;
    match stype {
        0 => {}
        -1 => {
            r.shape()?;
            return Ok(NDArray::none());
        }
        1 | 2 => return read_sparse(r, stype),
        s => bail!("Invalid NDArray file format: storage type {s}"),
    }
    let shape = r.shape()?;
    if shape.ndim() == 0 && magic == V2_MAGIC {
        return Ok(NDArray::none());
    }
    // The saved context is read and dropped: arrays load onto cpu(0), as in MXNet.
    r.i32()?;
    r.i32()?;
    let ctx = Context::CPU0;
    let dtype = DType::from_code(r.i32()?)?;
    let nbytes = byte_len(r, &shape, dtype)?;
    let data = r.take(nbytes)?;
    NDArray::from_bytes(shape, dtype, ctx, data)
}

/// Bytes of an array of `shape` and `dtype`, bounded by what the file holds.
fn byte_len(r: &Reader<'_>, shape: &Shape, dtype: DType) -> Result<usize> {
    for &d in shape.dims() {
        ensure!(d >= 0, "Invalid NDArray file format: dimension {d}");
    }
    shape
        .dims()
        .iter()
        .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d as usize))
        .filter(|&n| n <= r.buf.len() - r.pos)
        .ok_or_else(|| {
            Error::new(format!(
                "Invalid NDArray file format: array of shape {shape} does not fit in the file"
            ))
        })
}

fn read_sparse(r: &mut Reader<'_>, stype: i32) -> Result<NDArray> {
    let stype = if stype == 1 {
        StorageType::RowSparse
    } else {
        StorageType::Csr
    };
    let storage_shape = r.shape()?;
    let shape = r.shape()?;
    r.i32()?;
    r.i32()?;
    let dtype = DType::from_code(r.i32()?)?;
    let naux = if stype == StorageType::RowSparse {
        1
    } else {
        2
    };
    let mut aux_types = Vec::with_capacity(naux);
    let mut aux_shapes = Vec::with_capacity(naux);
    for _ in 0..naux {
        aux_types.push(DType::from_code(r.i32()?)?);
        aux_shapes.push(r.shape()?);
    }
    let a = NDArray::sparse_zeros(stype, shape, dtype, Context::CPU0, &aux_types, &aux_shapes)?;
    let parts = a.parts()?;
    ensure!(
        parts.data.shape() == &storage_shape,
        "Invalid NDArray file format: storage shape {storage_shape} does not match the aux shapes"
    );
    let n = byte_len(r, &storage_shape, dtype)?;
    parts.data.copy_from_bytes(r.take(n)?)?;
    for aux in &parts.aux {
        let n = byte_len(r, aux.shape(), aux.dtype())?;
        aux.copy_from_bytes(r.take(n)?)?;
    }
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_example_is_157_bytes_and_round_trips() {
        let w = NDArray::from_bytes(
            Shape(vec![2, 3]),
            DType::F32,
            Context::CPU0,
            bytemuck::cast_slice(&[1f32, 2., 3., 4., 5., 6.]),
        )
        .unwrap();
        let b = NDArray::from_bytes(
            Shape(vec![1]),
            DType::I64,
            Context::CPU0,
            &7i64.to_le_bytes(),
        )
        .unwrap();
        let bytes = save(&[w, b], &[b"w".to_vec(), b"bias".to_vec()]).unwrap();
        assert_eq!(bytes.len(), 157);
        let (arrays, names) = load(&bytes).unwrap();
        assert_eq!(names, vec![b"w".to_vec(), b"bias".to_vec()]);
        assert_eq!(arrays[0].shape().dims(), &[2, 3]);
        assert_eq!(arrays[0].read().typed::<f32>(), &[1., 2., 3., 4., 5., 6.]);
        assert_eq!(arrays[1].dtype(), DType::I64);
        assert_eq!(save(&arrays, &names).unwrap(), bytes);
    }

    #[test]
    fn row_sparse_round_trip() {
        let data = NDArray::from_bytes(
            Shape(vec![2, 2]),
            DType::F32,
            Context::CPU0,
            bytemuck::cast_slice(&[1f32, 2., 3., 4.]),
        )
        .unwrap();
        let a = NDArray::row_sparse(Shape(vec![5, 2]), Context::CPU0, data, &[1, 3]).unwrap();
        let bytes = save(&[a], &[]).unwrap();
        let (arrays, _) = load(&bytes).unwrap();
        assert_eq!(arrays[0].stype(), StorageType::RowSparse);
        assert_eq!(arrays[0].rsp_indices().unwrap(), vec![1, 3]);
        assert_eq!(save(&arrays, &[]).unwrap(), bytes);
        for cut in 0..bytes.len() {
            assert!(load(&bytes[..cut]).is_err());
        }
    }

    #[test]
    fn garbage_is_an_error_not_a_crash() {
        assert!(load(b"")
            .unwrap_err()
            .message()
            .contains("Invalid NDArray file format"));
        let mut bytes = save(&[], &[]).unwrap();
        assert!(load(&bytes).unwrap().0.is_empty());
        bytes[16] = 0xff; // absurd count
        assert!(load(&bytes).is_err());
        let a = NDArray::zeros(Shape(vec![4]), DType::F64, Context::CPU0).unwrap();
        let full = save(&[a], &[]).unwrap();
        for cut in 0..full.len() {
            assert!(load(&full[..cut]).is_err(), "prefix {cut} accepted");
        }
    }
}

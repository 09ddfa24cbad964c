//! MXNet's `.params` file format (`MXNDArraySave` / `MXNDArrayLoad`), dense
//! and sparse arrays. Little-endian throughout:
//! list magic `0x112` (u64), reserved (u64), count (u64), the arrays, then the
//! names (u64 count, each u64 length + bytes).
//! One array (V2): magic `0xF993FAC9` (u32), storage type (i32), shape (i32
//! ndim + i64 dims; none arrays stop here), context (i32 type, i32 id),
//! dtype (i32), raw data. A sparse array (storage type 1 row_sparse, 2 csr)
//! has its storage shape before the shape, the aux types and shapes after
//! the dtype, and its aux arrays' data after its own.
//!
//! Loading also reads what MXNet 1.9.1 loads: the V1 and V0 formats of
//! before sparse arrays (see [`read_legacy`]). V3 (`0xF993FACA`, saved with
//! np shape semantics on) is refused, as MXNet refuses it with them off; so
//! are storage type -1 and ndim -1, which MXNet fails on too.
//!
//! Loading streams: every size read from the file is checked against the
//! bytes the file still holds before anything is allocated for it (MXNet
//! 1.9.1's `NDArray::Load` reads field by field too, and fails after 8 bytes
//! on a wrong magic). A source of unknown length (a pipe, a character
//! device) has nothing to check a size against, so there a claim is
//! believed only as far as the bytes read back it: names and shapes grow
//! with the bytes read, and an array is allocated once half of its bytes
//! have come (see [`Reader::read_data`]).
//!
//! Memory: MXNet allocates every claimed size up front (the array list, a
//! shape, a name, an array's data) and fails with `bad_alloc` where that
//! allocation fails. Here a claimed size is first checked to be allocatable
//! (see [`room`]: a mapping never touched and released at once), lists and
//! buffers are reserved up to [`RESERVE_MAX`] items and grow with the items
//! read, every growth is fallible (`try_reserve`), and the memory the load
//! holds is checked again at each [`PROBE_STEP`] it grows by: a file that
//! claims or holds more than the process can allocate fails with `-1`.

use std::collections::VecDeque;
use std::fmt;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::Path;

use super::dtype::DType;
use super::sparse::Parts;
use super::{Context, NDArray, Shape, StorageType, MAX_BYTES};
use crate::error::{Error, Result};
use crate::{bail, ensure};

const LIST_MAGIC: u64 = 0x112;
const V1_MAGIC: u32 = 0xF993_FAC8;
const V2_MAGIC: u32 = 0xF993_FAC9;
const V3_MAGIC: u32 = 0xF993_FACA;

/// An array checked for saving, with the parts a sparse one is written from.
enum Saved<'a> {
    Dense(&'a NDArray),
    Sparse(&'a NDArray, Parts),
}

/// Checks everything a save needs before anything is written (MXNet writes
/// the records before a bad array, then fails): the names, each array's
/// storage, and a sparse array's format.
fn check_save<'a>(arrays: &'a [NDArray], names: &[Vec<u8>]) -> Result<Vec<Saved<'a>>> {
    ensure!(
        names.is_empty() || names.len() == arrays.len(),
        "{} names for {} arrays",
        names.len(),
        arrays.len()
    );
    arrays
        .iter()
        .map(|a| match a.stype() {
            StorageType::Undefined => {
                bail!("Unknown storage type-1: cannot save an empty NDArray (MXNDArrayCreateNone)")
            }
            // The format (MXNet's `NDArray::Load`, and `load` here) reads a
            // shape of ndim 0 as a CreateNone array with nothing after it:
            // the element, context and dtype written for one would be read
            // as the next record (MXNet 1.9.1 writes such a file and crashes
            // loading it).
            StorageType::Default if a.shape().ndim() == 0 => bail!(
                "cannot save an array of ndim 0 (shape (), one element): the .params format \
                 reads ndim 0 as an empty NDArray with nothing after it, so the file would \
                 load back wrong (MXNet 1.9.1 writes it and fails loading it)"
            ),
            StorageType::Default => Ok(Saved::Dense(a)),
            StorageType::RowSparse | StorageType::Csr => {
                check_savable(a)?;
                Ok(Saved::Sparse(a, a.parts()?))
            }
        })
        .collect()
}

/// What a sparse array must satisfy to be saved: that MXNet 1.9.1 (and
/// libmxkv) load the file back as it was. MXNet's `NDArray::Save` checks
/// nothing: it writes the data's shape as the storage shape, then the aux
/// shapes and all the bytes. Its `Load` sizes the data by the storage shape
/// with its first dim set to the stored count (the indices' length), so a
/// data part of another length than the indices would be misread: refused
/// (as [`NDArray::check_format`]'s shape check does for row_sparse). A
/// csr's indptr is saved whatever its length (an array MXNet made with
/// `MXNDArrayCreateSparseEx` and never filled has none; one loaded from
/// such a file has none either), as MXNet saves and loads it.
fn check_savable(a: &NDArray) -> Result<()> {
    if a.stype() == StorageType::RowSparse {
        return a.check_format(false);
    }
    let p = a.parts()?;
    ensure!(
        p.aux[1].size() == p.data.size(),
        "Check failed: err != kCSRShapeErr: Shape mismatch of this csr NDArray: {} indices \
         for {} values (MXNet would save a file it reads back wrong)",
        p.aux[1].size(),
        p.data.size()
    );
    Ok(())
}

/// Writes checked arrays and their names to `out`, streaming each array's
/// bytes from its storage.
fn write_saved<W: Write>(out: &mut W, arrays: &[Saved], names: &[Vec<u8>]) -> io::Result<()> {
    out.write_all(&LIST_MAGIC.to_le_bytes())?;
    out.write_all(&0u64.to_le_bytes())?;
    out.write_all(&(arrays.len() as u64).to_le_bytes())?;
    for a in arrays {
        write_array(out, a)?;
    }
    out.write_all(&(names.len() as u64).to_le_bytes())?;
    for n in names {
        out.write_all(&(n.len() as u64).to_le_bytes())?;
        out.write_all(n)?;
    }
    Ok(())
}

/// Serialises `arrays` (and their names, if any) into `.params` bytes.
pub fn save(arrays: &[NDArray], names: &[Vec<u8>]) -> Result<Vec<u8>> {
    let saved = check_save(arrays, names)?;
    let mut out = Vec::new();
    write_saved(&mut out, &saved, names).map_err(|e| Error::new(e.to_string()))?;
    Ok(out)
}

/// Saves `arrays` (and their names, if any) to the file at `path`: checked
/// first, nothing written when a check fails; then streamed through a
/// buffer, never held whole in memory. When a write fails, a regular file
/// left half-written is removed (a pipe or device is left alone, and so is
/// a symbolic link, which removing would not remove the file it names).
pub fn save_file(path: &Path, arrays: &[NDArray], names: &[Vec<u8>]) -> Result<()> {
    let saved = check_save(arrays, names)?;
    let file = File::create(path)
        .map_err(|e| Error::new(format!("cannot write {}: {e}", path.display())))?;
    let regular = file.metadata().is_ok_and(|m| m.is_file());
    let linked = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    let mut out = BufWriter::new(file);
    let written = write_saved(&mut out, &saved, names).and_then(|()| out.flush());
    drop(out);
    let Err(e) = written else {
        return Ok(());
    };
    let fate = match (regular, linked) {
        (false, _) => "",
        (true, true) => " (the file the symbolic link names is left partly written)",
        (true, false) if std::fs::remove_file(path).is_ok() => " (the partial file was removed)",
        (true, false) => " (the partial file could not be removed)",
    };
    bail!("cannot write {}: {e}{fate}", path.display())
}

fn write_shape<W: Write>(out: &mut W, shape: &Shape) -> io::Result<()> {
    out.write_all(&(shape.ndim() as i32).to_le_bytes())?;
    for d in shape.dims() {
        out.write_all(&d.to_le_bytes())?;
    }
    Ok(())
}

fn write_array<W: Write>(out: &mut W, saved: &Saved) -> io::Result<()> {
    let a = match saved {
        Saved::Dense(a) | Saved::Sparse(a, _) => a,
    };
    out.write_all(&V2_MAGIC.to_le_bytes())?;
    out.write_all(&a.stype().code().to_le_bytes())?;
    if let Saved::Sparse(_, parts) = saved {
        write_shape(out, parts.data.shape())?;
    }
    write_shape(out, a.shape())?;
    out.write_all(&a.ctx().dev_type.to_le_bytes())?;
    out.write_all(&a.ctx().dev_id.to_le_bytes())?;
    out.write_all(&a.dtype().code().to_le_bytes())?;
    let Saved::Sparse(_, parts) = saved else {
        return out.write_all(a.read().bytes());
    };
    for aux in &parts.aux {
        out.write_all(&aux.dtype().code().to_le_bytes())?;
        write_shape(out, aux.shape())?;
    }
    out.write_all(parts.data.read().bytes())?;
    for aux in &parts.aux {
        out.write_all(aux.read().bytes())?;
    }
    Ok(())
}

/// What a load gives: the arrays, and their names (none, or one per array).
pub type Loaded = (Vec<NDArray>, Vec<Vec<u8>>);

/// Step by which a buffer grows while reading a source of unknown length.
const CHUNK: usize = 1 << 20;

/// Most arrays, and most names, a file may hold: `MXNDArrayLoad` returns
/// both counts as `uint32_t`.
const MAX_ITEMS: u64 = u32::MAX as u64;

/// Memory one loaded array costs besides its data (its header, shape and
/// handle; a lower bound), and one name besides its bytes: claimed counts
/// are checked against [`room`] for this much per item.
const ARRAY_COST: u64 = 128;
const NAME_COST: u64 = 32;

/// Items reserved up front for a list or a shape, whatever count the file
/// claims; beyond this the list grows as items are read.
const RESERVE_MAX: usize = 1024;

/// Claims smaller than this are not checked with [`room`], and the memory a
/// load holds is checked again each time it grows by this much.
const PROBE_STEP: u64 = 64 << 20;

/// Where in the file a read is, for error texts: the item, and its part.
#[derive(Clone, Copy)]
enum Place {
    Header,
    Array(u64),
    NameCount,
    Name(u64),
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::Header => f.write_str("the header"),
            Place::Array(i) => write!(f, "array {i}"),
            Place::NameCount => f.write_str("the name count"),
            Place::Name(i) => write!(f, "name {i}"),
        }
    }
}

/// A `.params` stream: `len` is the source's total length when it has one
/// (a regular file, a byte slice), `None` for pipes and devices.
struct Reader<R> {
    src: R,
    pos: u64,
    len: Option<u64>,
    /// Names the source in read errors.
    name: String,
    /// The item being read and its part (`""`: the item as a whole).
    place: Place,
    part: &'static str,
    /// Bytes of memory the arrays and names read so far hold (estimated),
    /// and that figure when [`room`] was last checked.
    held: u64,
    probed: u64,
}

/// Checks that `bytes` more could be allocated now, as a mapping of that
/// size never touched and released at once: where MXNet's up-front
/// allocation of a claimed size fails (`bad_alloc`), this fails, without
/// the memory ever being used. Sizes under [`PROBE_STEP`] pass unchecked.
fn room(bytes: u64, what: &dyn Fn() -> String) -> Result<()> {
    if bytes < PROBE_STEP {
        return Ok(());
    }
    let refuse = |e: &dyn fmt::Display| {
        Error::new(format!(
            "{} needs {bytes} bytes of memory, more than this process can allocate ({e})",
            what()
        ))
    };
    // Tests may set a limit, which then decides instead of the mapping.
    #[cfg(test)]
    match tests::ROOM_LIMIT.with(|l| l.get()) {
        u64::MAX => {}
        limit if bytes > limit => return Err(refuse(&"test limit")),
        _ => return Ok(()),
    }
    let len = usize::try_from(bytes).map_err(|e| refuse(&e))?;
    memmap2::MmapMut::map_anon(len)
        .map(drop)
        .map_err(|e| refuse(&e))
}

/// Makes room in `v` for one more item, failing (not aborting) when the
/// memory is not there.
fn grow<T>(v: &mut Vec<T>, what: &dyn Fn() -> String) -> Result<()> {
    v.try_reserve(1).map_err(|e| {
        Error::new(format!(
            "out of memory reading {} (after {} items): {e}",
            what(),
            v.len()
        ))
    })
}

impl<R: Read> Reader<R> {
    fn new(src: R, len: Option<u64>, name: &str) -> Reader<R> {
        Reader {
            src,
            pos: 0,
            len,
            name: name.to_string(),
            place: Place::Header,
            part: "",
            held: 0,
            probed: 0,
        }
    }
    /// Fills `buf` from the source: the end of the source is a truncated
    /// file, any other failure names the source.
    fn fill(&mut self, buf: &mut [u8]) -> Result<()> {
        match self.src.read_exact(buf) {
            Ok(()) => {
                self.pos += buf.len() as u64;
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => bail!(
                "Invalid NDArray file format: truncated at byte {}, in {} (wanted {} more bytes)",
                self.pos,
                self.place_text(),
                buf.len()
            ),
            Err(e) => bail!("cannot read {}: {e}", self.name),
        }
    }
    /// "the shape of array 2", "the header", ...
    fn place_text(&self) -> String {
        match self.part {
            "" => self.place.to_string(),
            part => format!("the {part} of {}", self.place),
        }
    }
    /// Counts `bytes` more of memory held by what was read, checking [`room`]
    /// for the next [`PROBE_STEP`] each time the total grows by that much.
    fn hold(&mut self, bytes: u64) -> Result<()> {
        self.held = self.held.saturating_add(bytes);
        if self.held - self.probed >= PROBE_STEP {
            let held = self.held;
            room(PROBE_STEP, &|| {
                format!("going on after {held} bytes of arrays and names")
            })?;
            self.probed = self.held;
        }
        Ok(())
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut b = [0; N];
        self.fill(&mut b)?;
        Ok(b)
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn i32(&mut self) -> Result<i32> {
        Ok(i32::from_le_bytes(self.array()?))
    }
    fn i64(&mut self) -> Result<i64> {
        Ok(i64::from_le_bytes(self.array()?))
    }
    /// Bytes left in a source of known length.
    fn left(&self) -> Option<u64> {
        self.len.map(|l| l.saturating_sub(self.pos))
    }
    /// Whether `n` more bytes can be in the source (always, when its length
    /// is unknown).
    fn fits(&self, n: u64) -> bool {
        self.left().map_or(true, |left| n <= left)
    }
    /// A shape as `TShape::Load` of MXNet 1.9.1 saves it: i32 ndim, i64
    /// dims. An ndim of -1 (unknown) makes MXNet read a size_t(-8)-byte
    /// buffer and fail (or overrun it), below -1 it refuses: both are
    /// refused. Any other ndim up to what the file holds is read.
    fn shape(&mut self) -> Result<Shape> {
        let ndim = self.i32()?;
        ensure!(ndim >= 0, "Invalid NDArray file format: ndim {ndim}");
        self.dims(ndim as u64, 8)
    }
    /// `ndim` dims of `width` bytes (8: i64; 4: u32, the V0 format's).
    fn dims(&mut self, ndim: u64, width: u64) -> Result<Shape> {
        ensure!(
            self.fits(ndim * width),
            "Invalid NDArray file format: ndim {ndim} does not fit in the file"
        );
        let place = self.place;
        let what = || format!("a shape of ndim {ndim} in {place}");
        if self.len.is_some() {
            room(ndim * 8, &what)?;
        }
        // Reserved up to RESERVE_MAX dims; beyond, grown with the dims read.
        let mut dims = Vec::new();
        dims.try_reserve_exact((ndim as usize).min(RESERVE_MAX))
            .map_err(|e| Error::new(format!("out of memory reading {}: {e}", what())))?;
        for _ in 0..ndim {
            grow(&mut dims, &what)?;
            dims.push(match width {
                4 => i64::from(self.u32()?),
                _ => self.i64()?,
            });
        }
        Ok(Shape(dims))
    }
    /// A count of items of at least `min` bytes each in the file and
    /// `cost` bytes each in memory: at most [`MAX_ITEMS`], fitting in the
    /// rest of the file and in the memory the process can allocate.
    fn count(&mut self, min: u64, cost: u64, items: &str) -> Result<u64> {
        let n = self.u64()?;
        ensure!(
            n <= MAX_ITEMS,
            "Invalid NDArray file format: the file claims {n} {items}, more than \
             MXNDArrayLoad can return ({MAX_ITEMS}, its counts are uint32)"
        );
        ensure!(
            self.fits(n.saturating_mul(min)),
            "Invalid NDArray file format: count {n} does not fit in the file"
        );
        room(n * cost, &|| {
            format!("holding the {n} {items} the file claims")
        })?;
        Ok(n)
    }
    /// Reads `n` bytes into `out` (emptied first). With a known length, `n`
    /// must fit in what is left, checked before allocating; otherwise `n`
    /// must be at most [`MAX_BYTES`], and `out` grows with the bytes read
    /// (at most twice them, plus [`CHUNK`]), with `try_reserve_exact`.
    fn take_into(&mut self, n: u64, what: &dyn Fn() -> String, out: &mut Vec<u8>) -> Result<()> {
        out.clear();
        let n = match (self.left(), usize::try_from(n)) {
            (Some(left), Ok(n)) if n as u64 <= left => n,
            (None, Ok(n)) if n <= MAX_BYTES => n,
            (None, _) => bail!(
                "Invalid NDArray file format: {} claims {n} bytes, more than this library \
                 allocates ({MAX_BYTES})",
                what()
            ),
            _ => bail!(
                "Invalid NDArray file format: {} needs {n} bytes, the file holds {} more",
                what(),
                self.left().map_or("fewer".into(), |l| l.to_string())
            ),
        };
        if self.len.is_some() {
            // n fits in the file: allocated up front, if the memory is there.
            room(n as u64, what)?;
            out.try_reserve_exact(n)
                .map_err(|e| Error::new(format!("out of memory reading {}: {e}", what())))?;
            out.resize(n, 0);
            return self.fill(out);
        }
        // Unknown length: the buffer grows with the bytes read, and fails
        // (not aborts) where it cannot; the claim itself is never allocated
        // or mapped.
        while out.len() < n {
            let at = out.len();
            let step = (n - at).min(at.max(CHUNK));
            out.try_reserve_exact(step).map_err(|e| {
                Error::new(format!(
                    "out of memory reading {} ({n} bytes) after {at} bytes: {e}",
                    what()
                ))
            })?;
            out.resize(at + step, 0);
            self.fill(&mut out[at..])?;
        }
        Ok(())
    }
    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.take_into(n, what, &mut out)?;
        Ok(out)
    }
    /// Reads `n` bytes of array data into the array `make` allocates: into
    /// its buffers (its own, or a sparse array's data and then its aux
    /// arrays), which must hold `n` bytes together.
    ///
    /// With a known length, `n` must fit in what the source holds, checked
    /// before anything is allocated. Of unknown length, `n` must be at most
    /// [`MAX_BYTES`], and the claim proves itself first: the bytes are read
    /// into mapped chunks of [`CHUNK`] bytes until what is still to come is
    /// no more than what came (or one chunk); then the array is allocated,
    /// each chunk is moved into it and unmapped, and the rest is read
    /// straight into it. A lying source so costs at most about three times
    /// the bytes it sent, and a true one the data once plus a chunk (not
    /// twice, as a buffer read whole and then copied would).
    ///
    /// The buffers need not be zeroed ([`NDArray::for_overwrite`]): every
    /// byte of them is read into here before the array is returned, and a
    /// short or failed read drops the array, which no one else holds.
    fn read_data(
        &mut self,
        n: u64,
        what: &dyn Fn() -> String,
        make: impl FnOnce() -> Result<(NDArray, Vec<NDArray>)>,
    ) -> Result<NDArray> {
        let mut chunks = VecDeque::new();
        match self.left() {
            Some(left) => ensure!(
                n <= left,
                "Invalid NDArray file format: {} needs {n} bytes, the file holds {left} more",
                what()
            ),
            None => {
                ensure!(
                    n <= MAX_BYTES as u64,
                    "Invalid NDArray file format: {} claims {n} bytes, more than this library \
                     allocates ({MAX_BYTES})",
                    what()
                );
                let mut got = 0;
                while n - got > got.max(CHUNK as u64) {
                    let mut chunk = memmap2::MmapMut::map_anon(CHUNK).map_err(|e| {
                        Error::new(format!(
                            "out of memory reading {} ({n} bytes) after {got} bytes: {e}",
                            what()
                        ))
                    })?;
                    self.fill(&mut chunk)?;
                    got += CHUNK as u64;
                    chunks.push_back(chunk);
                }
            }
        }
        let (a, bufs) = make()?;
        let sizes: u64 = bufs.iter().map(|b| b.read().len() as u64).sum();
        ensure!(
            sizes == n,
            "{} holds {sizes} bytes, not the {n} bytes read for it",
            what()
        );
        let mut head = 0; // bytes of the front chunk moved already
        for (i, buf) in bufs.iter().enumerate() {
            self.part = if i == 0 { "data" } else { "aux data" };
            let mut guard = buf.write();
            let dst = guard.bytes_mut();
            let mut at = 0;
            while let Some(chunk) = chunks.front().filter(|_| at < dst.len()) {
                let k = (chunk.len() - head).min(dst.len() - at);
                dst[at..at + k].copy_from_slice(&chunk[head..head + k]);
                at += k;
                head += k;
                if head == chunk.len() {
                    chunks.pop_front();
                    head = 0;
                }
            }
            self.fill(&mut dst[at..])?;
        }
        Ok(a)
    }
}

/// Parses `.params` bytes into arrays and names.
pub fn load(bytes: &[u8]) -> Result<Loaded> {
    load_from(bytes, Some(bytes.len() as u64), "the buffer")
}

/// Loads a `.params` file, streaming it: a regular file's length bounds
/// every size read from it; other files (pipes, devices) are read as they
/// come, with buffers that grow with the bytes read.
pub fn load_file(path: &Path) -> Result<Loaded> {
    let cannot = |e: io::Error| Error::new(format!("cannot read {}: {e}", path.display()));
    let file = File::open(path).map_err(cannot)?;
    let meta = file.metadata().map_err(cannot)?;
    let len = meta.is_file().then_some(meta.len());
    load_from(BufReader::new(file), len, &path.display().to_string())
}

/// Parses a `.params` stream of `len` bytes (`None`: unknown) from `src`;
/// `name` names the source in read errors.
pub fn load_from<R: Read>(src: R, len: Option<u64>, name: &str) -> Result<Loaded> {
    let mut r = Reader::new(src, len, name);
    let header = r.u64().map_err(|e| match e.message() {
        m if m.starts_with("cannot read") => e,
        _ => invalid(),
    })?;
    ensure!(header == LIST_MAGIC, "{}", invalid().message());
    r.u64()?; // reserved
    let n = r.count(12, ARRAY_COST, "arrays")?;
    let mut arrays = Vec::new();
    let what = || format!("the {n} arrays of {name}");
    arrays
        .try_reserve_exact((n as usize).min(RESERVE_MAX))
        .map_err(|e| Error::new(format!("out of memory reading {}: {e}", what())))?;
    for i in 0..n {
        r.place = Place::Array(i);
        grow(&mut arrays, &what)?;
        let a = read_array(&mut r)?;
        r.hold(ARRAY_COST + data_bytes(&a))?;
        arrays.push(a);
    }
    r.place = Place::NameCount;
    r.part = "";
    let nn = r.count(8, NAME_COST, "names")?;
    // MXNet checks this after reading the names.
    ensure!(
        nn == 0 || nn == n,
        "Invalid NDArray file format: {nn} names for {n} arrays"
    );
    let mut names = Vec::new();
    let what = || format!("the {nn} names of {name}");
    names
        .try_reserve_exact((nn as usize).min(RESERVE_MAX))
        .map_err(|e| Error::new(format!("out of memory reading {}: {e}", what())))?;
    for i in 0..nn {
        r.place = Place::Name(i);
        r.part = "length";
        let len = r.u64()?;
        r.part = "bytes";
        grow(&mut names, &what)?;
        names.push(r.take(len, &|| format!("name {i}"))?);
        r.hold(NAME_COST + len)?;
    }
    Ok((arrays, names))
}

/// The bytes of an array's data (and aux arrays).
fn data_bytes(a: &NDArray) -> u64 {
    let dense = |a: &NDArray| (a.size() * a.dtype().size()) as u64;
    match a.parts() {
        Ok(p) if a.is_sparse() => dense(&p.data) + p.aux.iter().map(dense).sum::<u64>(),
        _ => dense(a),
    }
}

fn invalid() -> Error {
    Error::new("Check failed: header == kMXAPINDArrayListMagic: Invalid NDArray file format")
}

fn read_array<R: Read>(r: &mut Reader<R>) -> Result<NDArray> {
    r.part = "magic";
    let magic = r.u32()?;
    match magic {
        V2_MAGIC => {}
        V3_MAGIC => bail!(
            "ndarray was saved in np shape semantics, must be loaded in the same semantics \
             (MXNet 1.9.1 loads it only with np shape semantics on, which libmxkv does not have)"
        ),
        _ => return read_legacy(r, magic),
    }
    r.part = "storage type";
    let stype = r.i32()?;
    match stype {
        0 => {}
        1 | 2 => return read_sparse(r, stype),
        // MXNet: "Unknown storage type-1" (also for the none arrays it
        // writes half of before failing)
        s => bail!("Invalid NDArray file format: unknown storage type {s}"),
    }
    r.part = "shape";
    let shape = r.shape()?;
    if shape.ndim() == 0 {
        return Ok(NDArray::none());
    }
    read_dense(r, shape)
}

/// The context, dtype and data of a dense array of `shape`.
fn read_dense<R: Read>(r: &mut Reader<R>, shape: Shape) -> Result<NDArray> {
    // The saved context is read and dropped: arrays load onto cpu(0), as in MXNet.
    r.part = "context";
    r.i32()?;
    r.i32()?;
    let ctx = Context::CPU0;
    r.part = "dtype";
    let dtype = DType::from_code(r.i32()?)?;
    let nbytes = byte_len(&shape, dtype)?;
    r.part = "data";
    let what = || format!("array of shape {shape}");
    // Not zeroed first: `read_data` fills every byte, or fails and drops it.
    r.read_data(nbytes, &what, || {
        let a = NDArray::for_overwrite(shape.clone(), dtype, ctx)?;
        Ok((a.clone(), vec![a]))
    })
}

/// An array of the formats before V2, which MXNet 1.9.1 still loads
/// (`NDArray::LegacyLoad`): no storage type, and either V1 (magic
/// `0xF993FAC8`, then a shape as V2's) or V0 (no magic: the first word is
/// the ndim, the dims are u32). Then the context, dtype and data as V2's.
/// As in MXNet, a V1 shape with a dim of -1 is a none array, read no
/// further; shapes of ndim 0 hold one element.
fn read_legacy<R: Read>(r: &mut Reader<R>, magic: u32) -> Result<NDArray> {
    r.part = "shape";
    let shape = if magic == V1_MAGIC {
        let shape = r.shape()?;
        if let Some(&d) = shape.dims().iter().find(|&&d| d < -1) {
            bail!("Invalid NDArray file format: dimension {d}");
        }
        if shape.dims().contains(&-1) {
            return Ok(NDArray::none());
        }
        shape
    } else {
        // MXNet makes the word an int ndim: from 2^31 on it is negative,
        // and refused (0xFFFFFFFF, -1, first makes it allocate 16 GiB).
        ensure!(
            magic <= i32::MAX as u32,
            "Invalid NDArray file format: array magic {magic:#x} is no known version, and as \
             the ndim of a V0 array it is negative ({})",
            magic as i32
        );
        r.dims(u64::from(magic), 4)?
    };
    read_dense(r, shape)
}

/// Bytes of an array of `shape` and `dtype` (an error when they overflow).
fn byte_len(shape: &Shape, dtype: DType) -> Result<u64> {
    for &d in shape.dims() {
        ensure!(d >= 0, "Invalid NDArray file format: dimension {d}");
    }
    shape
        .dims()
        .iter()
        .try_fold(dtype.size() as u64, |acc, &d| acc.checked_mul(d as u64))
        .ok_or_else(|| {
            Error::new(format!(
                "Invalid NDArray file format: array of shape {shape} does not fit in the file"
            ))
        })
}

/// The shape of a sparse array's data part, as [`NDArray::sparse_zeros`]
/// makes it (`None` when the shapes are malformed: it then refuses them
/// before allocating).
fn data_shape(stype: StorageType, shape: &Shape, aux_shapes: &[Shape]) -> Option<Shape> {
    match (stype, aux_shapes) {
        (StorageType::RowSparse, [idx]) if idx.ndim() == 1 && shape.ndim() >= 1 => {
            let rows = std::iter::once(idx.dims()[0]);
            Some(Shape(
                rows.chain(shape.dims()[1..].iter().copied()).collect(),
            ))
        }
        (StorageType::Csr, [_, idx]) if idx.ndim() == 1 => Some(idx.clone()),
        _ => None,
    }
}

/// The storage shape MXNet 1.9.1's `NDArray::Load` makes of the `saved`
/// one of a sparse array whose aux shapes give `want` (src/ndarray/ndarray.cc):
/// one of no elements (`TShape::Size() == 0`) is replaced by `want` (the
/// sparse constructor), any other keeps its dims but the first, which
/// allocating the aux arrays sets to the stored count
/// (`Chunk::set_aux_shape`). Its `NDArray::Save` writes the storage shape
/// before it waits for the array, so an array still being computed is
/// saved with [0], and one whose stored count an operation was changing
/// with the old count. (Negative dims, which `Size()` refuses, are kept.)
fn loaded_storage_shape(saved: &Shape, want: &Shape) -> Shape {
    let dims = saved.dims();
    if dims.iter().any(|&d| d < 0) {
        return saved.clone();
    }
    if dims.contains(&0) {
        return want.clone();
    }
    match (dims, want.dims()) {
        ([_, rest @ ..], [count, ..]) => Shape(
            std::iter::once(*count)
                .chain(rest.iter().copied())
                .collect(),
        ),
        _ => saved.clone(),
    }
}

fn read_sparse<R: Read>(r: &mut Reader<R>, stype: i32) -> Result<NDArray> {
    let stype = if stype == 1 {
        StorageType::RowSparse
    } else {
        StorageType::Csr
    };
    r.part = "storage shape";
    let storage_shape = r.shape()?;
    r.part = "shape";
    let shape = r.shape()?;
    if shape.ndim() == 0 {
        // as MXNet: a none array, read no further
        return Ok(NDArray::none());
    }
    r.part = "context";
    r.i32()?;
    r.i32()?;
    r.part = "dtype";
    let dtype = DType::from_code(r.i32()?)?;
    let naux = if stype == StorageType::RowSparse {
        1
    } else {
        2
    };
    r.part = "aux types and shapes";
    let mut aux_types = Vec::with_capacity(naux);
    let mut aux_shapes = Vec::with_capacity(naux);
    for _ in 0..naux {
        aux_types.push(DType::from_code(r.i32()?)?);
        aux_shapes.push(r.shape()?);
    }
    // MXNet's C API makes sparse arrays with int32 aux arrays (its Python
    // refuses them); libmxkv's sparse arrays hold int64 ones only.
    if let Some(t) = aux_types.iter().find(|&&t| t != DType::I64) {
        bail!(
            "{} is a {} array with {} (type {}) aux arrays: libmxkv holds sparse arrays with \
             int64 (type 6) aux arrays only",
            r.place,
            stype_name(stype),
            t.name(),
            t.code()
        );
    }
    // Everything is checked before the parts are allocated: the storage
    // shape MXNet makes of the saved one must be the one the aux shapes
    // give, and the data and aux bytes must fit in what the file holds.
    let storage_shape = match data_shape(stype, &shape, &aux_shapes) {
        Some(want) if loaded_storage_shape(&storage_shape, &want) == want => want,
        // MXNet would read the data with the one and the aux arrays with the
        // others.
        Some(want) => bail!(
            "Invalid NDArray file format: storage shape {storage_shape} does not match the aux \
             shapes (which give {want})"
        ),
        // (malformed aux shapes: refused by `NDArray::sparse_zeros`)
        None => storage_shape,
    };
    let mut total = Some(byte_len(&storage_shape, dtype)?);
    for (s, &t) in aux_shapes.iter().zip(&aux_types) {
        let n = byte_len(s, t)?;
        total = total.and_then(|total| total.checked_add(n));
    }
    let what = || {
        format!(
            "{} array of shape {shape} with storage shape {storage_shape}",
            stype_name(stype)
        )
    };
    let total = total.ok_or_else(|| {
        Error::new(format!(
            "Invalid NDArray file format: {} does not fit in the file",
            what()
        ))
    })?;
    r.part = "data";
    r.read_data(total, &what, || {
        let a = NDArray::sparse_for_overwrite(
            stype,
            shape.clone(),
            dtype,
            Context::CPU0,
            &aux_types,
            &aux_shapes,
        )?;
        let parts = a.parts()?;
        let bufs = std::iter::once(parts.data).chain(parts.aux).collect();
        Ok((a, bufs))
    })
}

fn stype_name(stype: StorageType) -> &'static str {
    match stype {
        StorageType::RowSparse => "row_sparse",
        StorageType::Csr => "csr",
        _ => "dense",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    thread_local! {
        /// Bytes [`room`] lets through on this thread (tests set it, so that
        /// what a claim is refused by does not depend on the machine).
        pub static ROOM_LIMIT: Cell<u64> = const { Cell::new(u64::MAX) };
    }

    /// A file of `len` bytes: `head`, then zeros (a sparse file), counting
    /// the bytes read from it.
    struct Holes {
        head: Vec<u8>,
        pos: u64,
        len: u64,
    }

    impl Read for Holes {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = (buf.len() as u64).min(self.len - self.pos) as usize;
            for (i, b) in buf[..n].iter_mut().enumerate() {
                let at = self.pos as usize + i;
                *b = self.head.get(at).copied().unwrap_or(0);
            }
            self.pos += n as u64;
            Ok(n)
        }
    }

    /// Loads `head` followed by zeros up to 1 TiB with room for `limit`
    /// bytes: the error, and the bytes read.
    fn load_holes(head: &[u8], limit: u64) -> (String, u64) {
        let len = 1u64 << 40;
        let mut src = Holes {
            head: head.to_vec(),
            pos: 0,
            len,
        };
        ROOM_LIMIT.with(|l| l.set(limit));
        let got = load_from(&mut src, Some(len), "holes");
        ROOM_LIMIT.with(|l| l.set(u64::MAX));
        (got.unwrap_err().message().to_string(), src.pos)
    }

    fn words(vals: &[u64]) -> Vec<u8> {
        vals.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// The review's 1 TiB sparse files (4 KiB on disk): counts, a name
    /// length and an ndim that fit in the file but not in memory fail
    /// before anything of their size is allocated or read (they aborted).
    #[test]
    fn huge_claims_in_a_holey_file_fail_without_allocating() {
        let gib = 1u64 << 30;
        let (msg, read) = load_holes(&words(&[LIST_MAGIC, 0, 1 << 36]), gib);
        assert_eq!(
            msg,
            "Invalid NDArray file format: the file claims 68719476736 arrays, more than \
             MXNDArrayLoad can return (4294967295, its counts are uint32)"
        );
        assert_eq!(read, 24);
        let (msg, read) = load_holes(&words(&[LIST_MAGIC, 0, u32::MAX as u64]), gib);
        assert_eq!(
            msg,
            "holding the 4294967295 arrays the file claims needs 549755813760 bytes of memory, \
             more than this process can allocate (test limit)"
        );
        assert_eq!(read, 24);
        let (msg, _) = load_holes(&words(&[LIST_MAGIC, 0, 0, 1 << 36]), gib);
        assert!(msg.contains("the file claims 68719476736 names"), "{msg}");
        // Names must be none or one per array: checked before reading them.
        let (msg, read) = load_holes(&words(&[LIST_MAGIC, 0, 0, 1, 1 << 39]), gib);
        assert_eq!(msg, "Invalid NDArray file format: 1 names for 0 arrays");
        assert_eq!(read, 32);
        // One none array (V2, ndim 0), then a name of 2^39 bytes.
        let mut head = words(&[LIST_MAGIC, 0, 1]);
        head.extend_from_slice(&V2_MAGIC.to_le_bytes());
        head.extend_from_slice(&[0; 8]);
        head.extend_from_slice(&words(&[1, 1 << 39]));
        let (msg, read) = load_holes(&head, gib);
        assert_eq!(
            msg,
            "name 0 needs 549755813888 bytes of memory, more than this process can allocate \
             (test limit)"
        );
        assert_eq!(read, head.len() as u64);
        // ndim 2^31 - 1: 16 GiB of dims.
        let mut head = words(&[LIST_MAGIC, 0, 1]);
        head.extend_from_slice(&V2_MAGIC.to_le_bytes());
        head.extend_from_slice(&0i32.to_le_bytes());
        head.extend_from_slice(&i32::MAX.to_le_bytes());
        let (msg, read) = load_holes(&head, gib);
        assert_eq!(
            msg,
            "a shape of ndim 2147483647 in array 0 needs 17179869176 bytes of memory, more \
             than this process can allocate (test limit)"
        );
        assert_eq!(read, head.len() as u64);
        // What a load holds is checked as it grows: an array of 64 MiB + 4
        // bytes, then no room for the next 64 MiB.
        let mut head = words(&[LIST_MAGIC, 0, 2]);
        head.extend_from_slice(&V2_MAGIC.to_le_bytes());
        for v in [0i32, 1, 0, 0, 1, 0, 0] {
            head.extend_from_slice(&v.to_le_bytes());
        }
        let n = (1u64 << 24) + 1;
        head[36..44].copy_from_slice(&n.to_le_bytes());
        let (msg, read) = load_holes(&head, (64 << 20) - 1);
        assert_eq!(
            msg,
            format!(
                "going on after {} bytes of arrays and names needs 67108864 bytes of memory, \
                 more than this process can allocate (test limit)",
                ARRAY_COST + 4 * n
            )
        );
        assert_eq!(read, head.len() as u64 + 4 * n);
    }

    /// The start and length of the field byte `cut` falls in, in the file
    /// of [`a_short_file_names_what_is_missing`] (the load reads the list
    /// header's words one by one, an array's context as two words).
    fn field(full: &[u8], cut: usize) -> (usize, usize) {
        assert_eq!(full.len(), 139);
        let ends = [
            0, 8, 16, 24, 28, 32, 36, 44, 48, 52, 56, 68, 72, 76, 80, 88, 92, 96, 100, 112, 120,
            128, 129, 137, 139,
        ];
        let start = ends.iter().copied().filter(|&e| e <= cut).max().unwrap();
        let end = ends.iter().copied().filter(|&e| e > cut).min().unwrap();
        (start, end - start)
    }

    /// V1 and V0 arrays (MXNet 1.9.1's `LegacyLoad`) load from a file and a
    /// pipe alike; a V1 dim of -1 is a none array read no further.
    #[test]
    fn legacy_formats_load() {
        let mut b = words(&[LIST_MAGIC, 0, 3]);
        // V1: float64 [2], on gpu(1) (loaded on cpu(0))
        b.extend_from_slice(&V1_MAGIC.to_le_bytes());
        b.extend_from_slice(&1i32.to_le_bytes());
        b.extend_from_slice(&words(&[2]));
        for v in [2i32, 1, 1] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(bytemuck::cast_slice(&[0.1f64, -3.0]));
        // V0: int32 [1, 2] (u32 dims)
        for v in [2u32, 1, 2, 1, 0, 4] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(bytemuck::cast_slice(&[-7i32, 9]));
        // V1 with a dim of -1: none, nothing more read
        b.extend_from_slice(&V1_MAGIC.to_le_bytes());
        b.extend_from_slice(&1i32.to_le_bytes());
        b.extend_from_slice(&(-1i64).to_le_bytes());
        b.extend_from_slice(&words(&[0]));
        for (arrays, names) in [load(&b).unwrap(), stream(&b).unwrap()] {
            assert!(names.is_empty());
            assert_eq!(arrays[0].shape().dims(), &[2]);
            assert_eq!(arrays[0].ctx(), Context::CPU0);
            assert_eq!(arrays[0].read().typed::<f64>(), &[0.1, -3.0]);
            assert_eq!(arrays[1].shape().dims(), &[1, 2]);
            assert_eq!(arrays[1].read().typed::<i32>(), &[-7, 9]);
            assert!(arrays[2].is_none());
        }
        // V0 whose ndim, as an int, is negative: refused.
        let mut b = words(&[LIST_MAGIC, 0, 1]);
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        b.extend_from_slice(&words(&[0]));
        let msg = load(&b).unwrap_err().message().to_string();
        assert!(
            msg.contains("array magic 0xffffffff is no known version"),
            "{msg}"
        );
    }

    /// Arrays are read into buffers that are not zeroed first (a pooled
    /// mapping holds what its last array left): a read that ends short (a
    /// file cut while it is loaded, a pipe) fails and returns nothing, and
    /// a load into a reused mapping holds the file's bytes only.
    #[test]
    fn unzeroed_buffers_are_filled_whole_or_dropped() {
        let n = (40 << 20) / 4; // a mapped buffer (32 MiB and more)
        let vals: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
        let a = NDArray::from_bytes(
            Shape(vec![n as i64]),
            DType::F32,
            Context::CPU0,
            bytemuck::cast_slice(&vals),
        )
        .unwrap();
        let full = save(&[a], &[]).unwrap();
        let stale = || {
            // a mapping of the same length, full of other bytes, back in the pool
            let s = NDArray::zeros(Shape(vec![n as i64]), DType::F32, Context::CPU0).unwrap();
            s.write().bytes_mut().fill(0xAB);
        };
        let data_at = full.len() - 4 * n - 8; // (then the name count)
        for cut in [
            data_at + 1,
            data_at + 4 * n / 2,
            full.len() - 9,
            full.len() - 1,
        ] {
            stale();
            // a regular file whose length was taken before it was cut
            let len = Some(full.len() as u64);
            let msg = load_from(&full[..cut], len, "cut").unwrap_err();
            assert!(msg.message().contains("truncated"), "{msg}");
            stale();
            assert!(stream(&full[..cut]).is_err());
        }
        stale();
        let (got, _) = load(&full).unwrap();
        assert_eq!(got[0].read().typed::<f32>(), &vals[..]);
        stale();
        let (got, _) = stream(&full).unwrap();
        assert_eq!(got[0].read().typed::<f32>(), &vals[..]);
    }

    /// A file shorter than it claims names the item and the part it ends in.
    #[test]
    fn a_short_file_names_what_is_missing() {
        let a = NDArray::zeros(Shape(vec![3]), DType::F32, Context::CPU0).unwrap();
        let full = save(&[a.clone(), a], &[b"a".to_vec(), b"bc".to_vec()]).unwrap();
        let want = [
            (10, "the header"),
            (26, "the magic of array 0"),
            (30, "the storage type of array 0"),
            (34, "the shape of array 0"),
            (40, "the shape of array 0"),
            (46, "the context of array 0"),
            (50, "the context of array 0"),
            (54, "the dtype of array 0"),
            (60, "the data of array 0"),
            (70, "the magic of array 1"),
            (105, "the data of array 1"),
            (115, "the name count"),
            (125, "the length of name 0"),
            (133, "the length of name 1"),
            (138, "the bytes of name 1"),
        ];
        // Of unknown length, the load reads up to the end; of known length,
        // it may refuse a size that does not fit before (checked elsewhere).
        for (cut, place) in want {
            let msg = stream(&full[..cut]).unwrap_err().message().to_string();
            let (start, len) = field(&full, cut);
            assert_eq!(
                msg,
                format!(
                    "Invalid NDArray file format: truncated at byte {start}, in {place} (wanted \
                     {len} more bytes)"
                ),
            );
            let msg = load(&full[..cut]).unwrap_err().message().to_string();
            assert!(msg.starts_with("Invalid NDArray file format: "), "{msg}");
        }
    }

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
            assert!(stream(&bytes[..cut]).is_err());
        }
        let (arrays, _) = stream(&bytes).unwrap();
        assert_eq!(save(&arrays, &[]).unwrap(), bytes);
    }

    /// A csr of any indptr length (none: made and never filled) saves as
    /// MXNet 1.9.1 saves it, and its file loads and saves again unchanged;
    /// data and indices of other lengths are refused.
    #[test]
    fn csr_of_any_indptr_length_round_trips() {
        for (indptr, nnz) in [(0, 0), (0, 2), (2, 0), (2, 2), (6, 0)] {
            let aux = [Shape(vec![indptr]), Shape(vec![nnz])];
            let a = NDArray::sparse_zeros(
                StorageType::Csr,
                Shape(vec![3, 4]),
                DType::F32,
                Context::CPU0,
                &[DType::I64, DType::I64],
                &aux,
            )
            .unwrap();
            let bytes = save(&[a], &[]).unwrap();
            let (arrays, _) = load(&bytes).unwrap();
            assert_eq!(arrays[0].parts().unwrap().aux[0].size(), indptr as usize);
            assert_eq!(save(&arrays, &[]).unwrap(), bytes);
        }
        let a = NDArray::sparse_zeros(
            StorageType::Csr,
            Shape(vec![3, 4]),
            DType::F32,
            Context::CPU0,
            &[DType::I64, DType::I64],
            &[Shape(vec![4]), Shape(vec![2])],
        )
        .unwrap();
        let three = NDArray::zeros(Shape(vec![3]), DType::F32, Context::CPU0).unwrap();
        a.set_part(-1, &three).unwrap();
        assert!(save(&[a], &[])
            .unwrap_err()
            .message()
            .contains("2 indices for 3 values"));
    }

    /// MXNet 1.9.1 saves an array it has not finished computing with a
    /// storage shape of [0] (`NDArray::Save` reads it before waiting), and
    /// loads any storage shape of no elements as the aux shapes give it.
    /// Others must agree with the aux shapes but in the first dim.
    #[test]
    fn a_storage_shape_of_no_elements_comes_from_the_aux_shapes() {
        let data = NDArray::from_bytes(
            Shape(vec![2, 2]),
            DType::F32,
            Context::CPU0,
            bytemuck::cast_slice(&[1f32, 2., 3., 4.]),
        )
        .unwrap();
        let a = NDArray::row_sparse(Shape(vec![5, 2]), Context::CPU0, data, &[1, 3]).unwrap();
        let good = save(&[a], &[]).unwrap();
        // storage shape: i32 ndim 2 at byte 32, then [2, 2]
        assert_eq!(
            good[32..52],
            [&2i32.to_le_bytes()[..], &words(&[2, 2])].concat()[..]
        );
        // (and one with elements keeps all but its first dim, which MXNet
        // takes from the aux shapes too)
        let shapes = [
            vec![0],
            vec![0, 2],
            vec![2, 0],
            vec![0, 0, 0],
            vec![7, 2],
            vec![1, 2],
            vec![2, 3],
            vec![2],
        ];
        for dims in shapes {
            let mut bytes = good[..32].to_vec();
            bytes.extend_from_slice(&(dims.len() as i32).to_le_bytes());
            bytes.extend_from_slice(&words(&dims));
            bytes.extend_from_slice(&good[52..]);
            let loaded = load(&bytes);
            if dims == [2, 3] || dims == [2] {
                for got in [loaded, stream(&bytes)] {
                    let msg = got.unwrap_err().message().to_string();
                    assert!(msg.contains("(which give [2,2])"), "{dims:?}: {msg}");
                }
                continue;
            }
            for (arrays, _) in [loaded.unwrap(), stream(&bytes).unwrap()] {
                assert_eq!(arrays[0].rsp_indices().unwrap(), vec![1, 3]);
                assert_eq!(save(&arrays, &[]).unwrap(), good, "{dims:?}");
            }
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
            assert!(
                stream(&full[..cut]).is_err(),
                "streamed prefix {cut} accepted"
            );
        }
    }

    /// Loads `bytes` as a source of unknown length (a pipe).
    fn stream(bytes: &[u8]) -> Result<Loaded> {
        load_from(bytes, None, "a pipe")
    }

    /// Counts the bytes read from the source below it.
    struct Counting<R> {
        inner: R,
        read: Rc<Cell<u64>>,
    }

    impl<R: Read> Read for Counting<R> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.inner.read(buf)?;
            self.read.set(self.read.get() + n as u64);
            Ok(n)
        }
    }

    /// A file in the temporary folder, removed when dropped.
    struct TempFile(std::path::PathBuf);

    impl TempFile {
        fn new(tag: &str) -> TempFile {
            let name = format!("mxkv-params-{}-{tag}.params", std::process::id());
            TempFile(std::env::temp_dir().join(name))
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// Loads `path` through a [`Counting`] reader, as `load_file` does.
    fn load_counted(path: &Path) -> (Result<Loaded>, u64) {
        let file = File::open(path).unwrap();
        let len = file.metadata().unwrap().len();
        let read = Rc::new(Cell::new(0));
        let src = BufReader::new(Counting {
            inner: file,
            read: read.clone(),
        });
        let got = load_from(src, Some(len), "the file");
        (got, read.get())
    }

    /// The 124-byte file of issue 9 (4.4): one row_sparse array claiming
    /// 10^8 rows of two float32 (800 MB) and 10^8 int64 indices, then 24 bytes.
    fn claims_800mb_of_rows() -> Vec<u8> {
        let mut b = Vec::new();
        let rows: u64 = 100_000_000;
        for v in [LIST_MAGIC, 0, 1] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&V2_MAGIC.to_le_bytes());
        b.extend_from_slice(&1i32.to_le_bytes()); // row_sparse
        for _ in 0..2 {
            // storage shape, then shape
            b.extend_from_slice(&2i32.to_le_bytes());
            b.extend_from_slice(&rows.to_le_bytes());
            b.extend_from_slice(&2u64.to_le_bytes());
        }
        for v in [1i32, 0, 0, 6, 1] {
            // context cpu(0), dtype float32, aux type int64, aux ndim 1
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&rows.to_le_bytes());
        b.resize(124, 0);
        b
    }

    #[test]
    fn a_wrong_magic_stops_the_load_after_the_header() {
        // 768 MiB of zeros, none of it written (a sparse file).
        let tmp = TempFile::new("wrong-magic");
        let file = File::create(&tmp.0).unwrap();
        file.set_len(768 << 20).unwrap();
        drop(file);
        let (got, read) = load_counted(&tmp.0);
        assert_eq!(got.unwrap_err(), invalid());
        // One BufReader fill (8 KiB), not the file.
        assert!(
            read <= 64 << 10,
            "{read} bytes read to refuse a wrong magic"
        );
        assert_eq!(load_file(&tmp.0).unwrap_err(), invalid());

        // The same file behind a valid header, claiming 800 MB of rows: the
        // claim is refused before the rows are read.
        let bytes = claims_800mb_of_rows();
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(&tmp.0)
            .unwrap();
        std::io::Write::write_all(&mut file, &bytes[..100]).unwrap();
        file.set_len(1 << 30).unwrap();
        drop(file);
        let (got, read) = load_counted(&tmp.0);
        let msg = got.unwrap_err().message().to_string();
        assert!(msg.contains("needs 1600000000 bytes"), "{msg}");
        assert!(read <= 64 << 10, "{read} bytes read");

        // An endless source of zeros (/dev/zero): refused after 8 bytes.
        let read = Rc::new(Cell::new(0));
        let src = Counting {
            inner: io::repeat(0),
            read: read.clone(),
        };
        assert_eq!(load_from(src, None, "zeros").unwrap_err(), invalid());
        assert_eq!(read.get(), 8);
    }

    #[test]
    fn sparse_sizes_are_checked_before_allocating() {
        let bytes = claims_800mb_of_rows();
        let msg = load(&bytes).unwrap_err().message().to_string();
        assert_eq!(
            msg,
            "Invalid NDArray file format: row_sparse array of shape [100000000,2] with storage \
             shape [100000000,2] needs 1600000000 bytes, the file holds 24 more"
        );
        // Of unknown length, the parts are read before the array is made:
        // the 24 bytes there are, then the end.
        let read = Rc::new(Cell::new(0));
        let src = Counting {
            inner: &bytes[..],
            read: read.clone(),
        };
        let msg = load_from(src, None, "a pipe")
            .unwrap_err()
            .message()
            .to_string();
        assert!(msg.contains("truncated at byte 100"), "{msg}");
        assert_eq!(read.get(), 124);

        // A storage shape that disagrees with the shape: a tiny storage shape
        // for rows of 2^38 float32 (1 TiB each) is refused before allocating.
        let mut b = Vec::new();
        for v in [LIST_MAGIC, 0, 1] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&V2_MAGIC.to_le_bytes());
        b.extend_from_slice(&1i32.to_le_bytes());
        for dims in [[1u64, 2], [1, 1 << 38]] {
            b.extend_from_slice(&2i32.to_le_bytes());
            for d in dims {
                b.extend_from_slice(&d.to_le_bytes());
            }
        }
        for v in [1i32, 0, 0, 6, 1] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&1u64.to_le_bytes());
        b.extend_from_slice(&[0; 16]);
        for got in [load(&b), stream(&b)] {
            assert_eq!(
                got.unwrap_err().message(),
                "Invalid NDArray file format: storage shape [1,2] does not match the aux shapes \
                 (which give [1,274877906944])"
            );
        }

        // Counts and name lengths beyond the file.
        let a = NDArray::zeros(Shape(vec![2]), DType::F32, Context::CPU0).unwrap();
        let good = save(&[a], &[b"a".to_vec()]).unwrap();
        let mut bad = good.clone();
        bad[16..24].copy_from_slice(&(1u64 << 31).to_le_bytes());
        let msg = load(&bad).unwrap_err().message().to_string();
        assert!(msg.contains("count 2147483648 does not fit"), "{msg}");
        bad[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes());
        for got in [load(&bad), stream(&bad)] {
            assert_eq!(
                got.unwrap_err().message(),
                "Invalid NDArray file format: the file claims 1099511627776 arrays, more than \
                 MXNDArrayLoad can return (4294967295, its counts are uint32)"
            );
        }
        let mut bad = good.clone();
        let at = good.len() - 9; // the name's length
        bad[at..at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
        let msg = load(&bad).unwrap_err().message().to_string();
        assert!(msg.contains("name 0 needs 1099511627776 bytes"), "{msg}");
        // (of unknown length, with room for the claim: read up to the end)
        ROOM_LIMIT.with(|l| l.set(u64::MAX - 1));
        let msg = stream(&bad).unwrap_err().message().to_string();
        ROOM_LIMIT.with(|l| l.set(u64::MAX));
        assert!(msg.contains("truncated"), "{msg}");
    }

    #[test]
    fn unknown_lengths_grow_buffers_with_the_bytes_read() {
        // (a claim of 1 TiB is allocatable here)
        ROOM_LIMIT.with(|l| l.set(1 << 40));
        let mut r = Reader::new(io::repeat(0).take((5 << 20) + 3), None, "a pipe");
        let mut out = Vec::new();
        let err = r
            .take_into(1 << 40, &|| "rows".into(), &mut out)
            .unwrap_err();
        assert!(err.message().contains("truncated"), "{}", err.message());
        // 1, 2, 4 MiB filled, then room for 8 MiB: never the 1 TiB claimed.
        assert_eq!(r.pos, 4 << 20);
        assert!(
            out.capacity() <= 2 * (5 << 20) + CHUNK,
            "{}",
            out.capacity()
        );
        // A claim the source holds is read whole.
        let mut r = Reader::new(io::repeat(7).take(1 << 22), None, "a pipe");
        r.take_into((3 << 20) + 1, &|| "rows".into(), &mut out)
            .unwrap();
        assert_eq!(out.len(), (3 << 20) + 1);
        assert!(out.iter().all(|&b| b == 7));
        ROOM_LIMIT.with(|l| l.set(u64::MAX));
    }

    /// Arrays of unknown length beyond [`CHUNK`] bytes: the first bytes go
    /// into chunks until the claim is half proved, then into the array, the
    /// chunks moved in; chunk edges fall inside the data and across the
    /// data's end into the aux arrays.
    #[test]
    fn pipes_read_big_arrays_through_chunks() {
        let n = 3 * CHUNK / 4 + 1; // float32: 3 MiB + 4 bytes
        let vals: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
        let dense = NDArray::from_bytes(
            Shape(vec![n as i64]),
            DType::F32,
            Context::CPU0,
            bytemuck::cast_slice(&vals),
        )
        .unwrap();
        // row_sparse: 70000 float64 rows of 3 (1680000 bytes), then 560000
        // bytes of indices: chunks end at 1 MiB and 2 MiB.
        let rows = 70_000usize;
        let data: Vec<f64> = (0..rows * 3).map(|i| i as f64 - 7.25).collect();
        let data = NDArray::from_bytes(
            Shape(vec![rows as i64, 3]),
            DType::F64,
            Context::CPU0,
            bytemuck::cast_slice(&data),
        )
        .unwrap();
        let idx: Vec<i64> = (0..rows as i64).map(|i| 2 * i + 1).collect();
        let rsp = NDArray::row_sparse(
            Shape(vec![2 * rows as i64 + 5, 3]),
            Context::CPU0,
            data,
            &idx,
        )
        .unwrap();
        let bytes = save(&[dense, rsp], &[]).unwrap();
        let (arrays, _) = stream(&bytes).unwrap();
        assert_eq!(arrays[0].read().typed::<f32>(), &vals[..]);
        assert_eq!(arrays[1].rsp_indices().unwrap(), idx);
        assert_eq!(save(&arrays, &[]).unwrap(), bytes);
        for cut in [bytes.len() - 1, bytes.len() - 600_000, 60 + (1 << 20)] {
            let msg = stream(&bytes[..cut]).unwrap_err().message().to_string();
            assert!(msg.contains("truncated"), "{cut}: {msg}");
        }
    }

    /// A pipe whose array claim it does not back: chunks are mapped only
    /// for the bytes that come, and the array never allocated.
    #[test]
    fn a_lying_pipe_costs_the_bytes_it_sent() {
        let sent = (5 << 20) + 3;
        let mut r = Reader::new(io::repeat(0).take(sent), None, "a pipe");
        let err = r
            .read_data(1 << 40, &|| "rows".into(), || panic!("allocated"))
            .unwrap_err();
        assert!(err.message().contains("truncated"), "{}", err.message());
        assert_eq!(r.pos, 5 << 20);
        // A claim within a chunk is allocated at once, as it is no more
        // than a chunk.
        let mut r = Reader::new(io::repeat(0).take(5), None, "a pipe");
        let err = r
            .read_data(CHUNK as u64, &|| "rows".into(), || {
                let a = NDArray::zeros(Shape(vec![CHUNK as i64]), DType::U8, Context::CPU0)?;
                Ok((a.clone(), vec![a]))
            })
            .unwrap_err();
        assert!(
            err.message().contains("truncated at byte 0"),
            "{}",
            err.message()
        );
    }

    /// A pipe (finding 2) claiming more than [`MAX_BYTES`] for an array or a
    /// name, then endless zeros: refused after the header, before reading
    /// or allocating any of the claim (the review's 1 TiB claim, within
    /// MAX_BYTES, grows with the bytes read until the growth fails: see
    /// ctests/test_params_hardening.c, under a capped address space).
    #[test]
    fn a_pipe_claiming_more_than_max_bytes_fails_at_once() {
        let mut head = words(&[LIST_MAGIC, 0, 1]);
        head.extend_from_slice(&V2_MAGIC.to_le_bytes());
        head.extend_from_slice(&[0, 0, 0, 0, 1, 0, 0, 0]);
        head.extend_from_slice(&(1u64 << 39).to_le_bytes());
        head.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]);
        let endless = |head: &[u8]| {
            let read = Rc::new(Cell::new(0));
            let src = Counting {
                inner: head.chain(io::repeat(0)),
                read: read.clone(),
            };
            let got = load_from(src, None, "a pipe");
            (got.unwrap_err().message().to_string(), read.get())
        };
        // 2^39 float64
        let (msg, read) = endless(&head);
        assert_eq!(
            msg,
            "Invalid NDArray file format: array of shape [549755813888] claims 4398046511104 \
             bytes, more than this library allocates (1099511627776)"
        );
        assert_eq!(read, head.len() as u64);
        // A name of 2^41 bytes.
        let mut head = words(&[LIST_MAGIC, 0, 1]);
        head.extend_from_slice(&V2_MAGIC.to_le_bytes());
        head.extend_from_slice(&[0; 8]);
        head.extend_from_slice(&words(&[1, 1 << 41]));
        let (msg, read) = endless(&head);
        assert_eq!(
            msg,
            "Invalid NDArray file format: name 0 claims 2199023255552 bytes, more than this \
             library allocates (1099511627776)"
        );
        assert_eq!(read, head.len() as u64);
    }

    #[test]
    fn any_ndim_round_trips() {
        for ndim in [33, 40, 1000] {
            let mut dims = vec![1i64; ndim];
            dims[3] = 2;
            dims[ndim - 1] = 3;
            let vals: Vec<f32> = (0..6).map(|i| i as f32 * 1.5).collect();
            let a = NDArray::from_bytes(
                Shape(dims.clone()),
                DType::F32,
                Context::CPU0,
                bytemuck::cast_slice(&vals),
            )
            .unwrap();
            let bytes = save(&[a], &[b"deep".to_vec()]).unwrap();
            assert_eq!(bytes.len(), 24 + 4 + 4 + 4 + 8 * ndim + 12 + 24 + 8 + 8 + 4);
            for (arrays, names) in [load(&bytes).unwrap(), stream(&bytes).unwrap()] {
                assert_eq!(names, vec![b"deep".to_vec()]);
                assert_eq!(arrays[0].shape().dims(), &dims[..]);
                assert_eq!(arrays[0].read().typed::<f32>(), &vals[..]);
            }
            // row_sparse of as many dims
            let mut rows = dims.clone();
            rows[0] = 2;
            let data = NDArray::from_bytes(
                Shape(rows),
                DType::F32,
                Context::CPU0,
                bytemuck::cast_slice(&[vals.clone(), vals.clone()].concat()),
            )
            .unwrap();
            dims[0] = 5;
            let r = NDArray::row_sparse(Shape(dims.clone()), Context::CPU0, data, &[1, 4]).unwrap();
            let bytes = save(&[r], &[]).unwrap();
            for (arrays, _) in [load(&bytes).unwrap(), stream(&bytes).unwrap()] {
                assert_eq!(arrays[0].shape().dims(), &dims[..]);
                assert_eq!(arrays[0].rsp_indices().unwrap(), vec![1, 4]);
                assert_eq!(save(&arrays, &[]).unwrap(), bytes);
            }
        }
        // An ndim is bounded only by the bytes the file holds.
        let a = NDArray::zeros(Shape(vec![4]), DType::F64, Context::CPU0).unwrap();
        let mut bytes = save(&[a], &[]).unwrap();
        bytes[32..36].copy_from_slice(&(1i32 << 30).to_le_bytes());
        let msg = load(&bytes).unwrap_err().message().to_string();
        assert_eq!(
            msg,
            "Invalid NDArray file format: ndim 1073741824 does not fit in the file"
        );
        assert!(stream(&bytes).unwrap_err().message().contains("truncated"));
        bytes[32..36].copy_from_slice(&(-2i32).to_le_bytes());
        assert!(load(&bytes).unwrap_err().message().contains("ndim -2"));
    }
}

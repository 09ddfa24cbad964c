//! The local store's key table: int or string keys (string keys get ids in
//! registration order) → one [`Entry`] per key, holding its stored value.
//! Adding keys is all or nothing ([`Table::begin_insert`]).
#![forbid(unsafe_code)]

use super::comm::CommKey;
use super::keys::{KeyKind, Keys, KindLock, StrRegistry};
use crate::error::{Error, Result};
use crate::ndarray::dtype::DType;
use crate::ndarray::Context;
use crate::ndarray::{NDArray, StorageType};
use crate::{bail, ensure};
use parking_lot::{Mutex, ReentrantMutex, RwLock, RwLockWriteGuard};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

/// One key's state.
pub struct Entry {
    /// The internal key (the int key, or the string key's id).
    pub id: i32,
    /// The key as the caller wrote it (for messages).
    pub name: String,
    /// The caller's string for string keys (handed to string updaters).
    pub str_key: Option<Vec<u8>>,
    /// The stored value, on the context MXNet 1.9.1 keeps it on (its copy
    /// checks depend on it; the data is in host memory whatever it is):
    /// `cpu_pinned(0)` after init. After a push without an updater MXNet
    /// stores the merged value itself (the pushed array on `local` for one
    /// dense value, on `device` for any one value, else the merge buffer)
    /// when the storage type stays, and a copy of it on the stored value's
    /// context when it changes (dense ↔ row_sparse, csr → dense or
    /// row_sparse). The value is replaced when either changes, else written
    /// in place.
    pub value: Mutex<NDArray>,
    /// Serialises pushes of this key; reentrant so that an updater may push
    /// to its own key again. Pulls do not take it: they read the stored value
    /// under its data lock.
    pub update: ReentrantMutex<()>,
    /// The key's merge buffers.
    pub comm: Arc<CommKey>,
}

impl Entry {
    pub fn value(&self) -> NDArray {
        self.value.lock().clone()
    }
}

/// Int keys → values, with a multiplicative hash (keys are small ints).
pub type IntMap<V> = HashMap<i32, V, BuildHasherDefault<IntHasher>>;

/// Fibonacci hashing of an int key.
#[derive(Default)]
pub struct IntHasher(u64);

impl Hasher for IntHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_i32(&mut self, i: i32) {
        self.0 = (i as u32 as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type EntryMap = IntMap<Arc<Entry>>;

pub fn duplicate(name: &str) -> Error {
    Error::new(format!(
        "duplicate init of key {name}. Please double check if you called kv.init or kv.broadcast with this key multiple times"
    ))
}

pub fn not_inited(name: &str) -> Error {
    Error::new(format!("key {name} has not been inited"))
}

/// Why an empty array cannot be stored or pushed.
const NONE_VALUE: &str =
    "the value is an empty NDArray (MXNDArrayCreateNone) with no shape or data";

/// Why a csr array cannot be pushed (or stored by a distributed store).
const NO_CSR_VALUE: &str =
    "(csr values are never pushed, as in MXNet; only the local and device stores take them, at init)";

/// Checks that a value can be stored or pushed (`what`: "init", "push").
/// csr values are refused; the local and device stores take them at init
/// through [`check_local_init_value`].
pub fn check_value(v: &NDArray, what: &str) -> Result<()> {
    match v.stype() {
        StorageType::Default => Ok(()),
        StorageType::Undefined => bail!("{NONE_VALUE}"),
        StorageType::RowSparse => v.check_row_sparse(),
        StorageType::Csr => {
            bail!("Unexpected storage type detected during kvstore {what}: 2 {NO_CSR_VALUE}")
        }
    }
}

/// Checks an init value of the local and device stores: as
/// [`check_value`], but a csr value is kept (MXNet 1.9.1's `KVStoreLocal`
/// copies it into the store; pulls cast it, a push replaces it). A csr value
/// that cannot be cast to dense is refused here (MXNet stores it and reads
/// or writes outside its buffers when a pull casts it).
pub fn check_local_init_value(v: &NDArray) -> Result<()> {
    match v.stype() {
        StorageType::Csr => v.check_csr_densifiable().map_err(|e| {
            Error::new(format!(
                "{} (a csr init value must be one that casts to dense)",
                e.message()
            ))
        }),
        _ => check_value(v, "init"),
    }
}

/// MXNet's `CopyFromToImpl` between storage types, from a value of storage
/// type `stype`, dtype `dtype` on `ctx` (a store's value, on cpu_pinned(0))
/// into `out` of another storage type: on one context it casts the storage
/// straight into the output, whose dtype must be the value's; across
/// contexts into a temporary of the output's storage type and dtype
/// float32, copied over with the values converted. Both casts check their
/// data type and fail (in MXNet at the next wait, leaving the output as it
/// was or, on one context, partly overwritten or crashing); here before
/// anything is written. Shared by the local and device stores' pulls and
/// the dist store's `pull(ignore_sparse=False)`.
pub fn check_cast_copy(
    stype: StorageType,
    dtype: DType,
    ctx: Context,
    out: &NDArray,
) -> Result<()> {
    fn label(stype: StorageType) -> &'static str {
        match stype {
            StorageType::Default => "dense",
            StorageType::RowSparse => "row_sparse",
            StorageType::Csr => "csr",
            StorageType::Undefined => "undefined",
        }
    }
    let (from, to) = (dtype, out.dtype());
    if ctx == out.ctx() {
        ensure!(
            from == to,
            "copying a {} {} value into a {} {} output on the same context ({}), a dtype change: MXNet 1.9.1 casts the storage into the output and fails its data type check (TBlob.get_with_shape: data type do not match)",
            label(stype),
            from.name(),
            label(out.stype()),
            to.name(),
            out.ctx()
        );
    } else {
        ensure!(
            from == DType::F32,
            "copying a {} {} value on {} into a {} output on {}: MXNet 1.9.1 casts the storage into a float32 temporary first and fails its data type check (TBlob.get_with_shape: Expected: float v.s. given {}) for any value dtype but float32",
            label(stype),
            from.name(),
            ctx,
            label(out.stype()),
            out.ctx(),
            from.name()
        );
    }
    Ok(())
}

/// Keys → entries. Lock order: `strs`, then `entries`.
#[derive(Default)]
pub struct Table {
    kind: KindLock,
    strs: RwLock<StrRegistry>,
    entries: RwLock<EntryMap>,
}

impl Table {
    /// Fixes the table's key type at the first call (even a failing one,
    /// as in MXNet); a call of the other type fails.
    pub fn check_kind(&self, kind: KeyKind) -> Result<()> {
        self.kind.check(kind)
    }

    /// Resolves keys to entries; every key must be initialised.
    pub fn entries_for(&self, keys: Keys<'_>) -> Result<Vec<Arc<Entry>>> {
        let lookup = |map: &EntryMap, i: usize, id: i32| {
            map.get(&id)
                .cloned()
                .ok_or_else(|| not_inited(&keys.show(i)))
        };
        match keys {
            Keys::Int(k) => {
                let map = self.entries.read();
                k.iter()
                    .enumerate()
                    .map(|(i, &id)| lookup(&map, i, id))
                    .collect()
            }
            Keys::Str(k) => {
                let ids = {
                    let strs = self.strs.read();
                    k.iter()
                        .map(|s| strs.lookup(s))
                        .collect::<Result<Vec<_>>>()?
                };
                let map = self.entries.read();
                ids.iter()
                    .enumerate()
                    .map(|(i, &id)| lookup(&map, i, id))
                    .collect()
            }
        }
    }

    /// Starts adding `keys` with their `values` (already checked and
    /// copied): every key must be new and appear once. Nothing is added
    /// until [`Insert::commit`]; the table is locked until then.
    pub fn begin_insert<'t, 'k>(
        &'t self,
        keys: Keys<'k>,
        values: Vec<NDArray>,
    ) -> Result<Insert<'t, 'k>> {
        let strs = self.strs.write();
        let map = self.entries.write();
        // The ids the new keys will get, checked for duplicates.
        let mut new: Vec<(i32, Arc<Entry>)> = Vec::with_capacity(values.len());
        // each new id's position in `new`
        let mut at: HashMap<i32, usize> = HashMap::with_capacity(values.len());
        let mut new_strs: HashMap<&'k [u8], i32> = HashMap::new();
        for (i, value) in values.into_iter().enumerate() {
            let name = keys.show(i);
            let (id, str_key) = match keys {
                Keys::Int(k) => (k[i], None),
                Keys::Str(k) => {
                    if strs.get(k[i]).is_some() || new_strs.contains_key(k[i]) {
                        return Err(duplicate(&name));
                    }
                    let id = strs.next_id() + new_strs.len() as i32;
                    new_strs.insert(k[i], id);
                    (id, Some(k[i].to_vec()))
                }
            };
            if map.contains_key(&id) || at.insert(id, new.len()).is_some() {
                return Err(duplicate(&name));
            }
            let entry = Entry {
                id,
                name,
                str_key,
                comm: CommKey::new(&value),
                value: Mutex::new(value),
                update: ReentrantMutex::new(()),
            };
            new.push((id, Arc::new(entry)));
        }
        Ok(Insert {
            keys,
            strs,
            map,
            new,
            at,
            new_strs,
        })
    }
}

/// Keys being added to a [`Table`], which stays locked meanwhile.
pub struct Insert<'t, 'k> {
    keys: Keys<'k>,
    strs: RwLockWriteGuard<'t, StrRegistry>,
    map: RwLockWriteGuard<'t, EntryMap>,
    new: Vec<(i32, Arc<Entry>)>,
    at: HashMap<i32, usize>,
    new_strs: HashMap<&'k [u8], i32>,
}

impl Insert<'_, '_> {
    /// The new entries, in call order.
    pub fn new_entries(&self) -> impl Iterator<Item = &Arc<Entry>> {
        self.new.iter().map(|(_, e)| e)
    }

    /// The entry of `keys[i]`, new or already in the table.
    pub fn lookup(&self, keys: Keys<'_>, i: usize) -> Result<Arc<Entry>> {
        let id = match keys {
            Keys::Int(k) => k[i],
            Keys::Str(k) => match self.new_strs.get(k[i]) {
                Some(id) => *id,
                None => self.strs.lookup(k[i])?,
            },
        };
        self.at
            .get(&id)
            .map(|&p| self.new[p].1.clone())
            .or_else(|| self.map.get(&id).cloned())
            .ok_or_else(|| not_inited(&keys.show(i)))
    }

    /// Adds the new keys to the table and unlocks it.
    pub fn commit(self) {
        let Insert {
            keys,
            mut strs,
            mut map,
            new,
            ..
        } = self;
        if let Keys::Str(k) = keys {
            for s in k {
                strs.register(s);
            }
        }
        map.extend(new);
        drop(map);
        drop(strs);
    }
}

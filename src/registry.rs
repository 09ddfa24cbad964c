//! Handle registries: the opaque `void*` handles of the C API are numbers
//! that name a slot here, never pointers. A handle packs
//! `tag(8) | generation(24) | index(32)`; the tag tells handle kinds apart
//! (and is never 0, so NULL and most real pointers are never valid), and the
//! generation changes on every free, so stale and double-freed handles are
//! recognised. Lookups clone the value out and release the lock at once: no
//! lock is held while the caller works with it.
//!
//! `fork()` while another thread is inside a registry would leave its lock
//! held forever in the child (which has only the forking thread). The C
//! API's `pthread_atfork` handlers (src/capi/boundary.rs) therefore hold
//! every registry's lock across a fork ([`Registry::hold_for_fork`]): a child
//! starts with every registry free. The lock is a std lock, whose guard may
//! be dropped in the child (a parking_lot lock may wake threads of the
//! parent through its global parking table, whose own locks may be held).
#![forbid(unsafe_code)]

use std::fmt;
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

const _: () = assert!(usize::BITS == 64, "handles are packed into 64-bit pointers");

const GEN_MASK: u32 = 0x00ff_ffff;

/// Why a handle was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandleError {
    Null,
    /// Not made by this registry: another kind of handle, or a foreign pointer.
    WrongKind,
    /// Made by this registry but freed since.
    Stale,
}

impl fmt::Display for HandleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HandleError::Null => "is NULL",
            HandleError::WrongKind => {
                "is not a handle of this kind (another kind of handle, or a pointer this library did not make)"
            }
            HandleError::Stale => "is stale (already freed?)",
        })
    }
}

struct Slot<T> {
    generation: u32,
    value: Option<T>,
}

struct Slots<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    live: usize,
}

pub struct Registry<T> {
    tag: u8,
    inner: RwLock<Slots<T>>,
}

/// A registry's lock, held exclusively: see [`Registry::hold_for_fork`].
pub struct ForkHold<'a, T> {
    _held: RwLockWriteGuard<'a, Slots<T>>,
}

impl<T: Clone> Registry<T> {
    pub const fn new(tag: u8) -> Registry<T> {
        assert!(tag != 0);
        Registry {
            tag,
            inner: RwLock::new(Slots {
                slots: Vec::new(),
                free: Vec::new(),
                live: 0,
            }),
        }
    }

    // (Nothing panics while the lock is held: a poisoned lock is as good.)
    fn read(&self) -> RwLockReadGuard<'_, Slots<T>> {
        self.inner.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Slots<T>> {
        self.inner.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until no other thread is inside this registry and keeps every
    /// other thread out until the hold is dropped (around a `fork()`: the
    /// child may drop it too).
    pub fn hold_for_fork(&self) -> ForkHold<'_, T> {
        ForkHold {
            _held: self.write(),
        }
    }

    fn pack(&self, index: u32, generation: u32) -> usize {
        ((self.tag as usize) << 56) | ((generation as usize) << 32) | index as usize
    }

    fn unpack(&self, handle: usize) -> Result<(usize, u32), HandleError> {
        if handle == 0 {
            return Err(HandleError::Null);
        }
        if (handle >> 56) as u8 != self.tag {
            return Err(HandleError::WrongKind);
        }
        Ok((handle & 0xffff_ffff, ((handle >> 32) as u32) & GEN_MASK))
    }

    /// Stores `value` and returns its new handle.
    pub fn insert(&self, value: T) -> usize {
        let mut g = self.write();
        g.live += 1;
        if let Some(index) = g.free.pop() {
            let slot = &mut g.slots[index as usize];
            slot.value = Some(value);
            return self.pack(index, slot.generation);
        }
        let index = u32::try_from(g.slots.len()).expect("more than 2^32 live handles");
        g.slots.push(Slot {
            generation: 1,
            value: Some(value),
        });
        self.pack(index, 1)
    }

    /// The value behind `handle` (a clone; the lock is released on return).
    pub fn get(&self, handle: usize) -> Result<T, HandleError> {
        let (index, generation) = self.unpack(handle)?;
        let g = self.read();
        match g.slots.get(index) {
            Some(Slot {
                generation: sg,
                value: Some(v),
            }) if *sg == generation => Ok(v.clone()),
            Some(_) => Err(HandleError::Stale),
            None => Err(HandleError::WrongKind),
        }
    }

    /// Frees `handle`, returning its value.
    pub fn remove(&self, handle: usize) -> Result<T, HandleError> {
        let (index, generation) = self.unpack(handle)?;
        let mut g = self.write();
        let slot = match g.slots.get_mut(index) {
            Some(s) => s,
            None => return Err(HandleError::WrongKind),
        };
        if slot.generation != generation || slot.value.is_none() {
            return Err(HandleError::Stale);
        }
        let value = slot.value.take().expect("checked above");
        slot.generation = (slot.generation + 1) & GEN_MASK;
        // A slot whose generation would wrap to 0 is retired for good.
        let reuse = slot.generation != 0;
        if reuse {
            g.free.push(index as u32);
        }
        g.live -= 1;
        Ok(value)
    }

    /// How many handles are live (for leak checks in tests).
    pub fn live(&self) -> usize {
        self.read().live
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_double_free_and_wrong_kind() {
        let a: Registry<u32> = Registry::new(0x4e);
        let b: Registry<u32> = Registry::new(0x4b);
        let h = a.insert(7);
        assert_eq!(a.get(h), Ok(7));
        assert_eq!(b.get(h), Err(HandleError::WrongKind));
        assert_eq!(a.get(0), Err(HandleError::Null));
        assert_eq!(a.get(0x5555_1234_5678), Err(HandleError::WrongKind));
        assert_eq!(a.remove(h), Ok(7));
        assert_eq!(a.get(h), Err(HandleError::Stale));
        assert_eq!(a.remove(h), Err(HandleError::Stale));
        let h2 = a.insert(8);
        assert_ne!(h, h2, "a reused slot gets a new generation");
        assert_eq!(a.get(h), Err(HandleError::Stale));
        assert_eq!(a.get(h2), Ok(8));
        assert_eq!(a.live(), 1);
    }

    #[test]
    fn model_based_random_use() {
        let r: Registry<u64> = Registry::new(1);
        let mut live: Vec<(usize, u64)> = Vec::new();
        let mut dead: Vec<usize> = Vec::new();
        let mut seed = 1u64;
        for i in 0..20000u64 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            match (seed >> 60) % 3 {
                0 => live.push((r.insert(i), i)),
                1 if !live.is_empty() => {
                    let (h, v) = live.swap_remove((seed >> 20) as usize % live.len());
                    assert_eq!(r.remove(h), Ok(v));
                    dead.push(h);
                }
                _ => {
                    for (h, v) in live.iter().take(3) {
                        assert_eq!(r.get(*h), Ok(*v));
                    }
                    for h in dead.iter().rev().take(3) {
                        assert_eq!(r.get(*h), Err(HandleError::Stale));
                    }
                }
            }
        }
        assert_eq!(r.live(), live.len());
    }
}

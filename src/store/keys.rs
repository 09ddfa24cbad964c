//! Keys: int keys or string keys (never both in one store), and the string
//! registry that maps string keys to internal ids in registration order.
#![forbid(unsafe_code)]

use crate::bail;
use crate::error::Result;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};

/// MXNet's key type codes: string = 0, int = 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    Str = 0,
    Int = 1,
}

/// The keys of one call, as the caller wrote them.
#[derive(Debug, Clone, Copy)]
pub enum Keys<'a> {
    Int(&'a [i32]),
    Str(&'a [&'a [u8]]),
}

impl Keys<'_> {
    pub fn kind(&self) -> KeyKind {
        match self {
            Keys::Int(_) => KeyKind::Int,
            Keys::Str(_) => KeyKind::Str,
        }
    }
    pub fn len(&self) -> usize {
        match self {
            Keys::Int(k) => k.len(),
            Keys::Str(k) => k.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The i-th key as the caller wrote it, for messages.
    pub fn show(&self, i: usize) -> String {
        match self {
            Keys::Int(k) => k[i].to_string(),
            Keys::Str(k) => show_str(k[i]),
        }
    }
}

/// A string key for messages: as written if it is UTF-8, else with its
/// bytes escaped (`\xff`).
pub fn show_str(s: &[u8]) -> String {
    match std::str::from_utf8(s) {
        Ok(t) => t.to_string(),
        Err(_) => s.escape_ascii().to_string(),
    }
}

/// The store's key type, fixed by its first keyed call (even a failing one,
/// as in MXNet).
#[derive(Default)]
pub struct KindLock(AtomicU8);

impl KindLock {
    pub fn check(&self, kind: KeyKind) -> Result<()> {
        let code = kind as u8 + 1;
        match self
            .0
            .compare_exchange(0, code, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Ok(()),
            Err(cur) if cur == code => Ok(()),
            Err(_) => {
                let (have, got) = match kind {
                    KeyKind::Str => ("int", "string"),
                    KeyKind::Int => ("string", "int"),
                };
                bail!(
                    "Mixed key types are not allowed: this store uses {have} keys and the call passed {got} keys"
                )
            }
        }
    }
}

/// String key → internal id, in registration order.
#[derive(Default)]
pub struct StrRegistry {
    ids: HashMap<Vec<u8>, i32>,
    names: Vec<Vec<u8>>,
}

impl StrRegistry {
    pub fn get(&self, key: &[u8]) -> Option<i32> {
        self.ids.get(key).copied()
    }

    pub fn lookup(&self, key: &[u8]) -> Result<i32> {
        match self.get(key) {
            Some(id) => Ok(id),
            None => bail!("key {} doesn't exist. Did you init?", show_str(key)),
        }
    }

    /// The id the next registration will get.
    pub fn next_id(&self) -> i32 {
        self.names.len() as i32
    }

    pub fn register(&mut self, key: &[u8]) -> i32 {
        let id = self.next_id();
        self.ids.insert(key.to_vec(), id);
        self.names.push(key.to_vec());
        id
    }

    pub fn name(&self, id: i32) -> Option<&[u8]> {
        usize::try_from(id)
            .ok()
            .and_then(|i| self.names.get(i))
            .map(|v| v.as_slice())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_lock_fixes_on_first_call() {
        let l = KindLock::default();
        l.check(KeyKind::Int).unwrap();
        l.check(KeyKind::Int).unwrap();
        let e = l.check(KeyKind::Str).unwrap_err();
        assert!(e.message().starts_with("Mixed key types are not allowed"));
    }

    #[test]
    fn registry_ids_follow_registration_order() {
        let mut r = StrRegistry::default();
        assert_eq!(r.register(b"b"), 0);
        assert_eq!(r.register(b"a"), 1);
        assert_eq!(r.lookup(b"a").unwrap(), 1);
        assert_eq!(r.name(0), Some(&b"b"[..]));
        assert_eq!(
            r.lookup(b"nope").unwrap_err().message(),
            "key nope doesn't exist. Did you init?"
        );
    }
}

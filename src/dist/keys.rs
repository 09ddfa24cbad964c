//! How MXNet 1.9.1 turns a KVStore key into ps-lite keys, and the codes its
//! data and command messages carry.
//!
//! Sources: MXNet 1.9.1 `src/kvstore/kvstore_dist.h` (`EncodeDefaultKey`,
//! `EncodeCompressedKey`, `EncodeRowSparseKey`), `kvstore_dist_server.h`
//! (`GetCommandType`, `DepairDataHandleType`, `CommandType`, `DecodeKey`) and
//! ps-lite 34fd45c `src/postoffice.cc` (`GetServerKeyRanges`) and
//! `include/ps/kv_app.h` (`KVWorker::DefaultSlicer`).
//!
//! Where MXNet's arithmetic misbehaves it is reproduced up to the point where
//! MXNet would abort or corrupt, and that point is an [`Error`] instead:
//! `key * 9973` is computed in wrapping 32-bit arithmetic as MXNet does (so
//! keys from 215,330 up land on the same servers as with a real MXNet worker),
//! and a negative server index (MXNet's `Check failed: ps_key <
//! krs[server].end()`) is refused with a message naming the overflow.
//! Lengths travel as 32-bit ints; a part of 2 GiB or more is refused (MXNet
//! overflows the `int` silently).
#![forbid(unsafe_code)]

use crate::error::{Error, Result};
use crate::{bail, ensure};
use std::collections::HashMap;
use std::ops::Range;

/// ps-lite's `kMaxKey`.
pub const MAX_KEY: u64 = u64::MAX;

/// MXNet's default `MXNET_KVSTORE_BIGARRAY_BOUND` (elements).
pub const DEFAULT_BIGARRAY_BOUND: usize = 1_000_000;

/// The ps key range server `rank` of `num_servers` owns
/// (`Postoffice::GetServerKeyRanges`): `[⌊MAX/S⌋·r, ⌊MAX/S⌋·(r+1))`.
pub fn server_range(rank: usize, num_servers: usize) -> Range<u64> {
    let width = MAX_KEY / num_servers.max(1) as u64;
    let begin = width * rank as u64;
    begin..begin + width
}

/// The ranges of all `num_servers` servers, by rank.
pub fn server_ranges(num_servers: usize) -> Vec<Range<u64>> {
    (0..num_servers)
        .map(|r| server_range(r, num_servers))
        .collect()
}

/// The request types of MXNet's data messages (`RequestType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequestType {
    Default = 0,
    RowSparse = 1,
    Compressed = 2,
}

/// The meta `head` of a data message: MXNet's `GetCommandType`, the Cantor
/// pairing of the request type and the mshadow dtype code.
pub fn command_type(rt: RequestType, dtype_code: i32) -> i32 {
    let m = rt as i32;
    (m + dtype_code) * (m + dtype_code + 1) / 2 + dtype_code
}

/// The inverse of [`command_type`] (`DepairDataHandleType`): the request type
/// and the dtype code of a data message's `head`.
pub fn depair_command(cmd: i32) -> Result<(RequestType, i32)> {
    ensure!(
        cmd >= 0,
        "invalid data command {cmd}: MXNet's data commands are non-negative"
    );
    // w = ⌊(√(8·cmd+1) − 1)/2⌋, computed exactly in integers.
    let c = i64::from(cmd);
    let mut w = (((8 * c + 1) as f64).sqrt() as i64 - 1) / 2;
    while (w + 1) * (w + 2) / 2 <= c {
        w += 1;
    }
    while w * (w + 1) / 2 > c {
        w -= 1;
    }
    let t = w * (w + 1) / 2;
    let d = c - t;
    let m = w - d;
    let rt = match m {
        0 => RequestType::Default,
        1 => RequestType::RowSparse,
        2 => RequestType::Compressed,
        _ => bail!("invalid data command {cmd}: request type {m} is not one of MXNet's (0 default, 1 row_sparse, 2 compressed)"),
    };
    Ok((rt, d as i32))
}

/// The heads of MXNet's SimpleApp commands (`CommandType`, "maintain same
/// order in frontend").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    /// Body: the pickled optimizer; the server's controller installs it.
    Controller = 0,
    /// Keep float32 master copies of non-float32 keys.
    SetMultiPrecision = 1,
    /// Answer, then end the server loop.
    StopServer = 2,
    /// Switch the servers to sync mode (rank 0 at create, unless `_async`).
    SyncMode = 3,
    /// Body `"<type>,<threshold %f>"` (see `CompressionParams::encode`).
    SetGradientCompression = 4,
    /// Body: profiler parameters followed by one digit (the profiler command).
    SetProfilerParams = 5,
}

impl Command {
    pub fn from_head(head: i32) -> Option<Command> {
        Some(match head {
            0 => Command::Controller,
            1 => Command::SetMultiPrecision,
            2 => Command::StopServer,
            3 => Command::SyncMode,
            4 => Command::SetGradientCompression,
            5 => Command::SetProfilerParams,
            _ => return None,
        })
    }

    pub fn head(self) -> i32 {
        self as i32
    }
}

/// The ps keys and lengths (bytes, one per key) of one request
/// (MXNet's `PSKV`); `size` is the total of `lens` in bytes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Pskv {
    pub keys: Vec<u64>,
    pub lens: Vec<i32>,
    pub size: usize,
}

/// A length as ps-lite's 32-bit `int`.
fn len_i32(bytes: usize, key: i32) -> Result<i32> {
    i32::try_from(bytes).map_err(|_| {
        Error::new(format!(
            "key {key}: a part of {bytes} bytes does not fit ps-lite's 32-bit lengths (at most {} bytes per server; MXNet overflows here)",
            i32::MAX
        ))
    })
}

/// The server a small array goes to: MXNet's `(key * 9973) % num_servers`
/// in 32-bit `int` arithmetic (wrapping, as the reference build behaves).
/// A negative result is where MXNet fails its `ps_key < range.end()` check.
pub fn server_of(key: i32, num_servers: usize) -> Result<usize> {
    ensure!(num_servers > 0, "there are no servers");
    let s = i32::try_from(num_servers)
        .map_err(|_| Error::new(format!("{num_servers} servers is too many")))?;
    let server = key.wrapping_mul(9973) % s;
    if server < 0 {
        bail!(
            "key {key} cannot be placed on a server: MXNet computes its server as (key * 9973) % {num_servers} in 32-bit arithmetic, which overflows to {server} for this key (keys from 215330 up overflow; use a smaller key)"
        );
    }
    Ok(server as usize)
}

/// `range.begin + key` as MXNet adds an `int` key to a `uint64` (the key is
/// sign-extended), checked against the range's end.
fn ps_key_in(range: &Range<u64>, key: i64, what: i32) -> Result<u64> {
    let k = range.start.wrapping_add(key as u64);
    ensure!(
        k >= range.start && k < range.end,
        "key {what} does not fit a server's key range (ps key {k:#x} outside [{:#x}, {:#x}))",
        range.start,
        range.end
    );
    Ok(k)
}

/// `round(x)` of C (half away from zero), on doubles, as `size_t`.
fn c_round(x: f64) -> usize {
    x.round() as usize
}

/// Where a split array's part `i` of `S` begins: `round(n / S * i)`.
fn split_point(n: usize, s: usize, i: usize) -> usize {
    c_round(n as f64 / s as f64 * i as f64)
}

/// The per-process cache of key encodings of one worker (MXNet's `ps_kv_`
/// and `compr_ps_kv_`): a key keeps the layout of its first use, and a later
/// use with another byte size is refused (`The value size cannot be changed`).
#[derive(Debug, Clone)]
pub struct KeyEncoder {
    num_servers: usize,
    bound: usize,
    ranges: Vec<Range<u64>>,
    default: HashMap<i32, Pskv>,
    /// (push, pull) layouts of compressed keys.
    compressed: HashMap<i32, (Pskv, Pskv)>,
}

impl KeyEncoder {
    /// An encoder for `num_servers` servers splitting arrays of at least
    /// `bigarray_bound` elements.
    pub fn new(num_servers: usize, bigarray_bound: usize) -> KeyEncoder {
        KeyEncoder {
            num_servers,
            bound: bigarray_bound,
            ranges: server_ranges(num_servers),
            default: HashMap::new(),
            compressed: HashMap::new(),
        }
    }

    pub fn num_servers(&self) -> usize {
        self.num_servers
    }

    pub fn bigarray_bound(&self) -> usize {
        self.bound
    }

    pub fn ranges(&self) -> &[Range<u64>] {
        &self.ranges
    }

    /// `EncodeDefaultKey`: one server (`(key*9973) % S`) below the bound,
    /// otherwise every server `i` gets `round(n/S·(i+1)) − round(n/S·i)`
    /// elements under ps key `range(i).begin + key`.
    pub fn encode_default(&mut self, key: i32, num_elems: usize, num_bytes: usize) -> Result<Pskv> {
        let bytes = num_elems
            .checked_mul(num_bytes)
            .ok_or_else(|| Error::new(format!("key {key}: value too large")))?;
        if let Some(p) = self.default.get(&key) {
            ensure!(
                p.size == bytes,
                "The value size cannot be changed {bytes}. Key is {key} (it was first used with {} bytes)",
                p.size
            );
            return Ok(p.clone());
        }
        ensure!(self.num_servers > 0, "there are no servers");
        let mut p = Pskv::default();
        if num_elems < self.bound {
            let server = server_of(key, self.num_servers)?;
            p.keys
                .push(ps_key_in(&self.ranges[server], key.into(), key)?);
            p.lens.push(len_i32(bytes, key)?);
        } else {
            let s = self.num_servers;
            for i in 0..s {
                let part = split_point(num_elems, s, i + 1) - split_point(num_elems, s, i);
                p.keys.push(ps_key_in(&self.ranges[i], key.into(), key)?);
                p.lens.push(len_i32(part * num_bytes, key)?);
            }
        }
        p.size = bytes;
        debug_assert_eq!(p.lens.iter().map(|&l| l as usize).sum::<usize>(), bytes);
        self.default.insert(key, p.clone());
        Ok(p)
    }

    /// `EncodeCompressedKey`: the push layout (`is_push`: a dummy key
    /// `range.begin + original elements` with len 0, then the key with the
    /// compressed bytes, per server) or the pull layout (the same servers,
    /// uncompressed sizes), both fixed at the first call. `factor` is the
    /// number of values per compressed 4-byte word (16 for 2-bit);
    /// `num_bytes` the element size (4: only float32 is compressed).
    pub fn encode_compressed(
        &mut self,
        key: i32,
        num_elems: usize,
        is_push: bool,
        num_bytes: usize,
        factor: usize,
    ) -> Result<Pskv> {
        ensure!(factor > 0, "invalid compression factor 0");
        let compr = num_elems.div_ceil(factor);
        if let Some((push, pull)) = self.compressed.get(&key) {
            let (p, want) = if is_push {
                (push, compr * num_bytes)
            } else {
                (pull, num_elems * num_bytes)
            };
            ensure!(
                p.size == want,
                "The value size can't be changed. For key {key} ({want} bytes now, {} at first use)",
                p.size
            );
            return Ok(p.clone());
        }
        ensure!(self.num_servers > 0, "there are no servers");
        let (mut push, mut pull) = (Pskv::default(), Pskv::default());
        if num_elems < self.bound {
            let server = server_of(key, self.num_servers)?;
            let range = &self.ranges[server];
            let dummy = i64::try_from(num_elems)
                .map_err(|_| Error::new(format!("key {key}: value too large")))?;
            push.keys.push(ps_key_in(range, dummy, key)?);
            push.lens.push(0);
            let k = ps_key_in(range, key.into(), key)?;
            push.keys.push(k);
            pull.keys.push(k);
            push.lens.push(len_i32(compr * num_bytes, key)?);
            pull.lens.push(len_i32(num_elems * num_bytes, key)?);
            push.size = compr * num_bytes;
            pull.size = num_elems * num_bytes;
        } else {
            let s = self.num_servers;
            let (mut sum_c, mut sum_o) = (0usize, 0usize);
            for i in 0..s {
                let (part_c, part_o) = if i == s - 1 {
                    // MXNet computes this in size_t and fails its range
                    // check when the whole words given out exceed the values
                    ensure!(
                        sum_o <= num_elems,
                        "key {key}: {num_elems} compressed values cannot be split over {s} servers the way MXNet splits them ({sum_o} values in whole {factor}-value words before the last server; MXNet's worker fails here): raise MXNET_KVSTORE_BIGARRAY_BOUND above {num_elems} or use a larger array"
                    );
                    (compr - sum_c, num_elems - sum_o)
                } else {
                    let c = split_point(compr, s, i + 1) - split_point(compr, s, i);
                    (c, c * factor)
                };
                let range = &self.ranges[i];
                push.keys.push(ps_key_in(range, part_o as i64, key)?);
                push.lens.push(0);
                let k = ps_key_in(range, key.into(), key)?;
                push.keys.push(k);
                pull.keys.push(k);
                push.lens.push(len_i32(part_c * num_bytes, key)?);
                pull.lens.push(len_i32(part_o * num_bytes, key)?);
                sum_c += part_c;
                sum_o += part_o;
            }
            push.size = sum_c * num_bytes;
            pull.size = sum_o * num_bytes;
        }
        let out = if is_push { push.clone() } else { pull.clone() };
        self.compressed.insert(key, (push, pull));
        Ok(out)
    }

    /// `EncodeRowSparseKey` for the rows `rows` (sorted, unique, in
    /// `[0, total_rows)`) of a row_sparse array whose rows hold `unit_len`
    /// elements of `num_bytes` bytes. Not cached (MXNet rebuilds it per call).
    pub fn encode_row_sparse(
        &self,
        key: i32,
        rows: &[i64],
        unit_len: usize,
        total_rows: usize,
        num_bytes: usize,
    ) -> Result<Pskv> {
        ensure!(self.num_servers > 0, "there are no servers");
        let row_bytes = len_i32(unit_len * num_bytes, key)?;
        let mut p = Pskv::default();
        if total_rows.saturating_mul(unit_len) >= self.bound {
            let s = self.num_servers;
            let mut start = 0usize;
            let mut next = 0usize; // index into rows
            for i in 0..s {
                let range = &self.ranges[i];
                p.keys.push(ps_key_in(range, key.into(), key)?);
                p.lens.push(0);
                let end = start + split_point(total_rows, s, i + 1) - split_point(total_rows, s, i);
                while next < rows.len() && (rows[next] as usize) < end {
                    let off = row_key(key, rows[next] - start as i64)?;
                    p.keys.push(ps_key_in(range, off, key)?);
                    p.lens.push(row_bytes);
                    next += 1;
                }
                start = end;
            }
        } else {
            let server = server_of(key, self.num_servers)?;
            let range = &self.ranges[server];
            p.keys.push(ps_key_in(range, key.into(), key)?);
            p.lens.push(0);
            for &r in rows {
                p.keys.push(ps_key_in(range, row_key(key, r)?, key)?);
                p.lens.push(row_bytes);
            }
        }
        p.size = rows.len() * unit_len * num_bytes;
        Ok(p)
    }
}

/// The offset of row `row` of `key` in a server's range: the server reads it
/// back as an `int` (`DecodeKey`), so it must stay below 2^31 (MXNet wraps).
fn row_key(key: i32, row: i64) -> Result<i64> {
    let off = i64::from(key) + row;
    ensure!(
        (0..=i64::from(i32::MAX)).contains(&off),
        "key {key}: row {row} cannot be addressed: MXNet's server reads key + row as a 32-bit int (at most {})",
        i32::MAX
    );
    Ok(off)
}

/// One server's part of a request (ps-lite's `DefaultSlicer`): the indices of
/// its keys and the byte range of its values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slice {
    pub server: usize,
    pub keys: Range<usize>,
    pub vals: Range<usize>,
}

/// Cuts a request by the server ranges: each server with keys gets its
/// keys, the matching lens and bytes of the values (by summing `lens`;
/// without lens, an equal share per key). Servers without keys get no
/// slice. As in ps-lite, the keys must come server by server (ascending
/// ranges); within one server they need not be sorted (a compressed push
/// puts its size key, `range.begin + n`, before `range.begin + key`).
pub fn slice(
    keys: &[u64],
    lens: Option<&[i32]>,
    vals_len: usize,
    ranges: &[Range<u64>],
) -> Result<Vec<Slice>> {
    if let Some(l) = lens {
        ensure!(
            l.len() == keys.len(),
            "{} lens for {} keys",
            l.len(),
            keys.len()
        );
        ensure!(l.iter().all(|&x| x >= 0), "negative length in a request");
        let total: usize = l.iter().map(|&x| x as usize).sum();
        ensure!(
            total == vals_len,
            "lens add up to {total} bytes but the values hold {vals_len}"
        );
    }
    let per_key = match lens {
        None if !keys.is_empty() => {
            ensure!(
                vals_len % keys.len() == 0,
                "{vals_len} bytes of values do not divide over {} keys",
                keys.len()
            );
            vals_len / keys.len()
        }
        _ => 0,
    };
    // the server of each key, which must not decrease
    let mut servers = Vec::with_capacity(keys.len());
    for &k in keys {
        let s = ranges.partition_point(|r| r.end <= k);
        ensure!(
            s < ranges.len() && ranges[s].contains(&k),
            "ps key {k:#x} is in no server's range"
        );
        ensure!(
            servers.last().map_or(true, |&p| p <= s),
            "ps keys of a request must come server by server (ps key {k:#x} after a key of a later server)"
        );
        servers.push(s);
    }
    let mut out = Vec::new();
    let (mut pos, mut val_pos) = (0usize, 0usize);
    while pos < keys.len() {
        let server = servers[pos];
        let end = pos + servers[pos..].iter().take_while(|&&s| s == server).count();
        let bytes = match lens {
            Some(l) => l[pos..end].iter().map(|&x| x as usize).sum(),
            None => (end - pos) * per_key,
        };
        out.push(Slice {
            server,
            keys: pos..end,
            vals: val_pos..val_pos + bytes,
        });
        val_pos += bytes;
        pos = end;
    }
    Ok(out)
}

/// The server side of a ps key (`DecodeKey`): the offset from the start of
/// server `rank`'s range, as MXNet's `int`. A key outside the range, or an
/// offset beyond `int`, is refused (MXNet truncates silently).
pub fn decode_key(ps_key: u64, range: &Range<u64>) -> Result<i32> {
    ensure!(
        range.contains(&ps_key),
        "ps key {ps_key:#x} is not in this server's range [{:#x}, {:#x})",
        range.start,
        range.end
    );
    let off = ps_key - range.start;
    i32::try_from(off).map_err(|_| {
        Error::new(format!(
            "ps key {ps_key:#x} decodes to {off}, beyond MXNet's 32-bit keys"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_match_ps_lite() {
        assert_eq!(server_range(0, 1), 0..u64::MAX);
        assert_eq!(server_range(0, 2), 0..0x7FFF_FFFF_FFFF_FFFF);
        assert_eq!(
            server_range(1, 2),
            0x7FFF_FFFF_FFFF_FFFF..0xFFFF_FFFF_FFFF_FFFE
        );
        let r3 = server_ranges(3);
        assert_eq!(r3[1].start, r3[0].end);
        assert_eq!(r3[2].start, 2 * (u64::MAX / 3));
    }

    #[test]
    fn command_codes() {
        // observed: default f32 0, f64 2, f16 5, uint8 9, int32 14; rsp f32 1; compressed f32 3
        assert_eq!(command_type(RequestType::Default, 0), 0);
        assert_eq!(command_type(RequestType::Default, 1), 2);
        assert_eq!(command_type(RequestType::Default, 2), 5);
        assert_eq!(command_type(RequestType::Default, 3), 9);
        assert_eq!(command_type(RequestType::Default, 4), 14);
        assert_eq!(command_type(RequestType::RowSparse, 0), 1);
        assert_eq!(command_type(RequestType::Compressed, 0), 3);
        for rt in [
            RequestType::Default,
            RequestType::RowSparse,
            RequestType::Compressed,
        ] {
            for d in 0..13 {
                assert_eq!(depair_command(command_type(rt, d)).unwrap(), (rt, d));
            }
        }
        assert!(depair_command(-1).is_err());
        // 6 = Cantor(3, 0): request type 3 does not exist
        assert!(depair_command(6)
            .unwrap_err()
            .message()
            .contains("request type 3"));
        assert_eq!(Command::from_head(4), Some(Command::SetGradientCompression));
        assert_eq!(Command::from_head(6), None);
        assert_eq!(Command::StopServer.head(), 2);
    }

    #[test]
    fn default_keys_one_server_and_split() {
        let mut e = KeyEncoder::new(2, 10);
        // key 3 → (3*9973) % 2 = 1; observed ps key 0x8000000000000002
        let p = e.encode_default(3, 6, 4).unwrap();
        assert_eq!(p.keys, vec![0x8000_0000_0000_0002]);
        assert_eq!(p.lens, vec![24]);
        // key 7, 15 elements, bound 10: split 8 + 7
        let p = e.encode_default(7, 15, 4).unwrap();
        assert_eq!(p.keys, vec![7, 0x8000_0000_0000_0006]);
        assert_eq!(p.lens, vec![32, 28]);
        assert_eq!(p.size, 60);
        // cached: another size is refused with MXNet's words
        let err = e.encode_default(7, 16, 4).unwrap_err();
        assert!(err
            .message()
            .starts_with("The value size cannot be changed 64. Key is 7"));
        // same bytes, other dtype: allowed, as in MXNet
        assert_eq!(e.encode_default(7, 30, 2).unwrap().lens, vec![32, 28]);
        // default bound: 999,999 on one server, 1,000,000 split in halves
        let mut e = KeyEncoder::new(2, DEFAULT_BIGARRAY_BOUND);
        assert_eq!(e.encode_default(0, 999_999, 4).unwrap().keys.len(), 1);
        let p = e.encode_default(1, 1_000_000, 4).unwrap();
        assert_eq!(p.lens, vec![2_000_000, 2_000_000]);
        // three servers: round(n/3·i) boundaries
        let mut e = KeyEncoder::new(3, 1);
        let p = e.encode_default(2, 10, 8).unwrap();
        // round(3.33)=3, round(6.67)=7 → 3, 4, 3
        assert_eq!(p.lens, vec![24, 32, 24]);
    }

    #[test]
    fn halves_round_away_from_zero() {
        // n = 5 over 2 servers: round(2.5) = 3 → 3 + 2
        let mut e = KeyEncoder::new(2, 1);
        assert_eq!(e.encode_default(0, 5, 1).unwrap().lens, vec![3, 2]);
    }

    #[test]
    fn overflowing_keys() {
        // 215329 * 9973 fits; 215330 * 9973 overflows int32
        assert!(215_329i32.checked_mul(9973).is_some());
        assert!(215_330i32.checked_mul(9973).is_none());
        // observed: key 300001 with 2 servers fails in MXNet
        let err = server_of(300_001, 2).unwrap_err();
        assert!(err.message().contains("overflows"), "{err}");
        let mut e = KeyEncoder::new(2, 1000);
        assert!(e.encode_default(300_001, 4, 4).is_err());
        // a wrapped product that stays positive lands where MXNet puts it
        let k: i32 = 300_002;
        let want = k.wrapping_mul(9973) % 2;
        assert!(want >= 0);
        assert_eq!(server_of(k, 2).unwrap(), want as usize);
        // one server: every key fits
        assert_eq!(server_of(300_001, 1).unwrap(), 0);
        // negative keys: server 0 of 2, but the ps key leaves the range
        assert!(e.encode_default(-2, 4, 4).is_err());
        // 2 GiB parts do not fit ps-lite's int lengths
        let mut e = KeyEncoder::new(1, usize::MAX);
        let err = e.encode_default(1, 1 << 29, 4).unwrap_err();
        assert!(err.message().contains("32-bit"), "{err}");
    }

    #[test]
    fn compressed_keys() {
        // observed (session C): n = 10, one server → push keys [10, 1], lens [0, 4]
        let mut e = KeyEncoder::new(1, DEFAULT_BIGARRAY_BOUND);
        let push = e.encode_compressed(1, 10, true, 4, 16).unwrap();
        assert_eq!(push.keys, vec![10, 1]);
        assert_eq!(push.lens, vec![0, 4]);
        let pull = e.encode_compressed(1, 10, false, 4, 16).unwrap();
        assert_eq!(pull.keys, vec![1]);
        assert_eq!(pull.lens, vec![40]);
        // big: 100 values over 2 servers: 7 words → round(3.5)=4, then 3
        let mut e = KeyEncoder::new(2, 50);
        let push = e.encode_compressed(5, 100, true, 4, 16).unwrap();
        let b1 = server_range(1, 2).start;
        assert_eq!(push.keys, vec![64, 5, b1 + 36, b1 + 5]);
        assert_eq!(push.lens, vec![0, 16, 0, 12]);
        let pull = e.encode_compressed(5, 100, false, 4, 16).unwrap();
        assert_eq!(pull.keys, vec![5, b1 + 5]);
        assert_eq!(pull.lens, vec![256, 144]);
        // the push layout checks the compressed size (101 values: still 7
        // words, as in MXNet), the pull layout the full size
        assert!(e.encode_compressed(5, 101, true, 4, 16).is_ok());
        assert!(e.encode_compressed(5, 120, true, 4, 16).is_err());
        assert!(e.encode_compressed(5, 101, false, 4, 16).is_err());
        // 15 values over 2 servers: the first gets a whole word (16 values),
        // more than there are (MXNet's size_t arithmetic wraps and fails)
        let mut e = KeyEncoder::new(2, 10);
        let err = e.encode_compressed(7, 15, true, 4, 16).unwrap_err();
        assert!(
            err.message().contains("cannot be split over 2 servers"),
            "{err}"
        );
    }

    #[test]
    fn row_sparse_keys() {
        // observed (session D): rows 1, 4 of a 6x2 f32, key 1, one server
        let e = KeyEncoder::new(1, DEFAULT_BIGARRAY_BOUND);
        let p = e.encode_row_sparse(1, &[1, 4], 2, 6, 4).unwrap();
        assert_eq!(p.keys, vec![1, 2, 5]);
        assert_eq!(p.lens, vec![0, 8, 8]);
        assert_eq!(p.size, 16);
        // big: 6 rows over 2 servers, blocks [0,3) and [3,6)
        let e = KeyEncoder::new(2, 4);
        let b1 = server_range(1, 2).start;
        let p = e.encode_row_sparse(1, &[0, 2, 3, 5], 2, 6, 4).unwrap();
        assert_eq!(p.keys, vec![1, 1, 3, b1 + 1, b1 + 1, b1 + 3]);
        assert_eq!(p.lens, vec![0, 8, 8, 0, 8, 8]);
        // no rows on server 1: its master key only
        let p = e.encode_row_sparse(1, &[1], 2, 6, 4).unwrap();
        assert_eq!(p.keys, vec![1, 2, b1 + 1]);
        assert_eq!(p.lens, vec![0, 8, 0]);
        // key + row must fit the server's 32-bit int
        let e = KeyEncoder::new(1, usize::MAX);
        let big = i64::from(i32::MAX) - 5;
        assert!(e.encode_row_sparse(5, &[big], 1, 1 << 40, 4).is_ok());
        let err = e.encode_row_sparse(6, &[big], 1, 1 << 40, 4).unwrap_err();
        assert!(err.message().contains("32-bit int"), "{err}");
    }

    #[test]
    fn slicing() {
        let r = server_ranges(2);
        let b1 = r[1].start;
        let s = slice(&[7, b1 + 6], Some(&[32, 28]), 60, &r).unwrap();
        assert_eq!(
            s,
            vec![
                Slice {
                    server: 0,
                    keys: 0..1,
                    vals: 0..32
                },
                Slice {
                    server: 1,
                    keys: 1..2,
                    vals: 32..60
                }
            ]
        );
        // one server only
        let s = slice(&[b1 + 2], Some(&[24]), 24, &r).unwrap();
        assert_eq!(
            s,
            vec![Slice {
                server: 1,
                keys: 0..1,
                vals: 0..24
            }]
        );
        // no lens: equal shares (a pull has no values)
        let s = slice(&[1, 2, b1 + 1], None, 0, &r).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].keys, 0..2);
        // unsorted within one server (a compressed push): one slice
        let s = slice(&[10, 1], Some(&[0, 4]), 4, &r).unwrap();
        assert_eq!(
            s,
            vec![Slice {
                server: 0,
                keys: 0..2,
                vals: 0..4
            }]
        );
        // but not across servers
        assert!(slice(&[b1 + 1, 1], None, 0, &r).is_err());
        assert!(slice(&[1], Some(&[4]), 8, &r).is_err());
    }

    #[test]
    fn decoding() {
        let r = server_range(1, 2);
        assert_eq!(decode_key(0x8000_0000_0000_0002, &r).unwrap(), 3);
        assert!(decode_key(3, &r).is_err());
        assert!(decode_key(r.start + (1 << 31), &r).is_err());
    }
}

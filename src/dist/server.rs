//! The KV server's state machine, as MXNet 1.9.1's `KVStoreDistServer`
//! (`src/kvstore/kvstore_dist_server.h`) runs it, without any transport:
//! [`KvServer::handle`] takes one received ps-lite [`Message`] and sends its
//! replies through a [`Transport`].
//!
//! * A table of int keys → stored arrays: dense keys as flat 1-D arrays of
//!   the pushed dtype, row_sparse keys as `[rows, row length]` row_sparse
//!   arrays holding every row (a split big array is stored as independent
//!   parts on each server under the same int key).
//! * The first push of a key initialises it and is answered at once.
//! * Sync mode (after `kSyncMode`): pushes of a key are summed, in arrival
//!   order, into a merge buffer until `num_workers` requests arrived; then the
//!   updater runs once on the sum (or, without one, the sum is assigned) and
//!   every queued request is answered, pulls with the new value.
//! * Async mode (the default): every push runs the updater at once.
//! * Pulls are answered at once from the stored value.
//! * float16 and float64 keys are kept, summed and updated in float32 (a
//!   float32 master copy, cast back into the key's dtype after each update),
//!   as MXNet 1.9.1's pip wheel does from the start: its server reads an
//!   uninitialised `multi_precision_` member, which is set in practice. Probes
//!   against real MXNet 1.9.1 servers: an init of float64 0.1 pulls back
//!   0.10000000149011612; three float16 pushes of 1024, 0.375 and 0.375 give
//!   1025 in every arrival order (float16 steps would give 1024 unless 1024
//!   came last). `kSetMultiPrecision` is therefore a no-op here.
//! * row_sparse pushes are summed row-wise, 2-bit (and 1-bit) compressed
//!   pushes are dequantized first; `kSetMultiPrecision` keeps float32 master
//!   copies of other float keys and updates those.
//! * SimpleApp commands: `kController` goes to the controller callback;
//!   `kSyncMode`, `kSetGradientCompression`, `kSetMultiPrecision` and
//!   `kStopServer` are handled here; `kSetProfilerParams` is accepted and
//!   ignored (this library has no profiler).
//!
//! Where a real MXNet server aborts (integer dtypes, a pull of a key never
//! initialised, async mode without an updater, malformed requests, a
//! row_sparse pull of more rows than the table has, a compressed push
//! claiming another size than the key's) ours answers the request with an
//! error reply (see [`super::kv`]) and goes on. Requests and commands whose
//! sender is not a worker of this cluster (ids `9 + 2r`, `r < num_workers`)
//! are dropped unanswered, each sender logged once on stderr (MXNet's server
//! aborts on them).
//! Differences that a real worker can observe:
//! * a round that mixes pushpulls and plain pushes answers every request
//!   (MXNet answers only the pulls; the plain pushers wait forever);
//! * a row_sparse key is initialised only from a push of all its rows
//!   `0..n` (MXNet ignores the row ids of the first push and stores a table of
//!   as many rows as it carried, which later pushes overrun);
//! * a row_sparse round without an updater leaves the rows nobody pushed at
//!   zero and the table whole (MXNet's stored array then holds only the
//!   pushed rows, and pulls read past it);
//! * a pushpull that initialises a key is answered with the value (MXNet
//!   sends no data, which a real worker's pull check rejects);
//! * the updater runs before a request is answered (as in MXNet; a Python
//!   updater on a real MXNet server may still be running then).
#![forbid(unsafe_code)]

use super::keys::{decode_key, depair_command, server_range, Command, RequestType};
use super::kv::{
    error_reply, i32_bytes, node_name, protocol_check, rank_of, response_to, worker_id, KvPairs,
    Transport,
};
use super::message::{Bytes, Message};
use crate::error::{Error, Result};
use crate::ndarray::dtype::{DType, Elem};
use crate::ndarray::kernels::{self, SumOrder};
use crate::ndarray::sparse;
use crate::ndarray::{Context, NDArray, Shape, StorageType};
use crate::store::compression::CompressionParams;
use crate::store::table::IntMap;
use crate::store::{Updater, UpdaterSlot};
use crate::{bail, ensure};
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The controller: `(head, body)` of a command the server does not handle
/// itself (`kController`: body = the pickled optimizer). Runs on the
/// server's thread; its error goes back to the worker that sent the command.
pub type Controller<'a> = dyn FnMut(i32, &[u8]) -> Result<()> + 'a;

/// Who this server is in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerConfig {
    pub rank: usize,
    pub num_servers: usize,
    pub num_workers: usize,
}

/// What the caller of [`KvServer::handle`] does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// `kStopServer` was answered: leave the server loop.
    Stop,
}

/// What a server loop receives.
#[derive(Debug)]
pub enum ServerEvent {
    Message(Message),
    /// Peer `id` went away (the error names it): rounds that need it fail.
    PeerLost(i32, Error),
}

/// One stored key.
struct Entry {
    /// The value in the pushed dtype (what pulls read).
    stored: NDArray,
    /// float32 master copy under multi-precision (non-float32 keys only);
    /// updates go here and are cast into `stored`.
    realt: Option<NDArray>,
    /// The merge buffer of sync rounds (float32 with `realt`).
    merged: Option<NDArray>,
    /// Requests of the running sync round (data parts dropped but the keys).
    pending: Vec<Message>,
    /// When the running round's first push arrived.
    started: Option<Instant>,
}

impl Entry {
    fn new(stored: NDArray, multi_precision: bool) -> Result<Entry> {
        let realt = if multi_precision && stored.dtype() != DType::F32 {
            // the value goes through the master copy, as in MXNet
            let realt = f32_copy(&stored)?;
            stored.copy_from(&realt)?;
            Some(realt)
        } else {
            None
        };
        Ok(Entry {
            stored,
            realt,
            merged: None,
            pending: Vec::new(),
            started: None,
        })
    }

    fn is_row_sparse(&self) -> bool {
        self.stored.stype() == StorageType::RowSparse
    }

    fn merge_dtype(&self) -> DType {
        if self.realt.is_some() {
            DType::F32
        } else {
            self.stored.dtype()
        }
    }

    /// The array the update writes: the master copy when there is one.
    fn target(&self) -> &NDArray {
        self.realt.as_ref().unwrap_or(&self.stored)
    }
}

/// A float32 copy of `a` (dense or row_sparse).
fn f32_copy(a: &NDArray) -> Result<NDArray> {
    let c = if a.stype() == StorageType::RowSparse {
        empty_row_sparse(a.shape().clone(), DType::F32)?
    } else {
        NDArray::zeros(a.shape().clone(), DType::F32, Context::CPU0)?
    };
    c.copy_from(a)?;
    Ok(c)
}

fn empty_row_sparse(shape: Shape, dtype: DType) -> Result<NDArray> {
    NDArray::sparse_zeros(
        StorageType::RowSparse,
        shape,
        dtype,
        Context::CPU0,
        &[DType::I64],
        &[Shape(vec![0])],
    )
}

/// The element type of a data command, refusing what MXNet's server dies on.
fn float_dtype(code: i32) -> Result<DType> {
    let dt = DType::from_code(code).map_err(|e| Error::protocol(e.message().to_string()))?;
    match dt {
        DType::F32 | DType::F64 | DType::F16 => Ok(dt),
        other => Err(Error::usage(format!(
            "This operation only support floating point types, not {}",
            other.name()
        ))),
    }
}

/// `acc[i] = acc[i] + x[i]` in `dtype`'s arithmetic (`merged += recved`);
/// `x` may be unaligned.
fn add_bytes(dtype: DType, acc: &mut [u8], x: &[u8]) {
    crate::with_dtype!(dtype, T => {
        let acc: &mut [T] = bytemuck::cast_slice_mut(acc);
        match bytemuck::try_cast_slice::<u8, T>(x) {
            Ok(xs) => add_slices(acc, xs),
            Err(_) => add_slices(acc, &bytemuck::pod_collect_to_vec::<u8, T>(x)),
        }
    })
}

fn add_slices<T: Elem>(acc: &mut [T], x: &[T]) {
    use rayon::prelude::*;
    const PAR: usize = 1 << 18;
    if acc.len() >= 2 * PAR && crate::ndarray::kernels::parallel() {
        acc.par_chunks_mut(PAR)
            .zip(x.par_chunks(PAR))
            .for_each(|(a, x)| a.iter_mut().zip(x).for_each(|(a, &x)| *a = a.add(x)));
    } else {
        acc.iter_mut().zip(x).for_each(|(a, &x)| *a = a.add(x));
    }
}

/// A dense 1-D array of `dtype` holding `bytes` (any alignment).
fn dense_from(bytes: &[u8], dtype: DType) -> Result<NDArray> {
    NDArray::from_bytes(
        Shape(vec![(bytes.len() / dtype.size()) as i64]),
        dtype,
        Context::CPU0,
        bytes,
    )
}

/// A received value, before it is merged or applied.
enum Value {
    /// Dense bytes of the given dtype (the received frame, not copied).
    Dense(DType, Bytes),
    /// A row_sparse array (`None`: a push of no rows).
    RowSparse(Option<NDArray>),
}

/// The KV server of one server node.
pub struct KvServer {
    cfg: ServerConfig,
    range: Range<u64>,
    sync_mode: bool,
    multi_precision: bool,
    compression: Option<CompressionParams>,
    store: IntMap<Entry>,
    updater: UpdaterSlot,
    /// Set when a worker was lost: no sync round can complete any more.
    lost: Option<Error>,
    /// Replies the transport could not send (the peer is gone).
    send_errors: Vec<Error>,
    /// Senders outside the cluster whose requests were dropped (each logged
    /// once; at most [`MAX_FOREIGN_LOGGED`] are remembered).
    foreign: Vec<i32>,
    /// How many requests from outside the cluster were dropped.
    foreign_dropped: u64,
}

/// How many senders outside the cluster are logged by name.
const MAX_FOREIGN_LOGGED: usize = 16;

impl KvServer {
    pub fn new(cfg: ServerConfig) -> KvServer {
        KvServer {
            cfg,
            range: server_range(cfg.rank, cfg.num_servers),
            sync_mode: false,
            // MXNet 1.9.1 never initialises `multi_precision_`; the pip wheel's
            // servers behave as if it were set (see the module docs).
            multi_precision: true,
            compression: None,
            store: IntMap::default(),
            updater: UpdaterSlot::default(),
            lost: None,
            send_errors: Vec::new(),
            foreign: Vec::new(),
            foreign_dropped: 0,
        }
    }

    pub fn config(&self) -> ServerConfig {
        self.cfg
    }

    /// The slot the updater is read from (share it with whoever installs one).
    pub fn updater_slot(&self) -> UpdaterSlot {
        self.updater.clone()
    }

    pub fn set_updater(&self, updater: Option<Arc<dyn Updater>>) {
        self.updater.set(updater);
    }

    pub fn sync_mode(&self) -> bool {
        self.sync_mode
    }

    /// How many requests from senders outside the cluster were dropped.
    pub fn foreign_dropped(&self) -> u64 {
        self.foreign_dropped
    }

    /// Whether `id` is a worker of this cluster (ps-lite: rank `r` is id
    /// `9 + 2r`, `r < num_workers`).
    fn is_worker(&self, id: i32) -> bool {
        id >= 9 && id % 2 == 1 && rank_of(id) < self.cfg.num_workers
    }

    /// Drops a request whose sender is not a worker of this cluster (a real
    /// MXNet server aborts on one: its `KVServer` has no such customer),
    /// logging each sender once on stderr.
    fn drop_foreign(&mut self, msg: &Message) {
        self.foreign_dropped += 1;
        if self.foreign.contains(&msg.sender) || self.foreign.len() > MAX_FOREIGN_LOGGED {
            return;
        }
        self.foreign.push(msg.sender);
        let what = match (msg.simple_app, Command::from_head(msg.head)) {
            (true, Some(c)) => format!("command k{c:?} ({})", msg.head),
            (true, None) => format!("command {}", msg.head),
            (false, _) => "data request".to_string(),
        };
        let who = if msg.sender == super::message::EMPTY {
            "a peer without a ps-lite identity".to_string()
        } else {
            format!("node id {}", msg.sender)
        };
        let workers = match self.cfg.num_workers {
            0 => "none".to_string(),
            1 => "id 9".to_string(),
            n => format!("ids 9..={}", worker_id(n - 1)),
        };
        let more = if self.foreign.len() > MAX_FOREIGN_LOGGED {
            "; further foreign senders are not logged"
        } else {
            ""
        };
        eprintln!(
            "[mxkv server] server {} dropped a {what} from {who}: not a worker of this cluster (workers: {workers}); its later requests are dropped unlogged{more}",
            self.cfg.rank
        );
    }

    /// Replies that could not be sent since the last call.
    pub fn take_send_errors(&mut self) -> Vec<Error> {
        std::mem::take(&mut self.send_errors)
    }

    /// A copy of the stored value of `key` on this server (tests, diagnostics).
    pub fn stored(&self, key: i32) -> Option<NDArray> {
        self.store
            .get(&key)
            .and_then(|e| e.stored.copy_to_ctx(Context::CPU0).ok())
    }

    fn send(&mut self, out: &dyn Transport, msg: Message) {
        let r = out.send(msg);
        self.sent(r);
    }

    /// Keeps the error of a reply that could not be sent.
    fn sent(&mut self, r: Result<()>) {
        if let Err(e) = r {
            if self.send_errors.len() < 64 {
                self.send_errors.push(e);
            }
        }
    }

    /// Handles one received message. Requests that cannot be served get an
    /// error reply; `Err` is never returned for them (the server goes on).
    pub fn handle(
        &mut self,
        msg: Message,
        out: &dyn Transport,
        controller: &mut Controller<'_>,
    ) -> Flow {
        if !msg.request {
            return Flow::Continue; // servers send requests to nobody
        }
        if !self.is_worker(msg.sender) {
            // data requests and commands come from the cluster's workers only
            // (the scheduler sends control messages, never these)
            self.drop_foreign(&msg);
            return Flow::Continue;
        }
        if msg.simple_app {
            return self.command(msg, out, controller);
        }
        if let Err(e) = self.data(&msg, out) {
            self.send(out, error_reply(&msg, &e));
        }
        Flow::Continue
    }

    fn command(
        &mut self,
        msg: Message,
        out: &dyn Transport,
        controller: &mut Controller<'_>,
    ) -> Flow {
        let cmd = Command::from_head(msg.head);
        let result = match cmd {
            Some(Command::StopServer) => {
                let err = Error::usage(format!(
                    "server {} stopped (kStopServer) before this round completed",
                    self.cfg.rank
                ));
                self.fail_pending(&err, out);
                self.send(out, response_to(&msg));
                return Flow::Stop;
            }
            Some(Command::SyncMode) => {
                self.sync_mode = true;
                Ok(())
            }
            Some(Command::SetGradientCompression) => {
                CompressionParams::decode(&msg.body).map(|p| self.compression = p)
            }
            Some(Command::SetMultiPrecision) => self.set_multi_precision(),
            Some(Command::SetProfilerParams) => Ok(()),
            Some(Command::Controller) => controller(msg.head, &msg.body),
            None => Err(Error::usage(format!(
                "unknown server command {} (MXNet's commands are 0-5)",
                msg.head
            ))),
        };
        let reply = match result {
            Ok(()) => response_to(&msg),
            Err(e) => error_reply(&msg, &e),
        };
        self.send(out, reply);
        Flow::Continue
    }

    /// `CreateMultiPrecisionCopies`.
    fn set_multi_precision(&mut self) -> Result<()> {
        if self.multi_precision {
            return Ok(());
        }
        if let Some((k, e)) = self.store.iter().find(|(_, e)| !e.pending.is_empty()) {
            bail!(
                "{}: Multiprecision mode can not be set while pushes are underway. Please set optimizer before pushing keys. key {k}, {} pushes queued",
                self.cfg.rank,
                e.pending.len()
            );
        }
        for e in self.store.values_mut() {
            if e.stored.dtype() != DType::F32 {
                e.realt = Some(f32_copy(&e.stored)?);
                e.merged = None;
            }
        }
        self.multi_precision = true;
        Ok(())
    }

    fn data(&mut self, msg: &Message, out: &dyn Transport) -> Result<()> {
        let (rt, code) = depair_command(msg.head).map_err(|e| Error::protocol(e.message()))?;
        let dtype = float_dtype(code)?;
        let kv = KvPairs::from_parts(&msg.data)?;
        protocol_check(!kv.keys.is_empty(), || {
            "a data request without keys".to_string()
        })?;
        match rt {
            RequestType::Default => {
                protocol_check(kv.keys.len() == 1, || {
                    format!("a default request has exactly 1 key, not {}", kv.keys.len())
                })?;
                let key = self.decode(kv.keys[0])?;
                if msg.push {
                    protocol_check(
                        kv.lens.len() == 1
                            && kv.lens[0] >= 0
                            && kv.vals.len() == kv.lens[0] as usize,
                        || {
                            format!(
                                "a push carries 1 len equal to its {} value bytes; got lens {:?}",
                                kv.vals.len(),
                                kv.lens
                            )
                        },
                    )?;
                    self.push_dense(msg, key, dtype, kv.vals, out)
                } else {
                    self.pull_dense(msg, key, out)
                }
            }
            RequestType::Compressed => self.compressed(msg, kv, dtype, out),
            RequestType::RowSparse => self.row_sparse(msg, kv, dtype, out),
        }
    }

    fn decode(&self, ps_key: u64) -> Result<i32> {
        decode_key(ps_key, &self.range).map_err(|e| Error::protocol(e.message()))
    }

    /// The response to a pull of `key`: the stored bytes.
    fn pull_dense(&mut self, req: &Message, key: i32, out: &dyn Transport) -> Result<()> {
        self.send_value(req, key, out)
    }

    /// `DefaultStorageResponse`: keys echoed, vals = the stored bytes, lens =
    /// their size. A large dense value is sent without a copy
    /// ([`NDArray::share`]), a small one copied by the transport straight
    /// into the outgoing frame. `Err` when the reply cannot be made (a failed
    /// send is kept in `send_errors`).
    fn send_value(&mut self, req: &Message, key: i32, out: &dyn Transport) -> Result<()> {
        let e = self
            .store
            .get(&key)
            .ok_or_else(|| Error::not_inited(format!("init {key} first")))?;
        let len_of = |n: usize| {
            i32::try_from(n).map_err(|_| {
                Error::new(format!("key {key}: {n} bytes exceed ps-lite's int lengths"))
            })
        };
        let mut m = response_to(req);
        let sent = if e.is_row_sparse() {
            let rows: Vec<i64> = (0..e.stored.shape().dims()[0]).collect();
            let vals = gather_rows(&e.stored, &rows)?;
            let len = len_of(vals.len())?;
            m.data = vec![req.data[0].clone(), Bytes::from(vals), i32_bytes(&[len])];
            out.send(m)
        } else if let Some(value) = e.stored.share() {
            // large values go out without a copy (NDArray::share)
            let len = len_of(value.len())?;
            m.data = vec![req.data[0].clone(), value, i32_bytes(&[len])];
            out.send(m)
        } else {
            let g = e.stored.read();
            let len = len_of(g.len())?;
            m.data = vec![req.data[0].clone(), Bytes::new(), i32_bytes(&[len])];
            out.send_copying(m, 1, g.bytes())
        };
        self.sent(sent);
        Ok(())
    }

    /// Answers a queued request once its round is done.
    fn answer(&mut self, req: &Message, key: i32, out: &dyn Transport) {
        if req.pull {
            if let Err(e) = self.send_value(req, key, out) {
                self.send(out, error_reply(req, &e));
            }
        } else {
            self.send(out, response_to(req));
        }
    }

    fn push_dense(
        &mut self,
        msg: &Message,
        key: i32,
        dtype: DType,
        bytes: Bytes,
        out: &dyn Transport,
    ) -> Result<()> {
        ensure!(
            bytes.len() % dtype.size() == 0,
            "key {key}: {} bytes are not a whole number of {} values",
            bytes.len(),
            dtype.name()
        );
        let Some(e) = self.store.get(&key) else {
            // initialisation
            ensure!(
                !bytes.is_empty(),
                "key {key}: init with empty data is not supported"
            );
            let entry = Entry::new(dense_from(&bytes, dtype)?, self.multi_precision)?;
            self.store.insert(key, entry);
            self.answer(&keys_only(msg), key, out);
            return Ok(());
        };
        ensure!(
            !e.is_row_sparse(),
            "key {key} is a row_sparse key on this server; a dense push of it was refused"
        );
        check_same(key, &e.stored, dtype, bytes.len())?;
        self.accept(msg, key, Value::Dense(dtype, bytes), out)
    }

    fn compressed(
        &mut self,
        msg: &Message,
        kv: KvPairs,
        dtype: DType,
        out: &dyn Transport,
    ) -> Result<()> {
        ensure!(
            dtype == DType::F32,
            "Gradient compression is currently supported for fp32 only"
        );
        if !msg.push {
            protocol_check(kv.keys.len() == 1 && kv.lens.is_empty(), || {
                format!(
                    "a compressed pull has 1 key and no lens, not {} keys and {} lens",
                    kv.keys.len(),
                    kv.lens.len()
                )
            })?;
            let key = self.decode(kv.keys[0])?;
            return self.pull_dense(msg, key, out);
        }
        protocol_check(
            kv.keys.len() == 2
                && kv.lens.len() == 2
                && kv.lens[1] >= 0
                && kv.vals.len() == kv.lens[1] as usize,
            || {
                format!(
                    "a compressed push has 2 keys and 2 lens, the second equal to its {} value bytes; got {} keys, lens {:?}",
                    kv.vals.len(),
                    kv.keys.len(),
                    kv.lens
                )
            },
        )?;
        let n = self.decode(kv.keys[0])? as usize;
        let key = self.decode(kv.keys[1])?;
        let Some(params) = self.compression else {
            bail!("key {key}: a compressed push arrived, but gradient compression was not set on server {} (kSetGradientCompression)", self.cfg.rank);
        };
        // keys[0] claims the part's original size n: check it before n
        // values are made (a claim of 2^31-1 values in a 256 MB message asked
        // for 17 GB). A stored key's part holds exactly n values; a key not
        // stored yet (a compressed push initialises it, as in MXNet) at most
        // what a default push could carry (ps-lite's int lengths).
        match self.store.get(&key) {
            Some(e) => {
                ensure!(
                    !e.is_row_sparse(),
                    "key {key} is a row_sparse key on this server; a compressed push of it was refused"
                );
                ensure!(
                    e.stored.size() == n,
                    "The value size cannot be changed {}. Key is {key} (a compressed push of {n} values; server {} holds {} values of it)",
                    n.saturating_mul(4),
                    self.cfg.rank,
                    e.stored.size()
                );
            }
            None => ensure!(
                n <= i32::MAX as usize / DType::F32.size(),
                "key {key}: a compressed push claiming {n} values was refused: more than a push can carry ({} bytes)",
                i32::MAX
            ),
        }
        let want = params.compressed_len(n);
        ensure!(
            kv.vals.len() == want * 4,
            "key {key}: {} compressed bytes cannot hold {n} values ({want} words expected)",
            kv.vals.len()
        );
        let words = super::kv::read_u32s(&kv.vals)?;
        // dequantized straight into the buffer that becomes the value
        let mut values = vec![0u8; n * DType::F32.size()];
        match bytemuck::try_cast_slice_mut::<u8, f32>(&mut values) {
            Ok(v) => params.dequantize(&words, n, v),
            Err(_) => {
                let mut v = vec![0f32; n];
                params.dequantize(&words, n, &mut v);
                values.copy_from_slice(bytemuck::cast_slice(&v));
            }
        }
        self.push_dense(msg, key, DType::F32, Bytes::from(values), out)
    }

    fn row_sparse(
        &mut self,
        msg: &Message,
        kv: KvPairs,
        dtype: DType,
        out: &dyn Transport,
    ) -> Result<()> {
        let master = self.decode(kv.keys[0])?;
        let num_rows = kv.keys.len() - 1;
        let rows = kv.keys[1..]
            .iter()
            .map(|&k| Ok(i64::from(self.decode(k)?) - i64::from(master)))
            .collect::<Result<Vec<i64>>>()?;
        if !msg.push {
            return self.pull_rows(msg, &kv, master, &rows, out);
        }
        protocol_check(!kv.lens.is_empty() && kv.lens[0] == 0, || {
            format!(
                "a row_sparse push starts with a len of 0; got lens {:?}",
                kv.lens
            )
        })?;
        let unit_bytes = if num_rows > 0 {
            let u = kv.lens[1];
            protocol_check(
                u > 0
                    && kv.lens[1..].iter().all(|&l| l == u)
                    && kv.vals.len() == num_rows * u as usize,
                || {
                    format!(
                        "a row_sparse push carries rows of one length adding up to its {} value bytes; got lens {:?}",
                        kv.vals.len(),
                        kv.lens
                    )
                },
            )?;
            ensure!(
                u as usize % dtype.size() == 0,
                "key {master}: rows of {u} bytes are not whole {} values",
                dtype.name()
            );
            u as usize
        } else {
            0
        };
        let unit_len = unit_bytes / dtype.size();
        let Some(e) = self.store.get(&master) else {
            // initialisation: every row, in order
            ensure!(num_rows > 0, "init with empty data is not supported");
            ensure!(
                rows.iter().enumerate().all(|(i, &r)| r == i as i64),
                "key {master}: a row_sparse key is initialised with all its rows 0..n in order (MXNet ignores the row ids of the first push and stores as many rows as it carries); got rows {:?}",
                &rows[..rows.len().min(8)]
            );
            let shape = Shape(vec![num_rows as i64, unit_len as i64]);
            let data = NDArray::from_bytes(shape.clone(), dtype, Context::CPU0, &kv.vals)?;
            let stored = NDArray::row_sparse(shape, Context::CPU0, data, &rows)?;
            let entry = Entry::new(stored, self.multi_precision)?;
            self.store.insert(master, entry);
            self.send(out, response_to(msg));
            return Ok(());
        };
        ensure!(
            e.is_row_sparse(),
            "key {master} is a dense key on this server; a row_sparse push of it was refused"
        );
        ensure!(
            e.stored.dtype() == dtype,
            "key {master} holds {} values; a push of {} was refused",
            e.stored.dtype().name(),
            dtype.name()
        );
        let shape = e.stored.shape().clone();
        let total = shape.dims()[0];
        let value = if num_rows == 0 {
            None
        } else {
            ensure!(
                unit_len as i64 == shape.dims()[1],
                "key {master}: rows of {unit_len} values pushed to a table with rows of {}",
                shape.dims()[1]
            );
            let data = NDArray::from_bytes(
                Shape(vec![num_rows as i64, unit_len as i64]),
                dtype,
                Context::CPU0,
                &kv.vals,
            )?;
            let recv = NDArray::row_sparse(shape, Context::CPU0, data, &rows)?;
            recv.check_row_sparse().map_err(|err| {
                Error::usage(format!("key {master} (table of {total} rows): {err}"))
            })?;
            Some(recv)
        };
        self.accept(msg, master, Value::RowSparse(value), out)
    }

    /// `RowSparsePullResponse`: the requested rows, lens `[0, u, u, …]` in
    /// elements (MXNet's quirk).
    fn pull_rows(
        &mut self,
        msg: &Message,
        kv: &KvPairs,
        master: i32,
        rows: &[i64],
        out: &dyn Transport,
    ) -> Result<()> {
        let mut reply = response_to(msg);
        if rows.is_empty() {
            reply.data = KvPairs {
                keys: kv.keys.clone(),
                vals: Bytes::new(),
                lens: vec![0; kv.keys.len()],
            }
            .into_parts();
            self.send(out, reply);
            return Ok(());
        }
        let e = self
            .store
            .get(&master)
            .ok_or_else(|| Error::not_inited(format!("init {master} first")))?;
        ensure!(
            e.is_row_sparse(),
            "key {master} is a dense key on this server; a row_sparse pull of it was refused"
        );
        let total = e.stored.shape().dims()[0];
        // A worker may name a row twice (MXNet's PullRowSparseImpl does not
        // deduplicate), but never more rows than the table has: a longer
        // list would make a reply larger than the stored value (one request
        // of 800 KB naming row 0 of 1 MB rows 100,000 times asked for 100 GB).
        if rows.len() as i64 > total {
            return Err(Error::usage(format!(
                "key {master}: a row_sparse pull of {} rows from a table of {total} rows on server {} was refused (the reply would exceed the stored value)",
                rows.len(),
                self.cfg.rank
            )));
        }
        if let Some(r) = rows.iter().find(|&&r| !(0..total).contains(&r)) {
            bail!(
                "key {master}: row {r} is out of range [0, {total}) on server {}",
                self.cfg.rank
            );
        }
        let vals = gather_rows(&e.stored, rows)?;
        let unit = e.stored.row_len() as i32;
        let mut lens = vec![unit; kv.keys.len()];
        lens[0] = 0;
        reply.data = vec![msg.data[0].clone(), Bytes::from(vals), i32_bytes(&lens)];
        self.send(out, reply);
        Ok(())
    }

    /// Merges (sync) or applies (async) a push to a stored key.
    fn accept(&mut self, msg: &Message, key: i32, value: Value, out: &dyn Transport) -> Result<()> {
        if !self.sync_mode {
            let recv = match value {
                Value::RowSparse(None) => {
                    self.send(out, response_to(msg));
                    return Ok(());
                }
                Value::RowSparse(Some(a)) => a,
                Value::Dense(dt, b) => dense_from(&b, dt)?,
            };
            let e = &self.store[&key];
            let recv = if e.realt.is_some() {
                f32_copy(&recv)?
            } else {
                recv
            };
            let Some(updater) = self.updater.get() else {
                bail!("Updater needs to be set for async mode (key {key}; the server runs in async mode because no worker sent kSyncMode)");
            };
            let e = &self.store[&key];
            updater.update(key, None, &recv, e.target())?;
            if let Some(realt) = &e.realt {
                e.stored.copy_from(realt)?;
            }
            self.answer(&keys_only(msg), key, out);
            return Ok(());
        }
        if let Some(err) = &self.lost {
            return Err(Error::with_kind(
                err.kind(),
                format!(
                    "key {key}: this sync round cannot complete: {}",
                    err.message()
                ),
            ));
        }
        let e = self.store.get_mut(&key).expect("stored key");
        let first = e.pending.is_empty();
        // MXNet counts requests, not workers (a worker that pushes a key
        // twice before the others pushed it counts twice); so do we.
        merge(e, first, value)?;
        if first {
            e.started = Some(Instant::now());
        }
        e.pending.push(keys_only(msg));
        if e.pending.len() >= self.cfg.num_workers {
            self.finish_round(key, out);
        }
        Ok(())
    }

    /// `ApplyUpdates` of a complete round: updater or assign, then answer
    /// every queued request.
    fn finish_round(&mut self, key: i32, out: &dyn Transport) {
        let updater = self.updater.get();
        let e = self.store.get_mut(&key).expect("stored key");
        let pending = std::mem::take(&mut e.pending);
        e.started = None;
        let result = apply_round(key, e, updater.as_deref());
        for r in &pending {
            match &result {
                Ok(()) => self.answer(r, key, out),
                Err(err) => self.send(out, error_reply(r, err)),
            }
        }
    }

    /// Answers every queued request with `err` and drops the running rounds.
    pub fn fail_pending(&mut self, err: &Error, out: &dyn Transport) {
        let mut replies = Vec::new();
        for e in self.store.values_mut() {
            for r in e.pending.drain(..) {
                replies.push(error_reply(&r, err));
            }
            e.started = None;
        }
        for r in replies {
            self.send(out, r);
        }
    }

    /// Peer `id` was lost. A lost worker means, in sync mode, that no round
    /// can complete any more: the running ones fail now and later pushes
    /// are refused at once. Other peers (the scheduler) do not stop the KV
    /// traffic (ps-lite's servers serve without a scheduler too).
    pub fn on_peer_lost(&mut self, id: i32, err: &Error, out: &dyn Transport) {
        let is_worker = id >= 9 && id % 2 == 1;
        if self.sync_mode && is_worker {
            self.fail_pending(err, out);
            self.lost = Some(err.clone());
        }
    }

    /// Fails the rounds that have waited longer than `timeout`, naming the
    /// workers whose push is missing.
    pub fn expire_rounds(&mut self, timeout: Duration, out: &dyn Transport) {
        let now = Instant::now();
        let num_workers = self.cfg.num_workers;
        let rank = self.cfg.rank;
        let mut replies = Vec::new();
        for (key, e) in self.store.iter_mut() {
            let Some(t) = e.started else { continue };
            if now.duration_since(t) < timeout {
                continue;
            }
            let missing: Vec<String> = (0..num_workers)
                .map(worker_id)
                .filter(|id| !e.pending.iter().any(|p| p.sender == *id))
                .map(node_name)
                .collect();
            let err = Error::timeout(format!(
                "server {rank}: sync round of key {key} timed out after {:.0?}: {} of {num_workers} pushes arrived; no push from {}",
                timeout,
                e.pending.len(),
                if missing.is_empty() { "-".to_string() } else { missing.join(", ") }
            ));
            for r in e.pending.drain(..) {
                replies.push(error_reply(&r, &err));
            }
            e.started = None;
        }
        for r in replies {
            self.send(out, r);
        }
    }

    /// Keys with a running round and the ranks of the workers that pushed.
    pub fn running_rounds(&self) -> Vec<(i32, Vec<usize>)> {
        let mut v: Vec<(i32, Vec<usize>)> = self
            .store
            .iter()
            .filter(|(_, e)| !e.pending.is_empty())
            .map(|(k, e)| (*k, e.pending.iter().map(|p| rank_of(p.sender)).collect()))
            .collect();
        v.sort();
        v
    }

    /// Runs the server loop: handles events until `kStopServer` (Ok), or
    /// until the event source closes (Err). Every `tick` (and after each
    /// event) rounds older than `round_timeout` fail.
    pub fn run(
        &mut self,
        events: &std::sync::mpsc::Receiver<ServerEvent>,
        out: &dyn Transport,
        controller: &mut Controller<'_>,
        round_timeout: Duration,
    ) -> Result<()> {
        let tick = (round_timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        loop {
            match events.recv_timeout(tick) {
                Ok(ServerEvent::Message(m)) => {
                    if self.handle(m, out, controller) == Flow::Stop {
                        return Ok(());
                    }
                }
                Ok(ServerEvent::PeerLost(id, e)) => self.on_peer_lost(id, &e, out),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    let err = Error::peer_lost(format!(
                        "server {}: the transport closed before kStopServer",
                        self.cfg.rank
                    ));
                    self.fail_pending(&err, out);
                    return Err(err);
                }
            }
            self.expire_rounds(round_timeout, out);
        }
    }
}

/// `req` without its values (kept while a round runs): the keys part stays
/// for the pull response.
fn keys_only(req: &Message) -> Message {
    let mut m = req.clone();
    m.data.truncate(1);
    m
}

fn check_same(key: i32, stored: &NDArray, dtype: DType, bytes: usize) -> Result<()> {
    ensure!(
        stored.dtype() == dtype,
        "key {key} holds {} values; a push of {} was refused",
        stored.dtype().name(),
        dtype.name()
    );
    let have = stored.size() * dtype.size();
    ensure!(
        have == bytes,
        "The value size cannot be changed {bytes}. Key is {key} (this server holds {have} bytes of it)"
    );
    Ok(())
}

/// Adds a push into the entry's merge buffer (the first push of a round
/// becomes it, without a copy when it can).
fn merge(e: &mut Entry, first: bool, value: Value) -> Result<()> {
    let md = e.merge_dtype();
    match value {
        Value::Dense(dt, bytes) => {
            let merged = match &e.merged {
                Some(m) if m.dtype() == md && m.shape() == e.stored.shape() => m.clone(),
                _ => {
                    let m = NDArray::zeros(e.stored.shape().clone(), md, Context::CPU0)?;
                    e.merged = Some(m.clone());
                    m
                }
            };
            if dt == md {
                if first {
                    // the received frame becomes the sum without a copy
                    merged.assign_bytes(bytes)?;
                } else {
                    let mut g = merged.write();
                    let shared = (g.is_shared() && !g.take_back())
                        .then(|| g.share())
                        .flatten();
                    match shared {
                        // the sum so far is a received frame: sum it and this
                        // push into memory of the merge buffer's own, in one pass
                        Some(prev) if bytes.as_ptr().align_offset(8) == 0 => {
                            let out = g.overwrite();
                            kernels::sum_bytes(md, &[&prev, &bytes], out, SumOrder::LeftToRight);
                        }
                        _ => add_bytes(md, g.bytes_mut(), &bytes),
                    }
                }
            } else {
                let conv = f32_copy(&dense_from(&bytes, dt)?)?;
                if first {
                    merged.copy_from(&conv)?;
                } else {
                    add_bytes(md, merged.write().bytes_mut(), conv.read().bytes());
                }
            }
        }
        Value::RowSparse(v) => {
            let shape = e.stored.shape().clone();
            let v = match v {
                Some(a) if a.dtype() != md => Some(f32_copy(&a)?),
                v => v,
            };
            let merged = match (first, v, e.merged.take()) {
                // reset to zeros, then nothing to add (MXNet's "empty gradient")
                (true, None, _) => empty_row_sparse(shape, md)?,
                (true, Some(a), _) => a,
                (false, None, Some(m)) => m,
                (false, Some(a), Some(m)) => {
                    sparse::sum_row_sparse(&[m, a], &shape, md, Context::CPU0)?
                }
                (false, _, None) => bail!("internal: row_sparse round without a merge buffer"),
            };
            e.merged = Some(merged);
        }
    }
    Ok(())
}

/// The update of a complete sync round: the updater on the sum, or the sum
/// assigned; then the master copy cast into the stored value.
fn apply_round(key: i32, e: &mut Entry, updater: Option<&dyn Updater>) -> Result<()> {
    let merged = e
        .merged
        .clone()
        .ok_or_else(|| Error::new(format!("internal: key {key} has no merged value")))?;
    match updater {
        Some(u) => u.update(key, None, &merged, e.target())?,
        None if e.is_row_sparse() => assign_rows(&merged, e.target())?,
        None if e.realt.is_none() => {
            // The sum becomes the stored value; the old buffer is the next
            // round's merge buffer (nothing else holds either).
            let merged = e.merged.as_mut().expect("merged");
            std::mem::swap(&mut e.stored, merged);
        }
        None => e.target().copy_from(&merged)?,
    }
    if let Some(realt) = &e.realt {
        e.stored.copy_from(realt)?;
    }
    if e.is_row_sparse() {
        // row_sparse merge buffers are rebuilt each round
        e.merged = None;
    }
    Ok(())
}

/// `stored` (a whole table) becomes `merged`'s rows, zeros elsewhere.
fn assign_rows(merged: &NDArray, stored: &NDArray) -> Result<()> {
    let shape = stored.shape().clone();
    let total = shape.dims()[0];
    let dense = NDArray::zeros(shape.clone(), stored.dtype(), Context::CPU0)?;
    dense.copy_from(merged)?; // row_sparse → dense: rows over zeros
    let all: Vec<i64> = (0..total).collect();
    let data = NDArray::zeros(shape.clone(), stored.dtype(), Context::CPU0)?;
    data.copy_from_bytes(dense.read().bytes())?;
    let full = NDArray::row_sparse(shape, Context::CPU0, data, &all)?;
    stored.copy_from(&full)
}

/// The bytes of `rows` (sorted, in range) of the row_sparse `a`: stored rows,
/// zeros for rows it does not hold.
fn gather_rows(a: &NDArray, rows: &[i64]) -> Result<Vec<u8>> {
    let p = a.parts()?;
    let rb = a.row_len() * a.dtype().size();
    let idx = p.aux[0].read();
    let idx = idx.typed::<i64>();
    let data = p.data.read();
    let data = data.bytes();
    let full = idx.len() as i64 == a.shape().dims()[0];
    let mut out = vec![0u8; rows.len() * rb];
    for (j, &r) in rows.iter().enumerate() {
        let k = if full {
            Some(r as usize)
        } else {
            idx.binary_search(&r).ok()
        };
        if let Some(k) = k {
            out[j * rb..(j + 1) * rb].copy_from_slice(&data[k * rb..(k + 1) * rb]);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::keys::command_type;
    use crate::dist::kv::{reply_error, u64_bytes};
    use crate::dist::message::EMPTY;
    use crate::error::ErrorKind;
    use half::f16;
    use parking_lot::Mutex;

    #[derive(Default)]
    struct Rec(Mutex<Vec<Message>>);

    impl Transport for Rec {
        fn send(&self, msg: Message) -> Result<()> {
            self.0.lock().push(msg);
            Ok(())
        }
    }

    impl Rec {
        fn take(&self) -> Vec<Message> {
            std::mem::take(&mut *self.0.lock())
        }
    }

    fn server(workers: usize, sync: bool) -> KvServer {
        let mut s = KvServer::new(ServerConfig {
            rank: 0,
            num_servers: 1,
            num_workers: workers,
        });
        s.sync_mode = sync;
        s
    }

    fn no_controller(_: i32, _: &[u8]) -> Result<()> {
        Err(Error::usage("no controller"))
    }

    /// A KV request from worker `w` (id 9 + 2w).
    #[allow(clippy::too_many_arguments)]
    fn req(
        w: i32,
        ts: i32,
        head: i32,
        push: bool,
        pull: bool,
        keys: &[u64],
        vals: &[u8],
        lens: &[i32],
    ) -> Message {
        let mut data = vec![u64_bytes(keys), Bytes::from(vals.to_vec())];
        if !lens.is_empty() {
            data.push(i32_bytes(lens));
        }
        Message {
            head,
            request: true,
            push,
            pull,
            app_id: 0,
            customer_id: 0,
            timestamp: ts,
            sender: 9 + 2 * w,
            data,
            ..Message::default()
        }
    }

    fn push_f32(w: i32, ts: i32, key: u64, v: &[f32], pull: bool) -> Message {
        let b: &[u8] = bytemuck::cast_slice(v);
        req(w, ts, 0, true, pull, &[key], b, &[b.len() as i32])
    }

    fn handle(s: &mut KvServer, out: &Rec, m: Message) {
        assert_eq!(s.handle(m, out, &mut no_controller), Flow::Continue);
    }

    fn f32s(m: &Message) -> Vec<f32> {
        bytemuck::pod_collect_to_vec(&m.data[1])
    }

    #[test]
    fn a_round_of_pushes_and_pushpulls_answers_every_request() {
        let (mut s, out) = (server(2, true), Rec::default());
        handle(&mut s, &out, push_f32(0, 0, 4, &[1.0, 2.0], false));
        assert_eq!(out.take().len(), 1, "init answered at once");
        handle(&mut s, &out, push_f32(0, 1, 4, &[1.0, 1.0], false));
        assert!(out.take().is_empty(), "the round waits for worker 1");
        handle(&mut s, &out, push_f32(1, 0, 4, &[2.0, 0.5], true));
        let r = out.take();
        assert_eq!(r.len(), 2);
        // the plain push: no data; the pushpull: the assigned sum
        assert_eq!((r[0].recver, r[0].timestamp, r[0].data.len()), (9, 1, 0));
        assert_eq!((r[1].recver, r[1].timestamp), (11, 0));
        assert_eq!(f32s(&r[1]), vec![3.0, 1.5]);
    }

    #[test]
    fn a_pushpull_that_initialises_answers_with_the_value() {
        let (mut s, out) = (server(1, true), Rec::default());
        handle(&mut s, &out, push_f32(0, 0, 2, &[7.0], true));
        let r = out.take();
        assert_eq!(f32s(&r[0]), vec![7.0]);
        assert_eq!(r[0].data.len(), 3);
    }

    #[test]
    fn multi_precision_updates_a_float32_master_copy() {
        let (mut s, out) = (server(1, true), Rec::default());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let seen2 = seen.clone();
        s.set_updater(Some(Arc::new(
            move |_k: i32, _: Option<&[u8]>, recv: &NDArray, stored: &NDArray| -> Result<()> {
                seen2.lock().push((recv.dtype(), stored.dtype()));
                let g = recv.read().typed::<f32>().to_vec();
                for (w, g) in stored.write().typed_mut::<f32>().iter_mut().zip(g) {
                    *w -= g / 3.0;
                }
                Ok(())
            },
        )));
        let cmd = |head| Message {
            head,
            request: true,
            simple_app: true,
            app_id: 0,
            customer_id: 0,
            timestamp: 0,
            sender: 9,
            ..Message::default()
        };
        handle(&mut s, &out, cmd(Command::SetMultiPrecision.head()));
        let h = |x: f32| f16::from_f32(x);
        let v: Vec<f16> = vec![h(1.0), h(2.0)];
        let f16_cmd = command_type(RequestType::Default, 2);
        let b: &[u8] = bytemuck::cast_slice(&v);
        handle(&mut s, &out, req(0, 1, f16_cmd, true, false, &[3], b, &[4]));
        let g: Vec<f16> = vec![h(1.0), h(1.0)];
        let b: &[u8] = bytemuck::cast_slice(&g);
        handle(&mut s, &out, req(0, 2, f16_cmd, true, true, &[3], b, &[4]));
        let r = out.take();
        assert!(r.iter().all(|m| reply_error(m).is_none()));
        assert_eq!(*seen.lock(), vec![(DType::F32, DType::F32)]);
        let got: Vec<f16> = bytemuck::pod_collect_to_vec(&r.last().unwrap().data[1]);
        // f32 master: 1 - 1/3 and 2 - 1/3, then rounded to half once
        assert_eq!(got, vec![h(1.0 - 1.0 / 3.0), h(2.0 - 1.0 / 3.0)]);
    }

    #[test]
    fn float64_values_are_kept_in_float32_as_mxnet_1_9_1_keeps_them() {
        let (mut s, out) = (server(1, true), Rec::default());
        let f64_cmd = command_type(RequestType::Default, 1);
        let b = 0.1f64.to_le_bytes();
        handle(
            &mut s,
            &out,
            req(0, 0, f64_cmd, true, false, &[2], &b, &[8]),
        );
        handle(
            &mut s,
            &out,
            req(0, 1, f64_cmd, false, true, &[2], &[], &[]),
        );
        let r = out.take();
        let got = f64::from_le_bytes(r[1].data[1][..].try_into().unwrap());
        // what a real MXNet 1.9.1 server answers
        assert_eq!(got, 0.10000000149011612);
    }

    #[test]
    fn an_updater_error_goes_to_every_request_of_the_round() {
        let (mut s, out) = (server(2, true), Rec::default());
        s.set_updater(Some(Arc::new(
            |k: i32, _: Option<&[u8]>, _: &NDArray, _: &NDArray| -> Result<()> {
                Err(Error::usage(format!("optimizer failed on key {k}")))
            },
        )));
        handle(&mut s, &out, push_f32(0, 0, 4, &[1.0], false));
        out.take();
        handle(&mut s, &out, push_f32(0, 1, 4, &[1.0], false));
        handle(&mut s, &out, push_f32(1, 0, 4, &[1.0], true));
        let r = out.take();
        assert_eq!(r.len(), 2);
        for m in &r {
            let e = reply_error(m).expect("error reply");
            assert_eq!(e.message(), "optimizer failed on key 4");
            assert!(m.data.is_empty());
        }
    }

    #[test]
    fn refused_requests() {
        let (mut s, out) = (server(1, true), Rec::default());
        let err = |s: &mut KvServer, m: Message| {
            handle(s, &out, m);
            let r = out.take();
            assert_eq!(r.len(), 1);
            reply_error(&r[0]).expect("an error reply")
        };
        // integer dtypes (MXNet's server aborts)
        let e = err(&mut s, req(0, 0, 14, true, false, &[1], &[0; 4], &[4]));
        assert_eq!(
            e.message(),
            "This operation only support floating point types, not int32"
        );
        // two keys in a default request
        let e = err(&mut s, req(0, 1, 0, true, false, &[1, 2], &[0; 8], &[4, 4]));
        assert_eq!(e.kind(), ErrorKind::Protocol);
        // lens that do not match the values
        let e = err(&mut s, req(0, 2, 0, true, false, &[1], &[0; 8], &[4]));
        assert_eq!(e.kind(), ErrorKind::Protocol);
        // a key outside this server's range
        let mut t = KvServer::new(ServerConfig {
            rank: 1,
            num_servers: 2,
            num_workers: 1,
        });
        let e = err(&mut t, push_f32(0, 3, 5, &[1.0], false));
        assert!(e.message().contains("not in this server's range"), "{e}");
        // size and dtype changes
        handle(&mut s, &out, push_f32(0, 4, 1, &[1.0, 2.0], false));
        out.take();
        let e = err(&mut s, push_f32(0, 5, 1, &[1.0], false));
        assert!(
            e.message()
                .starts_with("The value size cannot be changed 4. Key is 1"),
            "{e}"
        );
        let e = err(&mut s, req(0, 6, 2, true, false, &[1], &[0; 16], &[16]));
        assert!(
            e.message()
                .contains("holds float32 values; a push of float64"),
            "{e}"
        );
        // a compressed push before kSetGradientCompression
        let e = err(&mut s, req(0, 7, 3, true, false, &[2, 1], &[0; 4], &[0, 4]));
        assert!(
            e.message().contains("gradient compression was not set"),
            "{e}"
        );
        // a row_sparse key initialised without all its rows
        let e = err(
            &mut s,
            req(0, 8, 1, true, false, &[9, 10, 12], &[0; 16], &[0, 8, 8]),
        );
        assert!(e.message().contains("all its rows 0..n"), "{e}");
        // pulls of keys never stored
        let e = err(&mut s, req(0, 9, 0, false, true, &[8], &[], &[]));
        assert_eq!(
            (e.kind(), e.message()),
            (ErrorKind::NotInited, "init 8 first")
        );
        // an unknown command; the profiler is accepted
        let cmd = |head| Message {
            head,
            request: true,
            simple_app: true,
            timestamp: 10,
            sender: 9,
            ..Message::default()
        };
        let e = err(&mut s, cmd(9));
        assert!(e.message().contains("unknown server command 9"), "{e}");
        handle(&mut s, &out, cmd(Command::SetProfilerParams.head()));
        assert!(reply_error(&out.take()[0]).is_none());
        // the server still serves
        handle(&mut s, &out, req(0, 11, 0, false, true, &[1], &[], &[]));
        assert_eq!(f32s(&out.take()[0]), vec![1.0, 2.0]);
    }

    #[test]
    fn a_row_sparse_pull_of_more_rows_than_the_table_is_refused() {
        let (mut s, out) = (server(1, true), Rec::default());
        // key 9: a table of 2 rows of 2 float32 values
        let rows: Vec<u8> = bytemuck::cast_slice(&[1f32, 2.0, 3.0, 4.0]).to_vec();
        handle(
            &mut s,
            &out,
            req(0, 0, 1, true, false, &[9, 9, 10], &rows, &[0, 8, 8]),
        );
        assert!(reply_error(&out.take()[0]).is_none());
        // duplicates within the table's row count are served (MXNet's workers
        // may send them)
        handle(
            &mut s,
            &out,
            req(0, 1, 1, false, true, &[9, 10, 10], &[], &[]),
        );
        let r = out.take();
        assert!(reply_error(&r[0]).is_none());
        assert_eq!(f32s(&r[0]), vec![3.0, 4.0, 3.0, 4.0]);
        // three rows of a 2-row table: refused before anything is gathered
        // (100,000 copies of a 1 MB row aborted the server)
        handle(
            &mut s,
            &out,
            req(0, 2, 1, false, true, &[9, 9, 9, 9], &[], &[]),
        );
        let r = out.take();
        let e = reply_error(&r[0]).expect("an error reply");
        assert_eq!(
            e.message(),
            "key 9: a row_sparse pull of 3 rows from a table of 2 rows on server 0 was refused (the reply would exceed the stored value)"
        );
        assert!(r[0].data.is_empty());
        // the server still serves
        handle(
            &mut s,
            &out,
            req(0, 3, 1, false, true, &[9, 9, 10], &[], &[]),
        );
        assert_eq!(f32s(&out.take()[0]), vec![1.0, 2.0, 3.0, 4.0]);
    }

    /// This process's peak resident set since the last reset, in bytes
    /// (`None` where /proc cannot reset it).
    fn reset_peak_rss() -> Option<()> {
        std::fs::write("/proc/self/clear_refs", "5").ok()
    }

    fn peak_rss() -> u64 {
        let s = std::fs::read_to_string("/proc/self/status").unwrap();
        let l = s.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
        l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
    }

    #[test]
    fn a_compressed_push_claiming_more_values_than_the_key_is_refused_before_allocating() {
        let (mut s, out) = (server(1, true), Rec::default());
        let cmd = Message {
            head: Command::SetGradientCompression.head(),
            request: true,
            simple_app: true,
            timestamp: 0,
            sender: 9,
            body: b"2,0.5".to_vec(), // 1-bit, threshold 0.5
            ..Message::default()
        };
        handle(&mut s, &out, cmd);
        handle(&mut s, &out, push_f32(0, 1, 3, &[1.0; 4], false));
        assert!(out.take().iter().all(|m| reply_error(m).is_none()));
        let compressed = command_type(RequestType::Compressed, 0);
        // keys[0] claims 2^29 values of key 3 (4 stored); the 64 MB of words
        // match the claim. The server made 2 x 2 GB of it before refusing.
        let n: u64 = 1 << 29;
        let words = vec![0xffu8; (n / 32 * 4) as usize];
        let push = req(
            0,
            2,
            compressed,
            true,
            false,
            &[n, 3],
            &words,
            &[0, words.len() as i32],
        );
        let measured = reset_peak_rss().is_some();
        let before = peak_rss();
        handle(&mut s, &out, push);
        let grown = peak_rss().saturating_sub(before);
        let r = out.take();
        let e = reply_error(&r[0]).expect("an error reply");
        assert_eq!(
            e.message(),
            "The value size cannot be changed 2147483648. Key is 3 (a compressed push of 536870912 values; server 0 holds 4 values of it)"
        );
        if measured {
            assert!(
                grown < 1 << 30,
                "the refusal grew the peak RSS by {grown} bytes"
            );
        } else {
            eprintln!("(peak RSS not measured: /proc/self/clear_refs is not writable)");
        }
        // a key not stored: at most what a push can carry (2^31-1 bytes)
        let e = {
            handle(
                &mut s,
                &out,
                req(
                    0,
                    3,
                    compressed,
                    true,
                    false,
                    &[1 << 30, 5],
                    &[0; 4],
                    &[0, 4],
                ),
            );
            reply_error(&out.take()[0]).expect("an error reply")
        };
        assert_eq!(
            e.message(),
            "key 5: a compressed push claiming 1073741824 values was refused: more than a push can carry (2147483647 bytes)"
        );
        // a matching compressed push is still taken (1-bit: set bits are +1,
        // the sum is assigned)
        handle(
            &mut s,
            &out,
            req(0, 4, compressed, true, true, &[4, 3], &[0xff; 4], &[0, 4]),
        );
        let r = out.take();
        assert!(reply_error(&r[0]).is_none());
        assert_eq!(f32s(&r[0]), vec![1.0; 4]);
    }

    fn command_from(sender: i32, ts: i32, cmd: Command, body: &[u8]) -> Message {
        Message {
            head: cmd.head(),
            request: true,
            simple_app: true,
            timestamp: ts,
            sender,
            body: body.to_vec(),
            ..Message::default()
        }
    }

    #[test]
    fn requests_from_outside_the_cluster_are_dropped() {
        let (mut s, out) = (server(2, true), Rec::default());
        let push = |s: &mut KvServer, sender: i32, ts: i32, v: f32| {
            let mut m = push_f32(0, ts, 3, &[v; 2], true);
            m.sender = sender;
            handle(s, &out, m);
        };
        push(&mut s, 9, 0, 0.0);
        assert_eq!(out.take().len(), 1, "init answered");
        // a round of key 3: worker 0, a peer with id 13 (no such worker in a
        // 2-worker cluster), the scheduler, a peer without an identity, worker 1
        push(&mut s, 9, 1, 1.0);
        for (i, id) in [13, 1, EMPTY, 8, 10].into_iter().enumerate() {
            push(&mut s, id, 2 + i as i32, 100.0);
        }
        assert!(out.take().is_empty(), "nothing answered, the round waits");
        assert_eq!(s.running_rounds(), vec![(3, vec![0])]);
        push(&mut s, 11, 9, 2.0);
        let r = out.take();
        assert_eq!(r.iter().map(|m| m.recver).collect::<Vec<_>>(), vec![9, 11]);
        assert_eq!(f32s(&r[0]), vec![3.0; 2]);
        assert_eq!(f32s(&r[1]), vec![3.0; 2]);
        // commands from outside: dropped, unanswered, without effect
        let body = b"2,0.5";
        for id in [13, 1, EMPTY] {
            for (cmd, b) in [
                (Command::SetGradientCompression, &body[..]),
                (Command::StopServer, b""),
                (Command::Controller, b"x"),
                (Command::SyncMode, b""),
            ] {
                let mut called = false;
                let mut controller = |_: i32, _: &[u8]| -> Result<()> {
                    called = true;
                    Ok(())
                };
                let flow = s.handle(command_from(id, 10, cmd, b), &out, &mut controller);
                assert_eq!(flow, Flow::Continue, "{cmd:?} from {id}");
                assert!(!called, "the controller ran for {id}");
            }
        }
        assert!(out.take().is_empty());
        assert_eq!(s.compression, None);
        assert_eq!(s.foreign_dropped(), 5 + 12);
        // any worker may send commands (MXNet's server takes them from any)
        let mut ok = |_: i32, _: &[u8]| -> Result<()> { Ok(()) };
        let flow = s.handle(
            command_from(11, 11, Command::Controller, b"x"),
            &out,
            &mut ok,
        );
        assert_eq!(flow, Flow::Continue);
        assert!(reply_error(&out.take()[0]).is_none());
        let flow = s.handle(
            command_from(11, 12, Command::SetGradientCompression, body),
            &out,
            &mut ok,
        );
        assert_eq!(flow, Flow::Continue);
        assert!(reply_error(&out.take()[0]).is_none());
        assert!(s.compression.is_some());
        // worker 0 stops the server
        let flow = s.handle(command_from(9, 13, Command::StopServer, b""), &out, &mut ok);
        assert_eq!(flow, Flow::Stop);
        assert!(reply_error(&out.take()[0]).is_none());
    }

    #[test]
    fn a_lost_worker_fails_sync_rounds_a_lost_scheduler_does_not() {
        let (mut s, out) = (server(2, true), Rec::default());
        handle(&mut s, &out, push_f32(0, 0, 4, &[1.0], false));
        handle(&mut s, &out, push_f32(0, 1, 4, &[1.0], false));
        out.take();
        s.on_peer_lost(1, &Error::peer_lost("the scheduler (id 1) is gone"), &out);
        assert!(out.take().is_empty(), "the round still waits for worker 1");
        s.on_peer_lost(11, &Error::peer_lost("worker 1 (id 11) is gone"), &out);
        let r = out.take();
        assert_eq!(r.len(), 1);
        let e = reply_error(&r[0]).unwrap();
        assert_eq!(
            (e.kind(), e.message()),
            (ErrorKind::PeerLost, "worker 1 (id 11) is gone")
        );
        // later pushes fail at once, pulls are served
        handle(&mut s, &out, push_f32(0, 2, 4, &[1.0], false));
        let e = reply_error(&out.take()[0]).unwrap();
        assert!(
            e.message()
                .contains("cannot complete: worker 1 (id 11) is gone"),
            "{e}"
        );
        handle(&mut s, &out, req(0, 3, 0, false, true, &[4], &[], &[]));
        assert_eq!(f32s(&out.take()[0]), vec![1.0]);
    }

    #[test]
    fn stop_fails_a_running_round_and_ends_the_loop() {
        let (mut s, out) = (server(2, true), Rec::default());
        handle(&mut s, &out, push_f32(0, 0, 4, &[1.0], false));
        handle(&mut s, &out, push_f32(0, 1, 4, &[1.0], false));
        out.take();
        assert_eq!(s.running_rounds(), vec![(4, vec![0])]);
        let stop = Message {
            head: Command::StopServer.head(),
            request: true,
            simple_app: true,
            timestamp: 2,
            sender: 9,
            ..Message::default()
        };
        assert_eq!(s.handle(stop, &out, &mut no_controller), Flow::Stop);
        let r = out.take();
        assert_eq!(r.len(), 2);
        assert!(reply_error(&r[0]).unwrap().message().contains("stopped"));
        assert!(
            reply_error(&r[1]).is_none(),
            "kStopServer itself is answered"
        );
    }
}

//! The KV worker: MXNet 1.9.1's `KVStoreDist` request side
//! (`src/kvstore/kvstore_dist.h`) over ps-lite's `KVWorker`/`Customer`
//! (`include/ps/kv_app.h`, `src/customer.cc`), without any transport.
//!
//! A call turns `(key, NDArray)` pairs into ps keys ([`super::keys`]), cuts
//! each request by server ranges, sends one message per server through a
//! [`Transport`] with one timestamp per logical request (SimpleApp commands
//! draw from the same counter, as in ps-lite), and completes a request when
//! every server that got a slice answered ([`KvWorker::handle_response`] is
//! fed the responses by the transport). Pulls are assembled from the
//! responses sorted by their first key, as `KVWorker::AddPullCB` does.
//!
//! Ordering (what MXNet's engine guarantees): a push returns once its
//! messages are sent; a later pull, pushpull, row_sparse pull or push of the
//! same key first waits for that push to be answered. Pushes of one key
//! (push, pushpull and init alike) go out one at a time, whichever threads
//! make them: a push of a key waits until the key's previous push was
//! answered and no other thread is sending one (a *reservation*, taken with
//! that wait under one lock and given up once its request is registered),
//! so a sync server never counts two pushes of one worker in one round.
//! An error of a push is reported by the next call on that key or by
//! [`KvWorker::wait_all`].
//!
//! Every wait has a deadline ([`WorkerConfig::timeout`]); on expiry the call
//! fails with a timeout error naming the servers that did not answer, the
//! key and the timestamp.
#![forbid(unsafe_code)]

use super::keys::{command_type, slice, Command, KeyEncoder, Pskv, RequestType};
use super::kv::{
    copy_to_vec, i32_bytes, node_name, reply_error, server_id, u64_bytes, KvPairs, Transport,
};
use super::message::{Bytes, Message};
use crate::error::{Error, Result};
use crate::ndarray::dtype::DType;
use crate::ndarray::{kernels, Context, NDArray, Shape, StorageType};
use crate::store::compression::CompressionParams;
use crate::{bail, ensure};
use parking_lot::{Condvar, Mutex, MutexGuard, RwLock};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Who this worker is and how it talks to the servers.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub rank: usize,
    /// ps-lite customer id (0 for the first store of a process).
    pub customer_id: i32,
    pub num_servers: usize,
    /// `MXNET_KVSTORE_BIGARRAY_BOUND`.
    pub bigarray_bound: usize,
    /// Deadline of every wait.
    pub timeout: Duration,
}

/// What a request is, for error and timeout messages ("push of key 3"):
/// made into text only when a message needs it (a request costs no
/// allocation for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum What {
    Push(i32),
    Init(i32),
    PushPull(i32),
    Pull(i32),
    RowSparsePull(i32),
    /// A SimpleApp command, by head.
    Command(i32),
}

impl std::fmt::Display for What {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            What::Push(key) => write!(f, "push of key {key}"),
            What::Init(key) => write!(f, "init of key {key}"),
            What::PushPull(key) => write!(f, "pushpull of key {key}"),
            What::Pull(key) => write!(f, "pull of key {key}"),
            What::RowSparsePull(key) => write!(f, "row_sparse pull of key {key}"),
            What::Command(head) => match Command::from_head(head) {
                Some(c) => write!(f, "{c:?} command"),
                None => write!(f, "command {head}"),
            },
        }
    }
}

/// One outstanding request.
struct Req {
    /// Server ids that have not answered yet.
    waiting: Vec<i32>,
    replies: Vec<KvPairs>,
    error: Option<Error>,
    /// What the request was, for error and timeout messages.
    what: What,
    /// A push nobody waits for: removed when complete, its error kept per key.
    detached: Option<i32>,
    done: bool,
}

#[derive(Default)]
struct State {
    next_ts: i32,
    reqs: HashMap<i32, Req>,
    /// The timestamp of each key's latest push (push, pushpull or init).
    last_push: HashMap<i32, i32>,
    /// Keys a thread is about to push (see the module documentation).
    reserved: HashSet<i32>,
    /// Threads waiting for a key's push or reservation (tests watch it).
    #[cfg(test)]
    key_waiters: usize,
    /// Errors of pushes nobody waited for, by key.
    push_errors: HashMap<i32, Error>,
    /// Set once a server is lost: every later request fails at once.
    lost: Option<Error>,
}

/// The KV worker of one store on one worker node.
pub struct KvWorker {
    cfg: WorkerConfig,
    transport: Arc<dyn Transport>,
    enc: Mutex<KeyEncoder>,
    st: Mutex<State>,
    cv: Condvar,
    /// Bumped whenever a request completes or fails, before `cv` is
    /// notified: what a waiter watches while it spins.
    events: AtomicU64,
    /// The gradient compression setting. Every push, pushpull and init
    /// reads it once and goes with what it read; a push holds it from its
    /// encoding until its messages are sent, and rank 0's switch
    /// ([`KvWorker::set_gradient_compression`]) holds it while it tells the
    /// servers, so that no server decodes a push with a setting it was not
    /// encoded with.
    compression: RwLock<Option<CompressionParams>>,
    /// Quantization residuals of compressed keys.
    residuals: Mutex<HashMap<i32, Vec<f32>>>,
}

/// The values of a push: bytes made for it, or a dense array, whose bytes
/// are lent to the transport when they can be ([`NDArray::share`]) and else
/// copied straight into the outgoing frames ([`Transport::send_copying`]).
enum Vals<'a> {
    Owned(Vec<u8>),
    Array(&'a NDArray),
}

impl Vals<'_> {
    fn len(&self) -> usize {
        match self {
            Vals::Owned(v) => v.len(),
            Vals::Array(a) => a.size() * a.dtype().size(),
        }
    }
}

/// What [`KvWorker::encode_push`] makes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// A push: compressed when compression is on; a row_sparse value's rows.
    Push,
    /// The first push (`Init` on rank 0): uncompressed (with the compressed
    /// keys' server layout); a row_sparse value with every row.
    Init,
    /// An init's checks and layout, no bytes.
    Check,
}

/// A message of a request; `copy`: the range of the request's values its
/// vals part (data part 1) gets when it is sent.
struct Outgoing {
    msg: Message,
    copy: Option<std::ops::Range<usize>>,
}

/// A pull sent: its timestamp, key, layout and output.
type Pull<'a> = (i32, i32, Pskv, Dest<'a>);

/// One output of a pull: the array the bytes go to.
enum Dest<'a> {
    Dense(&'a NDArray),
    RowSparse(&'a NDArray, &'a [i64]),
}

/// A key reserved for a push by one thread ([`KvWorker::reserve`]).
struct Reservation<'a> {
    w: &'a KvWorker,
    key: i32,
    /// False once the push's request took over ([`KvWorker::issue`]).
    held: bool,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if self.held {
            self.w.st.lock().reserved.remove(&self.key);
            self.w.notify();
        }
    }
}

impl KvWorker {
    pub fn new(cfg: WorkerConfig, transport: Arc<dyn Transport>) -> KvWorker {
        let enc = KeyEncoder::new(cfg.num_servers, cfg.bigarray_bound);
        KvWorker {
            cfg,
            transport,
            enc: Mutex::new(enc),
            st: Mutex::new(State::default()),
            cv: Condvar::new(),
            events: AtomicU64::new(0),
            compression: RwLock::new(None),
            residuals: Mutex::new(HashMap::new()),
        }
    }

    pub fn config(&self) -> &WorkerConfig {
        &self.cfg
    }

    /// Turns gradient compression on (or off) for later pushes and pulls,
    /// without telling the servers (what ranks other than 0 do).
    pub fn set_compression(&self, params: Option<CompressionParams>) {
        *self.compression.write() = params;
    }

    /// Rank 0's `SetGradientCompression`: sends `kSetGradientCompression`
    /// to every server, then turns compression on here. Pushes wait
    /// meanwhile; one encoded with the previous setting is sent first.
    pub fn set_gradient_compression(&self, params: CompressionParams) -> Result<()> {
        let mut setting = self.compression.write();
        self.command(
            Command::SetGradientCompression.head(),
            params.encode().as_bytes(),
        )?;
        *setting = Some(params);
        Ok(())
    }

    pub fn compression(&self) -> Option<CompressionParams> {
        *self.compression.read()
    }

    // ------------------------------------------------------------------
    // Responses and failures (called by the transport's receive side)

    /// Takes a response (KV or SimpleApp) addressed to this worker's
    /// customer. Unknown timestamps (a request that timed out) and
    /// unexpected senders are ignored.
    pub fn handle_response(&self, msg: Message) {
        if msg.request {
            return;
        }
        let mut st = self.st.lock();
        let ts = msg.timestamp;
        let Some(req) = st.reqs.get_mut(&ts) else {
            return;
        };
        let Some(pos) = req.waiting.iter().position(|&s| s == msg.sender) else {
            return;
        };
        req.waiting.swap_remove(pos);
        if let Some(e) = reply_error(&msg) {
            req.error.get_or_insert(Error::with_kind(
                e.kind(),
                format!("{}: {}", node_name(msg.sender), e.message()),
            ));
        } else if msg.pull && !msg.simple_app {
            match KvPairs::from_parts(&msg.data) {
                Ok(kv) if !kv.keys.is_empty() => req.replies.push(kv),
                Ok(_) => {
                    req.error.get_or_insert(Error::protocol(format!(
                        "{} answered the {} without data",
                        node_name(msg.sender),
                        req.what
                    )));
                }
                Err(e) => {
                    req.error.get_or_insert(e);
                }
            }
        }
        if req.waiting.is_empty() {
            if let Some(key) = req.detached {
                let req = st.reqs.remove(&ts).expect("present");
                if let Some(e) = req.error {
                    st.push_errors.insert(key, e);
                }
            } else {
                req.done = true;
            }
            self.notify();
        }
    }

    /// Fails the requests waiting for node `id` (all requests when `None`)
    /// with `err`; when a server is lost, every later request fails at once.
    pub fn fail_peer(&self, id: Option<i32>, err: &Error) {
        let mut st = self.st.lock();
        let affected: Vec<i32> = st
            .reqs
            .iter()
            .filter(|(_, r)| id.map_or(true, |id| r.waiting.contains(&id)))
            .map(|(ts, _)| *ts)
            .collect();
        for ts in affected {
            let req = st.reqs.get_mut(&ts).expect("present");
            req.waiting.clear();
            req.error.get_or_insert(err.clone());
            if let Some(key) = req.detached {
                let req = st.reqs.remove(&ts).expect("present");
                st.push_errors.insert(key, req.error.expect("set"));
            } else {
                req.done = true;
            }
        }
        if id.map_or(true, |id| id >= 8 && id % 2 == 0) {
            st.lost.get_or_insert(err.clone());
        }
        self.notify();
    }

    // ------------------------------------------------------------------
    // Sending and waiting

    fn servers(&self) -> Vec<std::ops::Range<u64>> {
        self.enc.lock().ranges().to_vec()
    }

    /// Registers a request under a new timestamp, stamps `msgs` with it and
    /// sends them (the lock is not held while sending: an in-process
    /// transport may answer at once).
    /// `push`: the reservation of the key a push, pushpull or init sends (its
    /// request becomes the key's latest push).
    fn issue(
        &self,
        what: What,
        detached: Option<i32>,
        push: Option<&mut Reservation<'_>>,
        mut msgs: Vec<Outgoing>,
        src: Option<Vals<'_>>,
    ) -> Result<i32> {
        let ts = {
            let mut st = self.st.lock();
            if let Some(e) = &st.lost {
                return Err(e.clone());
            }
            let ts = st.next_ts;
            st.next_ts = st.next_ts.wrapping_add(1).max(0);
            st.reqs.insert(
                ts,
                Req {
                    waiting: msgs.iter().map(|m| m.msg.recver).collect(),
                    replies: Vec::new(),
                    error: None,
                    what,
                    detached,
                    done: false,
                },
            );
            if let Some(r) = push {
                st.last_push.insert(r.key, ts);
                st.reserved.remove(&r.key);
                r.held = false;
            }
            ts
        };
        for m in &mut msgs {
            m.msg.timestamp = ts;
        }
        // A large array's bytes go out without a copy (its next write goes
        // to other memory); else they are read (and the array is kept from
        // writers) while copied into the frames.
        let shared = match &src {
            Some(Vals::Array(a)) => a.share(),
            _ => None,
        };
        let guard;
        let src: &[u8] = match &src {
            Some(Vals::Array(a)) if shared.is_none() => {
                guard = a.read();
                guard.bytes()
            }
            Some(Vals::Owned(v)) => v,
            _ => &[],
        };
        for Outgoing { msg: mut m, copy } in msgs {
            let to = m.recver;
            let sent = match (copy, &shared) {
                (Some(r), Some(b)) => {
                    m.data[1] = b.slice(r);
                    self.transport.send(m)
                }
                (Some(r), None) => self.transport.send_copying(m, 1, &src[r]),
                (None, _) => self.transport.send(m),
            };
            if let Err(e) = sent {
                self.st.lock().reqs.remove(&ts);
                self.notify();
                return Err(Error::with_kind(
                    e.kind(),
                    format!(
                        "worker {}: sending to {} failed: {}",
                        self.cfg.rank,
                        node_name(to),
                        e.message()
                    ),
                ));
            }
        }
        Ok(ts)
    }

    fn timeout_error(&self, req: &Req, ts: i32) -> Error {
        let who: Vec<String> = req.waiting.iter().map(|&id| node_name(id)).collect();
        Error::timeout(format!(
            "worker {}: no answer from {} to the {} (timestamp {ts}) within {:.0?}",
            self.cfg.rank,
            who.join(", "),
            req.what,
            self.cfg.timeout
        ))
    }

    /// Wakes the waiters (after a change to `st`).
    fn notify(&self) {
        self.events.fetch_add(1, Ordering::AcqRel);
        self.cv.notify_all();
    }

    /// Waits for the next completion or the deadline; true when the deadline
    /// passed. The first call of a wait (`*fresh`) only watches
    /// [`Self::events`] for up to [`super::spin::SPIN`] (not at all while
    /// the machine is busy: see [`super::spin`]), without the lock, and
    /// returns so that the caller checks its state again under the lock.
    /// Later calls sleep on the condition variable, the caller having held
    /// the lock since its check.
    fn sleep(&self, st: &mut MutexGuard<'_, State>, deadline: Instant, fresh: &mut bool) -> bool {
        if !std::mem::take(fresh) {
            // (a transport read by the waiting threads themselves has
            // another thread read while this one sleeps)
            self.transport.sleeping(true);
            let timed_out = self.cv.wait_until(st, deadline).timed_out();
            self.transport.sleeping(false);
            return timed_out;
        }
        let seen = self.events.load(Ordering::Acquire);
        MutexGuard::unlocked(st, || {
            self.transport
                .watch(&mut || self.events.load(Ordering::Acquire) != seen);
        });
        Instant::now() >= deadline
    }

    /// Waits until request `ts` completed and returns it.
    fn wait(&self, ts: i32) -> Result<Req> {
        self.wait_until(ts, Instant::now() + self.cfg.timeout)
    }

    /// [`Self::wait`] with a deadline shared by several requests of one call.
    fn wait_until(&self, ts: i32, deadline: Instant) -> Result<Req> {
        let mut st = self.st.lock();
        let mut fresh = true;
        loop {
            match st.reqs.get(&ts) {
                None => bail!("internal: request {ts} vanished"),
                Some(r) if r.done => {
                    let r = st.reqs.remove(&ts).expect("present");
                    return match r.error {
                        Some(e) => Err(e),
                        None => Ok(r),
                    };
                }
                Some(_) => {}
            }
            if self.sleep(&mut st, deadline, &mut fresh) {
                let mut r = st.reqs.remove(&ts).expect("present");
                if r.done {
                    return match r.error.take() {
                        Some(e) => Err(e),
                        None => Ok(r),
                    };
                }
                return Err(self.timeout_error(&r, ts));
            }
        }
    }

    /// Waits until the latest push of `key` completed; returns (and clears)
    /// its error.
    fn wait_push(&self, key: i32) -> Result<()> {
        self.wait_push_until(key, Instant::now() + self.cfg.timeout)
    }

    fn wait_push_until(&self, key: i32, deadline: Instant) -> Result<()> {
        self.wait_key(key, deadline, false)
    }

    /// [`Self::wait_push`], then reserves `key` for a push by this thread:
    /// waits until no other thread holds its reservation either, so that
    /// pushes of one key go out one at a time (see the module
    /// documentation). The reservation ends when the push's request is
    /// registered ([`Self::issue`]) or when it is dropped.
    fn reserve(&self, key: i32) -> Result<Reservation<'_>> {
        self.wait_key(key, Instant::now() + self.cfg.timeout, true)?;
        Ok(Reservation {
            w: self,
            key,
            held: true,
        })
    }

    /// Waits until the latest push of `key` completed (and, with `reserve`,
    /// until no thread holds the key's reservation, then takes it); returns
    /// (and clears) that push's error, without reserving.
    fn wait_key(&self, key: i32, deadline: Instant, reserve: bool) -> Result<()> {
        let mut st = self.st.lock();
        let mut fresh = true;
        let mut late = false;
        loop {
            let pending = st
                .last_push
                .get(&key)
                .filter(|ts| st.reqs.get(ts).is_some_and(|r| !r.done))
                .copied();
            if pending.is_none() && !(reserve && st.reserved.contains(&key)) {
                break;
            }
            if late {
                return Err(match pending {
                    Some(ts) => {
                        let err = self.timeout_error(&st.reqs[&ts], ts);
                        // a push nobody else waits for is given up here (a
                        // pushpull's or an init's caller gives up its own)
                        if st.reqs[&ts].detached.is_some() {
                            st.reqs.remove(&ts);
                        }
                        err
                    }
                    None => Error::timeout(format!(
                        "worker {}: a push of key {key} by another thread was not sent within {:.0?}",
                        self.cfg.rank, self.cfg.timeout
                    )),
                });
            }
            #[cfg(test)]
            {
                st.key_waiters += 1;
            }
            late = self.sleep(&mut st, deadline, &mut fresh);
            #[cfg(test)]
            {
                st.key_waiters -= 1;
            }
        }
        st.last_push.remove(&key);
        if let Some(e) = st.push_errors.remove(&key) {
            // reported by a later call: say whose error it is
            return Err(Error::with_kind(
                e.kind(),
                format!(
                    "an earlier push of key {key} failed (reported by the next call on the key): {}",
                    e.message()
                ),
            ));
        }
        if reserve {
            st.reserved.insert(key);
        }
        Ok(())
    }

    /// Waits for every push sent so far; returns the first error of any.
    pub fn wait_all(&self) -> Result<()> {
        let keys: Vec<i32> = {
            let st = self.st.lock();
            let mut k: Vec<i32> = st
                .last_push
                .keys()
                .chain(st.push_errors.keys())
                .copied()
                .collect();
            k.sort_unstable();
            k.dedup();
            k
        };
        // one deadline for all of them
        let deadline = Instant::now() + self.cfg.timeout;
        let mut first = None;
        for k in keys {
            if let Err(e) = self.wait_push_until(k, deadline) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Builds one KV message per server slice of `pskv` (values `vals`;
    /// `None` for a pull, which sends `[keys, empty]` and no lens), and the
    /// values its messages copy from when sent. Bytes made for the request
    /// and going to one server are handed over whole (no copy); an array's
    /// bytes, or a split value, are copied once, each slice into its frame.
    fn kv_messages<'a>(
        &self,
        cmd: i32,
        push: bool,
        pull: bool,
        pskv: &Pskv,
        vals: Option<Vals<'a>>,
    ) -> Result<(Vec<Outgoing>, Option<Vals<'a>>)> {
        let ranges = self.servers();
        let slices = match &vals {
            Some(v) => slice(&pskv.keys, Some(&pskv.lens), v.len(), &ranges)?,
            None => slice(&pskv.keys, None, 0, &ranges)?,
        };
        let mut vals = vals;
        let mut whole = match vals.take() {
            Some(Vals::Owned(v)) if slices.len() == 1 => Some(Bytes::from(v)),
            v => {
                vals = v;
                None
            }
        };
        let mut msgs = Vec::with_capacity(slices.len());
        for s in slices {
            let keys = u64_bytes(&pskv.keys[s.keys.clone()]);
            let mut copy = None;
            let data = match (&vals, whole.take()) {
                (_, Some(all)) => vec![keys, all, i32_bytes(&pskv.lens[s.keys.clone()])],
                (Some(_), None) => {
                    copy = Some(s.vals.clone());
                    vec![keys, Bytes::new(), i32_bytes(&pskv.lens[s.keys.clone()])]
                }
                (None, None) => vec![keys, Bytes::new()],
            };
            let msg = Message {
                head: cmd,
                request: true,
                push,
                pull,
                app_id: 0,
                customer_id: self.cfg.customer_id,
                recver: server_id(s.server),
                data,
                ..Message::default()
            };
            msgs.push(Outgoing { msg, copy });
        }
        Ok((msgs, vals))
    }

    /// Sends a SimpleApp command to every server (in server order) and waits
    /// for all answers (`SimpleApp::Request` + `Wait`).
    pub fn command(&self, head: i32, body: &[u8]) -> Result<()> {
        let msgs = (0..self.cfg.num_servers)
            .map(|r| Outgoing {
                msg: Message {
                    head,
                    body: body.to_vec(),
                    request: true,
                    simple_app: true,
                    app_id: 0,
                    customer_id: self.cfg.customer_id,
                    recver: server_id(r),
                    ..Message::default()
                },
                copy: None,
            })
            .collect();
        let ts = self.issue(What::Command(head), None, None, msgs, None)?;
        self.wait(ts).map(|_| ())
    }

    // ------------------------------------------------------------------
    // Push

    /// The ps layout (recorded in `enc`), command and bytes of a push of
    /// `value` to `key`, with every check a push or an init makes: the one
    /// place those checks live ([`Self::check_init`] runs them on a scratch
    /// encoder). `compression`: the setting the push goes with.
    fn encode_push<'a>(
        &self,
        enc: &Mutex<KeyEncoder>,
        key: i32,
        value: &'a NDArray,
        mode: Mode,
        compression: Option<CompressionParams>,
    ) -> Result<(Pskv, i32, Vals<'a>)> {
        let dtype = value.dtype();
        check_float(key, dtype)?;
        let n = value.size();
        ensure!(
            n > 0,
            "key {key}: a value of shape {} holds no elements and cannot be stored in a distributed store (MXNet cannot create such an array: shape inference fails on a zero dimension)",
            value.shape()
        );
        match value.stype() {
            StorageType::Default => match compression {
                None => {
                    let p = enc.lock().encode_default(key, n, dtype.size())?;
                    let cmd = command_type(RequestType::Default, dtype.code());
                    Ok((p, cmd, Vals::Array(value)))
                }
                Some(c) => {
                    ensure!(
                        dtype == DType::F32,
                        "Gradient compression is only supported for float32 type of parameters (key {key} is {})",
                        dtype.name()
                    );
                    let factor = c.kind.values_per_word();
                    // an init goes uncompressed, with the pull layout (built
                    // and checked together with the push layout)
                    let push = mode == Mode::Push;
                    let p = enc.lock().encode_compressed(key, n, push, 4, factor)?;
                    if !push {
                        return Ok((p, command_type(RequestType::Default, 0), Vals::Array(value)));
                    }
                    let grad: Vec<f32> = bytemuck::pod_collect_to_vec(value.read().bytes());
                    let mut words = vec![0u32; c.compressed_len(n)];
                    {
                        let mut res = self.residuals.lock();
                        let r = res.entry(key).or_insert_with(|| vec![0f32; n]);
                        ensure!(
                            r.len() == n,
                            "The value size can't be changed. For key {key}"
                        );
                        c.quantize(&grad, r, &mut words);
                    }
                    let wb: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
                    Ok((p, command_type(RequestType::Compressed, 0), Vals::Owned(wb)))
                }
            },
            StorageType::RowSparse => {
                ensure!(
                    compression.is_none(),
                    "Gradient compression for row sparse storage type is not supported (key {key})"
                );
                value.check_row_sparse()?;
                let total = value.shape().dims()[0];
                let (rows, bytes) = match mode {
                    Mode::Push => {
                        let p = value.parts()?;
                        let b = copy_to_vec(p.data.read().bytes());
                        (value.rsp_indices()?, b)
                    }
                    Mode::Init => {
                        // every row, so that each server's table is whole
                        let dense = NDArray::zeros(value.shape().clone(), dtype, Context::CPU0)?;
                        dense.copy_from(value)?;
                        let b = copy_to_vec(dense.read().bytes());
                        ((0..total).collect(), b)
                    }
                    // the first and the last row: the key's servers and the
                    // largest row offset of an init's layout
                    Mode::Check if total > 1 => (vec![0, total - 1], Vec::new()),
                    Mode::Check => (vec![0], Vec::new()),
                };
                let p = enc.lock().encode_row_sparse(
                    key,
                    &rows,
                    value.row_len(),
                    total as usize,
                    dtype.size(),
                )?;
                let cmd = command_type(RequestType::RowSparse, dtype.code());
                Ok((p, cmd, Vals::Owned(bytes)))
            }
            _ => bail!(
                "key {key}: only dense and row_sparse values can be pushed to a distributed store"
            ),
        }
    }

    /// Pushes one value per key (already reduced over devices). Returns once
    /// the messages are sent; see the module documentation for ordering.
    pub fn push(&self, items: &[(i32, &NDArray)]) -> Result<()> {
        for &(key, value) in items {
            let mut reserved = self.reserve(key)?;
            // held until sent (see `compression`)
            let compression = self.compression.read();
            let (pskv, cmd, vals) =
                self.encode_push(&self.enc, key, value, Mode::Push, *compression)?;
            let (msgs, src) = self.kv_messages(cmd, true, false, &pskv, Some(vals))?;
            #[cfg(test)]
            tests::hook(self);
            self.issue(What::Push(key), Some(key), Some(&mut reserved), msgs, src)?;
        }
        Ok(())
    }

    /// Checks, without sending or remembering anything, that [`Self::init`]
    /// can encode `items`: [`Self::encode_push`]'s checks (float dtypes,
    /// values holding elements, storage types, each key's server placement
    /// and byte layout) on a scratch encoder.
    /// Every rank calls it before its init barrier, so that what only
    /// rank 0 encodes and sends fails on every rank alike. `compression`:
    /// the setting the init goes with ([`Self::compression`]).
    pub fn check_init(
        &self,
        items: &[(i32, &NDArray)],
        compression: Option<CompressionParams>,
    ) -> Result<()> {
        let scratch = Mutex::new(KeyEncoder::new(
            self.cfg.num_servers,
            self.cfg.bigarray_bound,
        ));
        for &(key, value) in items {
            self.encode_push(&scratch, key, value, Mode::Check, compression)?;
        }
        Ok(())
    }

    /// The first push of each key (`Init` on rank 0): sent uncompressed
    /// (with the compressed keys' server layout), row_sparse values with
    /// every row; waits until every server stored it. Nothing is sent when
    /// [`Self::check_init`] refuses any of `items`.
    pub fn init(&self, items: &[(i32, &NDArray)]) -> Result<()> {
        // read once: checked and sent with the same setting
        let compression = self.compression();
        self.check_init(items, compression)?;
        #[cfg(test)]
        tests::hook(self);
        let mut sent = Vec::new();
        let mut first = None;
        for &(key, value) in items {
            let issued = self.reserve(key).and_then(|mut reserved| {
                let (pskv, cmd, vals) =
                    self.encode_push(&self.enc, key, value, Mode::Init, compression)?;
                let (msgs, src) = self.kv_messages(cmd, true, false, &pskv, Some(vals))?;
                self.issue(What::Init(key), None, Some(&mut reserved), msgs, src)
            });
            match issued {
                Ok(ts) => sent.push(ts),
                Err(e) => {
                    // the keys already sent are still waited for
                    first = Some(e);
                    break;
                }
            }
        }
        let deadline = Instant::now() + self.cfg.timeout;
        for ts in sent {
            if let Err(e) = self.wait_until(ts, deadline) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    // ------------------------------------------------------------------
    // Pull

    /// Pulls each key into its dense output (the whole value).
    pub fn pull(&self, items: &[(i32, &NDArray)]) -> Result<()> {
        self.pulls(items, |&(key, out)| {
            self.wait_push(key)?;
            out.ensure_dense("pull into")?;
            let dtype = out.dtype();
            check_float(key, dtype)?;
            let n = out.size();
            let (pskv, cmd) = match self.compression() {
                None => (
                    self.enc.lock().encode_default(key, n, dtype.size())?,
                    command_type(RequestType::Default, dtype.code()),
                ),
                Some(c) => (
                    self.enc.lock().encode_compressed(
                        key,
                        n,
                        false,
                        dtype.size(),
                        c.kind.values_per_word(),
                    )?,
                    command_type(RequestType::Compressed, dtype.code()),
                ),
            };
            let ts = self.send_built(What::Pull(key), cmd, false, true, &pskv, None)?;
            Ok((ts, key, pskv, Dest::Dense(out)))
        })
    }

    /// Pushes `value` and pulls the result into `out` in one request per
    /// server (dense keys, no compression).
    pub fn push_pull(&self, items: &[(i32, &NDArray, &NDArray)]) -> Result<()> {
        self.pulls(items, |&(key, value, out)| {
            let mut reserved = self.reserve(key)?;
            // read once: checked and sent with the same setting
            let compression = self.compression();
            ensure!(
                compression.is_none(),
                "Compression not supported with PushPull (key {key})"
            );
            ensure!(
                value.stype() == StorageType::Default && out.stype() == StorageType::Default,
                "Expected push_stype and pull_stype of value to be kDefaultStorage (key {key})"
            );
            ensure!(
                value.dtype() == out.dtype(),
                "Output buffer dtype is different (key {key}: pushed {}, output {})",
                value.dtype().name(),
                out.dtype().name()
            );
            ensure!(
                value.size() == out.size(),
                "key {key}: pushed {} values, output holds {}",
                value.size(),
                out.size()
            );
            #[cfg(test)]
            tests::hook(self);
            let (pskv, cmd, vals) =
                self.encode_push(&self.enc, key, value, Mode::Push, compression)?;
            let (msgs, src) = self.kv_messages(cmd, true, true, &pskv, Some(vals))?;
            let ts = self.issue(What::PushPull(key), None, Some(&mut reserved), msgs, src)?;
            Ok((ts, key, pskv, Dest::Dense(out)))
        })
    }

    /// Pulls rows `row_ids` (sorted, unique, in range) of `key` into the
    /// row_sparse `out`.
    pub fn pull_row_sparse(&self, key: i32, out: &NDArray, row_ids: &[i64]) -> Result<()> {
        self.wait_push(key)?;
        ensure!(
            out.stype() == StorageType::RowSparse,
            "expected kRowSparseStorage output for row_sparse_pull of key {key}"
        );
        let dtype = out.dtype();
        check_float(key, dtype)?;
        let total = out.shape().dims()[0];
        ensure!(
            row_ids.windows(2).all(|w| w[0] < w[1])
                && row_ids.iter().all(|r| (0..total).contains(r)),
            "row ids of key {key} must be sorted, unique and in [0, {total})"
        );
        let pskv = self.enc.lock().encode_row_sparse(
            key,
            row_ids,
            out.row_len(),
            total as usize,
            dtype.size(),
        )?;
        let cmd = command_type(RequestType::RowSparse, dtype.code());
        let ts = self.send_built(What::RowSparsePull(key), cmd, false, true, &pskv, None)?;
        self.finish_pulls(vec![(ts, key, pskv, Dest::RowSparse(out, row_ids))])
    }

    fn send_built(
        &self,
        what: What,
        cmd: i32,
        push: bool,
        pull: bool,
        pskv: &Pskv,
        vals: Option<Vals<'_>>,
    ) -> Result<i32> {
        let (msgs, src) = self.kv_messages(cmd, push, pull, pskv, vals)?;
        self.issue(what, None, None, msgs, src)
    }

    /// Sends the pull (or pushpull) of each item (`issue`: its timestamp,
    /// key, layout and output), then waits for them and writes their values.
    /// When an item fails before its request went out, no later one is
    /// sent, and the requests already sent are still waited for and their
    /// outputs written (as MXNet's engine completes the keys it was given
    /// before a key's check failed), so that none is left behind; the
    /// item's error is returned.
    fn pulls<'a, T>(
        &self,
        items: &'a [T],
        mut issue: impl FnMut(&'a T) -> Result<Pull<'a>>,
    ) -> Result<()> {
        let mut sent = Vec::with_capacity(items.len());
        for item in items {
            match issue(item) {
                Ok(p) => sent.push(p),
                Err(e) => {
                    let _ = self.finish_pulls(sent);
                    return Err(e);
                }
            }
        }
        self.finish_pulls(sent)
    }

    /// Waits for pulls and writes their values (all are waited for; the
    /// first error is returned).
    fn finish_pulls(&self, sent: Vec<Pull<'_>>) -> Result<()> {
        let deadline = Instant::now() + self.cfg.timeout;
        let mut first = None;
        for (ts, key, pskv, dest) in sent {
            let r = self
                .wait_until(ts, deadline)
                .and_then(|req| assemble(key, &pskv, req.replies, dest));
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

fn check_float(key: i32, dtype: DType) -> Result<()> {
    match dtype {
        DType::F32 | DType::F64 | DType::F16 => Ok(()),
        other => Err(Error::usage(format!(
            "key {key}: the distributed store holds float16/32/64 values only, not {} (MXNet's server dies on them: This operation only support floating point types, not {})",
            other.name(),
            other.name()
        ))),
    }
}

/// `AddPullCB`'s callback: checks the responses against the requested keys,
/// sorts them by first key and writes their values into `dest`.
fn assemble(key: i32, pskv: &Pskv, mut replies: Vec<KvPairs>, dest: Dest<'_>) -> Result<()> {
    let mut total_keys = 0;
    for r in &replies {
        let first = r.keys[0];
        let start = pskv.keys.partition_point(|&k| k < first);
        let run = &pskv.keys[start..(start + r.keys.len()).min(pskv.keys.len())];
        if run != r.keys.as_slice() {
            return Err(Error::protocol(format!(
                "unmatched keys size from one server (pull of key {key})"
            )));
        }
        total_keys += r.keys.len();
    }
    if total_keys != pskv.keys.len() {
        return Err(Error::protocol(format!(
            "lost some servers? (pull of key {key}: {total_keys} of {} keys answered)",
            pskv.keys.len()
        )));
    }
    replies.sort_by_key(|r| r.keys[0]);
    let total: usize = replies.iter().map(|r| r.vals.len()).sum();
    match dest {
        Dest::Dense(out) => {
            let want = out.size() * out.dtype().size();
            ensure!(
                total == want,
                "pull of key {key}: the servers hold {total} bytes, the output {want} ({} x {})",
                out.size(),
                out.dtype().name()
            );
            if let [r] = &replies[..] {
                // one reply: its frame becomes the output without a copy
                // when it can (see NDArray::assign_bytes)
                return out.assign_bytes(r.vals.clone());
            }
            let mut g = out.write();
            let buf = g.overwrite();
            let mut pos = 0;
            for r in &replies {
                kernels::copy_bytes(&r.vals, &mut buf[pos..pos + r.vals.len()]);
                pos += r.vals.len();
            }
            Ok(())
        }
        Dest::RowSparse(out, rows) => {
            let rb = out.row_len() * out.dtype().size();
            ensure!(
                total == rows.len() * rb,
                "row_sparse pull of key {key}: the servers sent {total} bytes for {} rows of {rb} bytes",
                rows.len()
            );
            let mut bytes = Vec::with_capacity(total);
            for r in &replies {
                bytes.extend_from_slice(&r.vals);
            }
            let mut dims = out.shape().dims().to_vec();
            dims[0] = rows.len() as i64;
            let data = NDArray::from_bytes(Shape(dims), out.dtype(), out.ctx(), &bytes)?;
            let got = NDArray::row_sparse(out.shape().clone(), out.ctx(), data, rows)?;
            out.copy_from(&got)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::kv_cluster_tests::{Cluster, Opts};
    use super::KvWorker;
    use crate::error::ErrorKind;
    use crate::error::Result;
    use crate::ndarray::dtype::DType;
    use crate::ndarray::{Context, NDArray, Shape};
    use crate::store::compression::{CompressionKind, CompressionParams};
    use crate::test_util::f32s;
    use std::cell::RefCell;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{mpsc, Arc};
    use std::time::{Duration, Instant};

    /// An init refused for one of its keys sends none of them: a key whose
    /// value holds no elements is refused before key 1 goes out (it used to
    /// be stored on the server while the call failed).
    #[test]
    fn an_init_refused_for_one_key_sends_none() {
        let c = Cluster::start(Opts {
            workers: 1,
            servers: 3,
            ..Opts::default()
        });
        let w = &c.workers[0];
        let empty = NDArray::zeros(
            Shape(vec![3, 0]),
            crate::ndarray::dtype::DType::F32,
            Context::CPU0,
        )
        .unwrap();
        let e = w.init(&[(1, &f32s(&[5.0; 2])), (2, &empty)]).unwrap_err();
        assert!(e.message().contains("key 2"), "{e}");
        assert!(e.message().contains("holds no elements"), "{e}");
        let e = w.pull(&[(1, &f32s(&[0.0; 2]))]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotInited, "{e}");
        // a key MXNet's 32-bit key -> server mapping cannot place (with 3
        // servers) is refused the same way
        let e = w
            .init(&[(4, &f32s(&[5.0; 2])), (215330, &f32s(&[5.0; 2]))])
            .unwrap_err();
        assert!(e.message().contains("cannot be placed"), "{e}");
        let e = w.pull(&[(4, &f32s(&[0.0; 2]))]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotInited, "{e}");
        // the refused keys can be inited afterwards
        w.init(&[(1, &f32s(&[5.0; 2]))]).unwrap();
        let out = f32s(&[0.0; 2]);
        w.pull(&[(1, &out)]).unwrap();
        assert_eq!(out.to_f64_vec(), vec![5.0; 2]);
        c.stop();
    }

    /// An async server without an updater refuses a push; the next call on
    /// the key reports it, saying it is an earlier push's error.
    #[test]
    fn an_earlier_push_error_says_it_is_an_earlier_push() {
        let c = Cluster::start(Opts {
            workers: 1,
            servers: 1,
            sync: false,
            ..Opts::default()
        });
        let w = &c.workers[0];
        w.init(&[(3, &f32s(&[1.0; 4]))]).unwrap();
        w.push(&[(3, &f32s(&[1.0; 4]))]).unwrap();
        let e = w.pull(&[(3, &f32s(&[0.0; 4]))]).unwrap_err();
        assert!(
            e.message().contains("an earlier push of key 3 failed"),
            "{e}"
        );
        assert!(e.message().contains("Updater needs to be set"), "{e}");
        // reported once: the pull itself goes through now
        let out = f32s(&[0.0; 4]);
        w.pull(&[(3, &out)]).unwrap();
        assert_eq!(out.to_f64_vec(), vec![1.0; 4]);
        c.stop();
    }

    type Hook = Box<dyn FnOnce(&KvWorker)>;

    thread_local! {
        /// Run by the next push, pushpull or init on this thread once it
        /// read the compression setting (a push: encoded, not yet sent).
        static HOOK: RefCell<Option<Hook>> = const { RefCell::new(None) };
    }

    pub(super) fn hook(w: &KvWorker) {
        if let Some(f) = HOOK.with(|h| h.borrow_mut().take()) {
            f(w)
        }
    }

    fn set_hook(f: impl FnOnce(&KvWorker) + 'static) {
        HOOK.with(|h| *h.borrow_mut() = Some(Box::new(f)));
    }

    fn hook_ran() -> bool {
        HOOK.with(|h| h.borrow().is_none())
    }

    fn two_bit(threshold: f32) -> CompressionParams {
        CompressionParams {
            kind: CompressionKind::TwoBit,
            threshold,
        }
    }

    /// Compression switched on (by another thread) after an init or a
    /// pushpull read the setting reaches neither: each goes on as checked,
    /// the next is checked with compression. The setting used to be read
    /// again when encoding: the init of a float64 key was refused after its
    /// checks passed (with key 1 already sent), and the pushpull of 3 went
    /// out 2-bit compressed (the server stored 0.5, the call failed).
    #[test]
    fn compression_switched_on_during_an_init_or_a_pushpull_does_not_reach_it() {
        let c = Cluster::start(Opts {
            workers: 1,
            servers: 1,
            ..Opts::default()
        });
        let w = &c.workers[0];
        // the server can decode compressed pushes from here on
        w.set_gradient_compression(two_bit(0.5)).unwrap();
        w.set_compression(None);
        let switch_on = || set_hook(|w| w.set_compression(Some(two_bit(0.5))));
        let f64s = |v: f64| {
            NDArray::from_bytes(
                Shape(vec![4]),
                DType::F64,
                Context::CPU0,
                bytemuck::cast_slice(&[v; 4]),
            )
            .unwrap()
        };
        switch_on();
        w.init(&[(1, &f32s(&[0.0; 4])), (2, &f64s(2.0))]).unwrap();
        assert!(hook_ran());
        let e = w.init(&[(3, &f64s(1.0))]).unwrap_err();
        assert!(e.message().contains("only supported for float32"), "{e}");

        w.set_compression(None);
        switch_on();
        let out = f32s(&[0.0; 4]);
        w.push_pull(&[(1, &f32s(&[3.0; 4]), &out)]).unwrap();
        assert!(hook_ran());
        assert_eq!(out.to_f64_vec(), vec![3.0; 4]);
        let e = w.push_pull(&[(1, &f32s(&[3.0; 4]), &out)]).unwrap_err();
        assert!(e.message().contains("Compression not supported"), "{e}");

        w.set_compression(None);
        let out = f64s(0.0);
        w.pull(&[(2, &out)]).unwrap();
        assert_eq!(out.to_f64_vec(), vec![2.0; 4]);
        c.stop();
    }

    /// Rank 0's switch to a new compression setting waits for a push that
    /// was encoded with the old one until it is sent: the server decodes
    /// the push with the setting it was made with. A probe (one thread
    /// raising the threshold while another pushed) saw a push quantized with
    /// threshold 333 dequantized by the server with 334.
    #[test]
    fn a_push_is_sent_before_the_servers_hear_of_a_new_compression_setting() {
        let c = Cluster::start(Opts {
            workers: 1,
            servers: 1,
            ..Opts::default()
        });
        let w = c.workers[0].clone();
        w.set_gradient_compression(two_bit(1.0)).unwrap();
        w.init(&[(1, &f32s(&[0.0; 4]))]).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let other = w.clone();
        set_hook(move |w| {
            // encoded with threshold 1, not sent yet
            assert!(
                w.compression.try_write().is_none(),
                "the compression setting can change between a push's encoding and its sending"
            );
            let switch = std::thread::spawn(move || other.set_gradient_compression(two_bit(2.0)));
            tx.send(switch).unwrap();
        });
        w.push(&[(1, &f32s(&[5.0, -5.0, 0.5, 0.0]))]).unwrap();
        assert!(hook_ran());
        rx.recv().unwrap().join().unwrap().unwrap();
        assert_eq!(w.compression(), Some(two_bit(2.0)));
        let out = f32s(&[0.0; 4]);
        w.pull(&[(1, &out)]).unwrap();
        assert_eq!(out.to_f64_vec(), vec![1.0, -1.0, 0.0, 0.0]);
        c.stop();
    }

    /// Pushes of one key from two threads of one worker go to two sync
    /// rounds, whether push or pushpull: thread B's push starts while thread
    /// A's is encoded and not yet sent (the test hook) and must wait for A's
    /// round. Before, both passed the wait for the key's previous push
    /// (there was none yet; a pushpull never registered as one) and went out
    /// together: the server summed 1 + 2 of worker 0 as one round, and worker
    /// 1's push waited for a round that never completed.
    #[test]
    fn pushes_of_one_key_from_two_threads_go_to_two_rounds() {
        let c = Cluster::start(Opts {
            workers: 2,
            servers: 1,
            timeout: Duration::from_secs(5),
            round_timeout: Duration::from_secs(5),
            ..Opts::default()
        });
        let (w0, w1) = (c.workers[0].clone(), c.workers[1].clone());
        let push = |w: &KvWorker, key: i32, v: f32, pushpull: bool| -> Result<f64> {
            let out = f32s(&[0.0; 4]);
            if pushpull {
                w.push_pull(&[(key, &f32s(&[v; 4]), &out)])?;
            } else {
                w.push(&[(key, &f32s(&[v; 4]))])?;
                w.pull(&[(key, &out)])?;
            }
            Ok(out.to_f64_vec()[0])
        };
        let cases = [(false, false), (true, true), (false, true), (true, false)];
        for (key, (a_pp, b_pp)) in (3..).zip(cases) {
            w0.init(&[(key, &f32s(&[0.0; 4]))]).unwrap();
            let (tx, rx) = mpsc::channel();
            let b_w = w0.clone();
            let a_w = w0.clone();
            let a = std::thread::spawn(move || {
                set_hook(move |w| {
                    let b_done = Arc::new(AtomicBool::new(false));
                    let done = b_done.clone();
                    tx.send(std::thread::spawn(move || {
                        let r = push(&b_w, key, 2.0, b_pp);
                        done.store(true, Ordering::Release);
                        r
                    }))
                    .unwrap();
                    // until B waits for A's push (or, wrongly, got through)
                    let t0 = Instant::now();
                    while w.st.lock().key_waiters == 0
                        && !b_done.load(Ordering::Acquire)
                        && t0.elapsed() < Duration::from_secs(10)
                    {
                        std::thread::yield_now();
                    }
                });
                let r = push(&a_w, key, 1.0, a_pp);
                assert!(hook_ran());
                r
            });
            let first = push(&w1, key, 100.0, a_pp);
            let second = push(&w1, key, 200.0, b_pp);
            let b = rx.recv().unwrap();
            let (a, b) = (a.join().unwrap(), b.join().unwrap());
            let case = format!("key {key}: A pushpull {a_pp}, B pushpull {b_pp}");
            // one push of each worker per round: 1 + 100, then 2 + 200
            assert_eq!(first.map_err(|e| e.to_string()), Ok(101.0), "{case}");
            assert_eq!(second.map_err(|e| e.to_string()), Ok(202.0), "{case}");
            let a = a.map_err(|e| e.to_string());
            if a_pp {
                assert_eq!(a, Ok(101.0), "{case}");
            } else {
                // A's pull follows its round: before or after the next one
                assert!(a == Ok(101.0) || a == Ok(202.0), "{case}: {a:?}");
            }
            assert_eq!(b.map_err(|e| e.to_string()), Ok(202.0), "{case}");
        }
        c.stop();
    }

    /// A pull or pushpull of several keys that fails at one key (an
    /// earlier push's error reported, an output of another dtype) still
    /// waits for the requests of the keys before it, which went out, and
    /// writes their outputs: none is left behind. They stayed in the
    /// worker's table for good (with the values their answers brought), and
    /// the abandoned pushpull stayed its key's latest push.
    #[test]
    fn a_call_failing_at_a_later_key_leaves_no_request_behind() {
        // async, no updater: the server refuses pushes
        let c = Cluster::start(Opts {
            workers: 1,
            servers: 2,
            sync: false,
            ..Opts::default()
        });
        let w = &c.workers[0];
        w.init(&[(1, &f32s(&[1.0; 4])), (2, &f32s(&[2.0; 4]))])
            .unwrap();
        w.push(&[(2, &f32s(&[1.0; 4]))]).unwrap();
        let out = f32s(&[0.0; 4]);
        let e = w.pull(&[(1, &out), (2, &f32s(&[0.0; 4]))]).unwrap_err();
        assert!(e.message().contains("an earlier push of key 2"), "{e}");
        assert_eq!(w.st.lock().reqs.len(), 0, "a pull request was left behind");
        assert_eq!(out.to_f64_vec(), vec![1.0; 4]);
        c.stop();

        let c = Cluster::start(Opts {
            workers: 1,
            servers: 2,
            ..Opts::default()
        });
        let w = &c.workers[0];
        w.init(&[(1, &f32s(&[1.0; 4])), (2, &f32s(&[2.0; 4]))])
            .unwrap();
        let out = f32s(&[0.0; 4]);
        let f64_out = NDArray::zeros(Shape(vec![4]), DType::F64, Context::CPU0).unwrap();
        let e = w
            .push_pull(&[(1, &f32s(&[3.0; 4]), &out), (2, &f32s(&[3.0; 4]), &f64_out)])
            .unwrap_err();
        assert!(e.message().contains("dtype is different"), "{e}");
        assert_eq!(
            w.st.lock().reqs.len(),
            0,
            "a pushpull request was left behind"
        );
        assert_eq!(out.to_f64_vec(), vec![3.0; 4]);
        c.stop();
    }

    /// A request's description is made when a message needs it, with the
    /// words it had when every request made it at once.
    #[test]
    fn request_descriptions() {
        use super::What;
        let texts: Vec<String> = [
            What::Push(3),
            What::Init(-1),
            What::PushPull(7),
            What::Pull(8),
            What::RowSparsePull(9),
            What::Command(0),
            What::Command(4),
            What::Command(42),
        ]
        .iter()
        .map(|w| w.to_string())
        .collect();
        assert_eq!(
            texts,
            [
                "push of key 3",
                "init of key -1",
                "pushpull of key 7",
                "pull of key 8",
                "row_sparse pull of key 9",
                "Controller command",
                "SetGradientCompression command",
                "command 42"
            ]
        );
    }

    /// Answers every request at once, from the server it went to.
    struct Echo(std::sync::Mutex<std::sync::Weak<KvWorker>>);

    impl super::Transport for Echo {
        fn send(&self, m: super::Message) -> Result<()> {
            let w = self.0.lock().unwrap().upgrade().expect("worker alive");
            w.handle_response(super::Message {
                request: false,
                push: m.push,
                pull: m.pull,
                head: m.head,
                app_id: m.app_id,
                customer_id: m.customer_id,
                timestamp: m.timestamp,
                sender: m.recver,
                recver: 9,
                ..super::Message::default()
            });
            Ok(())
        }
    }

    /// Not a test: the worker's cost per request with a transport that
    /// answers at once (`cargo test --release measure_request_cost --
    /// --ignored --nocapture`): 1-element pushes, each answered before the
    /// next (best of 5 runs of 200000).
    #[test]
    #[ignore]
    fn measure_request_cost() {
        let echo = Arc::new(Echo(std::sync::Mutex::new(std::sync::Weak::new())));
        let w = Arc::new(KvWorker::new(
            super::WorkerConfig {
                rank: 0,
                customer_id: 0,
                num_servers: 1,
                bigarray_bound: 1_000_000,
                timeout: Duration::from_secs(10),
            },
            echo.clone(),
        ));
        *echo.0.lock().unwrap() = Arc::downgrade(&w);
        let v = f32s(&[1.0]);
        let n = 200_000;
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = Instant::now();
            for _ in 0..n {
                w.push(&[(3, &v)]).unwrap();
            }
            best = best.min(t.elapsed().as_secs_f64() / n as f64);
        }
        w.wait_all().unwrap();
        println!("push (answered at once): {:.1} ns per request", best * 1e9);
    }
}

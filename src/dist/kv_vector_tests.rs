//! The KV layer against traffic captured between real MXNet 1.9.1 nodes
//! (`tests/vectors/dist/session_*.jsonl`, see its README): the worker
//! scripts of sessions A–D are replayed through our workers and servers in
//! one process, and every KV and SimpleApp message each node sends to each
//! peer — meta bytes and data parts — must equal the captured one, in order.
//! This checks the key mapping (small keys, a split key, string keys as
//! ints, row_sparse and 2-bit compressed keys), the command codes, the
//! timestamps, the lens, the values our servers compute (sync sums, SGD
//! updates, async row_sparse updates, dequantized compressed pushes), and
//! the reply layouts.
#![forbid(unsafe_code)]

use super::kv_cluster_tests::{Cluster, Net, Opts};
use super::message::{sender_of_identity, Message};
use crate::ndarray::dtype::DType;
use crate::ndarray::{Context, NDArray, Shape, StorageType};
use crate::store::compression::CompressionParams;
use std::collections::BTreeMap;
use std::path::PathBuf;

fn vectors_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors/dist")
}

/// The string value of `"name": "…"` in a JSON line (no escapes needed:
/// the fields read here are hex or plain names).
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let pat = format!("\"{name}\": \"");
    let start = line.find(&pat)? + pat.len();
    let len = line[start..].find('"')?;
    Some(&line[start..start + len])
}

/// The strings of `"data_hex": ["…", …]`.
fn data_hex(line: &str) -> Vec<String> {
    let pat = "\"data_hex\": [";
    let Some(start) = line.find(pat).map(|i| i + pat.len()) else {
        return Vec::new();
    };
    let end = start + line[start..].find(']').expect("closing bracket");
    line[start..end]
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Node id of a transcript name: H, S<r>, W<r>.
fn node_id(name: &str) -> i32 {
    match name.split_at(1) {
        ("H", _) => 1,
        ("S", r) => 8 + 2 * r.parse::<i32>().expect("rank"),
        ("W", r) => 9 + 2 * r.parse::<i32>().expect("rank"),
        _ => panic!("unknown node {name}"),
    }
}

/// (sender, recipient) → the messages in order, as (meta hex, data hex).
type Transcript = BTreeMap<(i32, i32), Vec<(String, Vec<String>)>>;

/// The KV and SimpleApp messages of a captured session, and the decoded
/// messages (for the optimizer body).
fn captured(session: &str) -> (Transcript, Vec<Message>) {
    let path = vectors_dir().join(format!("session_{session}.jsonl"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut t = Transcript::new();
    let mut msgs = Vec::new();
    for line in text.lines() {
        if !line.contains("\"type\": \"message\"") {
            continue;
        }
        let meta = unhex(field(line, "meta_hex").expect("meta_hex"));
        let data: Vec<Vec<u8>> = data_hex(line).iter().map(|h| unhex(h)).collect();
        let m = Message::decode(&meta, data.iter().map(|d| d.clone().into()).collect())
            .expect("captured meta decodes");
        if m.control.is_some() {
            continue;
        }
        let from = sender_of_identity(field(line, "identity").expect("identity").as_bytes());
        let to = node_id(field(line, "to").expect("to"));
        t.entry((from, to))
            .or_default()
            .push((hex(&meta), data.iter().map(|d| hex(d)).collect()));
        msgs.push(m);
    }
    assert!(!t.is_empty(), "no messages in {}", path.display());
    (t, msgs)
}

fn ours(net: &Net) -> Transcript {
    let mut t = Transcript::new();
    for m in net.log.lock().iter() {
        t.entry((m.sender, m.recver)).or_default().push((
            hex(&m.encode_meta()),
            m.data.iter().map(|d| hex(d)).collect(),
        ));
    }
    t
}

fn compare(session: &str, want: &Transcript, got: &Transcript) {
    let wk: Vec<_> = want.keys().collect();
    let gk: Vec<_> = got.keys().collect();
    assert_eq!(gk, wk, "session {session}: (sender, recipient) pairs");
    for (pair, w) in want {
        let g = &got[pair];
        for (i, (wm, gm)) in w.iter().zip(g).enumerate() {
            let decode = |m: &(String, Vec<String>)| {
                let meta = Message::decode(&unhex(&m.0), Vec::new()).expect("meta");
                format!(
                    "head {} ts {} push {} pull {} simple_app {} request {} data {:?}",
                    meta.head,
                    meta.timestamp,
                    meta.push,
                    meta.pull,
                    meta.simple_app,
                    meta.request,
                    m.1
                )
            };
            assert_eq!(
                gm,
                wm,
                "session {session}, {} -> {}, message {i}:\n ours:     {}\n captured: {}",
                pair.0,
                pair.1,
                decode(gm),
                decode(wm)
            );
        }
        assert_eq!(
            g.len(),
            w.len(),
            "session {session}, {pair:?}: message count"
        );
    }
}

fn body_of_controller(msgs: &[Message]) -> Vec<u8> {
    msgs.iter()
        .find(|m| m.simple_app && m.request && m.head == 0)
        .expect("a kController request")
        .body
        .clone()
}

fn arr(shape: &[i64], dtype: DType, vals: &[f64]) -> NDArray {
    let a = NDArray::from_bytes(
        Shape(shape.to_vec()),
        DType::F64,
        Context::CPU0,
        bytemuck::cast_slice(vals),
    )
    .unwrap();
    let b = NDArray::zeros(Shape(shape.to_vec()), dtype, Context::CPU0).unwrap();
    b.copy_from(&a).unwrap();
    b
}

fn zeros(shape: &[i64], dtype: DType) -> NDArray {
    NDArray::zeros(Shape(shape.to_vec()), dtype, Context::CPU0).unwrap()
}

fn rsp_zeros(shape: &[i64]) -> NDArray {
    NDArray::sparse_zeros(
        StorageType::RowSparse,
        Shape(shape.to_vec()),
        DType::F32,
        Context::CPU0,
        &[DType::I64],
        &[Shape(vec![0])],
    )
    .unwrap()
}

#[test]
fn session_a_dist_sync_2_servers_2_workers_int_keys_split_key_sgd() {
    let (want, msgs) = captured("a");
    let pickle = body_of_controller(&msgs);
    let c = Cluster::start(Opts {
        workers: 2,
        servers: 2,
        bound: 10,
        pickle_lr: Some(0.1),
        ..Opts::default()
    });
    c.run(move |r, w, b| {
        let m = (r + 1) as f64;
        let arange: Vec<f64> = (0..15).map(f64::from).collect();
        let inits = [
            (3, arr(&[2, 3], DType::F32, &[1.0; 6])),
            (7, arr(&[15], DType::F32, &arange)),
            (5, arr(&[4], DType::F64, &[1.0, 2.0, 3.0, 4.0])),
            (11, arr(&[2], DType::F16, &[10.0, 20.0])),
        ];
        for (k, v) in &inits {
            if r == 0 {
                w.init(&[(*k, v)]).unwrap();
            }
            b.wait();
        }
        let out3 = zeros(&[2, 3], DType::F32);
        w.push(&[(3, &arr(&[2, 3], DType::F32, &[m; 6]))]).unwrap();
        w.pull(&[(3, &out3)]).unwrap();
        assert_eq!(out3.to_f64_vec(), vec![3.0; 6]);
        let out7 = zeros(&[15], DType::F32);
        let v7: Vec<f64> = arange.iter().map(|x| x * m).collect();
        w.push(&[(7, &arr(&[15], DType::F32, &v7))]).unwrap();
        w.pull(&[(7, &out7)]).unwrap();
        b.wait();
        w.command(0, &pickle).unwrap();
        w.push_pull(&[(3, &arr(&[2, 3], DType::F32, &[1.0; 6]), &out3)])
            .unwrap();
        w.push(&[(7, &arr(&[15], DType::F32, &[1.0; 15]))]).unwrap();
        w.pull(&[(7, &out7)]).unwrap();
        w.pull(&[(5, &zeros(&[4], DType::F64))]).unwrap();
        w.pull(&[(11, &zeros(&[2], DType::F16))]).unwrap();
        b.wait();
    });
    compare("a", &want, &finish(c));
}

/// Stops the servers (kStopServer from worker 0) and returns the transcript.
fn finish(c: Cluster) -> Transcript {
    let net = c.net.clone();
    c.stop();
    ours(&net)
}

#[test]
fn session_b_dist_device_sync_2_servers_1_worker_string_keys() {
    let (want, _) = captured("b");
    let c = Cluster::start(Opts {
        workers: 1,
        servers: 2,
        bound: 1_000_000,
        ..Opts::default()
    });
    // 'weight' -> 0, 'bias' -> 1 (order of first init)
    let w = &c.workers[0];
    w.init(&[
        (0, &arr(&[3], DType::F32, &[2.0; 3])),
        (1, &arr(&[2], DType::F32, &[-1.0; 2])),
    ])
    .unwrap();
    let (ow, ob) = (zeros(&[3], DType::F32), zeros(&[2], DType::F32));
    w.push(&[(0, &arr(&[3], DType::F32, &[1.0; 3]))]).unwrap();
    w.pull(&[(0, &ow)]).unwrap();
    w.push(&[(1, &arr(&[2], DType::F32, &[4.0; 2]))]).unwrap();
    w.pull(&[(1, &ob)]).unwrap();
    assert_eq!(
        (ow.to_f64_vec(), ob.to_f64_vec()),
        (vec![1.0; 3], vec![4.0; 2])
    );
    compare("b", &want, &finish(c));
}

#[test]
fn session_c_dist_sync_1x1_two_bit_compression() {
    two_bit_session("c");
}

/// Session F runs session C's script with ps-lite's resender on: the same
/// KV traffic (plus ACKs, which are the van's business).
#[test]
fn session_f_as_c_with_the_resender() {
    two_bit_session("f");
}

#[test]
fn session_e_dist_sync_1x1_init_only() {
    let (want, _) = captured("e");
    let c = Cluster::start(Opts {
        workers: 1,
        servers: 1,
        bound: 1_000_000,
        ..Opts::default()
    });
    c.workers[0]
        .init(&[(0, &arr(&[2], DType::F32, &[1.0; 2]))])
        .unwrap();
    compare("e", &want, &finish(c));
}

fn two_bit_session(session: &str) {
    let (want, _) = captured(session);
    let c = Cluster::start(Opts {
        workers: 1,
        servers: 1,
        bound: 1_000_000,
        ..Opts::default()
    });
    let w = &c.workers[0];
    let params = CompressionParams::parse(&[
        (b"type".to_vec(), b"2bit".to_vec()),
        (b"threshold".to_vec(), b"0.5".to_vec()),
    ])
    .unwrap();
    w.command(4, params.encode().as_bytes()).unwrap();
    w.set_compression(Some(params));
    w.init(&[(1, &zeros(&[10], DType::F32))]).unwrap();
    let g = [0.7, -0.7, 0.2, -0.2, 0.5, -0.5, 1.5, 0.0, 0.49, -2.0];
    w.push(&[(1, &arr(&[10], DType::F32, &g))]).unwrap();
    let out = zeros(&[10], DType::F32);
    w.pull(&[(1, &out)]).unwrap();
    assert_eq!(
        out.to_f64_vec(),
        vec![0.5, -0.5, 0.0, 0.0, 0.5, -0.5, 0.5, 0.0, 0.0, -0.5]
    );
    compare(session, &want, &finish(c));
}

#[test]
fn session_d_dist_async_1x1_dense_and_row_sparse_with_sgd() {
    let (want, msgs) = captured("d");
    let pickle = body_of_controller(&msgs);
    let c = Cluster::start(Opts {
        workers: 1,
        servers: 1,
        bound: 1_000_000,
        sync: false,
        pickle_lr: Some(0.5),
        ..Opts::default()
    });
    let w = &c.workers[0];
    w.command(0, &pickle).unwrap();
    w.init(&[(0, &arr(&[4], DType::F32, &[1.0; 4]))]).unwrap();
    let dense: Vec<f64> = (0..12).map(f64::from).collect();
    let table = rsp_zeros(&[6, 2]);
    table.copy_from(&arr(&[6, 2], DType::F32, &dense)).unwrap();
    w.init(&[(1, &table)]).unwrap();
    w.push(&[(0, &arr(&[4], DType::F32, &[1.0; 4]))]).unwrap();
    let out = zeros(&[4], DType::F32);
    w.pull(&[(0, &out)]).unwrap();
    assert_eq!(out.to_f64_vec(), vec![0.5; 4]);
    let grad = rsp_zeros(&[6, 2]);
    let g = zeros(&[6, 2], DType::F32);
    g.copy_from(&arr(
        &[6, 2],
        DType::F32,
        &[0., 0., 1., 1., 0., 0., 0., 0., 1., 1., 0., 0.],
    ))
    .unwrap();
    grad.copy_from(&g).unwrap();
    w.push(&[(1, &grad)]).unwrap();
    let rsp = rsp_zeros(&[6, 2]);
    w.pull_row_sparse(1, &rsp, &[1, 4]).unwrap();
    assert_eq!(rsp.rsp_indices().unwrap(), vec![1, 4]);
    compare("d", &want, &finish(c));
}

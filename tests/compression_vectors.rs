//! Checks `mxkv::store::compression` against the vectors captured from MXNet
//! 1.9.1 in `tests/vectors/compression/` (see the README there).
//!
//! * `quantize_kernel.json`: every step of every case, bit for bit (words,
//!   their little-endian bytes, residuals, dequantized values), through the
//!   word kernels and the fused kernel, and again tiled past the parallel
//!   threshold.
//! * `device_store_sequences.json`: the `device` store simulated (one
//!   residual per device slot, dequantized values summed left to right in
//!   device order, stored = sum, or stored += sum with the updater).
//! * `dist_sync_sequences.json`: a `dist_sync` cluster simulated (one
//!   residual per key on each worker, the server's threshold read back from
//!   the `"1,%f"` text, the dequantized pushes summed, assigned or given to
//!   the `test` optimizer).
//!
//! The files contain `NaN` / `Infinity`, which standard JSON parsers refuse,
//! so a small JSON reader is included here.

use mxkv::store::compression::{
    dequantize_2bit, quantize_2bit, quantize_dequantize_2bit, CompressionKind, CompressionParams,
};
use std::path::PathBuf;

// ---------------------------------------------------------------------------
// A minimal JSON reader (with NaN, Infinity and -Infinity).

#[derive(Debug, Clone)]
enum Json {
    Null,
    Bool(bool),
    /// The number's text as written, and its value.
    Num(String, f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    fn get(&self, key: &str) -> &Json {
        match self {
            Json::Obj(fields) => fields
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v)
                .unwrap_or_else(|| panic!("missing key {key:?}")),
            _ => panic!("not an object looking up {key:?}"),
        }
    }
    fn arr(&self) -> &[Json] {
        match self {
            Json::Arr(v) => v,
            other => panic!("not an array: {other:?}"),
        }
    }
    fn num(&self) -> f64 {
        match self {
            Json::Num(_, v) => *v,
            other => panic!("not a number: {other:?}"),
        }
    }
    fn num_text(&self) -> &str {
        match self {
            Json::Num(t, _) => t,
            other => panic!("not a number: {other:?}"),
        }
    }
    fn str(&self) -> &str {
        match self {
            Json::Str(s) => s,
            other => panic!("not a string: {other:?}"),
        }
    }
    fn is_null(&self) -> bool {
        matches!(self, Json::Null)
    }
    fn as_bool(&self) -> bool {
        match self {
            Json::Bool(b) => *b,
            other => panic!("not a bool: {other:?}"),
        }
    }
    /// An array of numbers as float32 (the files hold float32 values
    /// written as the shortest round-tripping double).
    fn f32s(&self) -> Vec<f32> {
        self.arr().iter().map(|v| v.num() as f32).collect()
    }
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn parse(text: &str) -> Json {
        let mut p = Parser {
            s: text.as_bytes(),
            i: 0,
        };
        let v = p.value();
        p.ws();
        assert_eq!(p.i, p.s.len(), "trailing data in JSON");
        v
    }
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }
    fn eat(&mut self, lit: &str) -> bool {
        if self.s[self.i..].starts_with(lit.as_bytes()) {
            self.i += lit.len();
            true
        } else {
            false
        }
    }
    fn expect(&mut self, c: u8) {
        self.ws();
        assert_eq!(
            self.s.get(self.i),
            Some(&c),
            "JSON: expected {:?} at byte {}",
            c as char,
            self.i
        );
        self.i += 1;
    }
    fn value(&mut self) -> Json {
        self.ws();
        let c = *self.s.get(self.i).expect("JSON: unexpected end");
        match c {
            b'{' => {
                self.i += 1;
                let mut fields = Vec::new();
                self.ws();
                if self.eat("}") {
                    return Json::Obj(fields);
                }
                loop {
                    self.ws();
                    let key = self.string();
                    self.expect(b':');
                    fields.push((key, self.value()));
                    self.ws();
                    if self.eat("}") {
                        return Json::Obj(fields);
                    }
                    self.expect(b',');
                }
            }
            b'[' => {
                self.i += 1;
                let mut items = Vec::new();
                self.ws();
                if self.eat("]") {
                    return Json::Arr(items);
                }
                loop {
                    items.push(self.value());
                    self.ws();
                    if self.eat("]") {
                        return Json::Arr(items);
                    }
                    self.expect(b',');
                }
            }
            b'"' => Json::Str(self.string()),
            _ if self.eat("null") => Json::Null,
            _ if self.eat("true") => Json::Bool(true),
            _ if self.eat("false") => Json::Bool(false),
            _ if self.eat("NaN") => Json::Num("NaN".into(), f64::NAN),
            _ if self.eat("Infinity") => Json::Num("Infinity".into(), f64::INFINITY),
            _ if self.eat("-Infinity") => Json::Num("-Infinity".into(), f64::NEG_INFINITY),
            _ => {
                let start = self.i;
                while self.i < self.s.len()
                    && matches!(
                        self.s[self.i],
                        b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'
                    )
                {
                    self.i += 1;
                }
                let text = std::str::from_utf8(&self.s[start..self.i]).unwrap();
                let v = text
                    .parse::<f64>()
                    .unwrap_or_else(|_| panic!("JSON: bad number {text:?} at byte {start}"));
                Json::Num(text.to_string(), v)
            }
        }
    }
    fn string(&mut self) -> String {
        self.expect(b'"');
        let mut out = String::new();
        loop {
            let c = *self.s.get(self.i).expect("JSON: unterminated string");
            self.i += 1;
            match c {
                b'"' => return out,
                b'\\' => {
                    let e = self.s[self.i];
                    self.i += 1;
                    match e {
                        b'n' => out.push('\n'),
                        b't' => out.push('\t'),
                        b'r' => out.push('\r'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'u' => {
                            let hex = std::str::from_utf8(&self.s[self.i..self.i + 4]).unwrap();
                            self.i += 4;
                            let cp = u32::from_str_radix(hex, 16).unwrap();
                            out.push(char::from_u32(cp).unwrap_or('\u{fffd}'));
                        }
                        other => out.push(other as char),
                    }
                }
                _ => {
                    // Copy a whole UTF-8 sequence.
                    let start = self.i - 1;
                    let mut end = self.i;
                    while end < self.s.len() && (self.s[end] & 0xC0) == 0x80 {
                        end += 1;
                    }
                    out.push_str(std::str::from_utf8(&self.s[start..end]).unwrap());
                    self.i = end;
                }
            }
        }
    }
}

fn load(name: &str) -> Json {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors/compression");
    let path = dir.join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read the MXNet compression vectors at {}: {e}",
            path.display()
        )
    });
    Parser::parse(&text)
}

// ---------------------------------------------------------------------------
// Helpers.

/// Bit patterns, with every NaN mapped to one pattern.
fn bits(v: &[f32]) -> Vec<u32> {
    v.iter()
        .map(|x| if x.is_nan() { 0x7fc0_0000 } else { x.to_bits() })
        .collect()
}

fn assert_same(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(
        bits(got),
        bits(want),
        "{what}:\n  got  {got:?}\n  want {want:?}"
    );
}

fn params(kind: &str, threshold_text: &str) -> CompressionParams {
    let pairs = vec![
        (b"type".to_vec(), kind.as_bytes().to_vec()),
        (b"threshold".to_vec(), threshold_text.as_bytes().to_vec()),
    ];
    CompressionParams::parse(&pairs).expect("valid parameters")
}

/// `v[0] + v[1] + …` in float32, left to right.
fn sum_left_to_right(values: &[Vec<f32>]) -> Vec<f32> {
    let mut out = values[0].clone();
    for v in &values[1..] {
        for (o, x) in out.iter_mut().zip(v) {
            *o += *x;
        }
    }
    out
}

// ---------------------------------------------------------------------------
// quantize_kernel.json

#[test]
fn compression_quantize_kernel_vectors() {
    let doc = load("quantize_kernel.json");
    let cases = doc.get("cases").arr();
    assert!(!cases.is_empty());
    let mut steps_checked = 0;
    for case in cases {
        let name = case.get("name").str();
        let t = case.get("threshold_f32").num() as f32;
        assert_eq!(
            t as f64,
            case.get("threshold_f32").num(),
            "{name}: threshold not f32"
        );
        let n = case.get("n").num() as usize;
        let nwords = case.get("compressed_words").num() as usize;
        assert_eq!(CompressionKind::TwoBit.compressed_len(n), nwords, "{name}");

        let mut residual = vec![0.0f32; n];
        let mut residual_fused = vec![0.0f32; n];
        for (s, step) in case.get("steps").arr().iter().enumerate() {
            let what = format!("{name} step {s}");
            assert!(
                step.get("model_agrees").as_bool(),
                "{what}: model disagreed"
            );
            let grad = step.get("grad").f32s();
            assert_eq!(grad.len(), n, "{what}");
            let want_words: Vec<u32> = step
                .get("words_u32_hex")
                .arr()
                .iter()
                .map(|w| u32::from_str_radix(w.str().trim_start_matches("0x"), 16).unwrap())
                .collect();
            let want_bytes: String = step
                .get("word_bytes_le_hex")
                .arr()
                .iter()
                .map(|w| w.str())
                .collect();

            // Stale contents of the output must not leak.
            let mut words = vec![0x5a5a_5a5au32; nwords];
            quantize_2bit(&grad, &mut residual, t, &mut words);
            assert_eq!(words, want_words, "{what}: words");
            let bytes: String = words
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .map(|b| format!("{b:02x}"))
                .collect();
            assert_eq!(bytes, want_bytes, "{what}: bytes");
            assert_same(
                &residual,
                &step.get("residual_after").f32s(),
                &format!("{what}: residual"),
            );

            let want_deq = step.get("dequantized").f32s();
            let mut deq = vec![f32::NAN; n];
            dequantize_2bit(&words, n, t, &mut deq);
            assert_same(&deq, &want_deq, &format!("{what}: dequantized"));

            let mut fused = vec![f32::NAN; n];
            quantize_dequantize_2bit(&grad, &mut residual_fused, t, &mut fused);
            assert_same(&fused, &want_deq, &format!("{what}: fused dequantized"));
            assert_same(
                &residual_fused,
                &residual,
                &format!("{what}: fused residual"),
            );
            steps_checked += 1;
        }
    }
    assert!(steps_checked >= 20, "only {steps_checked} steps checked");
}

/// The same cases tiled past the parallel threshold: every element and (for
/// cases of 16 values) every word must repeat the small case's results.
#[test]
fn compression_quantize_kernel_vectors_tiled_parallel() {
    let doc = load("quantize_kernel.json");
    for case in doc.get("cases").arr() {
        let name = case.get("name").str();
        let t = case.get("threshold_f32").num() as f32;
        let n = case.get("n").num() as usize;
        let reps = (mxkv::store::compression::PARALLEL_MIN_ELEMENTS * 2).div_ceil(n);
        let big = n * reps;
        let mut residual = vec![0.0f32; big];
        let mut residual_fused = vec![0.0f32; big];
        for (s, step) in case.get("steps").arr().iter().enumerate() {
            let what = format!("{name} step {s} tiled x{reps}");
            let tile = |v: Vec<f32>| -> Vec<f32> { v.iter().copied().cycle().take(big).collect() };
            let grad = tile(step.get("grad").f32s());
            let mut words = vec![0u32; big.div_ceil(16)];
            quantize_2bit(&grad, &mut residual, t, &mut words);
            assert_same(
                &residual,
                &tile(step.get("residual_after").f32s()),
                &format!("{what}: residual"),
            );
            let mut deq = vec![0.0f32; big];
            dequantize_2bit(&words, big, t, &mut deq);
            let want_deq = tile(step.get("dequantized").f32s());
            assert_same(&deq, &want_deq, &format!("{what}: dequantized"));
            let mut fused = vec![0.0f32; big];
            quantize_dequantize_2bit(&grad, &mut residual_fused, t, &mut fused);
            assert_same(&fused, &want_deq, &format!("{what}: fused"));
            assert_same(
                &residual_fused,
                &residual,
                &format!("{what}: fused residual"),
            );
            if n == 16 {
                let w = u32::from_str_radix(
                    step.get("words_u32_hex").arr()[0]
                        .str()
                        .trim_start_matches("0x"),
                    16,
                )
                .unwrap();
                assert!(words.iter().all(|&x| x == w), "{what}: words");
            }
        }
    }
}

// ---------------------------------------------------------------------------
// device_store_sequences.json

#[test]
fn compression_device_store_vectors() {
    let doc = load("device_store_sequences.json");
    let seqs = doc.get("sequences").arr();
    assert!(!seqs.is_empty());
    let mut with_updater = 0;
    for seq in seqs {
        let name = seq.get("name").str();
        assert_eq!(seq.get("store").str(), "device", "{name}");
        let p = params("2bit", seq.get("threshold").num_text());
        let devices = seq.get("devices").num() as usize;
        let mut stored = seq.get("init").f32s();
        let n = stored.len();
        let updater = match seq.get("updater") {
            Json::Null => false,
            u => {
                assert_eq!(u.str(), "stored += recv", "{name}: unknown updater");
                with_updater += 1;
                true
            }
        };
        if let Json::Obj(fields) = seq {
            if let Some((_, agrees)) = fields.iter().find(|(k, _)| k == "model_agrees") {
                assert!(agrees.as_bool(), "{name}: model disagreed");
            }
        }
        // One residual per device slot, through the fused kernel, and a
        // second set through quantize + dequantize (must agree).
        let mut residuals = vec![vec![0.0f32; n]; devices];
        let mut residuals_words = vec![vec![0.0f32; n]; devices];
        let pushes = seq.get("pushes").arr();
        let pulled = seq.get("pulled_after_each_push").arr();
        assert_eq!(pushes.len(), pulled.len(), "{name}");
        for (s, (push, want)) in pushes.iter().zip(pulled).enumerate() {
            let what = format!("{name} push {s}");
            let per_device = push.arr();
            assert_eq!(per_device.len(), devices, "{what}");
            let mut deqs = Vec::with_capacity(devices);
            for (d, g) in per_device.iter().enumerate() {
                let g = g.f32s();
                assert_eq!(g.len(), n, "{what}");
                let mut deq = vec![0.0f32; n];
                p.quantize_dequantize(&g, &mut residuals[d], &mut deq);

                let mut words = vec![0u32; p.compressed_len(n)];
                p.quantize(&g, &mut residuals_words[d], &mut words);
                let mut deq_words = vec![0.0f32; n];
                p.dequantize(&words, n, &mut deq_words);
                assert_same(&deq_words, &deq, &format!("{what} device {d}: word path"));
                assert_same(
                    &residuals_words[d],
                    &residuals[d],
                    &format!("{what} device {d}: residual"),
                );
                deqs.push(deq);
            }
            let merged = sum_left_to_right(&deqs);
            if updater {
                for (w, m) in stored.iter_mut().zip(&merged) {
                    *w += *m;
                }
            } else {
                stored = merged;
            }
            assert_same(&stored, &want.f32s(), &format!("{what}: pulled"));
        }
    }
    assert!(with_updater > 0, "no sequence with an updater was checked");
}

// ---------------------------------------------------------------------------
// dist_sync_sequences.json

#[test]
fn compression_dist_sync_vectors() {
    let doc = load("dist_sync_sequences.json");
    let seqs = doc.get("sequences").arr();
    assert!(!seqs.is_empty());
    for seq in seqs {
        let name = seq.get("name").str();
        assert!(seq.get("model_agrees").as_bool(), "{name}: model disagreed");
        // Workers: Python sends str(threshold); rank 0 forwards EncodeParams.
        let worker = params("2bit", seq.get("threshold").num_text());
        let server = CompressionParams::decode(worker.encode().as_bytes())
            .expect("decodable")
            .expect("compression on");
        assert_eq!(
            server.threshold as f64,
            seq.get("server_threshold_after_text_roundtrip").num(),
            "{name}: server threshold"
        );
        let workers = seq.get("workers").num() as usize;
        let devices = seq.get("devices_per_worker").num() as usize;
        let optimizer = &seq.get("optimizer");
        let scale = if optimizer.is_null() {
            None
        } else {
            assert_eq!(
                optimizer.str(),
                "test(rescale_grad=2): w += 2*grad",
                "{name}"
            );
            Some(2.0f32)
        };
        let mut stored = seq.get("init").f32s();
        let n = stored.len();
        let mut residuals = vec![vec![0.0f32; n]; workers];
        let pushes = seq.get("pushes_per_rank");
        let pulled = seq.get("pulled_after_each_push").arr();
        for (s, want) in pulled.iter().enumerate() {
            let mut deqs = Vec::new();
            for (rank, residual) in residuals.iter_mut().enumerate() {
                // The worker's local (uncompressed) device reduce, then one
                // quantization per key with the worker's residual.
                let g = pushes.get(&rank.to_string()).arr()[s].f32s();
                let local = sum_left_to_right(&vec![g; devices]);
                let mut words = vec![0u32; worker.compressed_len(n)];
                worker.quantize(&local, residual, &mut words);
                // The server dequantizes with its own threshold.
                let mut deq = vec![0.0f32; n];
                server.dequantize(&words, n, &mut deq);
                deqs.push(deq);
            }
            let merged = sum_left_to_right(&deqs);
            match scale {
                None => stored = merged,
                Some(k) => {
                    for (w, m) in stored.iter_mut().zip(&merged) {
                        *w += k * *m;
                    }
                }
            }
            assert_same(&stored, &want.f32s(), &format!("{name} step {s}: pulled"));
        }
    }
}

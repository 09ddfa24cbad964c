//! The committed header must be what cbindgen makes of `src/capi` now, plus
//! the C++ default argument MXNet's header gives `MXKVStoreGetNumDeadNode`
//! (`timeout_sec DEFAULT(60)`), which cbindgen cannot write.
//! `MXKV_BLESS=1 cargo test --test header` (or `make header`) rewrites it.

use std::path::Path;

#[test]
fn committed_header_is_current() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(root)
        .with_config(config)
        .generate()
        .expect("cbindgen failed")
        .write(&mut generated);
    let generated = add_default_arguments(generated);
    let path = root.join("include/mxkv/c_api.h");
    if std::env::var_os("MXKV_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write header");
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/mxkv/c_api.h is stale: run `make header` and commit the result"
    );
}

/// MXNet's `DEFAULT(x)` arguments: `= x` in C++, nothing in C.
const DEFAULTS: &[(&str, &str)] = &[(
    "MXKVStoreGetNumDeadNode(KVStoreHandle handle, int node_id, int *number, int timeout_sec)",
    "MXKVStoreGetNumDeadNode(KVStoreHandle handle, int node_id, int *number, int timeout_sec DEFAULT(60))",
)];

fn add_default_arguments(header: Vec<u8>) -> Vec<u8> {
    let mut text = String::from_utf8(header).expect("cbindgen writes UTF-8");
    for (plain, with_default) in DEFAULTS {
        assert_eq!(
            text.matches(plain).count(),
            1,
            "the header should declare `{plain}` once"
        );
        text = text.replace(plain, with_default);
    }
    text.into_bytes()
}

//! The committed header must be what cbindgen makes of `src/capi` now, plus
//! the C++ default argument MXNet's header gives `MXKVStoreGetNumDeadNode`
//! (`timeout_sec DEFAULT(60)`), which cbindgen cannot write.
//! `MXKV_BLESS=1 cargo test --test header` (or `make header`) rewrites it.

use std::path::Path;

/// What cbindgen makes of `src/capi` now, with the default arguments.
fn generated_header() -> Vec<u8> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(root)
        .with_config(config)
        .generate()
        .expect("cbindgen failed")
        .write(&mut generated);
    add_default_arguments(generated)
}

#[test]
fn committed_header_is_current() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let generated = generated_header();
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

/// The shared library exports exactly the functions the header (as
/// generated from the sources the library was built from) declares:
/// nothing else of the library's (in particular not `__wrap_malloc`,
/// `__wrap_free`, `__wrap_realloc`, which the linker's `--wrap` binds the
/// library's own allocations to, see build.rs: exported, a program's or
/// another library's `__wrap_malloc` could bind to them, or they to it).
#[test]
#[cfg(target_os = "linux")]
fn shared_library_exports_exactly_the_header_functions() {
    use std::collections::BTreeSet;
    let header = String::from_utf8(generated_header()).expect("cbindgen writes UTF-8");
    let declared: BTreeSet<String> = header
        .lines()
        .filter_map(|l| l.strip_prefix("MXNET_DLL "))
        .map(|l| {
            let name = &l[..l.find('(').expect("a function declaration")];
            name.rsplit([' ', '*'])
                .next()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert!(declared.contains("MXKVStoreCreate"), "{declared:?}");
    // this test's executable is <profile dir>/deps/header-<hash>; before it,
    // cargo builds the library (all its crate types) into that deps folder
    // (and copies it up to <profile dir> only for `cargo build`)
    let exe = std::env::current_exe().expect("current_exe");
    let lib = exe.parent().expect("the deps directory").join("libmxkv.so");
    let out = std::process::Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&lib)
        .output()
        .expect("nm (binutils) runs");
    assert!(out.status.success(), "nm {}: {out:?}", lib.display());
    let exported: BTreeSet<String> = String::from_utf8(out.stdout)
        .expect("nm writes UTF-8")
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
        .collect();
    assert_eq!(
        exported,
        declared,
        "{} exports other symbols than the header (include/mxkv/c_api.h) declares",
        lib.display()
    );
}

//! Gives the shared library its soname (`libmxkv.so.0`), and stages the
//! soname link `libmxkv.so.0 -> libmxkv.so` beside the library cargo builds
//! (e.g. `target/release/`), so that a program linked straight against
//! `target/release` after `cargo build --release` finds the library at run
//! time too (with `-Wl,-rpath,<that dir>`). The link is the only file written
//! outside OUT_DIR. It also links the library's own `malloc`/`free`/`realloc`
//! calls to `src/capi/bigalloc.rs` (in the shared library only), and compiles `csrc/callbacks.cc` (the
//! try/catch the C API calls user callbacks through, `src/capi/kvstore.rs`).
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=csrc/callbacks.cc");
    // A C++ callback that throws must not unwind into Rust (which aborts on
    // a foreign exception): the library calls callbacks through these
    // trampolines, which catch. libstdc++ is linked already (for libzmq).
    cc::Build::new()
        .cpp(true)
        .file("csrc/callbacks.cc")
        .flag_if_supported("-fvisibility=hidden")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .compile("mxkv_callbacks");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        return;
    }
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmxkv.so.0");
    // Every malloc/free/realloc made from inside the shared library (ours,
    // Rust's std, libzmq) goes to src/capi/bigalloc.rs, which keeps big
    // blocks for reuse; the rest of the process keeps its allocator.
    // -Bsymbolic-functions: the library's calls (to those, and to its own
    // functions) bind inside it, never to a program's functions of the same
    // names.
    println!("cargo:rustc-cdylib-link-arg=-Wl,--wrap=malloc,--wrap=free,--wrap=realloc");
    // The `__wrap_*` those calls now name are bigalloc.rs's functions, under
    // these names in the shared library only (the static library keeps no
    // `__wrap_*`, which would clash with a program's own --wrap); hidden
    // there, as rustc's version script makes every name it does not list.
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--defsym=__wrap_malloc=mxkv_bigalloc_malloc,\
         --defsym=__wrap_free=mxkv_bigalloc_free,--defsym=__wrap_realloc=mxkv_bigalloc_realloc"
    );
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
    // OUT_DIR is <target>/[<triple>/]<profile>/build/<pkg>-<hash>/out, and the
    // library lands in <target>/[<triple>/]<profile>.
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let Some(profile_dir) = out.ancestors().nth(3) else {
        return;
    };
    let link = profile_dir.join("libmxkv.so.0");
    if std::fs::read_link(&link).is_ok_and(|t| t == std::path::Path::new("libmxkv.so")) {
        return;
    }
    let _ = std::fs::remove_file(&link);
    if let Err(e) = std::os::unix::fs::symlink("libmxkv.so", &link) {
        println!("cargo:warning=could not stage {}: {e}", link.display());
    }
}

//! Gives the shared library a soname. Writes nothing outside OUT_DIR.
fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmxkv.so.0");
    }
    println!("cargo:rerun-if-changed=build.rs");
}

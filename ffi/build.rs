//! Writes include/ferrolock.h from the crate's source with cbindgen. The header is committed;
//! it is rewritten only when its text changes, so a build never dirties the tree needlessly.

use std::path::PathBuf;

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    // A hand edit of the committed header is overwritten, and `make check-header` shows it.
    println!("cargo:rerun-if-changed=include/ferrolock.h");
    // The shared library's name as the linker records it in programs linked against it.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libferrolock.so");
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml"))
        .expect("ffi/cbindgen.toml is readable and valid");
    let header = match cbindgen::Builder::new()
        .with_crate(&dir)
        .with_config(config)
        .generate()
    {
        Ok(bindings) => {
            let mut text = Vec::new();
            bindings.write(&mut text);
            text
        }
        Err(e) => {
            // A header that cannot be generated must not stop the library from building
            // (the committed one stays); `make check-header` reports it.
            println!("cargo:warning=ferrolock.h not regenerated: {e}");
            return;
        }
    };
    let path = dir.join("include").join("ferrolock.h");
    if std::fs::read(&path).ok().as_deref() != Some(&header[..]) {
        std::fs::write(&path, header).expect("ffi/include is writable");
    }
}

//! Writes include/ferrolock.h from the crate's source with cbindgen. The header is committed;
//! it is rewritten only when its text changes, so a build never dirties the tree needlessly.

use std::path::PathBuf;

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    // A hand edit of the committed header is overwritten, and `make check-header` shows it.
    println!("cargo:rerun-if-changed=include/ferrolock.h");
    let version =
        |part: &str| std::env::var(format!("CARGO_PKG_VERSION_{part}")).expect("set by cargo");
    let (major, minor, patch) = (version("MAJOR"), version("MINOR"), version("PATCH"));
    // The shared library's name as the linker records it in programs linked against it: it
    // carries the ABI, which a 0.y release may break (so 0.y is in it) and from 1.0 only a
    // major release. ELF targets only (the unix family but Apple's, whose linker has no
    // -soname: it takes -install_name; Windows has no soname).
    let cfg = |name: &str| std::env::var(format!("CARGO_CFG_TARGET_{name}")).unwrap_or_default();
    let elf = cfg("FAMILY").split(',').any(|f| f == "unix") && cfg("VENDOR") != "apple";
    if elf {
        let abi = if major == "0" {
            format!("0.{minor}")
        } else {
            major.clone()
        };
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libferrolock.so.{abi}");
    }
    let mut config = cbindgen::Config::from_file(dir.join("cbindgen.toml"))
        .expect("ffi/cbindgen.toml is readable and valid");
    // The version macros come from Cargo.toml's workspace version, the one place it is set.
    config.after_includes = Some(format!(
        "\n// The version of this header (`ferrolock_version()` gives the library's).\n\
         #define FERROLOCK_VERSION_MAJOR {major}\n\
         #define FERROLOCK_VERSION_MINOR {minor}\n\
         #define FERROLOCK_VERSION_PATCH {patch}\n\
         #define FERROLOCK_VERSION_STRING \"{major}.{minor}.{patch}\""
    ));
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

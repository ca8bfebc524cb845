//! The Rust examples (`core/examples/`; `first_lock.rs` is the README's, `read_write.rs` is
//! docs/read-write-lock.md's) run against a real redis-server, as a user runs them. `make
//! test` only built them: one that compiled but failed at run time went unnoticed.

use std::path::PathBuf;
use std::process::Command;

use ferrolock_testbed::RedisServer;

/// Builds the examples (a test target alone does not build them) and returns their folder.
fn examples_dir() -> PathBuf {
    // This test runs from <target>/<profile>/deps; the examples are in <target>/<profile>/examples.
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let mut build = Command::new(cargo);
    build
        .args([
            "build",
            "--quiet",
            "--locked",
            "-p",
            "ferrolock",
            "--examples",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if profile_dir.file_name().is_some_and(|p| p == "release") {
        build.arg("--release");
    }
    let status = build.status().expect("run cargo build --examples");
    assert!(status.success(), "the examples do not build: {status}");
    profile_dir.join("examples")
}

fn run_example(dir: &std::path::Path, name: &str, server: &RedisServer) -> String {
    let out = Command::new(dir.join(name))
        .env("FERROLOCK_NODES", server.url())
        .output()
        .unwrap_or_else(|e| panic!("cannot run example {name}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "example {name} failed ({}): stdout {stdout:?}, stderr {:?}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn the_rust_examples_run_against_a_real_server() {
    let server = RedisServer::start();
    let dir = examples_dir();
    let first = run_example(&dir, "first_lock", &server);
    assert!(first.contains("work done under the lock"), "{first:?}");
    let rw = run_example(&dir, "read_write", &server);
    assert!(rw.contains("two readers: true true"), "{rw:?}");
    assert!(rw.contains("written, fence Some("), "{rw:?}");
    // Both released what they took.
    let keys: Vec<String> = server.cmd(&["KEYS", "*"]);
    assert!(
        !keys.iter().any(|k| k == "orders:1001" || k == "catalog"),
        "left behind: {keys:?}"
    );
}

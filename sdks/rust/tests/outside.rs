//! The crate as it is published: `cargo package` makes `charter-VERSION.crate`;
//! a crate made in a temporary directory outside this repository depends on
//! it by path (the archive unpacked), builds the two examples the archive
//! ships as its own programs, and each tells the crash story to the end: the
//! run completed, every invoice paid once. Building that crate is what
//! verifies the archive (offline, against the same Debian sources), so
//! `cargo package` is told not to build it a second time on its own.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::story::crash_story;

fn cargo(dir: &Path, args: &[&str]) {
    let done = Command::new(env!("CARGO"))
        .args(args)
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", Path::new(env!("CARGO_MANIFEST_DIR")).join("target/outside"))
        .status()
        .expect("cargo");
    assert!(done.success(), "cargo {args:?} in {}", dir.display());
}

/// `cargo package`, and its archive unpacked into `into`: the crate's directory.
fn package(into: &Path) -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let packaged = Command::new(env!("CARGO"))
        .args(["package", "--offline", "--allow-dirty", "--no-verify"])
        .current_dir(here)
        .status()
        .expect("cargo package");
    assert!(packaged.success());
    let name = format!("charter-{}", env!("CARGO_PKG_VERSION"));
    let archive = here.join("target/package").join(format!("{name}.crate"));
    let unpacked = Command::new("tar").arg("xzf").arg(&archive).arg("-C").arg(into).status();
    assert!(unpacked.expect("tar").success(), "{}", archive.display());
    into.join(name)
}

/// A crate of its own outside the repository, whose programs are the examples
/// the package ships, against the package by path and Debian's crate sources.
fn outside(packaged: &Path, dir: &Path) {
    std::fs::create_dir_all(dir.join("src/bin")).unwrap();
    std::fs::create_dir_all(dir.join(".cargo")).unwrap();
    let manifest = format!(
        r#"[package]
name = "pays-a-week"
version = "0.0.0"
edition = "2021"
publish = false

[workspace]

[dependencies]
charter = {{ path = {:?}, features = ["async"] }}
serde = {{ version = "1", features = ["derive"] }}
serde_json = "1"
tokio = {{ version = "1", features = ["rt-multi-thread", "macros", "time"] }}
"#,
        packaged.display().to_string()
    );
    std::fs::write(dir.join("Cargo.toml"), manifest).unwrap();
    let sources = "[source.crates-io]\nreplace-with = \"debian\"\n\n\
                   [source.debian]\ndirectory = \"/usr/share/cargo/registry\"\n\n\
                   [net]\noffline = true\n";
    std::fs::write(dir.join(".cargo/config.toml"), sources).unwrap();
    for program in ["pay_week", "pay_week_async"] {
        let shipped = packaged.join("examples").join(format!("{program}.rs"));
        std::fs::copy(&shipped, dir.join("src/bin").join(format!("{program}.rs")))
            .unwrap_or_else(|e| panic!("{} is not in the package: {e}", shipped.display()));
    }
}

#[test]
fn x2_item10_the_packaged_crate_builds_outside_the_repository_and_tells_the_crash_story() {
    let dir = std::env::temp_dir().join(format!("charter-rs-outside-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let packaged = package(&dir);
    let user = dir.join("pays-a-week");
    outside(&packaged, &user);
    cargo(&user, &["build", "--offline", "--bins"]);
    let bin = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/outside/debug");
    crash_story(&bin.join("pay_week"));
    crash_story(&bin.join("pay_week_async"));
    let _ = std::fs::remove_dir_all(&dir);
}

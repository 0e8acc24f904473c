//! Stamps the binary with the commit it was built from, for `sluice --version`.
//!
//! `SLUICE_COMMIT` in the build environment wins (a release built from a source archive sets
//! it); otherwise `git` is asked, and a tree with uncommitted changes is marked `-dirty`.
//! Without either the commit reads `unknown`.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    println!("cargo:rerun-if-env-changed=SLUICE_COMMIT");
    // Rebuilt when HEAD moves or the index changes (a commit, a checkout, an add).
    for path in ["HEAD", "index"] {
        if let Some(p) = git(&["rev-parse", "--git-path", path]) {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"])
        && let Some(p) = git(&["rev-parse", "--git-path", &r])
    {
        println!("cargo:rerun-if-changed={p}");
    }
    let commit = std::env::var("SLUICE_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| {
            let hash = git(&["rev-parse", "--short=12", "HEAD"])?;
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            Some(if dirty { format!("{hash}-dirty") } else { hash })
        })
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=SLUICE_COMMIT={commit}");
}

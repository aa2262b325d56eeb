//! The `linnet` binary's command line, run as a user would run it.
#![allow(clippy::expect_used)]

use std::process::Command;

fn linnet(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_linnet"))
        .args(args)
        .output()
        .expect("run the linnet binary")
}

#[test]
fn help_lists_every_subcommand() {
    let out = linnet(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for sub in ["agent", "diff", "validate", "status", "crds"] {
        assert!(help.contains(sub), "--help does not list `{sub}`:\n{help}");
    }
}

#[test]
fn unbuilt_subcommand_says_so_and_fails() {
    let out = linnet(&["status"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not built yet"), "stderr: {err}");
}

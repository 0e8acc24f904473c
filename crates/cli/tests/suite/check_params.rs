//! `sluice check` and `sluice validate` judge an algorithm's parameters alike: a parameter the
//! algorithm does not take is rejected by both, with the same message.

use std::process::Command;

fn sluice(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .expect("run sluice");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `sluice validate` on a file holding one `[policies.p]` with `body`; returns its stderr.
/// The file sits in a directory of its own, removed afterwards.
fn validate(body: &str) -> (i32, String) {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("sluice-check-params-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("sluice.toml");
    std::fs::write(&file, format!("[policies.p]\n{body}")).unwrap();
    let r = sluice(&["validate", "--config", file.to_str().unwrap()]);
    let _ = std::fs::remove_dir_all(&dir);
    r
}

#[test]
fn check_rejects_parameters_the_algorithm_does_not_take_as_validate_does() {
    let cases: [(&[&str], &str, &str); 3] = [
        (
            &["-a", "gcra", "--rate", "1/s", "--capacity", "4"],
            "algorithm = \"gcra\"\nrate = \"1/s\"\ncapacity = 4\n",
            "gcra takes no capacity (it takes rate, burst)",
        ),
        (
            &[
                "-a",
                "token-bucket",
                "--capacity",
                "2",
                "--rate",
                "1/s",
                "--mode",
                "shaping",
            ],
            "algorithm = \"token-bucket\"\ncapacity = 2\nrate = \"1/s\"\nmode = \"shaping\"\n",
            "token-bucket takes no mode (it takes capacity, rate)",
        ),
        (
            &[
                "-a",
                "fixed-window",
                "--limit",
                "3",
                "--window",
                "1s",
                "--lease",
                "5s",
            ],
            "algorithm = \"fixed-window\"\nlimit = 3\nwindow = \"1s\"\nlease = \"5s\"\n",
            "fixed-window takes no lease (it takes limit, window)",
        ),
    ];
    for (flags, file, message) in cases {
        let mut args = vec!["check"];
        args.extend_from_slice(flags);
        args.push("user:1");
        let (code, err) = sluice(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(message), "check {args:?}: {err}");
        let (code, err) = validate(file);
        assert_eq!(code, 1, "{file}: {err}");
        assert!(err.contains(message), "validate {file:?}: {err}");
    }
}

#[test]
fn check_still_accepts_the_parameters_an_algorithm_takes() {
    let (code, err) = sluice(&[
        "check",
        "-a",
        "leaky-bucket",
        "--capacity",
        "2",
        "--rate",
        "1/s",
        "--mode",
        "shaping",
        "-n",
        "1",
        "user:2",
    ]);
    assert_eq!(code, 0, "{err}");
    let (code, err) = sluice(&[
        "check",
        "-a",
        "concurrency",
        "--limit",
        "1",
        "--lease",
        "2s",
        "user:3",
    ]);
    assert_eq!(code, 0, "{err}");
}
